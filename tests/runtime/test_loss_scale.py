"""Dynamic loss scaling of fp16 graph plans: a step whose gradients overflow is skipped and
halves the scale; GROWTH_INTERVAL clean steps in a row double it."""

from __future__ import annotations

import torch

from runtime.loss_scale import GROWTH_INTERVAL, INITIAL_SCALE, LossScale


def test_an_overflow_halves_the_scale_and_clean_steps_double_it() -> None:
    scale = LossScale()
    clean, bad = [torch.ones(3)], [torch.tensor([1.0, float("inf")])]
    assert scale.overflowed(bad, across_ranks=False)
    assert scale.scale == INITIAL_SCALE / 2
    assert scale.overflowed([torch.tensor([float("nan")])], across_ranks=False)
    assert scale.scale == INITIAL_SCALE / 4
    for _ in range(GROWTH_INTERVAL - 1):
        assert not scale.overflowed(clean, across_ranks=False)
    assert scale.scale == INITIAL_SCALE / 4
    assert not scale.overflowed(clean, across_ranks=False)
    assert scale.scale == INITIAL_SCALE / 2 and scale.good_steps == 0
