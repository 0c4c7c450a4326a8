"""A rank slower than its peers, named while the job runs.

Collectives make every rank's wall time per step the same (the fast ones wait), so each
rank measures its own work instead: the CPU time of its training thread over the step
(`time.thread_time`), which waiting in a gloo collective does not add to (gloo's own
threads move the bytes). On GPUs the same measure is the stage's kernel time (CUDA
events around its forward and backward), as Megatron-LM's `StragglerDetector` takes it.

Ranks of different pipeline stages do different work, so each rank's time is divided by
its stage's predicted time (the Plan's forward and backward per micro-batch); a rank
whose ratio exceeds `threshold` times the median of the others' is named. Each rank
posts its time to the rendezvous store (no collective: the plan's collectives stay what
runs) and rank 0 reads them, one line per straggler the first time it is seen, and
keeps every step's ratios for the report.

`--slow-rank R --slow-factor F` makes rank R spin for (F - 1) times its own step's
work after each step, for tests.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

__all__ = ["Slow", "StragglerMonitor"]

THRESHOLD = 1.5
"""A rank is a straggler above this many times its peers' median (time per predicted)."""


@dataclass(frozen=True)
class Slow:
    """An injected straggler: rank `rank` works `factor` times as long each step."""

    rank: int
    factor: float

    def __post_init__(self) -> None:
        if self.factor < 1:
            raise ValueError(f"slow factor {self.factor}: give 1 or more")

    def after_step(self, rank: int, step_cpu_s: float) -> None:
        if rank != self.rank:
            return
        until = time.thread_time() + (self.factor - 1) * step_cpu_s
        while time.thread_time() < until:
            pass  # busy: the rank's own work, as a slower device would take


class StragglerMonitor:
    """This rank's step time over its predicted time, posted to `store`; on rank 0, the
    comparison."""

    def __init__(self, rank: int, world_size: int, store: dist.Store, expected_s: float,
                 attempt: int, wait_s: float, threshold: float = THRESHOLD) -> None:
        """`expected_s`: this rank's predicted seconds per step (its stages' forward and
        backward: only the ratios between ranks matter); `wait_s`: how long rank 0 waits
        for a peer's time before it gives that step up."""
        self.rank, self.world_size, self.store = rank, world_size, store
        self.expected_s, self.threshold, self.wait_s = expected_s, threshold, wait_s
        self.prefix = f"stragglers/attempt{attempt}"
        self.named: dict[int, float] = {}
        self.ratios: list[list[float]] = []
        self._start = 0.0

    def start_step(self) -> None:
        self._start = time.thread_time()

    def end_step(self, step: int, slow: Slow | None = None) -> None:
        """Post this rank's time for `step` (after any injected slowness); rank 0 then
        compares every rank's."""
        spent = time.thread_time() - self._start
        if slow is not None:
            slow.after_step(self.rank, spent)
            spent = time.thread_time() - self._start
        ratio = spent / max(self.expected_s, 1e-12)
        self.store.set(f"{self.prefix}/step{step}/rank{self.rank}", repr(ratio))
        if self.rank == 0 and self.world_size > 1:
            self._compare(step)

    def _compare(self, step: int) -> None:
        keys = [f"{self.prefix}/step{step}/rank{r}" for r in range(self.world_size)]
        try:
            self.store.wait(keys, timedelta(seconds=self.wait_s))
        except (RuntimeError, dist.DistStoreError):
            return  # a peer did not post (it failed): the fault is reported elsewhere
        ratios = [float(self.store.get(k)) for k in keys]
        self.ratios.append(ratios)
        for rank, ratio in enumerate(ratios):
            peers = statistics.median(ratios[:rank] + ratios[rank + 1:])
            if peers > 0 and ratio > self.threshold * peers and rank not in self.named:
                self.named[rank] = ratio / peers
                print(f"straggler: rank {rank} worked {ratio / peers:.1f}x as long as its "
                      f"peers in step {step} (time per predicted stage time)",
                      file=sys.stderr, flush=True)
