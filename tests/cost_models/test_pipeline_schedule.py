"""cost_models.pipeline_schedule: each rank's actions equal the order torch 2.13's own
schedules run (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV), and the closed
forms of `in_flight` equal the walk of the actions over grids of ranks, micro-batches and
chunks."""

from __future__ import annotations

import itertools
import subprocess
import sys

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
    eager_last_stage,
    in_flight,
    peak_in_flight,
    rank_actions,
    schedule_actions,
    torch_strings,
)
from planner.vocabulary.schedules import LAID_OUT

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


def test_the_closed_forms_answer_without_walking() -> None:
    # The searches ask these for every candidate: O(1), no actions laid out.
    from cost_models.pipeline_schedule import _walked_in_flight

    before = _walked_in_flight.cache_info().misses
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 4),
                        ("dualpipev", 2)):
        for r in range(0, 64, 7):
            in_flight(schedule, 64, r, 4096, v)
    assert _walked_in_flight.cache_info().misses == before
