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
- stop: end the job with one line naming the step, the reason, the rank that saw it and
  the last checkpoint.

Every rank must take the same decision, though only the last stage sees the loss: the
ranks agree through the rendezvous store (a counter per step, and the reason of each rank
that saw the step diverge), not a collective, so the collectives a plan predicts stay
what runs. `policies_line` says what each policy would do with a step, for a run that
met a diverging step with none.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

__all__ = ["DivergenceGuard", "DivergencePolicy", "Diverged", "policies_line"]

Action = Literal["skip", "rollback", "stop"]
ACTIONS: tuple[Action, ...] = ("skip", "rollback", "stop")


GRADIENT_NOT_FINITE = "a gradient is not finite"


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
                 attempt: int, rank: int | None = None) -> None:
        """`rank`: this rank (default: its rank in the default process group, else 0)."""
        self.policy, self.store, self.world_size = policy, store, world_size
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        self.rank = rank
        self.prefix = f"divergence/attempt{attempt}"
        self.recent: deque[float] = deque(maxlen=policy.window)
        self.rounds = 0

    def local_reason(self, loss: float | None, grads: list[torch.Tensor]) -> str | None:
        """Why this rank sees the step diverge, or None."""
        if loss is not None and not math.isfinite(loss):
            return f"loss {loss} is not finite"
        if any(not bool(torch.isfinite(g).all()) for g in grads):
            return GRADIENT_NOT_FINITE
        if loss is not None and len(self.recent) >= 3:
            mean = sum(self.recent) / len(self.recent)
            if loss > self.policy.spike_factor * mean:
                return (f"loss {loss:.4g} is {loss / mean:.1f}x the mean of the last "
                        f"{len(self.recent)} ({mean:.4g})")
        return None

    def judge(self, loss: float | None, grads: list[torch.Tensor]) -> str | None:
        """The step's verdict, the same on every rank: why it diverged and on which rank
        ("loss nan is not finite on rank 3 (rank 0 too)"), or None to apply it. A loss
        is named before gradients (which follow a bad loss back through every stage),
        then the lowest rank."""
        reason = self.local_reason(loss, grads)
        self.rounds += 1
        key = f"{self.prefix}/round{self.rounds}"
        if reason is not None:
            self.store.set(f"{key}/rank{self.rank}", reason)
        self.store.add(f"{key}/arrived", 1)
        while self.store.add(f"{key}/arrived", 0) < self.world_size:
            time.sleep(0.002)
        seen = {r: self.store.get(f"{key}/rank{r}").decode() for r in range(self.world_size)
                if self.store.check([f"{key}/rank{r}"])}
        if not seen:
            if loss is not None:
                self.recent.append(loss)
            return None
        first = min(seen, key=lambda r: (seen[r] == GRADIENT_NOT_FINITE, r))
        rest = [str(r) for r in sorted(seen) if r != first]
        too = f" (rank{'s' * (len(rest) > 1)} {', '.join(rest)} too)" if rest else ""
        return f"{seen[first]} on rank {first}{too}"


def policies_line(step: int, checkpoint_every: int) -> str:
    """What each `--on-divergence` policy does with step `step` (0-based) that diverged,
    in a run checkpointing every `checkpoint_every` steps (0: never), in one line."""
    # The checkpoint saved after `k * every` steps is the newest before step `step`.
    saved = step // checkpoint_every * checkpoint_every if checkpoint_every else 0
    if saved:
        rollback = (f"rollback reloads the checkpoint of step {saved} and goes on without "
                    f"batch {step}")
    elif step:
        rollback = (f"rollback needs a checkpoint from before step {step} (--checkpoint-every "
                    f"{step} or less)")
    else:
        rollback = "rollback has no checkpoint from before step 0 to go back to"
    return (f"--on-divergence skip drops step {step}'s update and goes on; {rollback}; "
            f"stop ends the job at step {step}, naming it")

