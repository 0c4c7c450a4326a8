"""A training loop's checkpoints and restarts: resume from the newest complete checkpoint
when there is one, save every K steps in the background, and, to exercise all of it,
kill one rank at one step of the job's first attempt, stall or slow one, or make a step's
loss NaN; and what to do with a step that diverges.

Under torch's elastic agent (torchrun, `runtime.elastic.launch`) with restarts, a rank that
dies takes its attempt down; the agent starts every rank again (``TORCHELASTIC_RESTART_
COUNT`` counts the attempts) and each finds the newest checkpoint and goes on from its step:
the data resumes there too, since a batch is a function of its step index. Each rank's
notes (its losses so far) travel in the checkpoint, so the resumed job reports every step.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.checkpoint import Resumed, latest_checkpoint
from runtime.divergence import DivergencePolicy
from runtime.flight_recorder import Stall
from runtime.stragglers import Slow


def restart_count() -> int:
    """Which attempt of the job this is (0: the first), as torch's elastic agent says."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@dataclass(frozen=True)
class Resilience:
    """How a run checkpoints, and the fault it injects (if any)."""

    checkpoint_dir: str
    every: int = 0
    """Save after every `every` steps (0: never)."""
    kill_rank: int | None = None
    kill_at_step: int | None = None
    """The rank `kill_rank` SIGKILLs itself as step `kill_at_step` (0-based) begins, in the
    first attempt only."""
    asynchronous: bool = True
    stall: Stall | None = None
    """A rank that hangs in a collective (`runtime.flight_recorder`)."""
    slow: Slow | None = None
    """A rank that works slower than its peers (`runtime.stragglers`)."""
    nan_at_step: int | None = None
    """The step whose loss is made NaN, once (first attempt)."""
    divergence: DivergencePolicy | None = None
    """How a diverging step is met (`runtime.divergence`); None: trained on."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"checkpoint every {self.every} steps: give 0 (never) or more")
        if (self.kill_rank is None) != (self.kill_at_step is None):
            raise ValueError("a kill needs both the rank and the step")

    def poisons(self, step: int) -> bool:
        """Whether `step`'s loss is made NaN (the injected `--nan-at-step`)."""
        return step == self.nan_at_step and restart_count() == 0

    def last_checkpoint(self) -> str:
        """The newest complete checkpoint, as a fault's message names it."""
        latest = latest_checkpoint(self.checkpoint_dir)
        return str(latest) if latest is not None else f"none yet under {self.checkpoint_dir}"

    def resume(self, trainer: Any) -> Resumed | None:
        """Load the newest complete checkpoint into `trainer`, if there is one."""
        latest = latest_checkpoint(self.checkpoint_dir)
        return None if latest is None else trainer.load(latest)

    def before_step(self, rank: int, step: int) -> None:
        """The injected fault: SIGKILL this process (nothing is flushed or reported)."""
        if (rank, step) == (self.kill_rank, self.kill_at_step) and restart_count() == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_step(self, trainer: Any, notes: dict[str, Any]) -> Path | None:
        """Checkpoint when `trainer.steps_done` is a multiple of `every`."""
        if not self.every or trainer.steps_done % self.every:
            return None
        return trainer.save(self.checkpoint_dir, asynchronous=self.asynchronous, notes=notes)
