"""Memory as each engine holds it: model state, working buffers, reserved, and published
runs predicted like with like."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models.engine_memory import loss_bytes, model_state
from cost_models.published_memory import predict, read_runs
from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig

PARAMS, BLOCK, ENDS = 1e9, 5e7, 1e8


def test_megatrons_distributed_optimizer_keeps_weights_and_main_grads_whole() -> None:
    # 2-byte weights and 4-byte main gradients on every rank, 12 bytes of fp32 main
    # weights and moments sharded over the 8 data-parallel ranks.
    state, extra = model_state(PARAMS, BLOCK, ENDS, ParallelConfig(data=8, zero_stage=1))
    assert (state.weights, state.gradients, state.optimizer, extra) == (
        2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 8, 0.0)
    aware, _ = model_state(PARAMS, BLOCK, ENDS, ParallelConfig(
        data=8, zero_stage=1, main_grads_dtype="bf16", exp_avg_dtype="bf16"))
    assert (aware.gradients, aware.optimizer) == (2 * PARAMS, (4 + 4) * PARAMS / 8)


def test_fsdp2_under_a_pipeline_keeps_the_stage_gathered_and_its_gradients_unsharded() -> None:
    titan = ParallelConfig(data=8, zero_stage=3, engine="torchtitan")
    state, alone = model_state(PARAMS, BLOCK, ENDS, titan)
    assert state.total == 16 * PARAMS / 8
    # Two blocks gathered in bf16 plus the root's ends; one block's bf16 and fp32 gradient.
    assert alone == 2 * (2 * BLOCK + ENDS) + 6 * BLOCK
    _, piped = model_state(PARAMS, BLOCK, ENDS, ParallelConfig(
        data=8, pipeline=4, zero_stage=3, engine="torchtitan"))
    assert piped == 2 * PARAMS + 4 * PARAMS
    _, always = model_state(PARAMS, BLOCK, ENDS, ParallelConfig(
        data=8, pipeline=4, zero_stage=3, engine="torchtitan", fsdp_reshard_after_forward="always"))
    assert always == 2 * (2 * BLOCK + ENDS) + 4 * PARAMS


def test_torchtitans_405b_run_is_not_predicted_at_a_third_of_its_memory() -> None:
    # TorchTitan's Llama 3.1 405B (FSDP8 x TP8 x PP8, 1F1B, full checkpointing, float8)
    # reserved 82.5 GiB per GPU; priced as Megatron would run the same degrees it was 32.8.
    model = get_preset("llama3-405b").model_copy(update={"seq_length": 8192})
    cluster = Cluster.load("dgx-h100").with_devices(512)
    knobs = dict(tensor=8, pipeline=8, data=8, zero_stage=3, recompute="full",
                 precision="fp8", fp8_recipe="tensorwise", micro_batch_size=1,
                 global_batch_size=64, sequence_parallel=True)
    titan = predict_step(model, cluster, ParallelConfig(engine="torchtitan", **knobs))
    assert titan.reserved_gib_per_gpu > 60
    assert titan.reserved_gib_per_gpu > 1.5 * predict_step(
        model, cluster, ParallelConfig(engine="tessel", **knobs)).memory_gib_per_gpu


def test_a_run_that_fits_allocated_but_not_reserved_is_flagged_not_refused() -> None:
    model = get_preset("llama3-8b")
    cluster = Cluster.load("dgx-h100").with_devices(8)
    knobs = dict(data=8, zero_stage=3, engine="torchtitan", recompute="selective",
                 global_batch_size=16, micro_batch_size=2)
    p = predict_step(model, cluster, ParallelConfig(**knobs))
    assert p.fits and not p.reserved_fits  # 79.6 GiB: about 73 allocated, 81 reserved
    assert p.memory_gib_per_gpu < 79.6 < p.reserved_gib_per_gpu
    assert sum(p.memory_breakdown_gib.values()) == pytest.approx(p.memory_gib_per_gpu)


# Rows Tessel still gets wrong, and why; the test fails when one comes right, so that the
# list only shrinks.
KNOWN_GAPS = {
    # Megatron-Bridge's Llama 3 70B SFT ran out of memory through fragmentation in 30-60%
    # of its runs at 58.8 GiB allocated: reserved near the 79.1 GiB device. Predicted at
    # +7.8% allocated, but its reserved estimate (Megatron's fitted 1.093 over allocated)
    # stays under the device: what Transformer Engine's CUDA-graph memory pools hold
    # beyond the caching allocator's own splitting is not counted.
    12: "the fragmentation of CUDA-graph memory pools",
}


def test_published_peak_memory_is_predicted_within_ten_percent() -> None:
    runs, skipped = read_runs()
    assert len(runs) + len(skipped) == 12 and not skipped
    for run in runs:
        result = predict(run)
        right = (result.error is None or abs(result.error) <= 0.10) and result.verdict_ok
        assert right != (run.line in KNOWN_GAPS), (run.line, run.name, result.error)


def test_a_compiled_loss_keeps_the_bf16_logits() -> None:
    model = get_preset("llama3-8b")
    eager = ParallelConfig(engine="torchtitan", micro_batch_size=2)
    logits = model.seq_length * 2 * model.vocab_size
    head_input = 2 * model.seq_length * 2 * model.hidden_size
    # Eager: the fp32 log-softmax kept; the bf16 logits and their fp32 copy at the peak.
    assert loss_bytes(model, eager) == (4 * logits + head_input, 6 * logits)
    compiled = replace(eager, compile_loss=True)
    assert loss_bytes(model, compiled) == (2 * logits + head_input, 2 * logits)
