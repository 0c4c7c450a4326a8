"""Dynamic loss scaling for fp16 training, as `torch.amp.GradScaler` does it.

An fp16 plan's last stage multiplies its loss by the scale (`passes.stage_graph.LOSS_SCALE`),
so every gradient of the step is that many times larger and small ones do not flush to
zero in fp16. The trainer divides the summed gradients by it; if any is not finite on any
rank, every rank skips the step and halves the scale; after `GROWTH_INTERVAL` steps in a
row without, the scale doubles. The defaults are GradScaler's (init 2**16, factors 2 and
0.5, interval 2000).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 2000


@dataclass
class LossScale:
    """The scale of the next step, and the steps since it last changed without overflow."""

    scale: float = INITIAL_SCALE
    good_steps: int = 0

    def overflowed(self, gradients: list[torch.Tensor], across_ranks: bool = True) -> bool:
        """Whether any of these gradients, on any rank, is not finite (one all-reduce of
        one element over every rank of the job; none for a single process's), updating the
        scale for the next step."""
        bad = any(not bool(torch.isfinite(g).all()) for g in gradients)
        flag = torch.tensor([1.0 if bad else 0.0])
        if across_ranks:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            self.scale /= 2
            self.good_steps = 0
            return True
        self.good_steps += 1
        if self.good_steps == GROWTH_INTERVAL:
            self.scale *= 2
            self.good_steps = 0
        return False

    def as_tensor(self) -> torch.Tensor:
        """(scale, good steps), as a checkpoint holds them (`runtime.checkpoint`): every rank
        has the same, so a resumed run scales its next step as the uninterrupted one would."""
        return torch.tensor([self.scale, float(self.good_steps)], dtype=torch.float64)

    def load(self, saved: torch.Tensor) -> None:
        self.scale, self.good_steps = float(saved[0]), int(saved[1])
