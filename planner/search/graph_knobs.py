"""What a user may fix of a graph plan (`plan MODEL --gpus N` for a model of one's own,
`planner.parallelize(..., gpus=N)`); the graph search chooses the rest."""

from __future__ import annotations

from dataclasses import dataclass

from planner.vocabulary.parallel import Precision
from planner.vocabulary.schedules import SCHEDULES, Schedule, schedule_info

GRAPH_SCHEDULES = tuple(sorted((name for name in SCHEDULES if schedule_info(name).chunks == 1),
                               key=lambda name: name != "1f1b"))
"""What graph plans run: the one-chunk schedules (`runtime.graph_pipeline` runs a stage as
one program), 1F1B first, the default."""
GRAPH_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class GraphKnobs:
    """The graph search's fixed choices; None: searched."""

    recompute: bool | None = None
    """True: every stage but the last keeps only its incoming tensors per micro-batch in
    flight and runs its first pass again before the backward (the last stage holds one
    micro-batch at a time, so recomputing would save it nothing); False: none does."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: 1f1b (a stage holds one micro-batch per stage from it to the
    last) or gpipe (every stage but the last holds all of them)."""
    lean: bool | None = None
    """True: every parameter, its gradient and optimizer state at their least memory,
    sharded over every mesh axis they split on (ZeRO-3); False: placed as fast as they go
    (the ILP's choice, replicated where that is fastest: ZeRO-0)."""
    precision: Precision = "fp32"
    """fp32, or bf16 or fp16: the model traced, priced and run in that precision with fp32
    master weights, gradient accumulators and moments (mixed precision); fp16 with dynamic
    loss scaling (`runtime.graph_pipeline.LossScale`)."""

    def __post_init__(self) -> None:
        if self.schedule not in GRAPH_SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}: graph plans run "
                             f"{' or '.join(GRAPH_SCHEDULES)}")
        if self.precision not in GRAPH_PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: graph plans train in "
                             f"{' or '.join(GRAPH_PRECISIONS)}")

    def precision_problem(self, peaks: dict[str, float], device: str) -> str | None:
        """Why `device` (its datasheet `peaks`) cannot train in the knobs' precision:
        '<precision> needs ...', for the caller to name the flag or argument."""
        if self.precision in peaks:
            return None
        return (f"{self.precision} needs {self.precision} tensor cores, which {device} "
                "lacks; train in fp32 or plan for a newer cluster")

    def modes(self) -> tuple[bool, ...]:
        """The lean settings a layout may take (False, True when searched)."""
        return (False, True) if self.lean is None else (self.lean,)

    def recomputations(self, last: bool) -> tuple[bool, ...]:
        """The recompute settings a stage may take (the last stage never recomputes)."""
        if last:
            return (False,)
        return (False, True) if self.recompute is None else (self.recompute,)
