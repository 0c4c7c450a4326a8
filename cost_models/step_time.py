"""Step time, throughput and memory of one Megatron-LM training configuration.

The model of a step, per GPU:

- each kernel of a layer (`cost_models/transformer_ops.py`) takes its FLOPs over the
  device's bf16 peak times an efficiency that falls for small or skinny matmuls, or its
  bytes over the HBM bandwidth, plus a fixed launch cost (`cost_models/efficiency.py`);
  the backward runs each matmul twice (input and weight gradients), attention's backward
  is 2.5x its forward (FlashAttention-2's count), memory kernels move twice the bytes;
- tensor parallelism adds two all-reduces per layer in the forward and two in the backward
  (Shoeybi et al. 2019), or the same volume as all-gathers and reduce-scatters with
  sequence parallelism (Korthikanti et al. 2022); they are not overlapped;
- recomputation replays the forward of each layer (full) or of its attention (selective)
  inside the backward;
- the pipeline runs m micro-batches through p stages: sum of stage times + (m - 1) x the
  slowest (Alpa's stage latency formula; the 1F1B and GPipe bubble), (m + (p - 1) / v) x
  the slowest for the interleaved schedule with v chunks (Narayanan et al. 2021);
- data-parallel gradient reduction (fp32 main gradients, as Megatron-LM keeps them) runs
  after the last backward, or hides behind the last micro-batch's backward with
  `overlap_grad_reduce`, exposed only where it is longer; then the Adam update, bound by
  memory bandwidth.

Ranks are laid out as Megatron-LM's default order: tensor fastest, then context, data,
pipeline; so tensor groups stay in a node and pipeline neighbours are far apart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cost_models import memory
from cost_models.comm import group_collective_time
from cost_models.efficiency import Efficiency
from cost_models.transformer_ops import (
    ACTIVATION_BYTES,
    Attention,
    Matmul,
    Memory,
    Op,
    forward_flops,
    head_ops,
    layer_ops,
)
from planner.cluster import Cluster, DeviceSpec
from planner.models.config import TransformerConfig
from planner.parallel import ParallelConfig

# FlashAttention-2's backward does 2.5x the forward's matmul FLOPs (Dao 2023, Sec. 3.1).
ATTENTION_BACKWARD_FACTOR = 2.5
# Bytes the Adam update reads and writes per parameter: fp32 weight, two moments and the
# fp32 gradient read, the weight and moments written, the bf16 copy written.
ADAM_BYTES_PER_PARAMETER = 4 * 4 + 3 * 4 + 2
MAIN_GRAD_BYTES = 4


@dataclass(frozen=True)
class StepPrediction:
    """What one configuration is predicted to do. Times are seconds per optimizer step."""

    step_time_s: float
    """Wall time of one optimizer step."""
    compute_s: float
    """Kernel time of the slowest pipeline stage over all its micro-batches."""
    tensor_parallel_comm_s: float
    """Tensor- and context-parallel communication of that stage (not overlapped)."""
    pipeline_comm_s: float
    """Point-to-point activation and gradient transfers of that stage."""
    bubble_s: float
    """Time stages wait for each other while the pipeline fills and drains."""
    data_parallel_comm_s: float
    """Exposed gradient reduction (and parameter gathering for ZeRO)."""
    optimizer_s: float
    """The optimizer update."""
    tokens_per_s: float
    """Tokens trained per second over the whole cluster."""
    model_tflops_per_gpu: float
    """Model FLOPs (3x the forward, no recomputation) per second per GPU, in TFLOP/s."""
    hardware_tflops_per_gpu: float
    """FLOPs executed per second per GPU, recomputed forwards included (as Megatron-LM
    reports), in TFLOP/s."""
    mfu: float
    """Model FLOPs utilization: model TFLOP/s over the device's dense bf16 peak."""
    memory_gib_per_gpu: float
    """Peak memory of the fullest GPU, framework reserve included, in GiB."""
    fits: bool
    """Whether that peak fits in device memory."""

    def to_dict(self) -> dict:
        return asdict(self)


def kernel_seconds(op: Op, device: DeviceSpec, efficiency: Efficiency) -> float:
    """Forward time of one kernel."""
    peak = device.peak_tflops.get("bf16", device.peak_tflops["fp32"]) * 1e12
    bandwidth = device.memory_bandwidth_gbs * 1e9 * efficiency.memory
    overhead = efficiency.kernel_overhead_us * 1e-6
    if isinstance(op, Memory):
        return op.bytes / bandwidth + overhead
    if isinstance(op, Attention):
        work = op.flops / 2 if op.causal else op.flops  # causal kernels skip masked blocks
        return work / (peak * efficiency.attention) + overhead
    compute = op.flops / (peak * efficiency.matmul_fraction(op.m, op.n, op.k))
    traffic = (op.m * op.k + op.k * op.n + op.m * op.n) * op.count * ACTIVATION_BYTES
    return max(compute, traffic / bandwidth) + overhead


def backward_seconds(op: Op, device: DeviceSpec, efficiency: Efficiency) -> float:
    """Backward time of one kernel: input and weight gradients of a matmul, attention's
    backward kernel, twice the bytes of a memory kernel."""
    if isinstance(op, Matmul):
        grad_input = Matmul(op.name, op.m, op.k, op.n, op.count)
        grad_weight = Matmul(op.name, op.k, op.n, op.m, op.count)
        return kernel_seconds(grad_input, device, efficiency) + kernel_seconds(
            grad_weight, device, efficiency
        )
    if isinstance(op, Attention):
        scaled = Attention(op.name, op.flops * ATTENTION_BACKWARD_FACTOR, op.causal)
        return kernel_seconds(scaled, device, efficiency)
    return kernel_seconds(Memory(op.name, 2 * op.bytes), device, efficiency)


@dataclass(frozen=True)
class _Pass:
    """Forward and backward time of some kernels, and the forward replayed in backward."""

    forward: float
    backward: float
    recompute: float = 0.0


def _layer_pass(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster, flash: bool
) -> tuple[_Pass, _Pass]:
    """(kernels, tensor/context-parallel communication) of one layer, one micro-batch."""
    device, eff = cluster.device, cluster.device.efficiency
    seq = model.seq_length / parallel.context
    ops = layer_ops(model, parallel.micro_batch_size, seq, parallel.tensor,
                    parallel.sequence_parallel, flash)
    forward = sum(kernel_seconds(op, device, eff) for op in ops)
    backward = sum(backward_seconds(op, device, eff) for op in ops)
    attention_core = sum(
        kernel_seconds(op, device, eff) for op in ops
        if isinstance(op, Attention) or op.name in ("scores", "softmax", "context")
    )
    recompute = {"none": 0.0, "selective": attention_core, "full": forward}[parallel.recompute]
    comm = _tensor_parallel_comm(model, parallel, cluster)
    comm_recompute = comm if parallel.recompute == "full" else 0.0
    return _Pass(forward, backward, recompute), _Pass(comm, comm, comm_recompute)


def _tensor_parallel_comm(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster
) -> float:
    """One direction (forward or backward) of a layer's tensor- and context-parallel
    collectives for one micro-batch."""
    seq = model.seq_length / parallel.context
    hidden = parallel.micro_batch_size * seq * model.hidden_size * ACTIVATION_BYTES
    t = parallel.tensor
    if parallel.sequence_parallel:
        per_layer = 2 * (
            group_collective_time("all_gather", hidden, t, 1, cluster)
            + group_collective_time("reduce_scatter", hidden, t, 1, cluster)
        )
    else:
        per_layer = 2 * group_collective_time("all_reduce", hidden, t, 1, cluster)
    if model.num_experts is not None and parallel.expert > 1:
        routed = hidden * model.moe_top_k / t
        per_layer += 2 * group_collective_time(
            "all_to_all", routed, parallel.expert, t * parallel.context, cluster
        )
    if parallel.context > 1:
        # Ring attention passes each rank's keys and values around the context group.
        kv = 2 * parallel.micro_batch_size * seq * model.num_kv_heads * model.head_dim
        per_layer += group_collective_time(
            "all_gather", kv * ACTIVATION_BYTES * parallel.context / t, parallel.context,
            t, cluster,
        )
    return per_layer


def predict_step(
    model: TransformerConfig,
    cluster: Cluster,
    parallel: ParallelConfig,
    flash_attention: bool = True,
    layers_per_stage: list[int] | None = None,
) -> StepPrediction:
    """Predict `parallel` (resolved for the cluster's GPU count) for `model` on `cluster`."""
    num_gpus = cluster.num_devices
    parallel = parallel.resolve(num_gpus)
    p, m, v = parallel.pipeline, parallel.num_micro_batches, parallel.virtual_pipeline
    layers = layers_per_stage or _even_split(model.num_layers, p)
    device, eff = cluster.device, cluster.device.efficiency
    kernels, comm = _layer_pass(model, parallel, cluster, flash_attention)
    seq = model.seq_length / parallel.context
    head = head_ops(model, parallel.micro_batch_size, seq, parallel.tensor)
    head_pass = _Pass(
        sum(kernel_seconds(op, device, eff) for op in head),
        sum(backward_seconds(op, device, eff) for op in head),
    )
    p2p = _pipeline_p2p(model, parallel, cluster) if p > 1 else 0.0

    stage_compute, stage_comm = [], []
    for index, count in enumerate(layers):
        compute = count * (kernels.forward + kernels.backward + kernels.recompute)
        if index == p - 1:
            compute += head_pass.forward + head_pass.backward
        stage_compute.append(compute)
        stage_comm.append(count * (comm.forward + comm.backward + comm.recompute))
    stage_times = [c + x + p2p for c, x in zip(stage_compute, stage_comm)]
    slowest = max(range(p), key=lambda i: stage_times[i])
    if parallel.schedule == "interleaved":
        pipeline_s = (m + (p - 1) / v) * stage_times[slowest] + (v - 1) * m * p2p
    else:
        pipeline_s = sum(stage_times) + (m - 1) * stage_times[slowest]
    busy = m * stage_times[slowest]

    params = _stage_parameters(model, layers, parallel)
    data_s = _data_parallel_comm(max(params), parallel, cluster, kernels, layers[-1])
    shard = parallel.data if parallel.zero_stage >= 1 else 1
    optimizer_s = (
        max(params) / shard * ADAM_BYTES_PER_PARAMETER
        / (device.memory_bandwidth_gbs * 1e9 * eff.memory)
    )
    step = pipeline_s + data_s + optimizer_s

    tokens = parallel.global_batch_size * model.seq_length
    model_flops, hardware_flops = _step_flops(model, parallel)
    peak = device.peak_tflops.get("bf16", device.peak_tflops["fp32"])
    worst_memory = max(
        (_stage_memory(model, parallel, params[i], layers[i], i, flash_attention)
         for i in range(p)),
        key=lambda breakdown: breakdown.total,
    )
    return StepPrediction(
        step_time_s=step,
        compute_s=m * stage_compute[slowest],
        tensor_parallel_comm_s=m * stage_comm[slowest],
        pipeline_comm_s=m * p2p,
        bubble_s=pipeline_s - busy,
        data_parallel_comm_s=data_s,
        optimizer_s=optimizer_s,
        tokens_per_s=tokens / step,
        model_tflops_per_gpu=model_flops / step / num_gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step / num_gpus / 1e12,
        mfu=model_flops / step / num_gpus / (peak * 1e12),
        memory_gib_per_gpu=worst_memory.total / 2**30,
        fits=worst_memory.fits(device.memory_gib * 2**30),
    )


def _even_split(num_layers: int, stages: int) -> list[int]:
    base, extra = divmod(num_layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def _pipeline_p2p(model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster) -> float:
    """Activation out and gradient in, per micro-batch, between neighbouring stages; each
    rank sends its 1/t slice (Megatron's scatter-gather optimization)."""
    seq = model.seq_length / parallel.context
    nbytes = parallel.micro_batch_size * seq * model.hidden_size * ACTIVATION_BYTES
    stride = parallel.tensor * parallel.context * parallel.data
    return 2 * group_collective_time(
        "send_recv", nbytes / parallel.tensor, parallel.pipeline, stride, cluster
    )


def _stage_parameters(
    model: TransformerConfig, layers: list[int], parallel: ParallelConfig
) -> list[float]:
    """Parameters one GPU of each stage holds (its tensor-parallel shard)."""
    per_layer = model.parameters_per_layer()
    embedding = model.vocab_size * model.hidden_size
    positions = model.hidden_size * (model.max_position_embeddings or 0) * (
        model.position_embedding == "learned"
    )
    params = []
    for index, count in enumerate(layers):
        total = count * per_layer
        if index == 0:
            total += embedding + positions
        if index == len(layers) - 1 and (not model.tie_embeddings or len(layers) > 1):
            total += embedding  # untied head, or the tied copy Megatron keeps last
        params.append(total / parallel.tensor)
    return params


def _data_parallel_comm(
    params: float, parallel: ParallelConfig, cluster: Cluster, kernels: _Pass, layers: int
) -> float:
    """Exposed gradient reduction of the fullest stage's parameters."""
    d = parallel.data
    if d == 1:
        return 0.0
    stride = parallel.tensor * parallel.context
    grads = params * MAIN_GRAD_BYTES
    if parallel.zero_stage == 0:
        total = group_collective_time("all_reduce", grads, d, stride, cluster)
    else:
        # Reduce-scatter the gradients, all-gather the updated bf16 weights.
        total = group_collective_time("reduce_scatter", grads, d, stride, cluster)
        total += group_collective_time("all_gather", params * 2, d, stride, cluster)
    if parallel.zero_stage == 3:
        # Weights gathered again for every micro-batch's forward and backward.
        total += 2 * parallel.num_micro_batches * group_collective_time(
            "all_gather", params * 2, d, stride, cluster
        )
    if parallel.overlap_grad_reduce:
        hidden_by = layers * (kernels.backward + kernels.recompute)
        return max(0.0, total - hidden_by)
    return total


def _step_flops(model: TransformerConfig, parallel: ParallelConfig) -> tuple[float, float]:
    """(model FLOPs, executed FLOPs) of one step on the whole cluster."""
    sequences = parallel.global_batch_size
    ops = layer_ops(model, 1, model.seq_length, 1, False, flash_attention=True)
    layer = forward_flops(ops)
    head = forward_flops(head_ops(model, 1, model.seq_length, 1))
    forward = sequences * (model.num_layers * layer + head)
    attention = sum(op.flops for op in ops if isinstance(op, Attention))
    replay = {"none": 0.0, "selective": attention, "full": layer}[parallel.recompute]
    return 3 * forward, 3 * forward + sequences * model.num_layers * replay


def _stage_memory(
    model: TransformerConfig,
    parallel: ParallelConfig,
    params: float,
    layers: int,
    index: int,
    flash: bool,
) -> memory.MemoryBreakdown:
    state = memory.model_state_bytes(
        params, parallel.data, parallel.zero_stage, grads_bytes=MAIN_GRAD_BYTES,
    )
    seq = math.ceil(model.seq_length / parallel.context)
    per_layer = memory.activation_bytes_per_layer(
        seq, parallel.micro_batch_size, model.hidden_size, model.num_attention_heads,
        parallel.tensor, parallel.sequence_parallel, parallel.recompute, flash,
    )
    in_flight = memory.in_flight_micro_batches(
        parallel.schedule, parallel.pipeline, index, parallel.num_micro_batches,
        parallel.virtual_pipeline,
    )
    extra = 0.0
    if index == parallel.pipeline - 1:
        extra = memory.output_layer_activation_bytes(
            seq, parallel.micro_batch_size, model.hidden_size, model.vocab_size,
            parallel.tensor,
        )
    return memory.peak_memory_bytes(state, per_layer, layers, in_flight, extra)
