"""The divergence guard's verdicts, judged without processes (a one-rank store)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from runtime.divergence import DivergenceGuard, DivergencePolicy


def _guard(**policy) -> DivergenceGuard:
    return DivergenceGuard(DivergencePolicy(**policy), dist.HashStore(), 1, attempt=0)


def test_a_non_finite_loss_or_gradient_diverges() -> None:
    guard = _guard()
    assert guard.judge(math.nan, []) == "loss nan is not finite"
    assert guard.judge(None, [torch.tensor([1.0, math.inf])]) == "a gradient is not finite"
    assert guard.judge(2.0, [torch.ones(3)]) is None


def test_a_spike_beyond_the_factor_of_the_recent_mean_diverges() -> None:
    guard = _guard(spike_factor=3.0)
    for loss in (2.0, 2.2, 1.8):
        assert guard.judge(loss, []) is None
    assert guard.judge(5.9, []) is None  # below 3 x 2.0 (and now part of the mean)
    said = guard.judge(9.0, [])
    assert said == "loss 9 is 3.0x the mean of the last 4 (2.975)"
    # A rejected loss does not enter the mean: the next normal one is accepted.
    assert guard.judge(2.0, []) is None


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="give one of skip, rollback, stop"):
        DivergencePolicy("retry")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="above 1"):
        DivergencePolicy("skip", spike_factor=0.5)
