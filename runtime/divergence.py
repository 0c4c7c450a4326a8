"""A loss that diverges: found before the optimizer applies it, and skipped, rolled back or
stopped on, the same way on every rank.

A step diverges when its loss or any gradient is not finite (an overflow, a bad batch:
Megatron-LM's `--check-for-nan-in-loss-and-grad`), or when its loss jumps beyond
`spike_factor` times the mean of the last `window` accepted losses (the spikes PaLM
met at scale; Chowdhery et al. 2022, Sec. 5.1, restarted from a checkpoint about 100
steps before a spike and skipped 200-500 batches). What to do (`--on-divergence`):

- skip: drop the step's update (the batch is consumed, the optimizer does not step);
- rollback: load the newest complete checkpoint and go on from it, skipping the batch
  that diverged (every batch is a function of its index, so the run then equals one
  process that never saw that batch);
- stop: end the job with one line naming the step, the reason and the last checkpoint.

Every rank must take the same decision, though only the last stage sees the loss: the
ranks agree through the rendezvous store (two counters per step), not a collective, so
the collectives a plan predicts stay what runs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

__all__ = ["DivergenceGuard", "DivergencePolicy", "Diverged"]

Action = Literal["skip", "rollback", "stop"]
ACTIONS: tuple[Action, ...] = ("skip", "rollback", "stop")


class Diverged(RuntimeError):
    """The run stopped on a diverging step (`--on-divergence stop`); one line."""


@dataclass(frozen=True)
class DivergencePolicy:
    """What a run does with a diverging step, and what counts as one."""

    action: Action = "stop"
    spike_factor: float = 10.0
    """A finite loss above this many times the recent mean diverges too."""
    window: int = 8
    """Accepted losses the recent mean is taken over (a spike is judged after 3)."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"on divergence {self.action!r}: give one of {', '.join(ACTIONS)}")
        if not self.spike_factor > 1:
            raise ValueError(f"spike factor {self.spike_factor}: give a factor above 1")


class DivergenceGuard:
    """One rank's judge of each step, agreeing with its peers through `store`."""

    def __init__(self, policy: DivergencePolicy, store: dist.Store, world_size: int,
                 attempt: int) -> None:
        self.policy, self.store, self.world_size = policy, store, world_size
        self.prefix = f"divergence/attempt{attempt}"
        self.recent: deque[float] = deque(maxlen=policy.window)
        self.rounds = 0

    def local_reason(self, loss: float | None, grads: list[torch.Tensor]) -> str | None:
        """Why this rank sees the step diverge, or None."""
        if loss is not None and not math.isfinite(loss):
            return f"loss {loss} is not finite"
        if any(not bool(torch.isfinite(g).all()) for g in grads):
            return "a gradient is not finite"
        if loss is not None and len(self.recent) >= 3:
            mean = sum(self.recent) / len(self.recent)
            if loss > self.policy.spike_factor * mean:
                return (f"loss {loss:.4g} is {loss / mean:.1f}x the mean of the last "
                        f"{len(self.recent)} ({mean:.4g})")
        return None

    def judge(self, loss: float | None, grads: list[torch.Tensor]) -> str | None:
        """The step's verdict, the same on every rank: a reason it diverged (this rank's,
        or that a peer saw it), or None to apply it."""
        reason = self.local_reason(loss, grads)
        self.rounds += 1
        key = f"{self.prefix}/round{self.rounds}"
        self.store.add(f"{key}/diverged", int(reason is not None))
        self.store.add(f"{key}/arrived", 1)
        while self.store.add(f"{key}/arrived", 0) < self.world_size:
            time.sleep(0.002)
        if reason is None and self.store.add(f"{key}/diverged", 0):
            reason = "a peer's loss or gradients diverged"
        if reason is None and loss is not None:
            self.recent.append(loss)
        return reason
