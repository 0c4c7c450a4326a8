"""One optimizer step's pipeline schedule as bars on a (stage x time) chart.

A pure function from each stage's per-micro-batch phase times, the micro-batch count and
the schedule to the bars a timeline draws. Every stage runs its operations in the order
the engine issues them, each as soon as the stage is free and its input has arrived:

- gpipe: all forwards, then all backwards (`torch.distributed.pipelining.ScheduleGPipe`);
- 1f1b: stage i warms up with p - i - 1 forwards, then alternates one forward and one
  backward, and drains the backwards left (PipeDream-Flush, Narayanan et al. 2021);
- interleaved: each stage holds v model chunks and warms up with 2 (p - i - 1) + (v - 1) p
  chunk-forwards, micro-batches taken in groups of p per chunk (Megatron-LM's order; with
  m not a multiple of p, which Megatron-LM refuses, all forwards first); a chunk's work is
  taken as 1/v of the stage's (its transfers excepted: each chunk sends its own), so this
  one is approximate.

With equal stages the 1F1B and GPipe timelines last sum(stage times) + (m - 1) x slowest,
as does any pipeline whose last stage is its slowest, and the interleaved one (m + (p - 1)
/ v) x slowest (plus its chunks' extra transfers): the step-time model's formulas
(`cost_models/step_time.py`), which the tests check. Where a middle stage is the slowest,
the stages around it wait on each other in ways the formula does not count, and the two
differ a little.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")
BAR_KINDS = ("forward", "backward", "recompute", "communication", "bubble")
"""What a bar shows: a stage's forward or backward kernels, the forward it replays in
backward (activation recomputation), communication it waits on (tensor- and context-
parallel collectives, pipeline sends and receives), or idle time."""


@dataclass(frozen=True)
class StagePhases:
    """Seconds one pipeline stage spends on one micro-batch (all its chunks), by phase."""

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
    def total(self) -> float:
        """Seconds per micro-batch as the step-time model counts a stage (one transfer)."""
        return (self.forward + self.backward + self.recompute + self.forward_communication
                + self.backward_communication + self.transfer)

    def scaled(self, factor: float) -> StagePhases:
        """Every phase times `factor`."""
        return StagePhases(self.forward * factor, self.backward * factor,
                           self.recompute * factor, self.forward_communication * factor,
                           self.backward_communication * factor, self.transfer * factor)


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


# An operation of a stage's program: ("F" or "B", chunk, micro-batch).
Operation = tuple[str, int, int]


def pipeline_timeline(
    stages: list[StagePhases], num_micro_batches: int, schedule: str, virtual: int = 1,
) -> Timeline:
    """The bars of `num_micro_batches` micro-batches through `stages` under `schedule`
    (`virtual` chunks per stage for the interleaved one), bubbles included."""
    p, m, v = len(stages), num_micro_batches, virtual
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need stages, micro-batches and chunks >= 1, got {p}, {m} and {v}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if v > 1 and schedule != "interleaved":
        raise ValueError(f"{v} chunks per stage need the interleaved schedule, not {schedule}")
    programs = [_program(schedule, p, i, m, v) for i in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (F/B, virtual stage, micro-batch) -> end
    bars: list[Bar] = []
    position, free = [0] * p, [0.0] * p
    remaining = sum(len(program) for program in programs)
    while remaining:
        progressed = False
        for i in range(p):
            while position[i] < len(programs[i]):
                kind, chunk, micro = programs[i][position[i]]
                need = _dependency(kind, chunk * p + i, micro, p * v)
                if need is not None and need not in done:
                    break  # its input comes from a stage that has not run it yet
                start = max(free[i], done[need] if need is not None else 0.0)
                free[i] = _emit(bars, i, start, kind, chunk, micro, stages[i], v)
                done[kind, chunk * p + i, micro] = free[i]
                position[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # every stage waits on another: the program order is wrong
            raise RuntimeError(f"the {schedule} schedule deadlocked at {position}")
    length = max(free)
    return Timeline(bars + _bubbles(bars, p, length), length, p)


def _program(schedule: str, p: int, i: int, m: int, v: int) -> list[Operation]:
    """The operations stage `i` of `p` runs, in order."""
    if schedule == "gpipe":
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
    total = m * v
    if schedule == "1f1b":
        warmup = min(p - i - 1, m)
    elif m % p:
        # Megatron-LM interleaves only whole groups of p micro-batches; a short last group
        # would leave a stage waiting on itself, so such a step runs all forwards first.
        warmup = total
    else:
        warmup = min(2 * (p - i - 1) + (v - 1) * p, total)
    forwards = [("F", *_chunk_micro_batch(k, p, m, v, False)) for k in range(total)]
    backwards = [("B", *_chunk_micro_batch(k, p, m, v, True)) for k in range(total)]
    program = forwards[:warmup]
    for k in range(total - warmup):  # steady state: one forward, one backward
        program += [forwards[warmup + k], backwards[k]]
    return program + backwards[total - warmup:]


def _chunk_micro_batch(k: int, p: int, m: int, v: int, backward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of a stage's k-th forward (or backward): micro-batches go in
    groups of p (fewer in a last short group), each group through chunk 0, 1, ... (the
    backward through the chunks in reverse)."""
    group_start = (k // (p * v)) * p
    size = min(p, m - group_start)
    offset = k - group_start * v
    chunk = offset // size
    return (v - 1 - chunk if backward else chunk), group_start + offset % size


def _dependency(kind: str, virtual_stage: int, micro: int,
                num_virtual: int) -> tuple[str, int, int] | None:
    """The operation whose output this one consumes: the previous virtual stage's
    forward, the next one's backward, or (the last stage's backward) its own forward."""
    if kind == "F":
        return ("F", virtual_stage - 1, micro) if virtual_stage > 0 else None
    if virtual_stage < num_virtual - 1:
        return ("B", virtual_stage + 1, micro)
    return ("F", virtual_stage, micro)


def _emit(bars: list[Bar], stage: int, start: float, kind: str, chunk: int, micro: int,
          phases: StagePhases, v: int) -> float:
    """Append one operation's bars (its chunk's share of the stage's phases, 1/v, and
    its own transfer); return when it ends."""
    if kind == "F":
        parts = [("forward", phases.forward / v),
                 ("communication", phases.forward_communication / v + phases.transfer / 2)]
    else:
        # Recomputation replays the forward just before the backward that needs it.
        parts = [("recompute", phases.recompute / v), ("backward", phases.backward / v),
                 ("communication", phases.backward_communication / v + phases.transfer / 2)]
    t = start
    for name, seconds in parts:
        if seconds > 0:
            bars.append(Bar(stage, t, t + seconds, name, micro, chunk))
            t += seconds
    return t


def _bubbles(bars: list[Bar], p: int, length: float) -> list[Bar]:
    """Each stage's idle intervals in [0, length]: pipeline fill, waits and drain."""
    out = []
    for stage in range(p):
        t = 0.0
        for bar in sorted((b for b in bars if b.stage == stage), key=lambda b: b.start):
            if bar.start > t + 1e-12 * max(length, 1.0):
                out.append(Bar(stage, t, bar.start, "bubble"))
            t = max(t, bar.end)
        if length > t + 1e-12 * max(length, 1.0):
            out.append(Bar(stage, t, length, "bubble"))
    return out
