"""The divergence guard's verdicts, judged without processes (a one-rank store)."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.distributed as dist

from runtime.divergence import DivergenceGuard, DivergencePolicy, policies_line


def _guard(**policy) -> DivergenceGuard:
    return DivergenceGuard(DivergencePolicy(**policy), dist.HashStore(), 1, attempt=0)


def test_a_non_finite_loss_or_gradient_diverges() -> None:
    guard = _guard()
    assert guard.judge(math.nan, []) == "loss nan is not finite on rank 0"
    assert guard.judge(None, [torch.tensor([1.0, math.inf])]) == \
        "a gradient is not finite on rank 0"
    assert guard.judge(2.0, [torch.ones(3)]) is None


def test_a_spike_beyond_the_factor_of_the_recent_mean_diverges() -> None:
    guard = _guard(spike_factor=3.0)
    for loss in (2.0, 2.2, 1.8):
        assert guard.judge(loss, []) is None
    assert guard.judge(5.9, []) is None  # below 3 x 2.0 (and now part of the mean)
    said = guard.judge(9.0, [])
    assert said == "loss 9 is 3.0x the mean of the last 4 (2.975) on rank 0"
    # A rejected loss does not enter the mean: the next normal one is accepted.
    assert guard.judge(2.0, []) is None


def test_every_rank_names_the_rank_whose_loss_diverged() -> None:
    """Only the last stage (here rank 1 of 2) sees the loss: both ranks stop on the same
    line, naming it. (Each rank judges in a thread of its own, over one store.)"""
    store, said = dist.HashStore(), {}
    guards = {rank: DivergenceGuard(DivergencePolicy(), store, 2, attempt=0, rank=rank)
              for rank in (0, 1)}
    # The NaN loss's gradients flow back to rank 0's stage: the loss is named first.
    losses, grads = {0: None, 1: math.nan}, {0: torch.tensor([math.nan]), 1: torch.ones(2)}
    threads = [threading.Thread(target=lambda r=r: said.update({r: guards[r].judge(
        losses[r], [grads[r]])})) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert said == {r: "loss nan is not finite on rank 1 (rank 0 too)" for r in (0, 1)}


def test_what_each_policy_would_do_is_one_line() -> None:
    assert policies_line(5, 2) == (
        "--on-divergence skip drops step 5's update and goes on; rollback reloads the "
        "checkpoint of step 4 and goes on without batch 5; stop ends the job at step 5, "
        "naming it")
    assert "rollback needs a checkpoint from before step 2 (--checkpoint-every 2 or less)" \
        in policies_line(2, 0)
    assert "rollback has no checkpoint from before step 0" in policies_line(0, 1)


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="give one of skip, rollback, stop"):
        DivergencePolicy("retry")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="above 1"):
        DivergencePolicy("skip", spike_factor=0.5)
