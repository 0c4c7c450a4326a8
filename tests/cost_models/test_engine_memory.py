"""Memory as each engine holds it: model state, working buffers, reserved, and published
runs predicted like with like."""

from __future__ import annotations


import pytest

from cost_models.engine_memory import FRAGMENTATION, loss_bytes, model_state
from cost_models.published_memory import (
    fragmentation_fit,
    fragmentation_leave_one_out,
    fragmentation_rows,
    predict,
    read_runs,
)
from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig

PARAMS, BLOCK, ENDS = 1e9, 5e7, 1e8


def test_megatrons_distributed_optimizer_keeps_weights_and_main_grads_whole() -> None:
    # 2-byte weights and 4-byte main gradients on every rank, 12 bytes of fp32 main
    # weights and moments sharded over the 8 data-parallel ranks.
    state, extra = model_state(PARAMS, BLOCK, ENDS, ParallelConfig.of(data=8, zero_stage=1))
    assert (state.weights, state.gradients, state.optimizer, extra) == (
        2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 8, 0.0)
    aware, _ = model_state(PARAMS, BLOCK, ENDS, ParallelConfig.of(
        data=8, zero_stage=1, main_grads_dtype="bf16", exp_avg_dtype="bf16"))
    assert (aware.gradients, aware.optimizer) == (2 * PARAMS, (4 + 4) * PARAMS / 8)


def test_fsdp2_under_a_pipeline_keeps_the_stage_gathered_and_its_gradients_unsharded() -> None:
    titan = ParallelConfig.of(data=8, zero_stage=3, engine="torchtitan")
    state, alone = model_state(PARAMS, BLOCK, ENDS, titan)
    assert state.total == 16 * PARAMS / 8
    # Two blocks gathered in bf16 plus the root's ends; one block's bf16 and fp32 gradient.
    assert alone == 2 * (2 * BLOCK + ENDS) + 6 * BLOCK
    _, piped = model_state(PARAMS, BLOCK, ENDS, ParallelConfig.of(
        data=8, pipeline=4, zero_stage=3, engine="torchtitan"))
    assert piped == 2 * PARAMS + 4 * PARAMS
    _, always = model_state(PARAMS, BLOCK, ENDS, ParallelConfig.of(
        data=8, pipeline=4, zero_stage=3, engine="torchtitan", fsdp_reshard_after_forward="always"))
    # Every unit resharded after forward, the ends' too: an end beside the block next to it.
    assert always == 2 * (BLOCK + ENDS) + 4 * PARAMS


def test_fsdp2_resharding_every_unit_holds_one_end_at_a_time() -> None:
    # TorchTitan's "always" (and torchtune's custom_sharded_layers): the embedding and the
    # head are units of their own, gathered only around their passes, beside one block.
    always = ParallelConfig.of(data=8, zero_stage=3, engine="torchtitan",
                               fsdp_reshard_after_forward="always")
    _, two_ends = model_state(PARAMS, BLOCK, ENDS, always, end_unit=ENDS / 2)
    assert two_ends == 2 * (BLOCK + ENDS / 2) + 6 * BLOCK
    # Ends smaller than a block: two blocks are the most gathered at once.
    _, small = model_state(PARAMS, BLOCK, ENDS, always, end_unit=BLOCK / 2)
    assert small == 2 * (2 * BLOCK) + 6 * BLOCK
    # A 16-bit model under FSDP2 with no mixed-precision policy reduces its bf16
    # gradients: a block's gradient and its reduce-scatter input, 2 + 2 bytes.
    bf16 = always.but(main_grads_dtype="bf16")
    state, reduced = model_state(PARAMS, BLOCK, ENDS, bf16, end_unit=ENDS / 2)
    assert reduced == 2 * (BLOCK + ENDS / 2) + 4 * BLOCK
    assert state.gradients == 2 * PARAMS / 8


def test_torchtitans_405b_run_is_not_predicted_at_a_third_of_its_memory() -> None:
    # TorchTitan's Llama 3.1 405B (FSDP8 x TP8 x PP8, 1F1B, full checkpointing, float8)
    # reserved 82.5 GiB per GPU; priced as Megatron would run the same degrees it was 32.8.
    model = get_preset("llama3-405b").model_copy(update={"seq_length": 8192})
    cluster = Cluster.load("dgx-h100").with_devices(512)
    knobs = dict(tensor=8, pipeline=8, data=8, zero_stage=3, recompute="full",
                 precision="fp8", fp8_recipe="tensorwise", micro_batch_size=1,
                 global_batch_size=64, sequence_parallel=True)
    titan = predict_step(model, cluster, ParallelConfig.of(engine="torchtitan", **knobs))
    assert titan.reserved_gib_per_gpu > 60
    assert titan.reserved_gib_per_gpu > 1.5 * predict_step(
        model, cluster, ParallelConfig.of(engine="tessel", **knobs)).memory_gib_per_gpu


def test_a_run_that_fits_allocated_but_not_reserved_is_flagged_not_refused() -> None:
    model = get_preset("llama3-8b")
    cluster = Cluster.load("dgx-h100").with_devices(8)
    knobs = dict(data=8, zero_stage=3, engine="torchtitan", recompute="selective",
                 global_batch_size=16, micro_batch_size=2)
    p = predict_step(model, cluster, ParallelConfig.of(**knobs))
    assert p.fits and not p.reserved_fits  # 79.6 GiB: about 73 allocated, 81 reserved
    assert p.memory_gib_per_gpu < 79.6 < p.reserved_gib_per_gpu
    assert sum(p.memory_breakdown_gib.values()) == pytest.approx(p.memory_gib_per_gpu)


def test_published_peak_memory_is_predicted_within_ten_percent() -> None:
    # Every row within 10% of what it measured, and every verdict right: the rows that ran
    # fit, the one out of memory does not, and Megatron-Bridge's Llama 3 70B SFT run, out
    # of memory through fragmentation in 30-60% of its runs, is flagged by its reserved
    # estimate (its CUDA graphs' pool beside the eager pool, `cost_models.graph_pool`).
    runs, skipped = read_runs()
    assert len(runs) + len(skipped) == 12 and not skipped
    for run in runs:
        result = predict(run)
        assert result.error is None or abs(result.error) <= 0.10, (run.line, result.error)
        assert result.verdict_ok, (run.line, run.name)
    bridge = next(predict(run) for run in runs if run.fragmentation)
    assert bridge.fits and not bridge.reserved_fits


def test_a_compiled_loss_keeps_the_bf16_logits() -> None:
    model = get_preset("llama3-8b")
    eager = ParallelConfig.of(engine="torchtitan", micro_batch_size=2)
    logits = model.seq_length * 2 * model.vocab_size
    head_input = 2 * model.seq_length * 2 * model.hidden_size
    # Eager: the fp32 log-softmax kept; the bf16 logits and their fp32 copy at the peak.
    assert loss_bytes(model, eager) == (4 * logits + head_input, 6 * logits)
    compiled = eager.but(compile_loss=True)
    assert loss_bytes(model, compiled) == (2 * logits + head_input, 2 * logits)


def test_a_chunked_loss_keeps_every_chunk_and_works_on_one() -> None:
    # torchtune's LinearCrossEntropyLoss in 8 chunks: each chunk's graph is kept for the
    # backward (the same bytes as one whole loss), which then walks them one at a time.
    model = get_preset("llama3-8b")
    logits = model.seq_length * 2 * model.vocab_size
    head_input = 2 * model.seq_length * 2 * model.hidden_size
    eager = ParallelConfig.of(engine="torchtitan", micro_batch_size=2, loss_chunks=8)
    assert loss_bytes(model, eager) == (4 * logits + head_input, 6 * logits / 8)
    compiled = eager.but(compile_loss=True)
    assert loss_bytes(model, compiled) == (2 * logits + head_input, 2 * logits / 8)


def test_torchtitans_fragmentation_is_their_fit_and_predicts_each_row_left_out() -> None:
    # FRAGMENTATION['torchtitan'] is the fit on TorchTitan's three dense Llama 3.1 8B rows;
    # refitted on two, it predicts the third's reserved peak within 10% too.
    rows = fragmentation_rows([predict(run) for run in read_runs()[0]])
    assert [row.run.line for row in rows] == [2, 3, 4]
    assert fragmentation_fit(rows) == pytest.approx(FRAGMENTATION["torchtitan"], abs=5e-4)
    held_out = fragmentation_leave_one_out()
    assert [run.line for run, _, _ in held_out] == [2, 3, 4]
    for run, shipped, left_out in held_out:
        assert shipped == pytest.approx(run.measured_gib, rel=0.10)
        assert left_out == pytest.approx(run.measured_gib, rel=0.10)
        assert left_out != shipped


def test_loss_parallelism_holds_four_fp32_copies_of_the_logits_shard() -> None:
    # DTensor's loss-parallel backward, (zeros_like(x) + exp(x)) * grad, beside the saved
    # fp32 log-probabilities: 16 bytes a logit of the rank's vocabulary shard at its peak.
    model = get_preset("llama3-70b")
    titan = ParallelConfig.of(engine="torchtitan", tensor=8, sequence_parallel=True,
                              micro_batch_size=16)
    logits = 16 * model.seq_length * model.vocab_size / 8
    head_input = 2 * 16 * model.seq_length * model.hidden_size
    assert loss_bytes(model, titan) == (4 * logits + head_input, 12 * logits)
    # Megatron-LM's vocab-parallel cross-entropy works in place.
    megatron = ParallelConfig.of(tensor=8, sequence_parallel=True, micro_batch_size=16)
    assert sum(loss_bytes(model, megatron)) < sum(loss_bytes(model, titan)) - 8 * logits
