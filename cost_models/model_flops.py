"""The FLOPs of one training step, counted two ways.

- **Model FLOPs** (`megatron_flops_per_token`): what Megatron-LM's
  `num_floating_point_operations` counts, the numerator of the model TFLOP/s and MFU that
  Megatron-LM logs and NeMo, Megatron-Bridge and Megatron-MoE-ModelZoo publish. It is a
  closed form over the model's shape, as nanoGPT's `estimate_mfu` is: no recomputation,
  the causal attention scores counted once over their unmasked half, no router.
- **Executed (hardware) FLOPs** (`step_flops`'s second number): the matmuls and attention
  of the kernels Tessel prices (`transformer_ops`), as they run: causal attention over its
  unmasked half (FlashAttention's kernels skip the masked blocks, as `kernel_time` prices
  them), a sliding window over its band, the router, the multi-token-prediction layers, and
  the forwards that recomputation replays in backward. A backward counts twice its
  forward, as Narayanan et al. 2021 (Appendix) count it; FlashAttention's backward also
  recomputes the scores (2.5x, which `kernel_time` prices in time), which is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.identity_memo import IdentityMemo
from cost_models.layer_mix import layer_variants
from cost_models.transformer_ops import (
    Attention,
    Memory,
    Op,
    head_ops,
    layer_ops,
    mtp_ops,
    selective_kernels,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.cluster import DeviceSpec
from planner.vocabulary.parallel import Engine, ParallelConfig, Precision

MODEL_FLOPS_COUNT = "megatron-lm causal"
"""How the transformer plans count model FLOPs (`Predicted.flops_count`):
`megatron_flops_per_token`, Megatron-LM's count with the causal halving."""
TRACED_FLOPS_COUNT = "traced"
"""How the graph plans count them: 3x the traced forward's FLOPs (`ModelLayers.flops`),
matmuls and elementwise ops alike, attention as the traced graph computes it."""


def megatron_flops_per_token(model: TransformerConfig, causal: bool = True) -> float:
    """Model FLOPs of one token of a training step (forward, data and weight gradients) as
    Megatron-LM's `num_floating_point_operations` counts them for full-length sequences
    (its BSHD default): megatron/training/training.py, `transformer_flops`, at d98e8a64dd.
    The core-attention term (QK^T and softmax x V) is halved for the causal mask since
    8873b55d6a ("Fixes in number of floating-point operation estimates for MoE and attention
    layer", 2025-03-06); `causal=False` counts the full score matrix as before, which for a
    dense model without MTP is Narayanan et al.'s 72 B s l h^2 (1 + s/6h + V/12hl) per step
    (the count Megatron-Core's July 2024 H100 table was published with). As that formula
    does: the MTP layers count as blocks of the last layer's kind with their norms ("3h")
    and 2h -> h projection, each with its own logits; MLA's latent norms count as one more
    row of their up projections ("+ 1"); sliding-window layers count as full attention;
    the router, norms, biases and softmax count nothing; the vocabulary is `vocab_size`,
    the padded rows of the embedding (Tessel reads --vocab-size padded as Megatron-LM pads
    it)."""
    h, s, heads, mtp = model.hidden_size, model.seq_length, model.num_attention_heads, \
        model.mtp_num_layers
    fma = 3 * 2  # forward, data and weight gradients; a multiply-add is two FLOPs
    glu = 3 if model.activation == "swiglu" else 2  # gate and up (or up alone), and down
    layers = model.num_layers + mtp
    moe = sum(n for kind, n in model.kind_counts() if kind.moe) + mtp * model.mtp_kind().moe
    if model.multi_latent_attention:
        rank, rope = model.q_lora_rank, model.qk_pos_emb_head_dim
        query = h * model.query_width if rank is None else rank * (h + model.query_width + 1)
        key_value = model.kv_lora_rank * (h + heads * (model.qk_head_dim + model.v_head_dim) + 1)
        projections = query + key_value + h * rope + model.value_width * h
    else:
        kv = model.num_kv_heads * model.head_dim
        projections = h * (model.query_width + 2 * kv) + model.query_width * h
    # QK^T and softmax x V: each query against s keys, half of them under the causal mask.
    core = s * (model.query_width + model.value_width) / (2 if causal else 1)
    shared = model.moe_shared_expert_intermediate_size or 0
    mlp = glu * h * ((layers - moe) * model.ffn_size
                     + moe * (model.moe_top_k * model.expert_ffn_size + shared))
    mtp_extra = mtp * (3 * h + 2 * h * h)
    logits = h * model.vocab_size * (mtp + 1)
    return fma * (layers * (projections + core) + mlp + mtp_extra + logits)


def step_flops(model: TransformerConfig, parallel: ParallelConfig,
               replays: int) -> tuple[float, float]:
    """(model FLOPs, executed FLOPs) of one step on the whole cluster: Megatron-LM's count
    of the batch's tokens (`megatron_flops_per_token`), and the kernels' (3x each forward,
    plus `replays` layers of each model replica replaying their forward, or what selective
    recomputation replays of it, in backward)."""
    sequences = parallel.batch.global_batch_size
    layer, selective, forward = _sequence_flops(model, parallel.execution.engine,
                                                parallel.recomputation.recompute_modules)
    replay = {"none": 0.0, "selective": selective, "full": layer}[parallel.recomputation.recompute]
    model_flops = sequences * model.seq_length * megatron_flops_per_token(model)
    return model_flops, 3 * sequences * forward + sequences * replays * replay


_FLOPS: IdentityMemo[tuple[float, float, float]] = IdentityMemo(10_000)
"""`_sequence_flops` by model, engine and modules: every layout a search prices asks it."""


def _sequence_flops(model: TransformerConfig, engine: Engine, modules: tuple[str, ...]
                    ) -> tuple[float, float, float]:
    """(one mean layer's forward, what selective recomputation replays of it, the whole
    forward) executed FLOPs of one sequence."""
    return _FLOPS.get((model,), (engine, modules),
                      lambda: _count_sequence_flops(model, engine, modules))


def _count_sequence_flops(model: TransformerConfig, engine: Engine, modules: tuple[str, ...]
                          ) -> tuple[float, float, float]:
    """`_sequence_flops`, counted."""
    layer = selective = 0.0
    for variant, share in layer_variants(model):
        ops = layer_ops(variant, 1, model.seq_length, 1, False)
        layer += share * executed_flops(ops)
        selective += share * executed_flops(selective_kernels(variant, ops, engine, modules))
    head = executed_flops(head_ops(model, 1, model.seq_length, 1))
    mtp = model.mtp_num_layers * executed_flops(mtp_ops(model, 1, model.seq_length, 1))
    return layer, selective, model.num_layers * layer + head + mtp


def executed_flops(ops: list[Op]) -> float:
    """FLOPs the matmuls and attention of a kernel list execute: a causal attention
    kernel's unmasked half (its blocks above the diagonal are skipped, as
    `kernel_time.kernel_seconds` prices it), every other kernel's `flops`; memory kernels
    count 0."""
    return sum(op.flops / 2 if isinstance(op, Attention) and op.causal else op.flops
               for op in ops if not isinstance(op, Memory))


def peak_flops(device: DeviceSpec, precision: Precision) -> float:
    """FLOP/s of `device`'s dense peak at the matmul `precision`. A precision its datasheet
    lists no peak for is measured against its fp32 peak: the one fallback
    `DeviceSpec.peak_tflops` documents ("the fallback for dtypes not listed"), as the
    roofline (`cost_models.compute.op_time`) prices such ops. The search and `predict`
    refuse a precision the device has no peak for, so only direct callers reach it."""
    peaks = device.peak_tflops
    return peaks.get(precision, peaks["fp32"]) * 1e12


def model_flops_utilization(model_flops: float, step_s: float, num_gpus: int,
                            device: DeviceSpec, precision: Precision) -> float:
    """MFU: the model FLOPs of one step per second per GPU over the device's dense peak at
    the matmul precision (`peak_flops`). The definition of Chowdhery et al., "PaLM" (arXiv
    2204.02311), Appendix B, which nanoGPT's `estimate_mfu` cites; Megatron-LM reports the
    same ratio from Narayanan et al. (SC 2021), Appendix. Every MFU Tessel prints (the
    transformer plans' `predict_step`, the graph plans') is this. The FLOPs are the
    caller's count: the transformer plans' are Megatron-LM's (`megatron_flops_per_token`,
    `MODEL_FLOPS_COUNT`); the graph plans' are the traced forward's (`ModelLayers.flops`),
    which also charges each elementwise op one FLOP per output element."""
    return model_flops / step_s / num_gpus / peak_flops(device, precision)


def mixed_flops_utilization(model_flops: float, step_s: float,
                            devices: Sequence[tuple[int, DeviceSpec]],
                            precision: Precision) -> float:
    """MFU over devices of several kinds (`devices`: how many of each): the same ratio as
    `model_flops_utilization`, over the summed dense peaks of every device at `precision`
    (a pipeline across pools of a mixed cluster)."""
    return model_flops / step_s / sum(count * peak_flops(device, precision)
                                      for count, device in devices)
