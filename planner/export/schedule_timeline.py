"""One optimizer step's pipeline schedule as bars on a (stage x time) chart.

A pure function from each stage's per-micro-batch phase times, the micro-batch count and
the schedule to the bars a timeline draws. Each stage runs its actions in the order the
engine issues them (`cost_models.pipeline_schedule`: torch.distributed.pipelining's
GPipe, 1F1B, Interleaved1F1B and DualPipeV orders), each as soon as the stage is free and
its input has arrived (`pipeline_timing.simulate`); an action is drawn as the phases it
spends its time on. Under the interleaved and DualPipeV schedules a chunk's work is taken
as 1/v of its stage's (its transfers excepted: each chunk sends its own). DualPipeV's
split backwards are drawn as `pipeline_timing.dualpipev_chunk` prices them: W (the
weights' gradient) half the chunk's backward kernels, I the rest of its backward.

The timeline is `pipeline_timing.simulate_stages`, which the step-time model's closed
forms (`pipeline_timing.pipeline_time`) stand for; where they differ (a middle stage the
slowest, the interleaved chunks' transfers in the fill, a DualPipeV chunk whose I is not as
long as its F), the docstrings there say by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.pipeline_timing import StagePhases, action_parts, simulate_stages
from planner.vocabulary.schedules import SCHEDULES

DRAWN_SCHEDULES = SCHEDULES
"""The schedules drawn: the planner's (ZB-V, which no plan names, is not)."""
BAR_KINDS = ("forward", "backward", "recompute", "communication", "bubble")
"""What a bar shows: a stage's forward or backward kernels, the forward it replays in
backward (activation recomputation), communication it waits on (tensor- and context-
parallel collectives, pipeline sends and receives), or idle time."""


@dataclass(frozen=True)
class Bar:
    """One interval of one stage's time."""

    stage: int
    start: float
    end: float
    kind: str
    """One of BAR_KINDS."""
    micro_batch: int = -1
    """The micro-batch it works on (-1 for a bubble)."""
    chunk: int = 0
    """The model chunk (interleaved schedule), 0 otherwise."""


@dataclass(frozen=True)
class Timeline:
    """The bars of one step's pipeline, and when its last stage goes idle."""

    bars: list[Bar]
    length: float
    num_stages: int

    def busy(self, stage: int) -> float:
        """Seconds `stage` works (every bar but its bubbles)."""
        return sum(b.end - b.start for b in self.bars if b.stage == stage and b.kind != "bubble")


def pipeline_timeline(
    stages: list[StagePhases], num_micro_batches: int, schedule: str, virtual: int = 1,
) -> Timeline:
    """The bars of `num_micro_batches` micro-batches through `stages` under `schedule`
    (`virtual` chunks per stage for the interleaved one, 2 for dualpipev), bubbles
    included."""
    p, m, v = len(stages), num_micro_batches, virtual
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need stages, micro-batches and chunks >= 1, got {p}, {m} and {v}")
    if schedule not in DRAWN_SCHEDULES:
        raise ValueError(f"cannot draw schedule {schedule!r}; it draws "
                         f"{', '.join(DRAWN_SCHEDULES)}")
    run = simulate_stages(schedule, stages, m, v)
    # A wait shorter than this is rounding in the sums above, not a bubble.
    tolerance = 1e-12 * max(run.makespan, 1.0)
    bars = []
    for stage, intervals in enumerate(run.intervals):
        for action, start, _ in intervals:
            t = start
            for name, seconds in action_parts(action, stages[stage], v):
                if seconds > 0:
                    bars.append(Bar(stage, t, t + seconds, name, action.micro_batch,
                                    action.stage // p))
                    t += seconds
        bars += [Bar(stage, start, end, "bubble") for start, end in run.gaps(stage)
                 if end - start > tolerance]
    return Timeline(bars, run.makespan, p)
