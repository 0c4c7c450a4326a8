"""Analytical memory cost: model state and a device's peak by kind.

- Model state (weights, gradients, optimizer): Rajbhandari et al., "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models" (SC 2020), Sec. 5 and Table 1;
  Megatron-LM's `megatron/training/theoretical_memory_usage.py` for its own accounting.
- Activations per transformer layer are counted tensor by tensor in
  `cost_models/saved_activations.py` (Korthikanti et al.'s Table 2 for a GPT layer), and
  what differs by engine in `cost_models/engine_memory.py`.
- Micro-batches in flight per pipeline schedule are read off the schedule's actions
  (`cost_models.pipeline_schedule.in_flight`).

Every function is pure arithmetic on plain numbers. A plan whose `MemoryBreakdown` does not
`fit` the device is infeasible; callers must reject it rather than clamp anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cost_models.offload import OffloadBytes

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)

# Memory no formula above accounts for: the CUDA context and loaded kernel images
# (~0.5-1 GiB on Hopper), NCCL communicator buffers for the TP/PP/DP groups (~0.5-1 GiB),
# and caching-allocator fragmentation plus transient buffers (all-gather/reduce-scatter
# staging, cuBLAS workspaces). An engineering estimate, not a measurement; calibrate it.
FRAMEWORK_RESERVE_BYTES: float = 3 * 2**30


def _check_choice(name: str, value: object, valid: tuple) -> None:
    if value not in valid:
        names = ", ".join(repr(v) for v in valid)
        raise ValueError(f"Unknown {name} {value!r}; expected one of {names}.")


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model state held by one device."""

    weights: float
    """Low-precision (bf16/fp16) parameters used in forward and backward."""
    gradients: float
    """Gradients of those parameters (or Megatron's fp32 main grads)."""
    optimizer: float
    """fp32 master weights plus Adam's two moments (K = 12 bytes per parameter)."""
    experts: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Of the weights, gradients and optimizer state, the routed experts' bytes."""
    frozen: float = 0.0
    """Of the weights, those of a frozen base (LoRA, QLoRA), trained by no one."""
    total: float = field(init=False)
    """weights + gradients + optimizer."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.weights + self.gradients + self.optimizer)


@dataclass(frozen=True)
class StateElementBytes:
    """Bytes per parameter of each kind of model state, at a training precision."""

    params: int
    grads: int
    optimizer: int


def state_element_bytes(precision: str) -> StateElementBytes:
    """fp32 training: fp32 weights and gradients, Adam's two fp32 moments (4 + 4 + 8).
    Mixed precision (bf16, fp16, fp8 matmuls): 16-bit weights, Megatron-LM's fp32 main
    gradients, fp32 master weights and moments (2 + 4 + 12)."""
    if precision == "fp32":
        return StateElementBytes(params=4, grads=4, optimizer=8)
    return StateElementBytes(params=2, grads=4, optimizer=12)


def gradient_element_bytes(main_grads_dtype: str) -> int:
    """Bytes of one gradient element the optimizer reads and data parallelism reduces:
    fp32 main gradients, or 16-bit ones (Megatron-LM's --grad-reduce-in-bf16, FSDP2 with a
    bf16 reduce dtype)."""
    return 4 if main_grads_dtype == "fp32" else 2


def model_state_bytes(
    num_parameters: float,
    data_parallel: int,
    zero_stage: int,
    distributed_optimizer: bool = False,
    params_bytes: float = 2,
    grads_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> ModelStateBytes:
    """Weights, gradients and optimizer state of one rank, with Psi = `num_parameters`
    (those of one model-parallel rank: the caller divides by the tensor and pipeline
    degrees) and Nd = `data_parallel`, K = `optimizer_bytes` (ZeRO, Table 1):

    - stage 0 (plain data parallelism): (2 + 2 + K) Psi
    - stage 1 (optimizer state sharded): 2 Psi + 2 Psi + K Psi / Nd
    - stage 2 (+ gradients sharded):     2 Psi + (2 + K) Psi / Nd
    - stage 3 (+ weights sharded):       (2 + 2 + K) Psi / Nd

    `distributed_optimizer` (Megatron's `--use-distributed-optimizer`) shards the fp32
    master weights and Adam moments over data parallel ranks: it is ZeRO stage 1, and
    cannot be combined with stages 2 or 3.

    The defaults are ZeRO's accounting, 2 + 2 + 12 = 16 bytes per parameter, the figure
    the ZeRO paper and DESIGN.md use. Megatron-LM keeps fp32 main gradients unless
    `--grad-reduce-in-bf16`; pass `grads_bytes=4` for its own numbers, 18 bytes per
    parameter, or 6 + 12 / Nd with the distributed optimizer.
    """
    _check_choice("ZeRO stage", zero_stage, ZERO_STAGES)
    if data_parallel < 1:
        raise ValueError(f"data_parallel must be >= 1, got {data_parallel}")
    if num_parameters < 0:
        raise ValueError(f"num_parameters must be >= 0, got {num_parameters}")
    if distributed_optimizer:
        if zero_stage > 1:
            raise ValueError(
                f"distributed_optimizer is ZeRO stage 1; it cannot be combined with "
                f"zero_stage={zero_stage}"
            )
        zero_stage = 1

    def per_rank(first_sharding_stage: int) -> float:
        # Parameters' worth of a state on one rank: ZeRO partitions the optimizer state from
        # stage 1 on, the gradients from stage 2 and the weights from stage 3.
        sharded = zero_stage >= first_sharding_stage
        return num_parameters / data_parallel if sharded else num_parameters

    return ModelStateBytes(
        weights=params_bytes * per_rank(3),
        gradients=grads_bytes * per_rank(2),
        optimizer=optimizer_bytes * per_rank(1),
    )


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on one device of one pipeline stage."""

    weights: float
    """Parameters as the engine stores them (after ZeRO-3 / FSDP sharding, if any)."""
    gradients: float
    """Gradients (after ZeRO-2/3 sharding, if any)."""
    optimizer: float
    """fp32 master weights and Adam moments (after ZeRO / distributed-optimizer sharding)."""
    activations: float
    """Activations kept for backward at the peak, over all micro-batches in flight."""
    reserve: float
    """Memory outside the caching allocator (CUDA context, communicator buffers), or for
    the plans priced without the engines' rules a fixed framework overhead."""
    transient: float = 0.0
    """Working buffers alive at the peak: gathered weights and unsharded gradients, the
    loss's fp32 logits, a layer's backward gradients."""
    fragmentation: float = 0.0
    """What the caching allocator holds beyond the allocated peak."""
    graph_pool: float = 0.0
    """CUDA graphs' private pool, held beside the eager pool's reserved peak
    (`cost_models.graph_pool`)."""
    activation_kinds: tuple[tuple[str, float], ...] = ()
    """`activations` by kind (norm inputs, attention, mlp, ...), where the engine's rules
    counted them."""
    expert_state: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Of the weights, gradients and optimizer state, the routed experts' bytes."""
    frozen: float = 0.0
    """Of the weights, a frozen base's (LoRA, QLoRA): the rest are the adapters'."""
    host: float = 0.0
    """Host memory this GPU's offloaded state and activations take (`cost_models.offload`);
    not part of `total`."""
    nvme: float = 0.0
    """NVMe capacity its offloaded state takes; not part of `total`."""
    offloaded: OffloadBytes | None = None
    """What its offload keeps off the GPU and moves per step, or None."""
    total: float = field(init=False)
    """Everything that must fit: the allocated peak and the memory outside the allocator."""

    def __post_init__(self) -> None:
        parts = (self.weights, self.gradients, self.optimizer, self.activations,
                 self.transient, self.reserve)
        object.__setattr__(self, "total", sum(parts))

    @property
    def allocated(self) -> float:
        """Peak allocated bytes (what `torch.cuda.max_memory_allocated` reports)."""
        return self.total - self.reserve

    @property
    def reserved(self) -> float:
        """Bytes the caching allocator holds at that peak (`max_memory_reserved`), CUDA
        graphs' pool included."""
        return self.allocated + self.fragmentation + self.graph_pool

    def fits(self, capacity_bytes: float) -> bool:
        """Whether the peak fits in a device of `capacity_bytes` (e.g. memory_gib * 2**30)."""
        return self.total <= capacity_bytes

    def reserved_fits(self, capacity_bytes: float) -> bool:
        """Whether what the allocator reserves fits too; a run that fits allocated but not
        reserved may run out of memory through fragmentation."""
        return self.reserved + self.reserve <= capacity_bytes


def breakdown_gib(peak: MemoryBreakdown, by_kind: bool = True) -> dict[str, float]:
    """`peak` by kind in GiB, activations split by the kinds counted (`by_kind`) or whole,
    the routed experts' weights, gradients and optimizer state apart from the rest's."""
    experts = dict(zip(("weights", "gradients", "optimizer"), peak.expert_state))
    parts = {kind: total - experts[kind] for kind, total in (
        ("weights", peak.weights), ("gradients", peak.gradients),
        ("optimizer", peak.optimizer))}
    if any(peak.expert_state):
        parts |= {f"experts' {kind}": bytes_ for kind, bytes_ in experts.items()}
    if peak.frozen:
        parts = {"frozen weights": peak.frozen,
                 "adapters": parts.pop("weights") - peak.frozen,
                 **{f"adapters' {kind}": parts.pop(kind) for kind in ("gradients", "optimizer")},
                 **parts}
    if peak.activation_kinds and by_kind:
        parts |= {f"activations: {kind}": bytes_ for kind, bytes_ in peak.activation_kinds}
    else:
        parts["activations"] = peak.activations
    parts |= {"working buffers": peak.transient, "outside the allocator": peak.reserve}
    return {kind: bytes_ / 2**30 for kind, bytes_ in parts.items()}
