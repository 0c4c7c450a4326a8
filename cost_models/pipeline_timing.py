"""How long a pipeline schedule's step lasts: every rank's actions
(`cost_models.pipeline_schedule`) run against each other with given durations
(`simulate`), and the closed forms the search prices with (`pipeline_time`,
`one_chunk_seconds`), each of which tests/cost_models/test_pipeline_timing.py checks
against the simulation over a grid of stages, micro-batches, chunks and schedules, under
the condition its docstring states; where no closed form holds, `pipeline_time` simulates.

Pure Python on plain numbers: no torch, nothing searched.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cost_models.pipeline_schedule import Action, schedule_actions, stage_rank
from planner.vocabulary.schedules import SCHEDULES, schedule_info


def dualpipev_bubble(pipeline: int, forward: float, backward: float, weight: float,
                     forward_backward: float | None = None) -> float:
    """Seconds each rank of a DualPipeV pipeline over `pipeline` ranks (2 x pipeline
    stages) waits in one step: (PP / 2 - 1)(F&B + B - 3 W) with PP = 2 x pipeline stages,
    F, B and W the seconds of one chunk's forward, full backward and weights' gradient,
    and F&B of a forward and a backward run overlapped (`forward_backward`; default F +
    B: torch runs the two one after the other unless an OVERLAP_F_B function is
    registered, and Tessel registers none). The formula: DeepSeek-V3 Technical Report
    (arXiv 2412.19437) Table 2 for DualPipe, which deepseek-ai/DualPipe's README gives
    DualPipeV too ("Pipeline Bubbles and Memory Usage Comparison", PP the number of
    stages, F, B, W per chunk).

    `simulate` of the schedule's actions gives exactly this where a chunk's I (B - W)
    lasts as long as its F, as in the report's figure; the wait is longer where I is
    shorter, and shorter where it is longer."""
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    both = forward + backward if forward_backward is None else forward_backward
    return (pipeline - 1) * (both + backward - 3 * weight)


def dualpipev_chunk(forward: float, backward: float, backward_kernels: float,
                    transfer: float) -> tuple[float, float, float]:
    """(F, B, W): seconds of one of a DualPipeV rank's two chunks, from the rank's
    seconds per micro-batch: `forward` (kernels and exposed collectives), `backward`
    (kernels, replayed forward and exposed collectives), `backward_kernels` (the backward
    kernels alone) and `transfer` (one chunk's activation out and gradient in, each chunk
    sending its own). A chunk is half the rank's layers; F and B each carry half the
    transfer. W, the weights' gradient: half the chunk's backward kernels. Assumed: each
    matmul's backward is two matmuls of its forward's size, one for the inputs' gradient
    and one for the weights' (the kernel model's backward = 2 x forward for matmuls);
    attention's own backward and the elementwise kernels have no weights, so this
    overstates W a little. The replayed forward and the collectives go with I = B - W,
    which the previous stage waits for."""
    return (forward / 2 + transfer / 2, backward / 2 + transfer / 2, backward_kernels / 4)


def dualpipev_pipeline_seconds(pipeline: int, micro_batches: int, forward: float,
                               backward: float, backward_kernels: float,
                               transfer: float) -> float:
    """Seconds a DualPipeV step's pipeline lasts, the rank's times as `dualpipev_chunk`
    reads them: every micro-batch through both chunks, 2 m (F + B), and the wait
    `dualpipev_bubble` (DeepSeek-V3 Technical Report Table 2; deepseek-ai/DualPipe README)
    with F&B = F + B, as torch runs the pair."""
    f, b, w = dualpipev_chunk(forward, backward, backward_kernels, transfer)
    return 2 * micro_batches * (f + b) + dualpipev_bubble(pipeline, f, b, w)


@dataclass(frozen=True)
class StagePhases:
    """Seconds one pipeline stage spends on one micro-batch (all its chunks), by phase:
    what the pipeline's time is made of (`pipeline_time`), and what a schedule's timeline
    draws (`action_parts`)."""

    forward: float
    """Forward kernels."""
    backward: float
    """Backward kernels."""
    recompute: float = 0.0
    """Forward replayed inside the backward (activation recomputation)."""
    forward_communication: float = 0.0
    """Exposed collectives of the forward (tensor, context and expert parallel)."""
    backward_communication: float = 0.0
    """Exposed collectives of the backward (the replayed forward's included)."""
    transfer: float = 0.0
    """Pipeline point-to-point of one chunk: sending the activation (half of it, after a
    forward) and the gradient (the other half, after a backward). Each of a stage's v
    chunks sends its own, so unlike the phases above it is not shared among chunks."""

    @property
    def compute(self) -> float:
        """Kernel seconds: forward, backward and the replayed forward."""
        return self.forward + self.backward + self.recompute

    @property
    def communication(self) -> float:
        """Exposed tensor-, context- and expert-parallel collectives."""
        return self.forward_communication + self.backward_communication

    @property
    def total(self) -> float:
        """Seconds per micro-batch as the pipeline counts a stage (one transfer)."""
        return self.compute + self.communication + self.transfer


def action_parts(action: Action, phases: StagePhases, virtual: int = 1
                 ) -> list[tuple[str, float]]:
    """What `action` spends its time on, in order, its stage's `phases` shared by its
    `virtual` chunks: its chunk's 1/v of the stage's phases, and its own half of the
    chunk's transfer. A split backward's W (the weights' gradient) is half the chunk's
    backward kernels, as `dualpipev_chunk` prices it; its I is the rest of the backward."""
    v = virtual
    if action.kind == "F":
        return [("forward", phases.forward / v),
                ("communication", phases.forward_communication / v + phases.transfer / 2)]
    weight = phases.backward / v / 2
    if action.kind == "W":
        return [("backward", weight)]
    backward = phases.backward / v - (weight if action.kind == "I" else 0.0)
    # Recomputation replays the forward just before the backward that needs it.
    return [("recompute", phases.recompute / v), ("backward", backward),
            ("communication", phases.backward_communication / v + phases.transfer / 2)]


def simulate_stages(schedule: str, stages: Sequence[StagePhases], micro_batches: int,
                    virtual: int = 1) -> Timeline:
    """`simulate` of `schedule`'s actions for `micro_batches` through `stages` (one per
    pipeline rank, `virtual` chunks each), each action lasting its `action_parts`:
    the pipeline time that `pipeline_time`'s closed forms stand for."""
    p = len(stages)
    actions = schedule_actions(schedule, p, micro_batches, virtual)
    return simulate(actions, lambda action: sum(
        t for _, t in action_parts(action, stages[stage_rank(action.stage, p, schedule)],
                                   virtual)))


class PipelineTime(NamedTuple):
    """How long a step's pipeline runs."""

    seconds: float
    """From the first forward to the last backward."""
    bubble: float
    """Of that, what the slowest stage's own m micro-batches do not fill: the fill and
    drain (and, interleaved, the chunks' extra transfers)."""
    slowest: int
    """The slowest stage (the first of them), whose time per micro-batch paces the rest."""


def paced_micro_batches(micro_batches: int) -> int:
    """The micro-batches a one-chunk pipeline's slowest stage paces after the first has
    gone through every stage: m - 1. Its time is sum of stage times + this x the slowest
    (`one_chunk_seconds`): the weight of t_max in Alpa's stage DP."""
    return micro_batches - 1


def one_chunk_seconds(stage_seconds: Sequence[float], micro_batches: int) -> float:
    """GPipe's and 1F1B's pipeline over stages of `stage_seconds` per micro-batch: one
    micro-batch through every stage (the fill and drain), then the other m - 1 at the
    slowest stage's pace, sum_i t_i + (m - 1) max_i t_i: Alpa's objective (Zheng et al.,
    "Alpa", OSDI 2022, Sec. 5.2); for p equal stages (m + p - 1) t, the bubble
    (p - 1) t of Narayanan et al. (SC 2021, Sec. 2.2.1).

    Equal to `simulate_stages` where every stage's backward is the same multiple of its
    forward, under GPipe; under 1F1B (and GPipe with an eager last stage) where besides
    the last stage is the slowest (Megatron-LM's layouts: the loss on the last). Where a
    middle stage is the slowest, the stages around it fill some of the slots it paces, and
    the schedule ends before this."""
    return float(sum(stage_seconds)) + paced_micro_batches(micro_batches) * float(
        max(stage_seconds))


def pipeline_time(schedule: str, stages: Sequence[StagePhases] | Sequence[float],
                  micro_batches: int, virtual: int = 1) -> PipelineTime:
    """The pipeline of `micro_batches` through `stages` (each stage's `StagePhases`, or
    its total seconds per micro-batch where the schedule needs no more) under `schedule`
    with `virtual` chunks per stage, in O(p):

    - gpipe, 1f1b: `one_chunk_seconds`.
    - interleaved: (m + (p - 1) / v) t_max + (v - 1) m c, t_max the slowest stage's
      total, c one chunk's transfer (each of v chunks sends its own): the bubble (p - 1)
      / v of Narayanan et al. (SC 2021, Sec. 2.2.2). Equal to `simulate_stages` for equal
      stages without transfers, for every m >= p torch's rounds accept; above it for
      unequal stages (each paced as the slowest). With transfers it is short of it by at
      most (p - 1)(v - 1) / v c: its fill counts one transfer per stage, as the one-chunk
      forms do, where the schedule's fill crosses a boundary per chunk.
    - dualpipev: `dualpipev_pipeline_seconds` of the slowest stage (DeepSeek-V3 Technical
      Report Table 2): equal to `simulate_stages` for equal stages whose chunks' I (B -
      W) lasts as long as their F; above it where such stages are unequal."""
    p, m, v = len(stages), micro_batches, virtual
    totals = [s.total if isinstance(s, StagePhases) else float(s) for s in stages]
    slowest = max(range(p), key=totals.__getitem__)
    if schedule == "interleaved":
        transfer = stages[slowest].transfer if isinstance(stages[slowest], StagePhases) else 0.0
        seconds = (m + (p - 1) / v) * totals[slowest] + (v - 1) * m * transfer
    elif schedule == "dualpipev":
        s = stages[slowest]
        if not isinstance(s, StagePhases):
            raise ValueError("dualpipev is priced from each stage's phases, not its total")
        seconds = dualpipev_pipeline_seconds(
            p, m, s.forward + s.forward_communication,
            s.recompute + s.backward + s.backward_communication, s.backward, s.transfer)
    elif schedule_info(schedule).chunks == 1:
        seconds = one_chunk_seconds(totals, m)
    else:
        raise ValueError(f"no pipeline time for schedule {schedule!r}; the planner prices "
                         f"{', '.join(SCHEDULES)}")
    # The fill and drain cannot be negative; one stage's pipeline leaves a rounding residue
    # of the sum above (printed as a bubble of -0.000 s).
    return PipelineTime(seconds, max(0.0, seconds - m * totals[slowest]), slowest)


Interval = tuple[Action, float, float]
"""An action and when it starts and ends."""


@dataclass(frozen=True)
class Timeline:
    """When each rank ran each of its actions, and how long the pipeline took."""

    intervals: list[list[Interval]]
    """Per rank, its actions in the order it ran them, with their start and end."""
    makespan: float
    """When the last rank finishes."""
    idle: list[float]
    """Per rank, the seconds of [0, makespan] it waits (its bubble)."""

    def gaps(self, rank: int) -> list[tuple[float, float]]:
        """The (start, end) of each of `rank`'s waits in [0, makespan]."""
        out, t = [], 0
        for _, start, end in self.intervals[rank]:
            if start > t:
                out.append((t, start))
            t = end
        if self.makespan > t:
            out.append((t, self.makespan))
        return out


def simulate(actions_per_rank: list[list[Action]], seconds: Callable[[Action], float],
             p2p_s: float = 0) -> Timeline:
    """Run every rank's actions in their order, each as soon as its rank is free and its
    input is there: a forward of stage s after stage s - 1's forward of the micro-batch,
    a backward (B or I) of stage s after stage s + 1's (the last stage's after its own
    forward), a W after its own I. An input from another rank arrives `p2p_s` after it
    is made. `seconds` gives each action's duration. An action overlapped with the one
    before it (DualPipeV's F&B) runs right after it, and the pair starts once both
    inputs are there, as DualPipe's `_forward_backward_chunk` receives both before it
    computes (deepseek-ai/DualPipe, dualpipe/dualpipev.py); together they last the sum
    of their `seconds`, as torch runs OVERLAP_F_B's two without an overlap function."""
    rank_of = {a.stage: rank for rank, actions in enumerate(actions_per_rank) for a in actions}
    last = max(rank_of, default=0)
    done: dict[tuple[str, int, int], float] = {}  # ("F" or "B" or "I", stage, mb) -> end
    intervals: list[list[Interval]] = [[] for _ in actions_per_rank]
    # Times start at int 0, so that Fraction durations give exact times.
    position, free = [0] * len(actions_per_rank), [0] * len(actions_per_rank)
    remaining = sum(map(len, actions_per_rank))
    while remaining:
        progressed = False
        for rank, actions in enumerate(actions_per_rank):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                ready = _ready(action, last, rank_of, done, p2p_s)
                after = actions[position[rank] + 1] if position[rank] + 1 < len(actions) \
                    else None
                if ready is not None and after is not None and after.overlap:
                    # The pair waits for the second's input too (unless the first makes it).
                    made = ("I" if action.kind == "B" else action.kind, action.stage,
                            action.micro_batch)
                    if _need(after, last) != made:
                        also = _ready(after, last, rank_of, done, p2p_s)
                        ready = None if also is None else max(ready, also)
                if ready is None:
                    break  # its input comes from a rank that has not made it yet
                start = max(free[rank], ready)
                free[rank] = start + seconds(action)
                intervals[rank].append((action, start, free[rank]))
                # A full backward makes what an I would: the previous stage's input.
                kind = "I" if action.kind == "B" else action.kind
                done[kind, action.stage, action.micro_batch] = free[rank]
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = [str(actions[i]) for actions, i in zip(actions_per_rank, position)
                       if i < len(actions)]
            raise ValueError(f"the schedule deadlocks: every rank waits ({', '.join(waiting)})")
    makespan = max(free, default=0)
    idle = [makespan - sum(end - start for _, start, end in rank) for rank in intervals]
    return Timeline(intervals, makespan, idle)


def _ready(action: Action, last: int, rank_of: dict[int, int],
           done: dict[tuple[str, int, int], float], p2p_s: float) -> float | None:
    """When `action`'s input is there, or None while it is not made yet."""
    need = _need(action, last)
    if need is None:
        return 0
    if need not in done:
        return None
    here = rank_of[action.stage]
    crossing = rank_of.get(need[1], here) != here
    return done[need] + p2p_s if crossing else done[need]


def _need(action: Action, last: int) -> tuple[str, int, int] | None:
    """What `action` waits for, as `simulate` records it: ("F" or "I", stage, micro-batch),
    or None (the first stage's forwards)."""
    s, j = action.stage, action.micro_batch
    if action.kind == "F":
        return ("F", s - 1, j) if s > 0 else None
    if action.kind == "W":
        return ("I", s, j)
    return ("I", s + 1, j) if s < last else ("F", s, j)
