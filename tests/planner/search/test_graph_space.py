"""planner.search.graph_space: which submeshes a graph search solves layers on, and which
layer solves it bounds rather than makes."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from planner.vocabulary.cluster import Cluster
from planner.search import layer_table
from cost_models.pipeline_schedule import in_flight
from passes.model_layers import ModelLayers
from passes.stage_graph import forward_graph, micro_batch_inputs, on_meta_device
from planner.search.graph_prediction import Layout, TracedForward, predict_all, usable_bytes
from planner.search.graph_space import logical_meshes, search_graph, usable_submeshes
from planner.search.layer_table import LayerTable
from planner.search.graph_knobs import GraphKnobs
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


def test_a_stage_holds_one_micro_batch_per_stage_from_it_to_the_last() -> None:
    # 1F1B on 4 stages with 8 micro-batches: 4, 3, 2, 1 in flight; with 2, at most 2
    # (GPipe: 8, 8, 8, 1). The plan of 2 stages with 4 micro-batches: its first stage holds
    # 2 (GPipe: 4).
    def held(schedule: str, m: int) -> list[float]:  # as the graph runtime runs them
        return [in_flight(schedule, 4, k, m, eager_last=True) for k in range(4)]

    assert held("1f1b", 8) == [4, 3, 2, 1]
    assert held("1f1b", 2) == [2, 2, 2, 1]
    assert held("gpipe", 8) == [8, 8, 8, 1]
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    from graph_models import narrow_mlp

    model, inputs = narrow_mlp()
    cluster = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    found = search_graph(model, inputs, cluster.with_devices(8), 16, micro_batches=4)
    pipelines = [c for c in found.candidates if c.exact and len(c.solves) > 1]
    assert pipelines
    for c in pipelines:
        stages = len(c.solves)
        assert c.memory_bytes == [
            x.cost.state_bytes + min(4, stages - k) * x.cost.activation_bytes
            for k, x in enumerate(c.solves)]


def test_fixed_knobs_hold_for_every_layout() -> None:
    # GPipe, every stage but the last recomputing, every parameter at its least memory
    # (ZeRO-3): the DP's plan and the baselines all run so, and data parallelism's
    # replicated parameters are no layout under ZeRO-3.
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    from graph_models import narrow_mlp

    model, inputs = narrow_mlp()
    cluster = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    knobs = GraphKnobs(recompute=True, schedule="gpipe", lean=True)
    found = search_graph(model, inputs, cluster.with_devices(8), 16, micro_batches=4,
                         knobs=knobs)
    assert "data parallel" not in {c.layout.name for c in found.candidates}
    # The DP's plan, its stages solved whole and run as their layers' programs.
    plans = [c for c in found.candidates if c.layout.name == "stage DP"]
    assert sorted(c.layout.layered for c in plans) == [False, True]
    for c in found.candidates:
        assert c.layout.schedule == "gpipe"
        assert all(lean for _, _, _, lean in c.layout.stages)
    for dp in plans:
        stages = len(dp.solves)
        assert stages > 1 and dp.layout.recompute == (True,) * (stages - 1) + (False,)
        # GPipe holds all 4 micro-batches on every stage but the last: their incoming
        # tensors.
        assert dp.memory_bytes == [
            x.cost.state_bytes + (4 * x.cost.checkpoint_bytes + x.cost.activation_bytes
                                  if k < stages - 1 else x.cost.activation_bytes)
            for k, x in enumerate(dp.solves)]


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


@pytest.mark.parametrize("factory", ["narrow_mlp", "residual_cnn"])
def test_a_stage_is_never_bounded_above_its_solve(factory: str) -> None:
    # Layouts of one stage are pruned when m x the sum of their layers' bounds is no less
    # than a plan already found: that sum must never exceed the stage's exact step, on 1-D
    # and 2-D meshes, for layers whose surrogate losses a whole stage does not have.
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    import graph_models

    model, inputs, *loss = getattr(graph_models, factory)()
    loss_fn = loss[0] if loss else None
    cluster = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    cluster = cluster.with_devices(4)
    on_meta = on_meta_device(model)
    values = {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}
    m, shapes = 2, [(4,), (2, 2)]
    batch = micro_batch_inputs(tuple(inputs), inputs[0].shape[0] // m)
    layers = ModelLayers.traced(forward_graph(on_meta, batch, loss_fn), 4)
    assert layers.num_layers >= 3
    with LayerTable(layers, values, batch, cluster, [4], 30.0, math.inf, m) as table:
        bounds = table.bound(shapes)
    traced = TracedForward(layers, batch, m)
    layouts = [(traced, Layout(((0, layers.num_layers, shape, False),), "single mesh"), None)
               for shape in shapes]
    for shape, candidate in zip(shapes, predict_all(layouts, values, cluster)):
        assert candidate.exact
        assert m * bounds[shape] <= candidate.step_time_s, shape
        assert m * bounds[shape] > 0.1 * candidate.step_time_s, shape  # not vacuous


def test_the_layer_table_leaves_meshes_of_every_device_to_bound() -> None:
    # A stage on every device is a layout of its own, solved whole: the stage DP never
    # reads its layers, so the table solves none on such a mesh and bounds them only when
    # one-stage layouts ask (`bound`).
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    from graph_models import narrow_mlp

    model, inputs = narrow_mlp()
    cluster = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    cluster = cluster.with_devices(4)
    on_meta = on_meta_device(model)
    values = {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}
    batch = micro_batch_inputs(tuple(inputs), inputs[0].shape[0] // 2)
    layers = ModelLayers.traced(forward_graph(on_meta, batch, None), 4)
    with LayerTable(layers, values, batch, cluster, [1, 2, 4], 30.0, math.inf, 2) as table:
        meshes = {shape for _, shape, _ in table.costs}
        assert meshes == {(1,), (2,)}
        bounds = table.bound([(4,), (2, 2)])
    assert all(bound > 0 for bound in bounds.values())
    assert {shape for _, shape in table.lower} >= {(4,), (2, 2)}


def test_the_dp_searches_again_when_its_stages_solved_whole_break_the_memory() -> None:
    # The DP prices a stage by its layers' solves; solved whole, this model's first stage
    # on 200 KiB devices holds more than that and breaks the limit. The search then refuses
    # that stage in that mode and finds a plan that fits (without refitting: none did).
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e"))
    import torch
    from graph_models import WideMLP

    torch.manual_seed(0)
    model, inputs = WideMLP((64,) * 9), (torch.randn(8, 64),)
    small = Cluster.load(str(Path(__file__).parents[2] / "fixtures" / "small_memory.yaml"))
    small = small.with_devices(8)
    tiny = small.model_copy(update={"device": small.device.model_copy(
        update={"memory_gib": 0.0002})})
    found = search_graph(model, inputs, tiny, 256, micro_batches=8)
    plans = [c for c in found.candidates if c.layout.name == "stage DP"]
    assert len(plans) >= 2 and not all(c.fits for c in plans)
    best = found.candidates[0]
    assert best.fits and best.layout.name == "stage DP"
    assert max(best.memory_bytes) <= usable_bytes(tiny)
