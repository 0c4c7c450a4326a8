"""cost_models.pipeline_timing: the simulated pipelines of the schedules' actions last
what the papers' formulas say, and the closed forms the rest of Tessel reads
(`pipeline_time`, `one_chunk_seconds`) equal their simulation over grids of stages,
micro-batches, chunks and schedules, under the conditions they state."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from typing import Callable

import pytest

from cost_models.pipeline_schedule import Action, eager_last_stage, schedule_actions
from cost_models.pipeline_timing import (
    StagePhases,
    dualpipev_bubble,
    one_chunk_seconds,
    paced_micro_batches,
    pipeline_time,
    simulate,
    simulate_stages,
)
from planner.vocabulary.schedules import SCHEDULES


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
