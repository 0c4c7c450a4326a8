"""How far below its datasheet a device runs, as a handful of fitted numbers.

Peak FLOP/s and bandwidths come from datasheets (the cluster presets); what real kernels
reach is lower, and lower still for small or skinny shapes. These parameters describe that
gap, and are what `cost_models/efficiency_fit.py` fits to measured step times: a preset ships
them fitted (A100, on vTrain's single-node measurements) or at the defaults below, which
are typical of large-model training on NVIDIA GPUs (Megatron-LM reports 50-60% of peak
end to end for GPT-3-sized models; Narayanan et al. 2021, Table 1).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Efficiency(BaseModel):
    """Achieved fractions of a device's peaks, and fixed per-kernel costs.

    The fractions (`matmul`, `fp8_matmul`, `attention`, `memory`, `intra_node_bandwidth`,
    `inter_node_bandwidth`) lie in (0, 1], `overlap_slowdown` in [0, 1]; `matmul_half_dim`
    (a matmul dimension) and the `*_us` costs (microseconds) are finite and >= 0. Infinite
    and NaN values are rejected.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    matmul: float = Field(
        default=0.80, gt=0, le=1,
        description="Fraction of peak FLOP/s a large dense matmul reaches.",
    )
    fp8_matmul: float = Field(
        default=0.65, gt=0, le=1,
        description="Fraction of the fp8 peak a large fp8 matmul reaches: less than "
        "matmul's of the 16-bit peak, as fp8 GEMMs are more often bound by memory and by "
        "their scaling epilogues.",
    )
    matmul_half_dim: float = Field(
        default=96.0, ge=0,
        description="Matmul dimension at which that dimension alone halves the efficiency: "
        "efficiency = matmul * prod(d / (d + matmul_half_dim)) over (m, n, k), so small or "
        "skinny matmuls run far below peak.",
    )
    attention: float = Field(
        default=0.55, gt=0, le=1,
        description="Fraction of peak FLOP/s fused (flash) attention reaches.",
    )
    sink_attention: float = Field(
        default=1.0, gt=0, le=1,
        description="Fraction of fused attention's efficiency that attention with learned "
        "softmax offsets (attention sinks, --softmax-type learnable: GPT-OSS) reaches. "
        "FlashAttention has no sink kernels; Transformer Engine runs them in "
        "cuDNN's sink kernels (TE 2.8, PR #2148: cuDNN 9.13.1 and later, 16-bit only, so "
        "fp8 attention falls back) or in its unfused attention where cuDNN is older (TE "
        "issue #2318). Fitted to the published MoE runs (cost_models/moe_calibration.py).",
    )
    memory: float = Field(
        default=0.75, gt=0, le=1,
        description="Fraction of memory bandwidth that elementwise and normalization "
        "kernels reach.",
    )
    kernel_overhead_us: float = Field(
        default=4.0, ge=0,
        description="Fixed GPU time per kernel (ramp-up and tail), in microseconds.",
    )
    dispatch_us: float = Field(
        default=0.0, ge=0,
        description="Host time to launch one kernel, in microseconds. The host runs ahead "
        "of the GPU, so a pass of kernels takes its GPU time or its launch time, whichever "
        "is longer: small kernels are bound by the host.",
    )
    collective_overhead_us: float = Field(
        default=0.0, ge=0,
        description="Time per collective call beyond its link latencies, per level of a "
        "synchronization tree (x ceil(log2 group size)): launching and waiting for the "
        "slowest rank, in microseconds.",
    )
    overlap_slowdown: float = Field(
        default=0.1, ge=0, le=1,
        description="Compute time lost per second of communication hidden beside it: "
        "NCCL's and userbuffers' kernels take SMs and memory bandwidth from the matmuls "
        "they overlap (NCCL runs a CTA per channel, of the order of a tenth of an H100's "
        "132 SMs; Rashidi et al., ISCA 2021, measure such interference).",
    )
    expert_matmul: float = Field(
        default=1.0, gt=0, le=1,
        description="Fraction of a dense matmul's efficiency (at the same shape) that the "
        "grouped GEMM of a rank's experts reaches: Transformer Engine's GroupedLinear runs "
        "one GEMM per local expert on several streams, whose shapes vary with the routing. "
        "The published MoE runs (cost_models/moe_calibration.py) put it at 1 on Hopper "
        "(bf16, fp8) and Blackwell (MXFP8) alike once attention sinks are priced.",
    )
    alltoall_bandwidth: float = Field(
        default=1.0, gt=0, le=1,
        description="Fraction of the bandwidth ring collectives reach on a link that MoE "
        "dispatch all-to-alls reach (many small messages to every peer; nccl-tests report "
        "all-to-all below all-gather across nodes). Fitted to the published MoE runs.",
    )
    moe_sync_us: float = Field(
        default=0.0, ge=0,
        description="Host time left exposed per local expert of an MoE layer's forward when "
        "its dispatcher waits for the tokens per expert (Megatron-Core's alltoall and flex "
        "dispatchers copy the counts to the host; the GPU then idles while the host "
        "launches the experts' GEMMs, one per local expert), in microseconds. Not under "
        "CUDA graphs. Fitted to the published MoE runs.",
    )
    intra_node_bandwidth: float = Field(
        default=0.80, gt=0, le=1,
        description="Fraction of the scale-up link bandwidth collectives reach (NCCL's "
        "bus bandwidth over the datasheet's).",
    )
    inter_node_bandwidth: float = Field(
        default=0.80, gt=0, le=1,
        description="Fraction of the scale-out bandwidth per device collectives reach.",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_fields(cls, values: Any) -> Any:
        # `layer_overhead_us`, a per-layer residual of the Blackwell dense fit, was retired
        # when Blackwell's fp8 GEMM rate was fitted in its place (issue 43); a cluster file
        # written before still loads, the residual no longer charged.
        return without_retired(values, "layer_overhead_us")

    def matmul_fraction(self, m: float, n: float, k: float, fp8: bool = False) -> float:
        """Fraction of peak a matmul of shape (m x k) @ (k x n) reaches (of the fp8 peak
        for an fp8 matmul)."""
        fraction = self.fp8_matmul if fp8 else self.matmul
        for d in (m, n, k):
            fraction *= d / (d + self.matmul_half_dim)
        return fraction


def without_retired(values: Any, *fields: str) -> Any:
    """A config's raw `values` less the retired `fields` (a `mode="before"` validator's
    input: a dict, or anything pydantic will reject by itself)."""
    if not isinstance(values, dict):
        return values
    return {k: v for k, v in values.items() if k not in fields}
