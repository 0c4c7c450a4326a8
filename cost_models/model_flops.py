"""The FLOPs of one training step: the model's (3x the forward, as Megatron-LM and MFU
count them: Narayanan et al. 2021, Appendix) and those the GPUs execute, replayed forwards
included. Each kind of block is counted as `transformer_ops` lists its kernels; the
multi-token-prediction layers and the output layer's logits too."""

from __future__ import annotations

from cost_models.identity_memo import IdentityMemo
from cost_models.layer_mix import layer_variants
from cost_models.transformer_ops import (
    forward_flops,
    head_ops,
    layer_ops,
    mtp_ops,
    selective_kernels,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.cluster import DeviceSpec
from planner.vocabulary.parallel import Engine, ParallelConfig, Precision


def step_flops(model: TransformerConfig, parallel: ParallelConfig,
               replays: int) -> tuple[float, float]:
    """(model FLOPs, executed FLOPs) of one step on the whole cluster, `replays` layers of
    each model replica replaying their forward (or attention core) in backward."""
    sequences = parallel.batch.global_batch_size
    layer, selective, forward = _sequence_flops(model, parallel.execution.engine,
                                                parallel.recomputation.recompute_modules)
    replay = {"none": 0.0, "selective": selective, "full": layer}[parallel.recomputation.recompute]
    return 3 * sequences * forward, 3 * sequences * forward + sequences * replays * replay


_FLOPS: IdentityMemo[tuple[float, float, float]] = IdentityMemo(10_000)
"""`_sequence_flops` by model, engine and modules: every layout a search prices asks it."""


def _sequence_flops(model: TransformerConfig, engine: Engine, modules: tuple[str, ...]
                    ) -> tuple[float, float, float]:
    """(one mean layer's forward, what selective recomputation replays of it, the whole
    forward) FLOPs of one sequence."""
    return _FLOPS.get((model,), (engine, modules),
                      lambda: _count_sequence_flops(model, engine, modules))


def _count_sequence_flops(model: TransformerConfig, engine: Engine, modules: tuple[str, ...]
                          ) -> tuple[float, float, float]:
    """`_sequence_flops`, counted."""
    layer = selective = 0.0
    for variant, share in layer_variants(model):
        ops = layer_ops(variant, 1, model.seq_length, 1, False)
        layer += share * forward_flops(ops)
        selective += share * forward_flops(selective_kernels(variant, ops, engine, modules))
    head = forward_flops(head_ops(model, 1, model.seq_length, 1))
    return (layer, selective, model.num_layers * layer + head + mtp_flops(model))


def mtp_flops(model: TransformerConfig) -> float:
    """Forward FLOPs of one sequence through the multi-token-prediction layers."""
    return model.mtp_num_layers * forward_flops(mtp_ops(model, 1, model.seq_length, 1))


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
    """MFU: the model FLOPs of one step (`model_flops`: 3 x the forward's, no
    recomputation, as `step_flops` counts them) per second per GPU over the device's dense
    peak at the matmul precision (`peak_flops`). The definition of Chowdhery et al.,
    "PaLM" (arXiv 2204.02311), Appendix B, which nanoGPT's `estimate_mfu` cites; Megatron-LM
    reports the same ratio from Narayanan et al. (SC 2021), Appendix. Every MFU Tessel
    prints (the transformer plans' `predict_step`, the graph plans') is this. The FLOPs
    are the caller's count: the transformer plans' are the matmuls' and attention's
    (`step_flops`); the graph plans' are the traced forward's (`ModelLayers.flops`), which
    also charges each elementwise op one FLOP per output element."""
    return model_flops / step_s / num_gpus / peak_flops(device, precision)
