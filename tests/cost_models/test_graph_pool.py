"""CUDA graphs' private pool: what Megatron-LM's graphed modules hold beside the eager
pool, counted in the reserved estimate and not in the allocated peak."""

from __future__ import annotations


import pytest

from cost_models.published_memory import read_runs
from cost_models.step_time import predict_step
from planner.models.presets import get_preset
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

GIB = 2**30


def _predict(**knobs):
    model = get_preset("llama3-8b")
    cluster = Cluster.load("dgx-h100").with_devices(8)
    base = dict(pipeline=4, data=2, global_batch_size=16, micro_batch_size=1,
                recompute="selective")
    return model, predict_step(model, cluster, ParallelConfig.of(**(base | knobs)))


def test_a_graphed_mlp_holds_its_saved_tensors_and_input_for_every_micro_batch_in_flight() -> None:
    model, eager = _predict()
    _, graphed = _predict(cuda_graph_scope=("mlp",))
    # Allocated is the eager warm-up's peak either way; reserved gains the pool.
    assert graphed.memory_gib_per_gpu == eager.memory_gib_per_gpu
    pool = (graphed.reserved_gib_per_gpu - eager.reserved_gib_per_gpu) * GIB
    # The first of 4 stages (8 layers) has 4 micro-batches in flight under 1F1B. Its MLP
    # keeps, per token in bf16: the norm's input and output (h each), SwiGLU's input
    # (2 f) and output (f), and the graph's static input (h).
    n, h, f = model.seq_length, model.hidden_size, model.ffn_size
    per_layer = 2 * n * (3 * h + 3 * f)
    assert pool == pytest.approx(8 * 4 * per_layer)


def test_whole_layer_graphs_hold_every_activation_the_layers_keep_and_other_engines_none() -> None:
    _, eager = _predict()
    _, whole = _predict(cuda_graphs=True)
    layers = sum(gib for kind, gib in eager.memory_breakdown_gib.items()
                 if kind.startswith("activations") and kind != "activations: loss")
    assert whole.reserved_gib_per_gpu - eager.reserved_gib_per_gpu == pytest.approx(layers)
    _, titan = _predict(engine="torchtitan", zero_stage=3, cuda_graph_scope=("mlp",))
    _, titan_eager = _predict(engine="torchtitan", zero_stage=3)
    assert titan.reserved_gib_per_gpu == titan_eager.reserved_gib_per_gpu


def test_published_rows_read_their_cuda_graphs_from_the_compile_column() -> None:
    runs = {run.line: run.parallel for run in read_runs()[0]}
    assert runs[12].execution.cuda_graph_scope == ("mlp",) and not runs[12].execution.cuda_graphs
    # Moonlight's "off (no CUDA graph)" captures nothing.
    assert not runs[13].execution.cuda_graph_scope and not runs[13].execution.cuda_graphs


def test_bridges_70b_sft_layouts_that_ran_are_judged_as_they_ran() -> None:
    # Held out (Megatron-Bridge skills/mbridge-perf-memory-tuning, "Measured Results"):
    # the same SFT run at TP 8 (50.2 GB peak) ran; at its baseline TP 4 it ran out of
    # memory through fragmentation. Both fit allocated; only the baseline is flagged.
    bridge = next(run for run in read_runs()[0] if run.fragmentation)
    baseline = predict_step(bridge.model, bridge.cluster, bridge.parallel)
    tp8 = predict_step(bridge.model, bridge.cluster,
                       bridge.parallel.but(tensor=8, data=1))
    assert baseline.fits and not baseline.reserved_fits
    assert tp8.fits and tp8.reserved_fits
