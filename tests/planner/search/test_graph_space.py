"""planner.search.graph_space: which submeshes a graph search solves layers on, and which
layer solves it bounds rather than makes."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from planner.cluster import Cluster
from planner.search import layer_table
from planner.search.graph_space import logical_meshes, search_graph, usable_submeshes
from planner.search.stage_solve import StageCost


def _brute_force(sizes: list[int], devices: int, most: int) -> list[int]:
    used = set()
    for k in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(sizes, k):
            if sum(combo) == devices:
                used.update(combo)
    return [n for n in sizes if n in used]


@pytest.mark.parametrize("devices, most", [(64, 1), (64, 2), (64, 3), (64, 16), (8, 3),
                                           (24, 2), (24, 4), (12, 5)])
def test_usable_submeshes_are_those_some_plan_uses(devices: int, most: int) -> None:
    sizes = [1, 2, 4, 8, 16, 24, 32, 64]
    sizes = [n for n in sizes if n <= devices]
    assert usable_submeshes(sizes, devices, most) == _brute_force(sizes, devices, most)


def test_one_micro_batch_solves_layers_on_the_whole_cluster_only() -> None:
    assert usable_submeshes([1, 2, 4, 8, 16, 32, 64], 64, 1) == [64]
    assert logical_meshes(64, 8) == [(64,), (32, 2), (16, 4), (8, 8)]


def test_bounds_change_the_work_not_the_plan(monkeypatch) -> None:
    # 2-D layer solves are bounded first and made only where a plan reads them. With the
    # weakest bound (nothing) the search must end where it does with the real bounds: at
    # the optimum of the table with every layer solved, which neither can beat.
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    from graph_models import narrow_mlp

    model, inputs = narrow_mlp()
    cluster = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    cluster = cluster.with_devices(8)
    bounded = search_graph(model, inputs, cluster, 16, micro_batches=4)
    monkeypatch.setattr(layer_table, "bound_stage",
                        lambda *args, **kwargs: StageCost(0, 0, 0, 0, 0, 0, exact=False))
    weakest = search_graph(model, inputs, cluster, 16, micro_batches=4)
    for found in (bounded, weakest):
        assert found.layer_bounds > 0 and found.candidates[0].fits
    assert bounded.candidates[0].layout == weakest.candidates[0].layout
    assert bounded.candidates[0].step_time_s == pytest.approx(weakest.candidates[0].step_time_s)
    assert bounded.layer_solves <= weakest.layer_solves
