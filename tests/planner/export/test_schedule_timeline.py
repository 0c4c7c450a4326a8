"""planner.export.schedule_timeline: the pipeline of one step laid out action by action
(`cost_models.pipeline_schedule`), against the step-time model's pipeline formulas; and
planner.export.stage_times, which reads each stage's phases from the Plan (as the
step-time model priced them) and gives back the plan's own times."""

from __future__ import annotations

import itertools

import pytest

from cost_models.pipeline_memory import StageLayout
from cost_models.pipeline_timing import (
    dualpipev_bubble,
    dualpipev_chunk,
    dualpipev_pipeline_seconds,
)
from planner.vocabulary.cluster import Cluster
from planner.export.schedule_timeline import Bar, StagePhases, Timeline, pipeline_timeline
from planner.export.stage_times import plan_pipeline_seconds, stage_times
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan

STAGE = StagePhases(forward=1.0, backward=2.0, recompute=0.5, forward_communication=0.25,
                    backward_communication=0.25)


def work(timeline: Timeline, stage: int, kind: str) -> list[Bar]:
    return [b for b in timeline.bars if b.stage == stage and b.kind == kind]


def operations(timeline: Timeline, stage: int) -> list[tuple[str, int, int]]:
    """The stage's forwards (F) and backwards (B) in the order it ran them."""
    heads = sorted((b for b in timeline.bars if b.stage == stage and b.kind in
                    ("forward", "backward")), key=lambda b: b.start)
    return [("F" if b.kind == "forward" else "B", b.chunk, b.micro_batch) for b in heads]


def check_consistent(timeline: Timeline) -> None:
    """Each stage's bars tile [0, length] with no overlap."""
    for stage in range(timeline.num_stages):
        bars = sorted((b for b in timeline.bars if b.stage == stage), key=lambda b: b.start)
        assert bars[0].start == 0.0
        assert bars[-1].end == pytest.approx(timeline.length)
        for before, after in zip(bars, bars[1:]):
            assert after.start == pytest.approx(before.end, abs=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_equal_stages_last_the_step_time_formula(schedule: str) -> None:
    p, m = 4, 6
    timeline = pipeline_timeline([STAGE] * p, m, schedule)
    # sum of stage times + (m - 1) x the slowest: (m + p - 1) x 4 s here.
    assert timeline.length == pytest.approx((m + p - 1) * STAGE.total)
    check_consistent(timeline)
    for stage in range(p):
        assert timeline.busy(stage) == pytest.approx(m * STAGE.total)
        bubble = sum(b.end - b.start for b in work(timeline, stage, "bubble"))
        assert bubble == pytest.approx((p - 1) * STAGE.total)  # the fill and drain
        assert sorted(b.micro_batch for b in work(timeline, stage, "forward")) == list(range(m))
        assert len(work(timeline, stage, "recompute")) == m
        assert len(work(timeline, stage, "communication")) == 2 * m


def test_1f1b_warms_up_then_alternates_and_gpipe_runs_all_forwards_first() -> None:
    p, m = 4, 6
    one_f_one_b = pipeline_timeline([STAGE] * p, m, "1f1b")
    assert operations(one_f_one_b, 0) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3), ("B", 0, 0), ("F", 0, 4),
        ("B", 0, 1), ("F", 0, 5), ("B", 0, 2), ("B", 0, 3), ("B", 0, 4), ("B", 0, 5)]
    last = operations(one_f_one_b, p - 1)
    assert last[:4] == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]
    gpipe = operations(pipeline_timeline([STAGE] * p, m, "gpipe"), 2)
    assert [kind for kind, _, _ in gpipe] == ["F"] * m + ["B"] * m


def test_an_operation_starts_after_the_one_it_consumes() -> None:
    timeline = pipeline_timeline([STAGE] * 3, 5, "1f1b")
    ends = {(b.stage, b.micro_batch, b.kind): b.end for b in timeline.bars}
    starts = {(b.stage, b.micro_batch, b.kind): b.start for b in timeline.bars}
    for j in range(5):
        for s in (1, 2):  # a forward waits for the previous stage's forward to be sent
            assert starts[s, j, "forward"] >= ends[s - 1, j, "communication"] - 1e-9 or \
                starts[s, j, "forward"] >= ends[s - 1, j, "forward"]
        for s in (0, 1):  # a backward (its recomputation first) waits for the next's
            assert starts[s, j, "recompute"] >= ends[s + 1, j, "backward"]


def test_a_slowest_last_stage_still_gives_the_formula() -> None:
    # The output layer and loss make the last stage the slowest in most plans.
    stages = [StagePhases(1.0, 2.0)] * 3 + [StagePhases(1.5, 2.5, transfer=0.2)]
    timeline = pipeline_timeline(stages, 6, "1f1b")
    totals = [s.total for s in stages]  # Alpa's: sum + (m - 1) x the slowest
    assert timeline.length == pytest.approx(sum(totals) + 5 * max(totals))


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 4), (3, 9, 3)])
def test_interleaved_stages_last_m_plus_p_minus_1_over_v_slowest(p: int, m: int, v: int) -> None:
    timeline = pipeline_timeline([STAGE] * p, m, "interleaved", v)
    assert timeline.length == pytest.approx((m + (p - 1) / v) * STAGE.total)
    check_consistent(timeline)
    for stage in range(p):
        forwards = {(b.chunk, b.micro_batch) for b in work(timeline, stage, "forward")}
        assert forwards == set(itertools.product(range(v), range(m)))
    # Megatron-LM's order: micro-batches in groups of p through chunk 0, then chunk 1, ...
    first = operations(timeline, 0)[:p * v]
    assert first == [("F", c, j) for c in range(v) for j in range(p)][:p * v]


def test_interleaved_chunks_send_their_own_transfers() -> None:
    p, m, v, transfer = 4, 8, 2, 0.1
    stages = [StagePhases(1.0, 2.0, transfer=transfer)] * p
    timeline = pipeline_timeline(stages, m, "interleaved", v)
    # The step-time model's: (m + (p - 1) / v) x the slowest, and v - 1 more transfers.
    formula = (m + (p - 1) / v) * stages[0].total + (v - 1) * m * transfer
    # Each chunk's transfer delays the fill too, which the formula leaves out.
    assert formula <= timeline.length <= formula + (p - 1) * (v - 1) / v * transfer + 1e-9


@pytest.mark.parametrize(("p", "m", "v"), [(4, 5, 3), (4, 6, 2), (3, 2, 4), (2, 1, 2)])
def test_interleaving_m_not_a_multiple_of_p_runs_one_round(p: int, m: int, v: int) -> None:
    # torch's Interleaved1F1B takes such micro-batches as one round of m.
    timeline = pipeline_timeline([STAGE] * p, m, "interleaved", v)
    check_consistent(timeline)
    for stage in range(p):
        assert len(work(timeline, stage, "backward")) == m * v
    with pytest.raises(ValueError, match="rounds"):  # 9 on 4: rounds of 4, 4 and 1
        pipeline_timeline([STAGE] * 4, 9, "interleaved", 2)


def test_dualpipev_s_timeline_waits_the_report_s_bubble() -> None:
    # Chunks whose I lasts as long as their F (the kernel model's matmuls: backward twice
    # the forward, W half of it; collectives alike both ways): every rank waits exactly
    # (p - 1)(F&B + B - 3W) (DeepSeek-V3 report Table 2), and the whole lasts what the
    # step-time model says: 2 m (F + B) plus that.
    stage = StagePhases(forward=1.0, backward=2.0, forward_communication=0.25,
                        backward_communication=0.25, transfer=0.2)
    for p, m in ((2, 4), (4, 8), (4, 11), (3, 9)):
        timeline = pipeline_timeline([stage] * p, m, "dualpipev", 2)
        check_consistent(timeline)
        f, b, w = dualpipev_chunk(1.25, 2.25, 2.0, 0.2)
        assert b - w == pytest.approx(f)
        bubble = dualpipev_bubble(p, f, b, w)
        assert timeline.length == pytest.approx(
            dualpipev_pipeline_seconds(p, m, 1.25, 2.25, 2.0, 0.2))
        assert timeline.length == pytest.approx(2 * m * (f + b) + bubble)
        for rank in range(p):
            waits = sum(bar.end - bar.start for bar in work(timeline, rank, "bubble"))
            assert waits == pytest.approx(bubble), (p, m, rank)
            # Two chunks in V order: rank r holds stages r and 2p - 1 - r, each of which
            # runs every micro-batch forward.
            forwards = {(bar.chunk, bar.micro_batch) for bar in work(timeline, rank, "forward")}
            assert forwards == set(itertools.product(range(2), range(m)))


def test_dualpipev_draws_split_backwards_as_their_two_halves() -> None:
    p, m = 2, 4
    timeline = pipeline_timeline([STAGE] * p, m, "dualpipev", 2)
    check_consistent(timeline)
    # Rank 0 runs 0I2 0W2 0I3 0W3 last (ScheduleDualPipeV's step 8): four backward bars,
    # an I's a quarter of the stage's backward (half the chunk's) less W, a W the other.
    tail = sorted(work(timeline, 0, "backward"), key=lambda bar: bar.start)[-4:]
    assert [bar.end - bar.start for bar in tail] == pytest.approx([0.5] * 4)
    assert [(bar.chunk, bar.micro_batch) for bar in tail] == [(0, 2), (0, 2), (0, 3), (0, 3)]
    for rank in range(p):
        assert timeline.busy(rank) == pytest.approx(m * STAGE.total)


def test_bad_inputs_are_refused() -> None:
    for schedule in ("zigzag", "zbv"):  # ZB-V splits a backward StagePhases keeps whole
        with pytest.raises(ValueError, match="cannot draw"):
            pipeline_timeline([STAGE], 2, schedule)
    with pytest.raises(ValueError, match="interleaved"):
        pipeline_timeline([STAGE] * 2, 2, "1f1b", virtual=2)
    with pytest.raises(ValueError, match=">= 1"):
        pipeline_timeline([STAGE], 0, "1f1b")


def check_slowest_stage(plan, phases: list[StagePhases]) -> None:
    """The stages the plan records are its prediction's: its breakdown holds the slowest stage's
    compute, tensor-parallel communication and transfers over the m micro-batches."""
    b = plan.predicted.breakdown
    slowest = max(phases, key=lambda s: s.total)
    m = plan.num_micro_batches
    assert m * slowest.total == pytest.approx(
        b.compute_s + b.tensor_parallel_comm_s + b.pipeline_comm_s, rel=1e-9)
    assert m * slowest.transfer == pytest.approx(b.pipeline_comm_s, rel=1e-9)


def _plans():
    model = get_preset("gpt3-175b")
    a100 = Cluster.load("dgx-a100-80g")
    yield "1f1b, selective", model, a100.with_devices(512), ParallelConfig.of(
        tensor=8, pipeline=8, micro_batch_size=1, global_batch_size=512,
        recompute="selective", sequence_parallel=True)
    yield "interleaved, block recompute, tp overlap", model, a100.with_devices(512), \
        ParallelConfig.of(tensor=8, pipeline=8, micro_batch_size=2, global_batch_size=512,
                       recompute="full", recompute_method="block", recompute_num_layers=2,
                       sequence_parallel=True, tp_comm_overlap=True, schedule="interleaved",
                       virtual_pipeline=2, zero_stage=1)
    yield "gpipe, no sequence parallelism", model, a100.with_devices(256), ParallelConfig.of(
        tensor=4, pipeline=16, micro_batch_size=1, global_batch_size=256, recompute="full",
        schedule="gpipe")
    yield "dualpipev, selective, torchtitan", model, a100.with_devices(512), ParallelConfig.of(
        tensor=8, pipeline=8, micro_batch_size=1, global_batch_size=512,
        recompute="selective", sequence_parallel=True, schedule="dualpipev",
        virtual_pipeline=2, engine="torchtitan", zero_stage=1)


@pytest.mark.parametrize("case", list(_plans()), ids=lambda case: case[0])
def test_the_plan_s_stage_phases_give_its_pipeline_time(case) -> None:
    _, model, cluster, parallel = case
    plan = training_plan("gpt3-175b", model, cluster, parallel)
    times = stage_times(plan)
    check_slowest_stage(plan, times.phases)
    timeline = pipeline_timeline(times.phases, plan.num_micro_batches, plan.schedule,
                                 parallel.pipelining.virtual_pipeline)
    # The last stage (output layer and loss) is the slowest: 1F1B and GPipe give the
    # formula exactly. Interleaving is laid out approximately (a chunk as 1/v of its
    # stage), and the formula charges its fill at the slowest stage's pace; so does
    # DualPipeV's, whose closed form is exact only where a chunk's I lasts its F.
    rel = {"interleaved": 1e-2, "dualpipev": 2e-2}.get(plan.schedule, 1e-9)
    assert timeline.length == pytest.approx(times.pipeline_s, rel=rel)


def test_stages_on_different_meshes_are_recorded_exactly() -> None:
    # An Alpa-space plan: each stage its own layers and (data x tensor) mesh.
    model = get_preset("llama3-70b")
    cluster = Cluster.load("dgx-h100").with_devices(48)
    parallel = ParallelConfig.of(data=1, tensor=8, pipeline=3, micro_batch_size=4,
                              global_batch_size=64, recompute="full")
    stages = (StageLayout(30, 8, 2), StageLayout(30, 4, 4), StageLayout(20, 8, 2))
    plan = training_plan("llama3-70b", model, cluster, parallel, stages=stages)
    times = stage_times(plan)
    check_slowest_stage(plan, times.phases)
    assert times.pipeline_s == plan_pipeline_seconds(plan)
    assert times.phases[0].total > times.phases[2].total  # 30 layers against 20
