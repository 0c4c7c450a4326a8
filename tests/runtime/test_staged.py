"""runtime.staged: the order in which a graph plan's stage runs its micro-batches (its
numerics and collectives are checked on 8 ranks in tests/e2e/test_graph_plans.py)."""

from __future__ import annotations

from runtime.staged import _warm_up


def test_1f1b_runs_as_many_forwards_first_as_there_are_stages_after() -> None:
    assert [_warm_up("1f1b", 8, 4, k) for k in range(4)] == [3, 2, 1, 0]
    assert [_warm_up("1f1b", 2, 4, k) for k in range(4)] == [2, 2, 1, 0]


def test_gpipe_runs_every_forward_first_but_on_the_last_stage() -> None:
    assert [_warm_up("gpipe", 8, 4, k) for k in range(4)] == [8, 8, 8, 0]
