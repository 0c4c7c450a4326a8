"""Graph plans (`plan MODEL --gpus N` for a model of one's own): models with no repeated
blocks on devices too small for data parallelism get a plan that fits, splits the model or
its parameters, is never predicted slower than the simple layouts, and trains on 8 gloo
ranks exactly as one process does, with every rank's collectives as predicted."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from planner.checks.operator import check_graph_plan
from planner.vocabulary.cluster import Cluster
from planner.plans.graph_plan import graph_plan
from planner.search.graph_space import search_graph
from planner.search.inter_op import stage_brute_force, stage_dp

sys.path.insert(0, str(Path(__file__).parent))
from graph_models import residual_cnn, wide_mlp  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures"
SMALL = Cluster.load(str(FIXTURES / "small_memory.yaml")).with_devices(8)
MODELS = {
    # (factory, global batch, micro-batches, at most this many layers). At least eight
    # layers, so that the even pipeline of one device per stage exists: wide_mlp's sixteen
    # Linear layers clustered into at most ten become nine, which plan in 2/3 of the time
    # of the default's eleven.
    "wide_mlp": (wide_mlp, 32, 4, 10),
    "residual_cnn": (residual_cnn, 16, 4, 16),
}


@functools.cache
def _searched(name: str) -> tuple:
    """(model, inputs, loss_fn, search) of MODELS[name], searched once for the module."""
    factory, batch, micro_batches, max_layers = MODELS[name]
    model, inputs, *loss = factory()
    loss_fn = loss[0] if loss else None
    found = search_graph(model, inputs, SMALL, batch, loss_fn, micro_batches=micro_batches,
                         max_layers=max_layers)
    return model, inputs, loss_fn, found


@pytest.fixture(scope="module", params=list(MODELS))
def planned(request):
    model, inputs, loss_fn, found = _searched(request.param)
    plan = graph_plan(found.candidates[0], SMALL, request.param, MODELS[request.param][1])
    return request.param, model, inputs, loss_fn, found, plan


def _by_name(found, name):
    return [c for c in found.candidates if c.layout.name == name]


def test_the_plan_fits_where_data_parallelism_does_not(planned) -> None:
    name, _, _, _, found, plan = planned
    (data_parallel,) = _by_name(found, "data parallel")
    assert not data_parallel.fits, f"{name}: the cluster must be too small for DP"
    assert plan.predicted.fits
    assert plan.predicted.memory_gib_per_gpu <= SMALL.device.memory_gib
    split = len(plan.stages) > 1
    sharded = any("S(" in p for stage in plan.stages for p in stage.parameters.values())
    assert split or sharded, f"{name}: neither pipeline stages nor sharded parameters"
    # Every parameter of the model is placed on exactly one stage.
    names = [fqn for stage in plan.stages for fqn in stage.parameters]
    assert sorted(names) == sorted(n for n, _ in planned[1].named_parameters())


def test_never_predicted_slower_than_the_simple_layouts(planned) -> None:
    name, _, _, _, found, plan = planned
    baselines = [c for c in found.candidates if c.layout.name != "stage DP"]
    assert {c.layout.name for c in baselines} >= {"data parallel", "even pipeline"}
    for candidate in baselines:
        if candidate.fits:
            assert plan.predicted.step_time_s <= candidate.step_time_s, candidate.layout.name
    # The stage DP found a fitting plan of its own.
    assert any(c.fits for c in _by_name(found, "stage DP")) or any(
        c.fits and c.layout.stages == found.candidates[0].layout.stages
        for c in found.candidates
    )


def test_the_stage_dp_equals_brute_force_on_the_model_costs(planned) -> None:
    _, _, _, _, found, plan = planned
    sizes = np.array(found.submesh_sizes)
    # Every split into at most four stages, every assignment of submeshes: small enough.
    fast = stage_dp(found.costs, sizes, 8, plan.num_micro_batches)
    slow = stage_brute_force(found.costs, sizes, 8, plan.num_micro_batches)
    assert slow is not None
    assert fast is not None and fast.total_latency == pytest.approx(slow.total_latency)


def test_trains_on_8_ranks_as_one_process_with_the_predicted_collectives(planned) -> None:
    name, model, inputs, loss_fn, _, plan = planned
    report = check_graph_plan(model, plan, loss_fn, inputs, steps=2)
    assert report.max_rel_error < 1e-4, name
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed


def test_stages_run_as_their_layers_programs_train_as_one_process() -> None:
    # The residual CNN's DP plan run as its layers' programs (`planner.search.
    # layered_stage`): skip connections cross the layers' cuts, so a layer passes a tensor
    # through to the next. It keeps the whole solve's stages, fits, and trains as one
    # process does with every collective as predicted. (A recomputing layered plan: the
    # fixed knobs' test.)
    model, inputs, loss_fn, found = _searched("residual_cnn")
    (layered,) = [c for c in found.candidates if c.layout.name == "stage DP" and c.layout.layered]
    (whole,) = [c for c in found.candidates
                if c.layout.name == "stage DP" and not c.layout.layered]
    assert layered.layout.stages == whole.layout.stages and layered.fits
    plan = graph_plan(layered, SMALL, "residual_cnn", MODELS["residual_cnn"][1])
    assert any(s.layers[1] - s.layers[0] > 1 for s in plan.stages), "no stage of several layers"
    for stage in plan.stages:
        assert stage.operators is None
        assert len(stage.layer_operators) == stage.layers[1] - stage.layers[0]
    assert [s.recompute for s in plan.stages] == list(layered.layout.recompute or
                                                      [False] * len(plan.stages))
    report = check_graph_plan(model, plan, loss_fn, inputs, steps=2)
    assert report.max_rel_error < 1e-4
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed


def test_recomputes_a_stage_where_keeping_its_activations_does_not_fit() -> None:
    # Eight Linear layers of width 64 on a batch of 256 in 8 micro-batches: activations
    # outweigh parameters. On devices of 200 KiB no pipelined layout keeping them fits; two
    # stages whose first (more micro-batches in flight) keeps only its inputs do, 1.5x as
    # fast as the one-stage layouts that fit (parameters sharded as ZeRO-3 does).
    from graph_models import WideMLP

    torch.manual_seed(0)
    model, inputs = WideMLP((64,) * 9), (torch.randn(8, 64),)
    tiny = SMALL.model_copy(update={"device": SMALL.device.model_copy(
        update={"memory_gib": 200 / 2**20})})
    found = search_graph(model, inputs, tiny, 256, micro_batches=8)
    best = found.candidates[0]
    assert best.fits and best.layout.name == "stage DP" and any(best.layout.recompute)
    kept = [c for c in found.candidates if c.fits and not any(c.layout.recompute)]
    assert kept and best.step_time_s < min(c.step_time_s for c in kept)
    plan = graph_plan(best, tiny, "recomputed_mlp", 256)
    assert plan.recompute == "full"
    assert [s.recompute for s in plan.stages] == list(best.layout.recompute)
    report = check_graph_plan(model, plan, None, inputs, steps=2)
    assert report.max_rel_error < 1e-4
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed


def _tied_plan():
    """fc0's weight is read by the first layer and, transposed, by the output layer; cut
    into two stages of four devices each, both hold it: sharded on the first (lean: each
    parameter at its least memory), replicated on the second."""
    from graph_models import tied_mlp

    from passes.model_layers import ModelLayers
    from passes.stage_graph import forward_graph, micro_batch_inputs, on_meta_device
    from planner.search.graph_prediction import Layout, TracedForward, predict_all

    model, inputs = tied_mlp()
    batch, m = 16, 4
    on_meta = on_meta_device(model)
    values = {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}
    micro = micro_batch_inputs(inputs, batch // m)
    layers = ModelLayers.traced(forward_graph(on_meta, micro), 4)
    assert layers.num_layers == 4  # the tied weight no longer keeps the model in one layer
    traced = TracedForward(layers, micro, m)
    layout = Layout(((0, 2, (4,), True), (2, 4, (2, 2), False)), "tied")
    (candidate,) = predict_all([(traced, layout, None)], values, SMALL)
    return model, inputs, candidate, graph_plan(candidate, SMALL, "tied_mlp", batch)


def test_a_weight_tied_across_stages_trains_as_one_process() -> None:
    # Each stage computes its share of the tied weight's gradient; one all-reduce over
    # the eight ranks sums them, once per step.
    model, inputs, candidate, plan = _tied_plan()
    assert plan.tie_groups() == {"fc0.weight": list(range(8))}
    assert [stage.parameters["fc0.weight"] for stage in plan.stages] == ["S(0)", "RR"]
    # The first stage gathers its shards' gradient, then both all-reduce the whole weight.
    weight_bytes = 64 * 32 * 4
    assert [(c.kind, c.nbytes) for c in candidate.tie_collectives[0]] == [
        ("all_gather", weight_bytes), ("all_reduce", weight_bytes)]
    assert [(c.kind, c.nbytes) for c in candidate.tie_collectives[1]] == [
        ("all_reduce", weight_bytes)]
    report = check_graph_plan(model, plan, None, inputs, steps=2)
    assert report.max_rel_error < 1e-4
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed


def _train_save_resume_tied(rank: int, world: int, plan_json: str, batches, directory: str):
    from graph_models import TiedMLP, tied_mlp

    from planner.vocabulary.plan import Plan
    from runtime.graph_pipeline import StagedTrainer

    plan = Plan.from_json(plan_json)
    model, inputs = tied_mlp()
    trainer = StagedTrainer(plan, model, inputs)
    losses = [trainer.step(*batch) for batch in batches[:2]]
    trainer.save(directory)
    torch.manual_seed(7)  # a restarted job: another initial model, then the saved state
    resumed = StagedTrainer(plan, TiedMLP(), inputs)
    resumed.load(directory)
    losses.append(resumed.step(*batches[2]))
    return losses, resumed.full_parameters()


def test_a_plan_with_a_tied_weight_saves_once_and_resumes_on_every_stage(tmp_path) -> None:
    from runtime.local_ranks import run_on_ranks

    from planner.checks.operator import train_single_process

    model, _, _, plan = _tied_plan()
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 32, generator=generator),) for _ in range(3)]
    results = run_on_ranks(_train_save_resume_tied, 8, plan.to_json(), batches,
                           str(tmp_path))
    reference_losses, reference_params = train_single_process(model, None, batches)
    for losses, _ in results[4:]:  # the last stage's ranks report the loss
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses))
    for rank in (0, 4):  # both stages' copies of the tied weight, after the resumed step
        torch.testing.assert_close(results[rank][1]["fc0.weight"],
                                   reference_params["fc0.weight"], rtol=1e-4, atol=1e-5)


def test_fixed_knobs_train_as_one_process() -> None:
    # GPipe, recomputation on every stage but the last, ZeRO-3 (each parameter at its least
    # memory), as `--schedule gpipe --recompute-granularity full --zero-stage 3` fix them.
    from graph_models import narrow_mlp

    from planner.search.graph_knobs import GraphKnobs

    model, inputs = narrow_mlp()
    knobs = GraphKnobs(recompute=True, schedule="gpipe", lean=True)
    found = search_graph(model, inputs, SMALL, 16, micro_batches=4, knobs=knobs)
    # The best plan, and the DP's run as its layers' programs: a recomputing stage runs
    # every layer's first pass again, the moves between its layers too.
    (layered,) = [c for c in found.candidates if c.layout.name == "stage DP"
                  and c.layout.layered]
    for candidate in (found.candidates[0], layered):
        plan = graph_plan(candidate, SMALL, "narrow_mlp", 16)
        assert plan.schedule == "gpipe" and len(plan.stages) > 1
        assert [s.recompute for s in plan.stages] == [True] * (len(plan.stages) - 1) + [False]
        report = check_graph_plan(model, plan, None, inputs, steps=2)
        assert report.max_rel_error < 1e-4
        assert report.communication_matches, report.mismatches[:3]
        assert report.passed
    assert any(len(s.layer_operators) > 1 for s in plan.stages)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_plan_trains_as_one_process_does(precision) -> None:
    # `--precision bf16|fp16`: traced, priced and run in 16 bits (half the bytes on every
    # wire), fp32 master weights, gradient accumulators and moments (18 bytes per
    # parameter); fp16 scales its loss, and every rank agrees once per step whether a
    # gradient overflowed (one all-reduce, predicted like the rest).
    from planner.checks.operator import RELATIVE_TOLERANCE_BF16
    from planner.search.graph_knobs import GraphKnobs

    model, inputs, loss_fn = residual_cnn()
    knobs = GraphKnobs(precision=precision)
    found = search_graph(model, inputs, SMALL, 16, loss_fn, micro_batches=4, knobs=knobs)
    plan = graph_plan(found.candidates[0], SMALL, "residual_cnn", 16)
    assert plan.precision == precision and len(plan.stages) > 1
    for stage in plan.stages:
        assert stage.memory.gradients_bytes == 2 * stage.memory.parameters_bytes
        assert stage.memory.optimizer_bytes == 6 * stage.memory.parameters_bytes
    report = check_graph_plan(model, plan, loss_fn, inputs, steps=2)
    assert report.max_rel_error < RELATIVE_TOLERANCE_BF16
    assert report.communication_matches, report.mismatches[:3]
    assert report.passed
