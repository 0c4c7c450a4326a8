"""Graph plans whose stages run their layers as programs of their own
(`planner.search.layered_stage`): priced exactly as the sum of the layer table's solves,
and run by the staged runtime exactly as predicted, collective for collective."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.check import check_graph_plan
from planner.cluster import Cluster
from planner.graph_plan import graph_plan
from planner.search.graph_knobs import GraphKnobs
from planner.search.graph_space import search_graph

sys.path.insert(0, str(Path(__file__).parent))
from graph_models import residual_cnn  # noqa: E402

SMALL = Cluster.load(str(Path(__file__).parents[1] / "fixtures" / "small_memory.yaml"))


def test_stages_run_as_their_layers_programs_train_as_one_process() -> None:
    # Skip connections cross the layers' cuts: a layer passes a tensor through to the
    # next. (A recomputing layered plan: test_graph_plans' fixed knobs.)
    factory, knobs = residual_cnn, GraphKnobs()
    model, inputs, *loss = factory()
    loss_fn = loss[0] if loss else None
    cluster = SMALL.with_devices(8)
    found = search_graph(model, inputs, cluster, 16, loss_fn, micro_batches=4, knobs=knobs)
    (layered,) = [c for c in found.candidates if c.layout.name == "stage DP" and c.layout.layered]
    (whole,) = [c for c in found.candidates
                if c.layout.name == "stage DP" and not c.layout.layered]
    assert layered.layout.stages == whole.layout.stages and layered.fits
    plan = graph_plan(layered, cluster, factory.__name__, 16)
    several = [s for s in plan.stages if s.layers[1] - s.layers[0] > 1]
    assert several, "no stage of several layers"
    for stage in plan.stages:
        assert stage.operators is None
        assert len(stage.layer_operators) == stage.layers[1] - stage.layers[0]
    assert [s.recompute for s in plan.stages] == list(layered.layout.recompute or
                                                      [False] * len(plan.stages))
    report = check_graph_plan(model, plan, loss_fn, inputs, steps=2)
    assert report.max_rel_error < 1e-4
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed


def test_a_zoo_transformer_under_intra_op_ilp_is_planned_as_any_model(tmp_path) -> None:
    """`plan check gpt ... --gpus 4 --intra-op ilp`: the transformer is traced with four of
    its six blocks and planned from its graph, as a model of one's own is; its stages run
    their layers' programs (the runtime traces all six blocks), and 4 gloo ranks train it
    as one process does, every rank's collectives as predicted."""
    from planner import cli
    from planner.plan import Plan

    out = tmp_path / "report.json"
    assert cli.main([
        "check", "gpt", "--num-layers", "6", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
        "--cluster", str(Path(__file__).parents[1] / "fixtures" / "small_memory.yaml"),
        "--gpus", "4", "--global-batch-size", "16", "--micro-batch-size", "4",
        "--intra-op", "ilp", "--steps", "2", "--json", str(out)]) == 0
    import json

    report = json.loads(out.read_text())
    plan = Plan.model_validate(report["plan"])
    assert plan.layer_cuts is not None and len(plan.layer_cuts) == 9  # 6 blocks and ends
    assert len(plan.stages) > 1 and all(s.layer_operators for s in plan.stages)
    held = {fqn for stage in plan.stages for fqn in stage.parameters}
    assert {f"layers.{i}.mlp.fc1.weight" for i in range(6)} <= held
    assert report["check"]["passed"] and report["check"]["communication_matches"]
    assert report["check"]["max_rel_error"] < 1e-4
