"""TorchTitan's step as TorchTitan runs it: its eager or compiled kernels, PyTorch's
attention kernel, FSDP2's per-block overlap, float8's casts, the GPU it ran on; and its
published throughput predicted within 15%, each row held out."""

from __future__ import annotations

import pytest

from cost_models.data_parallel import data_parallel_comm, fsdp2_comm
from cost_models.kernel_time import Pass
from cost_models.published_memory import (
    SPEED_FITTED,
    read_speed_runs,
    speed_leave_one_out,
)
from cost_models.step_time import _price_head
from cost_models.torchtitan_kernels import (
    SDPA_FLASH_OVER_CUDNN,
    fp8_weight_casts,
    torchtitan_efficiency,
    torchtitan_head_ops,
    torchtitan_layer_ops,
)
from cost_models.transformer_ops import Memory, layer_ops
from planner.models.presets import get_preset
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

MODEL = get_preset("llama3-8b").model_copy(update={"seq_length": 8192})


def _bytes(ops: list) -> float:
    return sum(op.bytes for op in ops if isinstance(op, Memory))


def test_torchtitans_published_runs_are_predicted_within_fifteen_percent() -> None:
    rows = speed_leave_one_out()
    assert len(rows) == 2
    for speed, shipped, held_out in rows:
        assert shipped == pytest.approx(speed.tokens_per_s_per_gpu, rel=0.15)
        assert held_out == pytest.approx(speed.tokens_per_s_per_gpu, rel=0.15)


def test_nothing_is_fitted_to_the_rows_so_each_is_held_out_as_shipped() -> None:
    assert SPEED_FITTED == ()
    assert all(shipped == held for _, shipped, held in speed_leave_one_out())


def test_the_rows_run_on_torchtitans_500_w_hbm2e_h100s() -> None:
    for speed in read_speed_runs():
        device = speed.run.cluster.device
        assert (device.memory_bandwidth_gbs, device.power_limit_w, device.rated_power_w) \
            == (2400, 500, 700)


def test_eager_pytorch_moves_the_bytes_of_every_unfused_kernel() -> None:
    # Llama 3.1 8B, one rank, per token: two eager RMSNorms (36 bytes an element), two
    # residual adds (6), rotary on q and k (20), k and v repeated to the 32 query heads
    # (read 2 per kv element, write 2 per q element), SwiGLU's silu and product (10).
    h, q, kv, f = 4096, 4096, 1024, 14336
    eager = torchtitan_layer_ops(MODEL, 1, 1, 1, False)
    assert _bytes(eager) == 2 * 36 * h + 2 * 6 * h + 20 * (q + kv) + 2 * (2 * kv + 2 * q) \
        + 10 * f
    # Compiled, each chain between two GEMMs is one kernel: the norm (4), the residual add
    # with the next norm (8), the last add (6), rotary q (4), rotary and repeat k, repeat v,
    # SwiGLU (6).
    compiled = torchtitan_layer_ops(MODEL, 1, 1, 1, False, compiled=True)
    assert _bytes(compiled) == (4 + 8 + 6) * h + 4 * q + 2 * (2 * kv + 2 * q) + 6 * f
    # Transformer Engine's fused kernels, as Megatron-LM runs them: unchanged.
    assert _bytes(layer_ops(MODEL, 1, 1, 1, False)) == (4 + 6 + 4 + 6) * h + 6 * f
    assert len([op for op in eager if isinstance(op, Memory)]) == 2 * 8 + 2 + 6 + 2 + 2


def test_torchtitan_runs_the_same_gemms_and_attention_as_megatron() -> None:
    for compiled in (False, True):
        titan = torchtitan_layer_ops(MODEL, 2, 8192, 2, True, compiled=compiled)
        assert [op for op in titan if not isinstance(op, Memory)] == \
            [op for op in layer_ops(MODEL, 2, 8192, 2, True) if not isinstance(op, Memory)]


def test_the_eager_loss_casts_the_logits_to_fp32_and_passes_them_four_times() -> None:
    logits = 2 * 8192 * MODEL.vocab_size
    head = torchtitan_head_ops(MODEL, 2, 8192, 1)
    losses = [op for op in head if op.name.startswith("cross entropy")]
    assert _bytes(losses) == (2 + 4) * logits + (3 * 4 + 4) * logits + 4 * 2 * 8192
    compiled = torchtitan_head_ops(MODEL, 2, 8192, 1, compiled_loss=True)
    assert _bytes([op for op in compiled if op.name == "cross entropy"]) == 4 * logits


def test_torchtitans_output_layer_stays_bf16_under_float8() -> None:
    device = Cluster.load("dgx-h100").device
    knobs = dict(engine="torchtitan", data=8, zero_stage=3, micro_batch_size=2)
    bf16 = _price_head(MODEL, ParallelConfig.of(**knobs), device, 1)
    fp8 = _price_head(MODEL, ParallelConfig.of(**knobs, precision="fp8"), device, 1)
    assert fp8 == bf16
    megatron = dict(data=8, micro_batch_size=2)
    assert _price_head(MODEL, ParallelConfig.of(**megatron, precision="fp8"), device, 1) \
        .total < _price_head(MODEL, ParallelConfig.of(**megatron), device, 1).total


def test_pytorchs_attention_kernel_is_flashattention2_where_te_runs_cudnns() -> None:
    eff = Cluster.load("dgx-h100").device.efficiency
    assert torchtitan_efficiency(eff, cudnn_attention=True).attention == pytest.approx(
        eff.attention * SDPA_FLASH_OVER_CUDNN)
    assert torchtitan_efficiency(eff, cudnn_attention=False) == eff


def test_float8_weights_are_cast_whole_or_as_the_shard_fsdp_gathers() -> None:
    ops = layer_ops(MODEL, 1, 1, 1, False)
    weights = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert _bytes(fp8_weight_casts(ops, 8, gathered_fp8=False)) == 5 * weights
    assert _bytes(fp8_weight_casts(ops, 8, gathered_fp8=True)) == 5 * weights / 8


def _fsdp(**knobs) -> ParallelConfig:
    return ParallelConfig.of(engine="torchtitan", data=8, zero_stage=3, micro_batch_size=2,
                             global_batch_size=16, **knobs).resolve(8)


def test_fsdp2_hides_each_blocks_collectives_behind_the_blocks_compute() -> None:
    cluster = Cluster.load("dgx-h100").with_devices(8)
    params, block, layers = 8.03e9, 2.18e8, 32
    busy = Pass(0.015, 0.030, 0.005)
    exposed = fsdp2_comm(params, block, _fsdp(), cluster, busy, layers, layers)
    bare = fsdp2_comm(params, block, _fsdp(), cluster, Pass(0.0, 0.0), layers, layers)
    # Without compute to hide behind, every gather and reduce-scatter is exposed.
    assert bare > 2.5 * exposed
    # What Megatron-LM's path would leave exposed without overlap: all of it.
    megatron = data_parallel_comm(params, ParallelConfig.of(
        data=8, zero_stage=3, micro_batch_size=2, global_batch_size=16).resolve(8),
        cluster, busy, layers, layers)
    assert exposed < megatron
    # The float8 all-gather moves one byte a weight, not two.
    fp8 = _fsdp(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    assert fsdp2_comm(params, block, fp8, cluster, busy, layers, layers) < exposed
    assert data_parallel_comm(params, _fsdp(), cluster, busy, layers, layers, block) == exposed
