"""cost_models.pipeline_schedule: each rank's actions equal the order torch 2.13's own
schedules run (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV); their simulated
pipelines last what the papers' formulas say; and the closed forms the rest of Tessel
reads (`in_flight`, `pipeline_time`) equal the walk of the actions and their simulation
over grids of stages, micro-batches, chunks and schedules, under the conditions they
state."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from fractions import Fraction
from typing import Callable

import pytest
import torch
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from cost_models.pipeline_schedule import (
    Action,
    StagePhases,
    dualpipev_bubble,
    eager_last_stage,
    in_flight,
    one_chunk_seconds,
    paced_micro_batches,
    peak_in_flight,
    pipeline_time,
    rank_actions,
    schedule_actions,
    simulate,
    simulate_stages,
    torch_strings,
)
from planner.vocabulary.schedules import LAID_OUT, SCHEDULES

COMPUTE = ("F", "B", "I", "W")


class _Stage(_PipelineStageBase):
    """A pipeline stage with no module, process group or buffers: torch's schedules read
    its index and group, and a single-stage schedule's run calls it once per forward and
    backward, which it records (as torch's own schedule tests mock a stage)."""

    def __init__(self, index: int, num_stages: int, group_size: int, group_rank: int):
        self.stage_index, self.num_stages = index, num_stages
        self.group_size, self.group_rank, self.group = group_size, group_rank, None
        self.submod = torch.nn.Identity()
        self.calls: list[str] = []

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def forward_one_chunk(self, micro_batch: int, *args, **kwargs) -> None:
        self.calls.append(f"{self.stage_index}F{micro_batch}")

    def backward_one_chunk(self, micro_batch: int, *args, **kwargs) -> None:
        self.calls.append(f"{self.stage_index}B{micro_batch}")

    # Nothing to send or receive: the order is what is recorded.
    def get_fwd_recv_ops(self, micro_batch: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, *args) -> None:
        pass

    def _prepare_forward_infra(self, *args, **kwargs) -> None:
        pass

    def _prepare_backward_infra(self, *args, **kwargs) -> None:
        pass

    def _create_grad_recv_info(self, *args, **kwargs) -> None:
        pass


def torch_single_stage_order(schedule: type, p: int, rank: int, m: int) -> list[str]:
    """The forwards and backwards torch's single-stage `schedule` runs on `rank`, recorded
    from its own `_step_microbatches`. (Its `pipeline_order` is a picture of that order;
    torch 2.13's Schedule1F1B draws the last rank's forwards one micro-batch late, 3F1 ...
    3F6 for 6 micro-batches, so the run is what is compared.)"""
    stage = _Stage(rank, p, p, rank)
    run = schedule(stage, m)
    run._initialize_stage = lambda *args, **kwargs: None  # shapes and buffers: none needed
    run._step_microbatches([()] * m, [{}] * m)
    return stage.calls


def torch_multi_stage_order(schedule: type, p: int, m: int, stages: list[int]) -> list[list[str]]:
    """Each rank's compute actions of torch's multi-stage `schedule` with `stages` on rank
    0: its `pipeline_order` without the idle slots, checked to be the compute order of
    the program with sends and receives that `_PipelineScheduleRuntime` runs."""
    run = schedule([_Stage(s, len(stages) * p, p, 0) for s in stages], m)
    order = [[str(a) for a in run.pipeline_order[r] if a is not None] for r in range(p)]
    lowered = [[str(a) for a in run.pipeline_order_with_comms[r]
                if a.computation_type in COMPUTE] for r in range(p)]
    assert lowered == order
    return order


def ours(schedule: str, p: int, m: int, v: int = 1) -> list[list[str]]:
    return [[str(a) for a in rank] for rank in schedule_actions(schedule, p, m, v)]


# -- the orders are torch's --------------------------------------------------------------


@pytest.mark.parametrize(("name", "schedule"), [("gpipe", ScheduleGPipe),
                                                ("1f1b", Schedule1F1B)])
def test_single_stage_schedules_run_as_torch_runs_them(name: str, schedule: type) -> None:
    for p in range(1, 6):
        for m in range(p if name == "1f1b" else 1, 11):  # torch's 1F1B asks m >= p
            expected = [torch_single_stage_order(schedule, p, r, m) for r in range(p)]
            assert ours(name, p, m) == expected, (p, m)


def test_interleaved_1f1b_is_torch_s_order() -> None:
    for p in range(1, 6):
        for v in (2, 3, 4):
            for m in range(1, 13):
                stages = [k * p for k in range(v)]  # rank 0: stages 0, p, 2p, ...
                try:
                    expected = torch_multi_stage_order(ScheduleInterleaved1F1B, p, m, stages)
                except ValueError:  # m does not split into equal rounds
                    with pytest.raises(ValueError, match="rounds"):
                        schedule_actions("interleaved", p, m, v)
                    continue
                assert ours("interleaved", p, m, v) == expected, (p, v, m)


def test_zbv_is_torch_s_order() -> None:
    for p in range(1, 6):
        for m in range(1, 13):
            expected = torch_multi_stage_order(ScheduleZBVZeroBubble, p, m, [0, 2 * p - 1])
            assert ours("zbv", p, m, 2) == expected, (p, m)


def test_dualpipev_is_torch_s_order() -> None:
    # Torch builds DualPipeV's order for all ranks from stages alone (no process group):
    # compared as it prints it, each overlapped forward and backward as one
    # (F;B)OVERLAP_F_B, and as the program with sends and receives it runs.
    for p in range(1, 6):
        for m in range(2 * p, 2 * p + 7):
            run = ScheduleDualPipeV([_Stage(0, 2 * p, p, 0), _Stage(2 * p - 1, 2 * p, p, 0)], m)
            expected = [[str(a) for a in run.pipeline_order[r] if a is not None]
                        for r in range(p)]
            lowered = [[str(a) for a in run.pipeline_order_with_comms[r] if a.is_compute_op]
                       for r in range(p)]
            assert lowered == expected
            got = [torch_strings(actions) for actions in schedule_actions("dualpipev", p, m, 2)]
            assert got == expected, (p, m)
    # Rank 0 of 2, 4 micro-batches, step by step (ScheduleDualPipeV's steps 1-8).
    assert torch_strings(rank_actions("dualpipev", 2, 0, 4, 2)) == [
        "0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "(0F3;3B1)OVERLAP_F_B",
        "(3F2;0B0)OVERLAP_F_B", "3B2", "(3F3;0B1)OVERLAP_F_B", "3B3", "0I2", "0W2", "0I3",
        "0W3"]


def test_dualpipev_refuses_what_torch_refuses() -> None:
    with pytest.raises(ValueError, match="at least as many microbatches"):
        ScheduleDualPipeV([_Stage(0, 6, 3, 0), _Stage(5, 6, 3, 0)], 5)
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        schedule_actions("dualpipev", 3, 5, 2)
    with pytest.raises(ValueError, match="virtual must be 2"):
        schedule_actions("dualpipev", 3, 6, 1)
    with pytest.raises(ValueError, match="virtual must be 2"):
        in_flight("dualpipev", 3, 0, 6, 1)


def test_one_chunk_interleaved_is_1f1b_as_megatron_runs_it() -> None:
    assert ours("interleaved", 4, 8, 1) == ours("1f1b", 4, 8)


def test_actions_write_and_read_as_torch_s() -> None:
    assert str(Action(2, "F", 0)) == "2F0" and repr(Action(13, "W", 7)) == "13W7"
    for text in ("2F0", "0B11", "5I3", "12W0"):
        assert str(Action.parse(text)) == text
    assert Action.parse(" 3I2 ") == Action(3, "I", 2)
    for text in ("F0", "2X0", "2F", "1UNSHARD", "2F0;"):
        with pytest.raises(ValueError, match="not an action"):
            Action.parse(text)


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule_actions("zigzag", 2, 4)
    with pytest.raises(ValueError, match="interleaved"):
        schedule_actions("1f1b", 2, 4, virtual=2)
    with pytest.raises(ValueError, match="virtual must be 2"):
        schedule_actions("zbv", 2, 4)
    with pytest.raises(ValueError, match=">= 1"):
        schedule_actions("gpipe", 2, 0)
    with pytest.raises(ValueError, match="rank"):
        rank_actions("gpipe", 2, 2, 4)


def test_the_module_does_not_import_torch() -> None:
    # cost_models imports only planner's vocabulary: a search never loads torch for it.
    code = "import sys, cost_models.pipeline_schedule; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- micro-batches in flight -------------------------------------------------------------


def walked(schedule: str, p: int, r: int, m: int, v: int, eager_last: bool) -> float:
    """What `in_flight` stands for: the peak of the rank's actions, over its chunks."""
    actions = rank_actions(schedule, p, r, m, v)
    if eager_last:
        actions = eager_last_stage(actions, p * v)
    return peak_in_flight(actions) / v


@pytest.mark.parametrize("schedule", LAID_OUT)
def test_in_flight_is_the_walk_of_the_actions(schedule: str) -> None:
    # Every closed form `in_flight` answers from, against the walk it stands for: every
    # rank, micro-batch count and chunk count the schedule runs, eager last stage or not.
    chunks = {"interleaved": (1, 2, 3, 4), "zbv": (2,), "dualpipev": (2,)}.get(schedule, (1,))
    checked = 0
    for p, v, eager in itertools.product(range(1, 7), chunks, (False, True)):
        for m in range(1, 4 * p + 3):
            for r in range(p):
                try:
                    expected = walked(schedule, p, r, m, v, eager)
                except ValueError:  # a count the schedule refuses: so does in_flight
                    with pytest.raises(ValueError):
                        in_flight(schedule, p, r, m, v, eager)
                    continue
                assert in_flight(schedule, p, r, m, v, eager) == expected, (p, r, m, v, eager)
                checked += 1
    assert checked > 100


def test_1f1b_first_stage_holds_p_last_holds_one() -> None:
    p, m = 8, 64
    assert [in_flight("1f1b", p, i, m) for i in range(p)] == [8, 7, 6, 5, 4, 3, 2, 1]
    # Fewer micro-batches than stages: nobody holds more than m.
    assert in_flight("1f1b", p, 0, 3) == 3


def test_gpipe_holds_every_micro_batch_but_on_an_eager_last_stage() -> None:
    assert [in_flight("gpipe", 4, i, 32) for i in range(4)] == [32] * 4
    assert [in_flight("gpipe", 4, i, 32, eager_last=True) for i in range(4)] == [32] * 3 + [1]


def test_interleaved_holds_megatron_s_factor() -> None:
    # Korthikanti et al. Sec. 4 (Megatron-LM's theoretical_memory_usage.py): the first rank
    # holds p (1 + (p - 1) / (p v)) micro-batches.
    p, v, m = 4, 2, 64
    assert in_flight("interleaved", p, 0, m, v) == p * (1 + (p - 1) / (p * v)) == 5.5
    # Last rank: (v - 1) p = 4 chunk-micro-batches of warm-up, then 5 halves.
    assert in_flight("interleaved", p, p - 1, m, v) == 2.5
    # Capped by the m v chunk-micro-batches that exist.
    assert in_flight("interleaved", p, 0, 4, v) == 4
    # One chunk per rank is plain 1F1B.
    assert in_flight("interleaved", p, 1, m) == in_flight("1f1b", p, 1, m)


def test_interleaving_rounds_of_more_than_p_hold_more() -> None:
    # 6 micro-batches on 4 ranks: torch runs one round of 6, and rank 0 runs all 12 of
    # its chunk-forwards before its first backward. Megatron-LM's warm-up for rounds of p
    # would say 5.5; in_flight walks the actions where p does not divide m.
    assert in_flight("interleaved", 4, 0, 6, 2) == 6


def test_in_flight_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zero_bubble'"):
        in_flight("zero_bubble", 4, 0, 8)
    with pytest.raises(ValueError, match="rank"):
        in_flight("1f1b", 4, 4, 8)
    with pytest.raises(ValueError, match="interleaved"):
        in_flight("1f1b", 4, 0, 8, 2)


def test_peak_in_flight_weighs_each_stage() -> None:
    actions = rank_actions("interleaved", 2, 0, 4, 2)  # stages 0 and 2
    # 0F0 0F1 2F0 2F1 0F2 2B0 0F3 ...: five at once, then four of stage 0 and one of 2.
    assert peak_in_flight(actions) == 5
    assert peak_in_flight(actions, {0: 3.0, 2: 1.0}) == 4 * 3 + 1
    assert peak_in_flight(actions, lambda stage: 2.0) == 10
    # Split backward: a stage's activations go at its W, not its I.
    assert peak_in_flight([Action(0, "F", 0), Action(0, "I", 0), Action(0, "F", 1),
                           Action(0, "W", 0), Action(0, "I", 1), Action(0, "W", 1)]) == 2


def test_an_eager_last_stage_holds_one_micro_batch() -> None:
    gpipe = schedule_actions("gpipe", 3, 4)
    eager = [eager_last_stage(actions, 3) for actions in gpipe]
    assert eager[:2] == gpipe[:2]  # the other stages run as torch's GPipe
    assert [str(a) for a in eager[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]
    assert [peak_in_flight(actions) for actions in eager] == [4, 4, 1]
    # 1F1B's last stage already runs each backward at once.
    assert [eager_last_stage(a, 3) for a in schedule_actions("1f1b", 3, 4)] == \
        schedule_actions("1f1b", 3, 4)
    # A split backward moves whole: ZB-V's last stage (2 p - 1) is rank 0's second.
    rank_0 = eager_last_stage(rank_actions("zbv", 2, 0, 3, 2), 4)
    assert [str(a) for a in rank_0 if a.stage == 3] == \
        ["3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "3F2", "3I2", "3W2"]
    assert sorted(map(str, rank_0)) == sorted(map(str, rank_actions("zbv", 2, 0, 3, 2)))


def test_zbv_holds_what_1f1b_s_first_stage_holds() -> None:
    # Qi et al. Sec. 6: ZB-V's peak is p micro-batches, as 1F1B's first stage.
    for p in range(1, 6):
        for m in range(2 * p - 1, 2 * p + 4):
            assert [in_flight("zbv", p, r, m, 2) for r in range(p)] == [p] * p


def test_dualpipev_holds_pp_plus_one_chunks_on_every_rank() -> None:
    # DualPipe's README: DualPipeV's "Activation Per Device" is PP + 1 (PP = 2 p stages),
    # each chunk half a rank's layers.
    for p in range(1, 7):
        for m in range(2 * p, 2 * p + 5):
            for r in range(p):
                actions = rank_actions("dualpipev", p, r, m, 2)
                assert peak_in_flight(actions) == 2 * p + 1, (p, r, m)
                assert in_flight("dualpipev", p, r, m, 2) == p + 0.5


# -- pipeline time -----------------------------------------------------------------------


def uniform(f: Fraction, b: Fraction) -> Callable[[Action], Fraction]:
    return lambda action: f if action.kind == "F" else b


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_fill_and_drain_last_m_plus_p_minus_1_stages(schedule: str) -> None:
    f, b = 1, 2
    for p in range(1, 6):
        for m in range(1, 10):
            timeline = simulate(schedule_actions(schedule, p, m), uniform(f, b))
            assert timeline.makespan == (m + p - 1) * (f + b)
            assert timeline.idle == [(p - 1) * (f + b)] * p


def test_interleaving_shrinks_the_bubble_v_times() -> None:
    # Narayanan et al. Sec. 2.2.2: v chunks of f / v and b / v last (m + (p - 1) / v)
    # (f + b), exactly, for every m >= p torch accepts.
    f, b = Fraction(1), Fraction(2)
    for p in range(1, 6):
        for v in (2, 3, 4):
            for m in range(p, 17):
                try:
                    actions = schedule_actions("interleaved", p, m, v)
                except ValueError:
                    continue
                timeline = simulate(actions, uniform(f / v, b / v))
                assert timeline.makespan == (m + Fraction(p - 1, v)) * (f + b), (p, v, m)
    # Fewer micro-batches than ranks: one round of m, a longer fill.
    assert simulate(schedule_actions("interleaved", 4, 2, 2),
                    uniform(f / 2, b / 2)).makespan == Fraction(27, 2)


def test_zbv_leaves_a_sixth_of_1f1b_s_bubble() -> None:
    # Every action one unit (T_F = T_B = T_W, where Qi et al. call ZB-V bubble-free):
    # each rank waits only p - 1 units for the V to fill; 1F1B over the same two chunks
    # per rank (f = 2, b = 4) waits 6 (p - 1).
    for p in range(1, 6):
        for m in range(2 * p - 1, 2 * p + 4):
            timeline = simulate(schedule_actions("zbv", p, m, 2), lambda action: 1)
            assert timeline.makespan == 6 * m + p - 1
            assert timeline.idle == [p - 1] * p


def test_transfers_delay_each_crossing() -> None:
    # GPipe's critical path crosses p - 1 boundaries each way.
    c = Fraction(1, 10)
    for p in range(1, 5):
        for m in range(1, 6):
            timeline = simulate(schedule_actions("gpipe", p, m), uniform(1, 2), p2p_s=c)
            assert timeline.makespan == (m + p - 1) * 3 + 2 * (p - 1) * c
    # Stages on one rank send nothing: one rank's interleaved chunks wait on nobody.
    alone = simulate(schedule_actions("interleaved", 1, 3, 2), uniform(1, 2), p2p_s=c)
    assert alone.makespan == 3 * 2 * 3 and alone.idle == [0]


def test_every_action_waits_for_its_input() -> None:
    actions = schedule_actions("zbv", 3, 6, 2)
    timeline = simulate(actions, lambda action: {"F": 1, "I": 2, "W": 1}[action.kind])
    ends = {str(a): end for rank in timeline.intervals for a, _, end in rank}
    last = 5
    for rank in timeline.intervals:
        for a, start, end in rank:
            if a.kind == "F" and a.stage > 0:
                assert start >= ends[f"{a.stage - 1}F{a.micro_batch}"]
            if a.kind == "I":
                before = f"{a.stage + 1}I" if a.stage < last else f"{a.stage}F"
                assert start >= ends[f"{before}{a.micro_batch}"]
            if a.kind == "W":
                assert start >= ends[f"{a.stage}I{a.micro_batch}"]
        gaps = timeline.gaps(timeline.intervals.index(rank))
        busy = sum(end - start for _, start, end in rank)
        assert sum(end - start for start, end in gaps) + busy == timeline.makespan


def test_an_order_that_waits_on_itself_is_refused() -> None:
    # Rank 0 runs stage 0's backward before stage 1 (rank 1) can have made its input,
    # and rank 1 waits for a forward rank 0 has not run.
    actions = [[Action(0, "B", 0), Action(0, "F", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(actions, lambda action: 1)


def durations(f, b, w) -> Callable[[Action], Fraction]:
    """A chunk's forward f, full backward b, and its split: I = b - w, W = w."""
    return lambda action: {"F": f, "B": b, "I": b - w, "W": w}[action.kind]


def test_dualpipev_waits_the_report_s_bubble() -> None:
    # DeepSeek-V3 report Table 2 / DualPipe README: (PP/2 - 1)(F&B + B - 3W) per rank, PP =
    # 2 p stages; F&B = F + B as torch runs the pair. Exact where I = B - W equals F, as in
    # the report's figure: e.g. the kernel model's matmuls (B = 2F, W = F).
    for p in range(1, 6):
        for m in range(2 * p, 2 * p + 4):
            for f, b, w in ((1, 2, 1), (2, 3, 1), (3, 5, 2), (1, 1, 0)):
                timeline = simulate(schedule_actions("dualpipev", p, m, 2), durations(f, b, w))
                bubble = dualpipev_bubble(p, f, b, w)
                assert bubble == (p - 1) * (f + 2 * b - 3 * w)
                assert timeline.idle == [bubble] * p, (p, m, f, b, w)
                assert timeline.makespan == 2 * m * (f + b) + bubble
    # A third of 1F1B's over the same two chunks per rank (F = 2, B = 4): 6 (p - 1).
    assert dualpipev_bubble(4, 1, 2, 1) == 6 == 6 * (4 - 1) / 3
    # An overlapped pair that runs faster than its two parts shrinks it.
    assert dualpipev_bubble(4, 1, 2, 1, forward_backward=2) == 3 * (2 + 2 - 3)
    # Where I is shorter than F the closed form is short of the schedule's own wait.
    timeline = simulate(schedule_actions("dualpipev", 3, 6, 2), durations(2, 3, 2))
    assert timeline.idle[0] > dualpipev_bubble(3, 2, 3, 2)


def test_an_overlapped_pair_starts_when_both_inputs_are_there() -> None:
    # Rank 0 of 2: (3F2;0B0) starts once 0B0's input (1B0, from rank 1) is there, not as
    # soon as 3F2's own (2F2) is; its backward follows its forward at once.
    timeline = simulate(schedule_actions("dualpipev", 2, 4, 2), durations(1, 2, 1))
    started = {str(a): start for rank in timeline.intervals for a, start, _ in rank}
    ended = {str(a): end for rank in timeline.intervals for a, _, end in rank}
    assert started["3F2"] == ended["1B0"] > ended["2F2"]
    assert started["0B0"] == ended["3F2"]


# -- the closed forms the step-time model reads (`pipeline_time`) ---------------------------


def phases(forward: float, backward: float, transfer: float = 0) -> StagePhases:
    """A stage whose forward action lasts `forward` and backward `backward`, each with its
    half of `transfer` (`action_parts`)."""
    return StagePhases(forward=forward - transfer / 2, backward=backward - transfer / 2,
                       transfer=transfer)


def uneven(rng: random.Random, p: int, ratio: int, transfer: int) -> list[StagePhases]:
    """p stages of random forwards, each backward `ratio` x its forward (transfers in)."""
    return [phases(f, ratio * f, transfer) for f in
            (rng.randint(1 + transfer, 9 + transfer) for _ in range(p))]


def one_chunk_grid() -> list[tuple[list[StagePhases], int]]:
    rng = random.Random(41)
    return [(uneven(rng, p, rng.randint(1, 3), rng.choice((0, 2))), m)
            for p in range(1, 6) for m in range(1, 11) for _ in range(6)]


def test_one_chunk_pipelines_last_the_sum_and_m_minus_1_slowest() -> None:
    # GPipe: exactly the closed form wherever each stage's backward is the same multiple
    # of its forward; 1F1B (and GPipe with an eager last stage, as Tessel's graph runtime
    # runs it) where besides the last stage is the slowest. Otherwise the closed form is
    # above the schedule: a middle stage's neighbours fill some of the slots it paces.
    exact = {"gpipe": 0, "1f1b": 0, "eager": 0}
    for stages, m in one_chunk_grid():
        p, totals = len(stages), [s.total for s in stages]
        closed = pipeline_time("1f1b", stages, m).seconds
        assert closed == pipeline_time("gpipe", stages, m).seconds == \
            one_chunk_seconds(totals, m) == sum(totals) + paced_micro_batches(m) * max(totals)
        assert simulate_stages("gpipe", stages, m).makespan == closed
        eager = [eager_last_stage(actions, p) for actions in schedule_actions("gpipe", p, m)]
        runs = {"1f1b": simulate_stages("1f1b", stages, m).makespan,
                "eager": simulate(eager, lambda a: {"F": stages[a.stage].forward,
                                                    "B": stages[a.stage].backward}[a.kind]
                                  + stages[a.stage].transfer / 2).makespan}
        for name, makespan in runs.items():
            if totals[-1] == max(totals):
                assert makespan == closed, (name, totals, m)
                exact[name] += 1
            else:
                assert makespan <= closed, (name, totals, m)
        exact["gpipe"] += 1
    assert min(exact.values()) > 50


def test_the_bubble_is_what_the_slowest_stage_does_not_fill() -> None:
    stages = [phases(2, 4), phases(3, 6), phases(2, 4)]
    time = pipeline_time("1f1b", stages, 8)
    assert time.seconds == 6 + 9 + 6 + 7 * 9
    assert time.bubble == time.seconds - 8 * 9 == 12
    # The stage DP weighs its slowest stage with the same m - 1.
    assert paced_micro_batches(8) == 7


def test_interleaved_equal_stages_last_m_plus_p_minus_1_over_v() -> None:
    # Narayanan et al. Sec. 2.2.2, exact for equal stages without transfers for every
    # m >= p that torch's rounds take; unequal stages are each paced by the slowest, so
    # the closed form is above the schedule; each chunk's transfer in the fill is left
    # out, at most (p - 1)(v - 1) / v transfers.
    rng = random.Random(2)
    checked = 0
    for p, v in itertools.product(range(1, 6), (1, 2, 3, 4)):
        for m in range(p, 3 * p + 2):
            try:
                schedule_actions("interleaved", p, m, v)
            except ValueError:
                continue
            equal = [StagePhases(Fraction(3), Fraction(5), recompute=Fraction(1))] * p
            closed = pipeline_time("interleaved", equal, m, v).seconds
            assert closed == pytest.approx((m + (p - 1) / v) * 9, rel=1e-12)
            assert simulate_stages("interleaved", equal, m, v).makespan == \
                pytest.approx(closed, rel=1e-12), (p, v, m)
            unequal = uneven(rng, p, 2, 0)
            assert simulate_stages("interleaved", unequal, m, v).makespan <= \
                pipeline_time("interleaved", unequal, m, v).seconds * (1 + 1e-12)
            c = Fraction(1, 2)
            sent = [phases(Fraction(3), Fraction(6), c)] * p
            closed = pipeline_time("interleaved", sent, m, v).seconds
            assert closed == pytest.approx((m + (p - 1) / v) * 9 + (v - 1) * m * c)
            makespan = simulate_stages("interleaved", sent, m, v).makespan
            assert closed * (1 - 1e-12) <= makespan
            assert makespan <= (closed + (p - 1) * (v - 1) / v * c) * (1 + 1e-12)
            checked += 1
    assert checked > 60


def test_dualpipev_lasts_the_report_s_closed_form() -> None:
    # DeepSeek-V3 Table 2's (PP / 2 - 1)(F&B + B - 3 W) over 2 m (F + B), per chunk of the
    # stages' phases (`dualpipev_chunk`), exact for equal stages whose chunks' I (B - W)
    # lasts as long as their F: here forward 2a and backward 4a give F = I = a (the
    # kernel model's matmuls), with as much exposed communication each way.
    for p, m, a, comm, transfer in itertools.product(range(1, 6), range(0, 5), (1, 3),
                                                     (0, 1), (0, 2)):
        m += 2 * p
        stages = [StagePhases(forward=2 * a, backward=4 * a, forward_communication=comm,
                              backward_communication=comm, transfer=transfer)] * p
        f, b, w = a + (comm + transfer) / 2, 2 * a + (comm + transfer) / 2, a
        time = pipeline_time("dualpipev", stages, m, 2)
        assert time.seconds == 2 * m * (f + b) + dualpipev_bubble(p, f, b, w)
        run = simulate_stages("dualpipev", stages, m, 2)
        assert run.makespan == pytest.approx(time.seconds, rel=1e-12), (p, m, a, comm)
        assert run.idle == pytest.approx([dualpipev_bubble(p, f, b, w)] * p)
        # Unequal stages of that kind: each is priced as the slowest, above the schedule.
        unequal = [StagePhases(forward=2 * k, backward=4 * k, forward_communication=comm,
                               backward_communication=comm, transfer=transfer)
                   for k in random.Random(p * m).sample(range(a, a + p), p)]
        assert simulate_stages("dualpipev", unequal, m, 2).makespan <= \
            pipeline_time("dualpipev", unequal, m, 2).seconds * (1 + 1e-12)


def test_pipeline_time_takes_totals_where_the_schedule_needs_no_more() -> None:
    stages = [phases(2, 4, 2), phases(3, 6, 2)]
    totals = [s.total for s in stages]
    for schedule in ("gpipe", "1f1b"):
        assert pipeline_time(schedule, totals, 5) == pipeline_time(schedule, stages, 5)
    with pytest.raises(ValueError, match="phases"):
        pipeline_time("dualpipev", totals, 8, 2)
    with pytest.raises(ValueError, match=", ".join(SCHEDULES)):
        pipeline_time("zbv", stages, 8, 2)


def test_the_closed_forms_answer_without_walking() -> None:
    # The searches ask these for every candidate: O(1), no actions laid out.
    from cost_models.pipeline_schedule import _walked_in_flight

    before = _walked_in_flight.cache_info().misses
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 4),
                        ("dualpipev", 2)):
        for r in range(0, 64, 7):
            in_flight(schedule, 64, r, 4096, v)
    assert _walked_in_flight.cache_info().misses == before
