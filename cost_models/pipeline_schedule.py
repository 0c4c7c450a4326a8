"""A pipeline schedule as data: for each pipeline rank, the forward and backward actions
it runs, in the order it runs them (torch.distributed.pipelining's `_Action` lists).

Micro-batches in flight are read off these lists (`peak_in_flight` walks one rank's
actions), and so is pipeline time (`cost_models.pipeline_timing` runs every rank's actions
against each other). The rest of Tessel reads them from these two modules only: `in_flight`
(the micro-batches a rank holds) answers in O(1) from closed forms, each of which
tests/cost_models/test_pipeline_schedule.py checks against the walk over a grid of ranks,
micro-batches and chunks; where no closed form holds, it walks the actions (cached).

The orders are torch 2.13's (`torch/distributed/pipelining/schedules.py`), action for
action; tests/cost_models/test_pipeline_schedule.py compares them with torch's own:

- gpipe: every forward, then every backward (Huang et al., "GPipe", NeurIPS 2019;
  `ScheduleGPipe`).
- 1f1b: PipeDream-Flush (Narayanan et al., "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", SC 2021, Sec. 2.2.1; `Schedule1F1B`): rank r runs
  min(m, p - r) forwards, then a backward and a forward in turn, then the backwards left.
- interleaved: Sec. 2.2.2 of the same paper (`ScheduleInterleaved1F1B`): rank r holds the
  v stages r, r + p, ..., r + (v - 1) p of p v, and takes micro-batches in rounds through
  each of them. With v = 1 it is 1f1b, as Megatron-LM runs it (torch's class would warm
  up with 2 (p - 1 - r) forwards instead).
- zbv: ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 6;
  `ScheduleZBVZeroBubble`): rank r holds stages r and 2 p - 1 - r (a V), and splits each
  backward into I (the inputs' gradient, which the previous stage waits for) and W (the
  weights' gradient, which fills the bubbles).
- dualpipev: DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437,
  Sec. 3.2.1, cut in half by Sea AI Lab; deepseek-ai/DualPipe `dualpipe/dualpipev.py`;
  `ScheduleDualPipeV`): the same V of stages r and 2 p - 1 - r; its steady state pairs a
  forward of one chunk with a backward of the other (torch's OVERLAP_F_B, written here as
  the forward followed by the backward with `overlap` set), and only the last half of its
  cool-down splits backwards into I and W.

Pure Python on plain numbers: no torch, nothing searched.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from collections.abc import Callable, Mapping

from planner.vocabulary.schedules import LAID_OUT, V_SHAPED, schedule_info

KINDS: tuple[str, ...] = ("F", "B", "I", "W")
"""Forward, full backward, backward for inputs, backward for weights (torch's letters)."""

_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")


@dataclass(frozen=True, slots=True, repr=False)
class Action:
    """One compute action of a pipeline rank: one kind of pass of one micro-batch through
    one (virtual) stage. Written as torch's `_Action` writes itself: `2F0`."""

    stage: int
    """The global (virtual) stage index, 0 for the first of all p v."""
    kind: str
    """One of KINDS."""
    micro_batch: int
    overlap: bool = False
    """Whether it runs overlapped with the action before it, a forward: torch's
    OVERLAP_F_B, DualPipe's `_forward_backward_chunk` (the pair starts once both inputs
    are there). str() leaves it out; `torch_strings` writes the pair as torch does."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"

    # Lists of actions print as torch prints them: ['0F0', '0F1', ...].
    __repr__ = __str__

    @staticmethod
    def parse(text: str) -> Action:
        """The action `text` writes (`2F0`, `5W3`): the inverse of str()."""
        match = _ACTION.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not an action such as 2F0 "
                             "(stage, one of F B I W, micro-batch)")
        return Action(int(match[1]), match[2], int(match[3]))


def stage_rank(stage: int, pipeline: int, schedule: str) -> int:
    """The pipeline rank that runs (virtual) `stage` of `pipeline` ranks: stage s on rank
    s mod p (GPipe, 1F1B, interleaved: Megatron-LM's and torch's loop order), or in V
    order for ZB-V and DualPipeV (rank s going down, 2 p - 1 - s coming back: torch's
    `generate_stage_to_rank_mapping(..., style="v")`)."""
    if schedule in V_SHAPED and stage >= pipeline:
        return 2 * pipeline - 1 - stage
    return stage % pipeline


def schedule_actions(schedule: str, pipeline: int, micro_batches: int,
                     virtual: int = 1) -> list[list[Action]]:
    """For each of `pipeline` ranks, the actions it runs, in order, for `micro_batches`
    micro-batches under `schedule` (one of `planner.vocabulary.schedules.LAID_OUT`;
    `virtual` stages per rank for the interleaved schedule, 2 for zbv and dualpipev).
    Sources in the module's docstring."""
    return [rank_actions(schedule, pipeline, rank, micro_batches, virtual)
            for rank in range(pipeline)]


def rank_actions(schedule: str, pipeline: int, rank: int, micro_batches: int,
                 virtual: int = 1) -> list[Action]:
    """The actions of one rank of `schedule_actions` (as torch computes one rank's,
    `_calculate_single_rank_operations`): what one rank needs, without the others'."""
    p, r, m, v = pipeline, rank, micro_batches, virtual
    _check(schedule, p, r, m, v)
    if schedule == "gpipe":
        return [Action(r, "F", j) for j in range(m)] + [Action(r, "B", j) for j in range(m)]
    if schedule == "zbv":
        return _zbv(p, r, m)
    if schedule == "dualpipev":
        return _dualpipev(p, r, m)
    if v == 1:
        return _one_f_one_b(p, r, m)
    return _interleaved(p, r, m, v)


def _check(schedule: str, p: int, r: int, m: int, v: int) -> None:
    if schedule not in LAID_OUT:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; "
                         f"expected one of {', '.join(LAID_OUT)}")
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pipeline, micro-batches and virtual stages must be >= 1, "
                         f"got {p}, {m} and {v}")
    if not 0 <= r < p:
        raise ValueError(f"rank must be in [0, {p}), got {r}")
    chunks = schedule_info(schedule).chunks
    if chunks == 2 and v != 2:
        raise ValueError(f"{schedule} holds two stages per rank (a V): virtual must be 2, "
                         f"got {v}")
    if schedule == "dualpipev" and m < 2 * p:
        # torch's ScheduleDualPipeV: "DualPipeV requires at least as many microbatches as
        # stages".
        raise ValueError(f"dualpipev needs at least as many micro-batches as its 2 x {p} "
                         f"stages, got {m}")
    if chunks == 1 and v != 1:
        raise ValueError(f"{v} stages per rank need the interleaved schedule, not {schedule}")


def _one_f_one_b(p: int, r: int, m: int) -> list[Action]:
    """PipeDream-Flush as `Schedule1F1B._step_microbatches` runs it: the first backward's
    gradient comes back once every stage from r on holds a micro-batch, so r warms up
    with p - r forwards, then runs a backward and a forward in turn."""
    warmup = min(m, p - r)
    actions = [Action(r, "F", j) for j in range(warmup)]
    for j in range(m - warmup):
        actions += [Action(r, "B", j), Action(r, "F", warmup + j)]
    return actions + [Action(r, "B", j) for j in range(m - warmup, m)]


def _interleaved(p: int, r: int, m: int, v: int) -> list[Action]:
    """Interleaved 1F1B as `ScheduleInterleaved1F1B` lays it out (`_get_warmup_ops`,
    `_get_1f1b_rank_ops`): micro-batches go in rounds of m / max(1, m // p) through the
    rank's stages r, r + p, ... (backwards through them in reverse). Its warm-up is the
    last rank's (v - 1) rounds plus 2 for each rank after r, at most every forward."""
    rounds = max(1, m // p)
    if m % rounds:
        # Torch refuses these (a short last round would leave a rank waiting on itself);
        # Megatron-LM asks for m a multiple of p.
        raise ValueError(f"the interleaved schedule takes micro-batches in {rounds} rounds "
                         f"of equal size: {m} micro-batches do not split into them")
    per_round, total = m // rounds, m * v
    warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)

    def forward_stage(k: int) -> int:
        return (k // per_round) % v * p + r

    def backward_stage(k: int) -> int:
        return (v - 1 - (k // per_round) % v) * p + r

    forwards = _numbered("F", [forward_stage(k) for k in range(total)])
    backwards = _numbered("B", [backward_stage(k) for k in range(total)])
    actions = forwards[:warmup]
    for k in range(total - warmup):  # steady state: one forward, one backward
        actions += [forwards[warmup + k], backwards[k]]
    return actions + backwards[total - warmup:]


def _numbered(kind: str, stages: list[int]) -> list[Action]:
    """`kind` actions on `stages` in turn, each stage's micro-batches counted from 0."""
    seen: dict[int, int] = {}
    out = []
    for stage in stages:
        seen[stage] = seen.get(stage, -1) + 1
        out.append(Action(stage, kind, seen[stage]))
    return out


def _zbv(p: int, r: int, m: int) -> list[Action]:
    """ZB-V as `ScheduleZBVZeroBubble` lays it out: rank r holds stage r (going down the
    V) and 2 p - 1 - r (coming back up). It warms up the first with 2 (p - r) - 1
    forwards, alternates both stages' forwards r times, then runs the second stage's
    F I W p - r times; the steady state runs F I W on each stage in turn; the cool-down
    runs the inputs' gradients first (the previous rank waits for them) and the weights'
    after. Laid out as torch does for at least 2 p - 1 micro-batches, those past m
    dropped."""
    down, up = r, 2 * p - 1 - r
    n = max(2 * p - 1, m)
    count = {(stage, kind): 0 for stage in (down, up) for kind in "FIW"}
    actions: list[Action] = []

    def add(stage: int, kind: str, micro_batch: int | None = None) -> None:
        if micro_batch is None:  # the next of the stage's own count of that kind
            micro_batch = count[stage, kind]
            count[stage, kind] += 1
        actions.append(Action(stage, kind, micro_batch))

    for _ in range(2 * (p - r) - 1):
        add(down, "F")
    for _ in range(r):
        add(up, "F")
        add(down, "F")
    for _ in range(p - r):
        add(up, "F")
        add(up, "I")
        add(up, "W")
    while count[up, "F"] < count[down, "F"] or count[down, "F"] < n:
        if count[down, "F"] < n:
            add(down, "F")
        add(down, "I")
        add(down, "W")
        add(up, "F")
        add(up, "I")
        add(up, "W")
    for _ in range(r):
        add(down, "I")
        add(up, "I")
    for _ in range(p - r):
        add(down, "I")
        add(down, "W")
    for stage in (up, down):
        while count[stage, "W"] < count[stage, "I"]:
            add(stage, "W")
    return [a for a in actions if a.micro_batch < m]


def _dualpipev(p: int, r: int, m: int) -> list[Action]:
    """DualPipeV as `ScheduleDualPipeV._calculate_single_rank_operations` lays it out (its
    steps 1-8, from deepseek-ai/DualPipe's `DualPipeV.step`): rank r holds stage r (chunk
    0, down the V) and 2 p - 1 - r (chunk 1, back up).

    1. 2 (p - r - 1) forwards of chunk 0; 2. r + 1 pairs of forwards, chunk 0 then 1;
    3. p - r - 1 times chunk 1's I, a pending W, chunk 1's F (zero-bubble fill);
    4. m - 2 p + r + 1 times chunk 0's F with chunk 1's B, then chunk 1's F with chunk 0's
       B, each pair overlapped (the last rank runs its first pair apart);
    5. p - r - 1 times chunk 1's B, then chunk 1's F with chunk 0's B overlapped;
    6. r + 1 times chunk 1's then chunk 0's backward, split into I (W queued) from the
       middle on; 7. p - r - 1 times a pending W and chunk 0's backward; 8. the Ws left.

    A full backward B is counted as both an I and a W of its micro-batch."""
    down, up = r, 2 * p - 1 - r
    count: dict[tuple[int, str], int] = {}
    weights: list[tuple[int, int]] = []  # (stage, micro-batch) of Is whose W is pending
    actions: list[Action] = []

    def add(stage: int, kind: str, overlap: bool = False) -> None:
        j = count.get((stage, "I" if kind == "B" else kind), 0)
        actions.append(Action(stage, kind, j, overlap))
        if kind == "B":
            count[stage, "I"] = j + 1
            count[stage, "W"] = count.get((stage, "W"), 0) + 1
            return
        if kind == "I":
            weights.append((stage, j))
        count[stage, kind] = j + 1

    def pending_weight() -> None:
        if weights:
            stage, j = weights.pop(0)
            actions.append(Action(stage, "W", j))
            count[stage, "W"] = count.get((stage, "W"), 0) + 1

    def overlapped(forward: int, backward: int) -> None:
        add(forward, "F")
        add(backward, "B", overlap=True)

    for _ in range(2 * (p - r - 1)):  # 1
        add(down, "F")
    for _ in range(r + 1):  # 2
        add(down, "F")
        add(up, "F")
    for _ in range(p - r - 1):  # 3
        add(up, "I")
        pending_weight()
        add(up, "F")
    for i in range(m - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:  # "We don't overlap these two chunks"
            add(down, "F")
            add(up, "B")
        else:
            overlapped(down, up)
        overlapped(up, down)
    for _ in range(p - r - 1):  # 5
        add(up, "B")
        overlapped(up, down)
    split = False
    for i in range(r + 1):  # 6
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        add(up, "I" if split else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        add(down, "I" if split else "B")
    for _ in range(p - r - 1):  # 7
        pending_weight()
        add(down, "I" if split else "B")
    for _ in range(r + 1):  # 8
        pending_weight()
    return actions


def torch_strings(actions: list[Action]) -> list[str]:
    """`actions` as torch's `_Action`s print: each overlapped pair as one
    `(0F3;3B1)OVERLAP_F_B`."""
    out: list[str] = []
    for action in actions:
        if action.overlap:
            out[-1] = f"({out[-1]};{action})OVERLAP_F_B"
        else:
            out.append(str(action))
    return out


def eager_last_stage(actions: list[Action], num_stages: int) -> list[Action]:
    """`actions` with each backward of the last of `num_stages` stages run right after its
    forward. That backward needs nothing but its own forward, so running it at once
    delays no one and keeps one micro-batch there: Tessel's graph runtime
    (`runtime.graph_pipeline`) runs its last stage so under every schedule, where torch's
    ScheduleGPipe keeps all m."""
    last = num_stages - 1
    backward: dict[int, list[Action]] = {}  # micro-batch -> the last stage's B (or I, W)
    for action in actions:
        if action.stage == last and action.kind != "F":
            backward.setdefault(action.micro_batch, []).append(action)
    out = []
    for action in actions:
        if action.stage != last:
            out.append(action)
        elif action.kind == "F":
            out += [action, *backward.get(action.micro_batch, [])]
    return out


def peak_in_flight(actions: list[Action],
                   stage_bytes: Callable[[int], float] | Mapping[int, float] | None = None,
                   ) -> float:
    """The most activations one rank holds at once, walking its `actions`: a forward
    keeps its stage's `stage_bytes` (1 per stage by default: the answer is then in
    micro-batch-stages), a full backward frees them, and a split backward frees them at
    its W. (Its I could free what only the inputs' gradient reads and keep what W reads,
    each layer's input and output gradient; counting the whole stage until W is the
    simple, safe side.)"""
    size = _sizes(stage_bytes)
    held = peak = 0.0
    for action in actions:
        if action.kind == "F":
            held += size(action.stage)
            peak = max(peak, held)
        elif action.kind in ("B", "W"):
            held -= size(action.stage)
    return peak


def _sizes(stage_bytes: Callable[[int], float] | Mapping[int, float] | None,
           ) -> Callable[[int], float]:
    if stage_bytes is None:
        return lambda stage: 1.0
    if isinstance(stage_bytes, Mapping):
        return stage_bytes.__getitem__
    return stage_bytes


def in_flight(schedule: str, pipeline: int, rank: int, micro_batches: int,
              virtual: int = 1, eager_last: bool = False) -> float:
    """Micro-batches of activations `rank` of `pipeline` ranks holds at its peak under
    `schedule`, in units of one micro-batch through all the rank's layers (its `virtual`
    stages taken as equal shares of them): `peak_in_flight` of `rank_actions` over
    `virtual`. `eager_last`: the last stage runs each backward right after its forward
    (`eager_last_stage`, as Tessel's graph runtime runs it).

    O(1) where a closed form gives the walk's answer (the tests check each against the
    walk over ranks, micro-batches and chunks), else the walk, cached:

    - gpipe: every forward before any backward (Huang et al., GPipe, NeurIPS 2019): m;
      1 on an eager last stage.
    - 1f1b, and interleaved with one chunk per rank (PipeDream-Flush: Narayanan et al.,
      SC 2021, Sec. 2.2.1): min(p - r, m); the first rank holds p, the last 1.
    - interleaved (Sec. 2.2.2), v chunks per rank, p dividing m (Megatron-LM's rule): the
      warm-up of w = 2 (p - r - 1) + (v - 1) p chunk-micro-batches, then one more, each
      1/v of the rank: min(w + 1, m v) / v. For rank 0 that is p (1 + (p - 1) / (p v)),
      the factor Megatron-LM's theoretical_memory_usage.py applies (Korthikanti et al.,
      2022, Sec. 4). Where p does not divide m torch runs other rounds: walked.
    - dualpipev: PP + 1 chunk-micro-batches on every rank, PP = 2 p stages, each chunk
      half the rank: p + 1/2, for every m >= 2 p torch's ScheduleDualPipeV runs
      (deepseek-ai/DualPipe README, "Activation Per Device" of DualPipeV; DeepSeek-V3
      Technical Report Table 2 for DualPipe).

    Under GPipe and 1F1B a rank's order depends only on the ranks from it to the last, so
    rank 0 of a pipeline of k answers for any stage with k - 1 stages after it: what a
    stage DP that knows only the stages after a stage asks."""
    p, r, m, v = pipeline, rank, micro_batches, virtual
    _check(schedule, p, r, m, v)
    if schedule == "gpipe":
        return 1.0 if eager_last and r == p - 1 else float(m)
    if v == 1:  # 1F1B, or interleaved over one chunk (the V-shaped ones have two)
        return float(min(p - r, m))  # an eager last stage already runs 1F1B's way
    if not eager_last and schedule == "interleaved" and m % p == 0:
        warmup = 2 * (p - r - 1) + (v - 1) * p
        return min(warmup + 1, m * v) / v
    if not eager_last and schedule == "dualpipev":
        return p + 0.5
    return _walked_in_flight(schedule, p, r, m, v, eager_last)


@functools.lru_cache(maxsize=4096)
def _walked_in_flight(schedule: str, p: int, r: int, m: int, v: int, eager_last: bool
                      ) -> float:
    """`in_flight` by walking the rank's actions."""
    actions = rank_actions(schedule, p, r, m, v)
    if eager_last:
        actions = eager_last_stage(actions, p * v)
    return peak_in_flight(actions) / v
