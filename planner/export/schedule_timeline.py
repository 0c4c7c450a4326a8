"""One optimizer step's pipeline schedule as bars on a (stage x time) chart.

A pure function from each stage's per-micro-batch phase times, the micro-batch count and
the schedule to the bars a timeline draws. Each stage runs its actions in the order the
engine issues them (`cost_models.pipeline_schedule`: torch.distributed.pipelining's
GPipe, 1F1B, Interleaved1F1B and DualPipeV orders), each as soon as the stage is free and
its input has arrived (`pipeline_schedule.simulate`); an action is drawn as the phases it
spends its time on. Under the interleaved and DualPipeV schedules a chunk's work is taken
as 1/v of its stage's (its transfers excepted: each chunk sends its own). DualPipeV's
split backwards are drawn as `pipeline_schedule.dualpipev_chunk` prices them: W (the
weights' gradient) half the chunk's backward kernels, I the rest of its backward.

With equal stages the 1F1B and GPipe timelines last sum(stage times) + (m - 1) x slowest,
as does any pipeline whose last stage is its slowest, and the interleaved one (m + (p - 1)
/ v) x slowest (plus its chunks' extra transfers) for m >= p: the step-time model's
formulas (`cost_models/step_time.py`), which the tests check. Where a middle stage is the
slowest, the stages around it wait on each other in ways the formula does not count, and
the two differ a little. DualPipeV's lasts 2 m (F + B) + (p - 1)(F&B + B - 3W) per chunk
(DeepSeek-V3 report Table 2), the step-time model's, where a chunk's I takes as long as
its F (`pipeline_schedule.dualpipev_bubble`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.pipeline_schedule import (
    Action,
    schedule_actions,
    simulate,
    stage_rank,
)
from cost_models.step_time import StagePhases

DRAWN_SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipev")
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
    # Stage s of the p v (virtual) stages runs on pipeline stage s % p (or in V order,
    # `stage_rank`), as its chunk s // p.
    def phases(action: Action) -> StagePhases:
        return stages[stage_rank(action.stage, p, schedule)]

    run = simulate(schedule_actions(schedule, p, m, v),
                   lambda action: sum(t for _, t in _parts(action, phases(action), v)))
    # A wait shorter than this is rounding in the sums above, not a bubble.
    tolerance = 1e-12 * max(run.makespan, 1.0)
    bars = []
    for stage, intervals in enumerate(run.intervals):
        for action, start, _ in intervals:
            t = start
            for name, seconds in _parts(action, stages[stage], v):
                if seconds > 0:
                    bars.append(Bar(stage, t, t + seconds, name, action.micro_batch,
                                    action.stage // p))
                    t += seconds
        bars += [Bar(stage, start, end, "bubble") for start, end in run.gaps(stage)
                 if end - start > tolerance]
    return Timeline(bars, run.makespan, p)


def _parts(action: Action, phases: StagePhases, v: int) -> list[tuple[str, float]]:
    """What one action spends its time on, in order: its chunk's share of the stage's
    phases (1/v), and its own half of the chunk's transfer."""
    if action.kind == "F":
        return [("forward", phases.forward / v),
                ("communication", phases.forward_communication / v + phases.transfer / 2)]
    # A split backward's W, the weights' gradient: half the chunk's backward kernels, as
    # `dualpipev_chunk` prices it.
    weight = phases.backward / v / 2
    if action.kind == "W":
        return [("backward", weight)]
    backward = phases.backward / v - (weight if action.kind == "I" else 0.0)
    # Recomputation replays the forward just before the backward that needs it.
    return [("recompute", phases.recompute / v), ("backward", backward),
            ("communication", phases.backward_communication / v + phases.transfer / 2)]
