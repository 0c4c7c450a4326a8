"""How long kernels take on a device: the roofline of one kernel, its backward, and a
pass of kernels launched by the host.

Each kernel takes its FLOPs over the device's peak at the matmul precision times an
efficiency that falls for small or skinny matmuls, or its bytes over the HBM bandwidth,
plus a fixed per-kernel cost (`planner/vocabulary/efficiency.py`); the backward runs each matmul
twice (input and weight gradients), attention's backward is 2.5x its forward
(FlashAttention-2's count), memory kernels move twice the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.vocabulary.efficiency import Efficiency
from cost_models.power import clock_fraction
from cost_models.transformer_ops import ACTIVATION_BYTES, Attention, Matmul, Memory, Op
from planner.vocabulary.cluster import DeviceSpec

# FlashAttention-2's backward does 2.5x the forward's matmul FLOPs (Dao 2023, Sec. 3.1).
ATTENTION_BACKWARD_FACTOR = 2.5
EXPERT_GEMMS = ("expert input", "expert output")
"""The grouped GEMMs of a rank's routed experts (`transformer_ops._mlp_ops`)."""


def kernel_seconds(
    op: Op, device: DeviceSpec, efficiency: Efficiency, precision: str = "bf16"
) -> float:
    """Forward time of one kernel; matmuls run at the `precision` peak (fp8 matmuls, as
    Transformer Engine runs them), attention and memory kernels in bf16, or in fp16 on a
    device without bf16 (a V100), where mixed precision is fp16 throughout."""
    peaks = device.peak_tflops
    # Compute peaks at the clock a power cap leaves (`cost_models.power`; 1 without one).
    clock = clock_fraction(device)
    peak = peaks.get("bf16", peaks.get("fp16", peaks["fp32"])) * 1e12 * clock
    bandwidth = device.memory_bandwidth_gbs * 1e9 * efficiency.memory
    overhead = efficiency.kernel_overhead_us * 1e-6 * getattr(op, "launches", 1)
    if isinstance(op, Memory):
        return op.bytes / bandwidth + overhead
    if isinstance(op, Attention):
        work = op.flops / 2 if op.causal else op.flops  # causal kernels skip masked blocks
        return work / (peak * efficiency.attention) + overhead
    if op.name in ("scores", "context"):
        precision = "bf16"  # attention multiplies activations in 16 bits, fp8 or not
    matmul_peak = peaks[precision] * 1e12 * clock if precision in peaks else peak
    fp8 = precision == "fp8" and "fp8" in device.peak_tflops
    fraction = efficiency.matmul_fraction(op.m, op.n, op.k, fp8)
    if op.name in EXPERT_GEMMS:
        fraction *= efficiency.expert_matmul
    compute = op.flops / (matmul_peak * fraction)
    traffic = (op.m * op.k + op.k * op.n + op.m * op.n) * op.count * ACTIVATION_BYTES
    return max(compute, traffic / bandwidth) + overhead


def backward_seconds(
    op: Op, device: DeviceSpec, efficiency: Efficiency, precision: str = "bf16"
) -> float:
    """Backward time of one kernel: input and weight gradients of a matmul, attention's
    backward kernel, twice the bytes of a memory kernel."""
    if isinstance(op, Matmul):
        grad_input = Matmul(op.name, op.m, op.k, op.n, op.count, op.launches)
        return kernel_seconds(grad_input, device, efficiency, precision) + \
            weight_gradient_seconds(op, device, efficiency, precision)
    if isinstance(op, Attention):
        scaled = Attention(op.name, op.flops * ATTENTION_BACKWARD_FACTOR, op.causal)
        return kernel_seconds(scaled, device, efficiency)
    return kernel_seconds(Memory(op.name, 2 * op.bytes, op.launches), device, efficiency)


def weight_gradient_seconds(
    op: Op, device: DeviceSpec, efficiency: Efficiency, precision: str = "bf16"
) -> float:
    """The second product of a matmul's backward, its right operand's gradient (left
    operand^T x output gradient: k x n over the m rows; a projection's weight gradient);
    0 for other kernels. Transformer Engine runs a projection's apart from its input
    gradient where weight gradients are delayed (--delay-wgrad-compute)."""
    if not isinstance(op, Matmul):
        return 0.0
    return kernel_seconds(Matmul(op.name, op.k, op.n, op.m, op.count, op.launches), device,
                          efficiency, precision)


def pass_seconds(
    ops: list[Op], device: DeviceSpec, efficiency: Efficiency, precision: str = "bf16",
    backward: bool = False, graphed: bool = False,
) -> float:
    """Time of the forward (or backward) kernels of `ops` in sequence: the GPU's time, or
    the host's time to launch them when that is longer (eager PyTorch enqueues kernels
    asynchronously, so the two overlap and the slower one sets the pace). `graphed`
    kernels replay from a CUDA graph, one launch for all of them: the GPU's time."""
    timer = backward_seconds if backward else kernel_seconds
    gpu = sum(timer(op, device, efficiency, precision) for op in ops)
    if graphed:
        return gpu
    launches = sum((2 if backward and isinstance(op, Matmul) else 1) * getattr(op, "launches", 1)
                   for op in ops)
    return max(gpu, launches * efficiency.dispatch_us * 1e-6)


@dataclass(frozen=True)
class Pass:
    """Forward and backward time of some kernels, and the forward replayed in backward."""

    forward: float
    backward: float
    recompute: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    def __add__(self, other: Pass) -> Pass:
        return Pass(self.forward + other.forward, self.backward + other.backward,
                    self.recompute + other.recompute)

    def scaled(self, factor: float) -> Pass:
        """Every phase times `factor`."""
        return Pass(self.forward * factor, self.backward * factor, self.recompute * factor)
