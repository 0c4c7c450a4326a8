"""One optimizer step's pipeline schedule as bars on a (stage x time) chart.

A pure function from each stage's per-micro-batch phase times, the micro-batch count and
the schedule to the bars a timeline draws. Each stage runs its actions in the order the
engine issues them (`cost_models.pipeline_schedule`: torch.distributed.pipelining's
GPipe, 1F1B and Interleaved1F1B orders), each as soon as the stage is free and its input
has arrived (`pipeline_schedule.simulate`); an action is drawn as the phases it spends
its time on. Under the interleaved schedule a chunk's work is taken as 1/v of its stage's
(its transfers excepted: each chunk sends its own).

With equal stages the 1F1B and GPipe timelines last sum(stage times) + (m - 1) x slowest,
as does any pipeline whose last stage is its slowest, and the interleaved one (m + (p - 1)
/ v) x slowest (plus its chunks' extra transfers) for m >= p: the step-time model's
formulas (`cost_models/step_time.py`), which the tests check. Where a middle stage is the
slowest, the stages around it wait on each other in ways the formula does not count, and
the two differ a little.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.pipeline_schedule import Action, schedule_actions, simulate
from cost_models.step_time import StagePhases

SCHEDULES = ("gpipe", "1f1b", "interleaved")
"""The schedules drawn: those whose backward is one pass (ZB-V splits it in two, which
`StagePhases` does not)."""
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
    (`virtual` chunks per stage for the interleaved one), bubbles included."""
    p, m, v = len(stages), num_micro_batches, virtual
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need stages, micro-batches and chunks >= 1, got {p}, {m} and {v}")
    if schedule not in SCHEDULES:
        raise ValueError(f"cannot draw schedule {schedule!r}; it draws {', '.join(SCHEDULES)}")
    # Stage s of the p v (virtual) stages runs on pipeline stage s % p, as its chunk s // p.
    run = simulate(schedule_actions(schedule, p, m, v),
                   lambda action: sum(t for _, t in _parts(action, stages[action.stage % p], v)))
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
    # Recomputation replays the forward just before the backward that needs it.
    return [("recompute", phases.recompute / v), ("backward", phases.backward / v),
            ("communication", phases.backward_communication / v + phases.transfer / 2)]
