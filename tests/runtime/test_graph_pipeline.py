"""runtime.graph_pipeline: the order in which a graph plan's stage runs its micro-batches (its
numerics and collectives are checked on 8 ranks in tests/e2e/test_graph_plans.py)."""

from __future__ import annotations

from runtime.graph_pipeline import _order


def warmed_up(warm_up: int, m: int, stage: int) -> list[str]:
    """What the runtime ran before its order came from `cost_models.pipeline_schedule`:
    `warm_up` forwards, then a forward and the oldest backward in turn, then the rest."""
    out = []
    for i in range(m):
        out.append(f"{stage}F{i}")
        if i >= warm_up:
            out.append(f"{stage}B{i - warm_up}")
    return out + [f"{stage}B{i}" for i in range(max(m - warm_up, 0), m)]


def order(schedule: str, m: int, stages: int, index: int) -> list[str]:
    return [str(action) for action in _order(schedule, m, stages, index)]


def test_1f1b_runs_as_many_forwards_first_as_there_are_stages_after() -> None:
    for m, warm_ups in ((8, [3, 2, 1, 0]), (2, [2, 2, 1, 0])):
        assert [order("1f1b", m, 4, k) for k in range(4)] == \
            [warmed_up(w, m, k) for k, w in enumerate(warm_ups)]


def test_gpipe_runs_every_forward_first_but_on_the_last_stage() -> None:
    # The last stage's backward waits only on its own forward: it runs at once.
    assert [order("gpipe", 8, 4, k) for k in range(4)] == \
        [warmed_up(w, 8, k) for k, w in enumerate([8, 8, 8, 0])]


def test_a_plan_of_one_stage_alternates() -> None:
    assert order(None, 3, 1, 0) == ["0F0", "0B0", "0F1", "0B1", "0F2", "0B2"]
