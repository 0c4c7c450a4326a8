"""Step time, throughput and memory of one Megatron-LM training configuration.

The model of a step, per GPU:

- each kernel of a layer (`cost_models/transformer_ops.py`) takes its FLOPs over the
  device's bf16 peak times an efficiency that falls for small or skinny matmuls, or its
  bytes over the HBM bandwidth, plus a fixed per-kernel cost (`planner/vocabulary/efficiency.py`);
  the host launches kernels asynchronously, so a pass takes the longer of its GPU time and
  its host launch time (small models and micro-batches are bound by the host);
  the backward runs each matmul twice (input and weight gradients), attention's backward
  is 2.5x its forward (FlashAttention-2's count), memory kernels move twice the bytes;
- tensor parallelism adds two all-reduces per layer in the forward and two in the backward
  (Shoeybi et al. 2019), or the same volume as all-gathers and reduce-scatters with
  sequence parallelism (Korthikanti et al. 2022); they are not overlapped;
- recomputation replays the forward of each layer (full) or of its attention (selective)
  inside the backward;
- the pipeline runs m micro-batches through p stages as the schedule lays them out
  (`cost_models.pipeline_timing.pipeline_time`: Alpa's objective for GPipe and 1F1B,
  Narayanan et al.'s interleaved bubble, DeepSeek-V3's DualPipeV bubble);
- data-parallel gradient reduction (fp32 main gradients, as Megatron-LM keeps them) runs
  after the last backward, or hides behind the last micro-batch's backward with
  `overlap_grad_reduce`, exposed only where it is longer; then the Adam update, bound by
  memory bandwidth.

Ranks are laid out as Megatron-LM's default order: tensor fastest, then context, data,
pipeline; so tensor groups stay in a node and pipeline neighbours are far apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from cost_models.identity_memo import IdentityMemo
from cost_models import engine_memory, memory
from cost_models.comm import group_collective_time
from cost_models.data_parallel import blocking_reductions, data_parallel_comm, hidden
from cost_models.eight_bit_adam import STEP_BYTES, eight_bit, paged_bytes
from cost_models.offload import (
    OffloadBytes,
    gpus_per_host,
    host_fits,
    offload_time,
    optimizer_off_gpu,
)
from cost_models import adapters
from cost_models.adapters import adapter_ops, trained_parameters
from planner.vocabulary.efficiency import Efficiency
from cost_models.kernel_time import Pass, pass_seconds, weight_gradient_seconds
from cost_models.layer_mix import layer_variants
from cost_models.model_flops import (
    MODEL_FLOPS_COUNT,
    mixed_flops_utilization,
    model_flops_utilization,
    step_flops,
)
from cost_models.pipeline_timing import StagePhases, pipeline_time
from cost_models.moe_dispatch import expert_split, host_sync, moe_layer_comm
from cost_models.stage_parameters import layer_gradients
from cost_models.saved_activations import activation_element_bytes as activation_bytes
from cost_models.saved_activations import checkpoint_bytes, saved_per_layer
from cost_models.pipeline_memory import (
    StageLayout,
    attention_backend,
    layer_parameters,
    recomputed_layers,
    stage_parameters,
    stage_memories,
    stages_peak_memory,
    uniform_stages,
)
from cost_models.training_collectives import Collective, RankLayout, layer_collectives
from cost_models.training_collectives import boundary_collectives, end_collectives
from cost_models.transformer_ops import (
    SCORE_FREE_ATTENTION,
    Matmul,
    fp8_casts,
    head_ops,
    layer_ops,
    mtp_ops,
    projections,
    selective_kernels,
)
from cost_models.torchtitan_kernels import (
    fp8_weight_casts,
    torchtitan_efficiency,
    torchtitan_head_ops,
    torchtitan_layer_ops,
)
from planner.vocabulary.cluster import Cluster, DeviceSpec
from planner.vocabulary.pools import AnyCluster, PooledCluster, on_pool

if TYPE_CHECKING:
    from cost_models.layer_collectives import LayerCollectives
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig

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
    """Model FLOPs per second per GPU, in TFLOP/s, as Megatron-LM counts them today
    (`model_flops.megatron_flops_per_token`: causal attention scores halved, no router, no
    recomputation), the count NeMo, Megatron-Bridge and Megatron-LM's logs report."""
    hardware_tflops_per_gpu: float
    """FLOPs the priced kernels execute per second per GPU, in TFLOP/s
    (`model_flops.step_flops`): causal attention's unmasked half, sliding windows' bands,
    the router, and the forwards recomputation replays."""
    mfu: float
    """Model FLOPs utilization: model TFLOP/s (Megatron-LM's count) over the device's dense
    peak at the matmul precision (bf16 unless fp8 was chosen)."""
    memory_gib_per_gpu: float
    """Peak memory of the fullest GPU, framework reserve included, in GiB."""
    fits: bool
    """Whether that peak fits in device memory."""
    reserved_gib_per_gpu: float = 0.0
    """What the caching allocator holds on that GPU at its peak, in GiB."""
    reserved_fits: bool = True
    """Whether that fits too; a run that fits allocated but not reserved may run out of
    memory through fragmentation (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."""
    memory_breakdown_gib: dict[str, float] = field(default_factory=dict)
    """The fullest GPU's peak by kind, in GiB: weights, gradients, optimizer, activations
    by kind, working buffers, memory outside the allocator."""
    offload_s: float = 0.0
    """What offload adds (`cost_models.offload`): the CPU's Adam step, NVMe swaps, and
    the copies compute does not hide."""
    host_memory_gib_per_host: float = 0.0
    """Host memory the offloaded state and activations of one host's GPUs take, GiB."""
    nvme_gb_per_step: float = 0.0
    """Bytes one host reads from and writes to NVMe per step, GB."""
    pcie_gb_per_step: float = 0.0
    """Bytes one GPU moves over its host link per step, both directions, GB."""
    flops_count: str = MODEL_FLOPS_COUNT
    """How `model_tflops_per_gpu` and `mfu` count FLOPs (`model_flops.MODEL_FLOPS_COUNT`)."""

    def to_dict(self) -> dict:
        return asdict(self)


MAX_MEMO = 100_000
"""Entries each of this module's memos holds before it is cleared."""
_HEAD_PASSES: IdentityMemo[Pass] = IdentityMemo(MAX_MEMO)
"""`_head_pass` by model, device, knobs and tensor degree."""


def _head_pass(
    model: TransformerConfig, parallel: ParallelConfig, device: DeviceSpec, tensor: int
) -> Pass:
    """Forward and backward of the final norm, output layer and loss for one micro-batch
    (and the multi-token-prediction layers')."""
    return _HEAD_PASSES.get((model, device), (parallel, tensor),
                            lambda: _price_head(model, parallel, device, tensor))


def _price_head(
    model: TransformerConfig, parallel: ParallelConfig, device: DeviceSpec, tensor: int
) -> Pass:
    """`_head_pass`, computed. The output layer's logits are priced at the run's matmul
    precision, with or without --fp8-output-proj. (Megatron-Core builds it as a plain
    bf16 ColumnParallelLinear outside Transformer Engine's fp8 autocast unless
    --fp8-output-proj makes it TE's linear under MXFP8: megatron/core/models/gpt/
    gpt_model.py, GPTModel.__init__; fp8_utils.is_mxfp8_output_proj_active. Pricing the
    bf16 head puts DeepSeek-V3 on B200 17% under its published throughput, beyond what the
    MoE fit absorbs, so it waits for a recalibration of the head.)"""
    seq = model.seq_length / parallel.dims.context
    precision = parallel.numerics.precision
    if parallel.execution.engine == "torchtitan":
        # Its eager norm and loss; its float8 leaves the output layer in bf16
        # (torchtitan/float8.py @9dec370: module_filter_fn skips "output").
        head = torchtitan_head_ops(model, parallel.batch.micro_batch_size, seq, tensor,
                                   parallel.execution.compile_loss)
        precision = "bf16" if precision == "fp8" else precision
    else:
        head = head_ops(model, parallel.batch.micro_batch_size, seq, tensor)
    if model.mtp_num_layers:
        head += model.mtp_num_layers * mtp_ops(model, parallel.batch.micro_batch_size, seq, tensor,
                                               expert_split(model, parallel))
    return Pass(pass_seconds(head, device, device.efficiency, precision),
                pass_seconds(head, device, device.efficiency, precision, backward=True))


_LAYER_PASSES: IdentityMemo[tuple[Pass, Pass]] = IdentityMemo(MAX_MEMO)
"""`_layer_pass` by model, cluster, collectives and knobs: a search prices the same layer
under many pipeline layouts."""


def _layer_knobs(parallel: ParallelConfig) -> tuple:
    """The knobs a layer's price reads: all but how the pipeline and the data-parallel
    replicas are laid out around it (the pipeline and data degrees, the global batch and
    the schedule)."""
    dims = parallel.dims
    return (dims.tensor, dims.context, dims.expert, dims.expert_tensor,
            parallel.batch.micro_batch_size, parallel.recomputation, parallel.numerics,
            parallel.sharding, parallel.overlap, parallel.execution, parallel.moe,
            parallel.finetuning)


def _layer_pass(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster, flash: bool,
    collectives: LayerCollectives | None = None,
) -> tuple[Pass, Pass]:
    """(kernels, tensor/context-parallel communication left exposed) of one layer, one
    micro-batch. `flash`: whether the device runs fused attention (what 'auto' picks)."""
    return _LAYER_PASSES.get(
        (model, cluster, collectives),
        (flash, *_layer_knobs(parallel)),
        lambda: _price_layer_mix(model, parallel, cluster, flash, collectives))


def _price_layer_mix(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster, flash: bool,
    collectives: LayerCollectives | None,
) -> tuple[Pass, Pass]:
    """`_layer_pass`, priced: the one kind of block, or the mean of several."""
    variants = layer_variants(model)
    if len(variants) == 1:
        kernels, comm = _price_layer(variants[0][0], parallel, cluster, flash, collectives)
    else:
        # Blocks of several kinds (dense and MoE, windowed and full attention): a stage's
        # layers are priced at the model's mean block.
        priced = [(_layer_pass(variant, parallel, cluster, flash, collectives), share)
                  for variant, share in variants]
        kernels = sum((k.scaled(share) for (k, _), share in priced), Pass(0.0, 0.0))
        comm = sum((c.scaled(share) for (_, c), share in priced), Pass(0.0, 0.0))
    return kernels, comm


def _price_layer(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster, flash: bool,
    collectives: LayerCollectives | None,
) -> tuple[Pass, Pass]:
    """`_layer_pass`, computed."""
    device, eff = cluster.device, cluster.device.efficiency
    seq = model.seq_length / parallel.dims.context
    split = expert_split(model, parallel) if model.is_moe else None
    shape = (model, parallel.batch.micro_batch_size, seq, parallel.dims.tensor,
             parallel.sharding.sequence_parallel, attention_backend(parallel, flash),
             parallel.dims.context, split)
    titan = parallel.execution.engine == "torchtitan"
    if titan:
        # TorchTitan's own memory kernels (eager, or fused per block by torch.compile) and
        # PyTorch's SDPA in place of Transformer Engine's cuDNN attention, which TE runs
        # on Hopper and newer (the devices with fp8 peaks).
        ops = torchtitan_layer_ops(*shape, compiled=parallel.execution.compile)
        eff = torchtitan_efficiency(eff, cudnn_attention="fp8" in device.peak_tflops)
    else:
        ops = layer_ops(*shape)
    precision, graphed = parallel.numerics.precision, parallel.execution.cuda_graphs
    if precision == "fp8":
        ops += fp8_casts(ops, parallel.numerics.fp8_recipe)
        if titan:
            ops += fp8_weight_casts(ops, parallel.dims.data * parallel.dims.context,
                                    parallel.numerics.fp8_param_gather)
    if model.softmax_type != "vanilla":
        # Attention sinks run outside the flash kernels vanilla softmax gets
        # (`Efficiency.sink_attention`).
        eff = eff.model_copy(update={"attention": eff.attention * eff.sink_attention})
    forward = pass_seconds(ops, device, eff, precision, graphed=graphed)
    backward = pass_seconds(ops, device, eff, precision, backward=True, graphed=graphed)
    if parallel.finetuning.adapters:
        # A frozen base computes no weight gradients; the adapters (and QLoRA's
        # dequantization of each base weight before its matmuls) run beside it.
        backward -= sum(weight_gradient_seconds(op, device, eff, precision)
                        for op in projections(ops))
        extra = adapter_ops(model, parallel, seq)
        dequantize = pass_seconds(extra.dequantize, device, eff, precision, graphed=graphed)
        scale = adapters.ADAPTER_TIME_SCALE
        forward += scale * pass_seconds(extra.matmuls, device, eff, precision,
                                        graphed=graphed) + dequantize
        backward += scale * pass_seconds(extra.matmuls, device, eff, precision, backward=True,
                                         graphed=graphed) + dequantize
    # Selective recomputation replays the attention core in Megatron-LM (and Tessel's
    # runtime); TorchTitan's op-level checkpointing replays every other matmul and the
    # memory-bound kernels instead.
    selective = selective_kernels(model, ops, parallel.execution.engine,
                                  parallel.recomputation.recompute_modules)
    replayed = pass_seconds(selective, device, eff, precision, graphed=graphed)
    granularity = parallel.recomputation.recompute
    recompute = {"none": 0.0, "selective": replayed, "full": forward}[granularity]
    tensor, others = _tensor_parallel_comm(model, parallel, cluster, collectives)
    if parallel.overlap.tp_comm_overlap:
        tensor = _overlapped(tensor, projections(ops), parallel, device, eff)
    compute = Pass(forward, backward, recompute)
    if split is not None:
        compute = compute + host_sync(model, parallel, cluster)
    if split is not None and parallel.execution.engine != "tessel":
        # Megatron-Core's and TorchTitan's dispatchers, by their mechanism; Tessel's
        # runtime is priced by the collectives it issues (`_tensor_parallel_comm`).
        others = others + moe_layer_comm(model, parallel, cluster, split, compute, ops)
    return compute, tensor + others


def _overlapped(tensor: Pass, gemms: list[Matmul], parallel: ParallelConfig,
                device: DeviceSpec, eff: Efficiency) -> Pass:
    """Tensor-parallel collectives split into chunks that run beside the projection
    matmuls they feed or follow (Transformer Engine's userbuffers; Wang et al., ASPLOS
    2023): each phase exposes only what its matmuls cannot cover."""
    forward = pass_seconds(gemms, device, eff, parallel.numerics.precision, graphed=True)
    backward = pass_seconds(gemms, device, eff, parallel.numerics.precision, backward=True,
                            graphed=True)
    replay = forward if parallel.recomputation.recompute == "full" else 0.0
    slowdown = eff.overlap_slowdown
    return Pass(hidden(tensor.forward, forward, 0.0, slowdown),
                hidden(tensor.backward, backward, 0.0, slowdown),
                hidden(tensor.recompute, replay, 0.0, slowdown))


def _tensor_parallel_comm(
    model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster,
    collectives: LayerCollectives | None = None,
) -> tuple[Pass, Pass]:
    """A layer's collectives for one micro-batch, forward, backward and rerun in backward:
    (tensor-parallel, context- and expert-parallel). They are the ones the runtime issues
    (`cost_models.training_collectives`), or with `collectives` the tensor-parallel ones
    are those the intra-op ILP chose for the layer on this tensor-parallel degree."""
    issued = layer_collectives(model, rank_layout(parallel))
    # Outside Tessel's runtime, expert dispatch is priced by `moe_dispatch`.
    skipped = ("tp",) if parallel.execution.engine == "tessel" else ("tp", "ep")
    others = price([c for c in issued if c.axis not in skipped], parallel, cluster)
    t = parallel.dims.tensor
    if collectives is not None and t in collectives:
        tokens = parallel.batch.micro_batch_size * model.seq_length / parallel.dims.context
        chosen = sum(
            group_collective_time(c.kind, c.bytes_per_token * tokens, t, 1, cluster)
            for c in collectives[t]
        )
        rerun = chosen if parallel.recomputation.recompute == "full" else 0.0
        return Pass(chosen, chosen, rerun), others
    if model.is_moe and parallel.execution.engine != "tessel":
        # Megatron-Core's MoE layer keeps its tokens in sequence shards: the dispatcher
        # moves them (`moe_dispatch`), so only the attention, and a shared expert (which
        # gathers the shard like a dense MLP), run the tensor-parallel collectives of a
        # dense layer's halves.
        dense = model.model_copy(update={"num_experts": None})
        half = 1.0 if model.moe_shared_expert_intermediate_size else 0.5
        tp = price([c for c in layer_collectives(dense, rank_layout(parallel))
                    if c.axis == "tp"], parallel, cluster)
        return Pass(tp.forward * half, tp.backward * half, tp.recompute * half), others
    return price([c for c in issued if c.axis == "tp"], parallel, cluster), others


def rank_layout(
    parallel: ParallelConfig, chunks: tuple[tuple[int, int], ...] = ((0, 1),),
    chunk_ranks: tuple[int, ...] = (0,),
) -> RankLayout:
    """The knobs of `parallel` that decide a rank's collectives, on a pipeline of `chunks`
    run by `chunk_ranks` (by default one chunk: what per-layer pricing needs; pipeline
    transfers are priced by `_pipeline_p2p`)."""
    return RankLayout(
        chunks=chunks, chunk_ranks=chunk_ranks, dims=parallel.dims,
        micro_batch_size=parallel.batch.micro_batch_size,
        num_micro_batches=parallel.num_micro_batches,
        sequence_parallel=parallel.sharding.sequence_parallel,
        zero_stage=parallel.sharding.zero_stage,
        recompute=parallel.recomputation.recompute,
        element_bytes=activation_bytes(parallel.numerics.precision),
        # DeepEP's flex dispatcher moves what all-to-all does, in fused kernels.
        expert_dispatcher="allgather" if parallel.moe.moe_token_dispatcher == "allgather"
        else "alltoall",
        gradient_bytes=MAIN_GRAD_BYTES,
        finetuning=parallel.finetuning,
    )


def price(collectives: list[Collective], parallel: ParallelConfig, cluster: Cluster) -> Pass:
    """Seconds of `collectives` by phase (forward, backward, and recompute: the forward
    rerun in backward), each on its mesh axis's group: tensor ranks adjacent, context
    ranks `tensor` apart, expert ranks `tensor x context` apart."""
    t, cp = parallel.dims.tensor, parallel.dims.context
    groups = {"tp": (t, 1), "cp": (cp, t), "ep": (parallel.dims.expert, t * cp)}
    seconds = {"forward": 0.0, "backward": 0.0, "recompute": 0.0}
    for c in collectives:
        size, stride = groups[c.axis]
        seconds[c.phase] += c.count * group_collective_time(c.kind, c.bytes, size, stride,
                                                            cluster)
    return Pass(seconds["forward"], seconds["backward"], seconds["recompute"])


def predict_step(
    model: TransformerConfig,
    cluster: Cluster,
    parallel: ParallelConfig,
    flash_attention: bool | None = None,
    layers_per_stage: list[int] | None = None,
    collectives: LayerCollectives | None = None,
) -> StepPrediction:
    """Predict `parallel` (resolved for the cluster's GPU count) for `model` on `cluster`,
    every stage on the same (data x tensor) mesh, as Megatron-LM lays them out."""
    parallel = parallel.resolve(cluster.num_devices)
    return predict_stages(model, cluster, parallel,
                          uniform_stages(model, parallel, layers_per_stage),
                          flash_attention, collectives)


def predict_stages(
    model: TransformerConfig,
    cluster: AnyCluster,
    parallel: ParallelConfig,
    stages: list[StageLayout],
    flash_attention: bool | None = None,
    collectives: LayerCollectives | None = None,
) -> StepPrediction:
    """Predict a pipeline whose stages may differ in layers and mesh (Alpa's space), and
    on a pooled cluster in the machines they run on (each stage on its `pool`'s).

    `parallel` gives the knobs shared by all stages; its data degree and micro-batch size
    fix the sequences of one micro-batch (`micro_batch_size x data`), which each stage
    splits over its own data-parallel replicas.
    """
    on = [on_pool(cluster, stage.pool) for stage in stages]
    if flash_attention is None:  # 'auto' attention runs as the devices do
        flash_attention = all(here.device.flash_attention for here in on)
    num_gpus = cluster.num_devices
    p, v = len(stages), parallel.pipelining.virtual_pipeline
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    m = parallel.batch.global_batch_size // sequences
    p2p = _pipeline_p2p(model, parallel, stages, cluster) if p > 1 else 0.0
    phases, local = _stage_phases(model, cluster, parallel, stages, flash_attention,
                                  collectives, p2p)
    compute = [phase.compute for phase in phases]
    comm = [phase.communication for phase in phases]
    pipeline = pipeline_time(parallel.pipelining.schedule, phases, m, v)
    pipeline_s, slowest = pipeline.seconds, pipeline.slowest

    params = stage_parameters(model, stages, parallel)
    trained = [trained_parameters(model, local[i][0], params[i], stages[i].layers)
               for i in range(p)]
    reductions = {(params[i], id(local[i][0]), stages[i].layers, stages[i].pool): i
                  for i in range(p)}
    data_s = max(
        data_parallel_comm(params[i], local[i][0], on[i], local[i][1], stages[i].layers,
                           recomputed_layers(parallel, stages[i].layers),
                           sum(layer_parameters(model, local[i][0])), trained[i],
                           layer_gradients(model) if blocking_reductions(parallel) else ())
        for i in reductions.values()
    )
    step_bytes = STEP_BYTES if eight_bit(parallel) else ADAM_BYTES_PER_PARAMETER
    optimizer_s = (1 - optimizer_off_gpu(parallel)) * max(
        trained[i] / (stages[i].data if parallel.sharding.zero_stage >= 1 else 1)
        * step_bytes / (on[i].device.memory_bandwidth_gbs * 1e9
                        * on[i].device.efficiency.memory)
        for i in range(p)
    )

    replays = sum(recomputed_layers(parallel, stage.layers) for stage in stages)
    model_flops, hardware_flops = step_flops(model, parallel, replays)
    if isinstance(cluster, Cluster):
        # Stages alike but in their in-flight micro-batches: the worst stands for all.
        worst = 0
        held = [stages_peak_memory(model, cluster, parallel, stages, flash_attention)] * p
    else:  # each stage against its own pool's devices and hosts
        held = stage_memories(model, on[0], parallel, stages, flash_attention)
        worst = max(range(p), key=lambda i: held[i].total / on[i].usable_memory_bytes)
    moved = [_paged_in(held[i], on[i]) for i in range(p)]
    offload_s = max((offload_time(moved[i], parallel, on[i], m, phases[i].forward,
                                  phases[i].backward, stages[i].layers).total
                     for i in range(p) if moved[i] is not None), default=0.0)
    step = pipeline_s + data_s + optimizer_s + offload_s
    precision = parallel.numerics.precision
    mfu = model_flops_utilization(model_flops, step, num_gpus, cluster.device, precision) \
        if isinstance(cluster, Cluster) else mixed_flops_utilization(
            model_flops, step, [(stage.devices * parallel.dims.context, here.device)
                                for stage, here in zip(stages, on)], precision)
    worst_memory, host, moved_here = held[worst], on[worst], moved[worst]
    return StepPrediction(
        step_time_s=step,
        compute_s=m * compute[slowest],
        tensor_parallel_comm_s=m * comm[slowest],
        pipeline_comm_s=m * p2p,
        bubble_s=pipeline.bubble,
        data_parallel_comm_s=data_s,
        optimizer_s=optimizer_s,
        tokens_per_s=parallel.batch.global_batch_size * model.seq_length / step,
        model_tflops_per_gpu=model_flops / step / num_gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step / num_gpus / 1e12,
        mfu=mfu,
        memory_gib_per_gpu=worst_memory.total / 2**30,
        fits=all(held[i].fits(on[i].usable_memory_bytes)
                 and host_fits(held[i].host, held[i].nvme, on[i]) for i in range(p)),
        offload_s=offload_s,
        host_memory_gib_per_host=worst_memory.host * gpus_per_host(host) / 2**30,
        nvme_gb_per_step=0.0 if moved_here is None else gpus_per_host(host)
        * (moved_here.nvme_bytes_read(m) + moved_here.nvme_write) / 1e9,
        pcie_gb_per_step=0.0 if moved_here is None else moved_here.pcie_bytes(m) / 1e9,
        reserved_gib_per_gpu=(worst_memory.reserved + worst_memory.reserve) / 2**30,
        reserved_fits=all(held[i].reserved_fits(on[i].usable_memory_bytes)
                          for i in range(p)),
        memory_breakdown_gib=memory.breakdown_gib(worst_memory),
    )


def _paged_in(held: memory.MemoryBreakdown, cluster: Cluster) -> OffloadBytes | None:
    """What a stage holding `held` moves off its GPUs, with a paged optimizer's state
    paged out where it does not fit beside the allocator's pool (`eight_bit_adam`)."""
    moved = held.offloaded
    if moved is not None and moved.paged_state:
        free = cluster.device.memory_gib * 2**30 - held.reserved - held.reserve
        moved = replace(moved, paged_moved=paged_bytes(moved.paged_state, free))
    return moved


def stage_phases(
    model: TransformerConfig,
    cluster: AnyCluster,
    parallel: ParallelConfig,
    stages: list[StageLayout],
    flash_attention: bool | None = None,
    collectives: LayerCollectives | None = None,
) -> list[StagePhases]:
    """Each stage's seconds per micro-batch by phase, as `predict_stages` prices them (the
    pipeline's time is made of these)."""
    if flash_attention is None:
        flash_attention = all(on_pool(cluster, stage.pool).device.flash_attention
                              for stage in stages)
    p2p = _pipeline_p2p(model, parallel, stages, cluster) if len(stages) > 1 else 0.0
    return _stage_phases(model, cluster, parallel, stages, flash_attention, collectives,
                         p2p)[0]


def _stage_phases(
    model: TransformerConfig, cluster: AnyCluster, parallel: ParallelConfig,
    stages: list[StageLayout], flash_attention: bool, collectives: LayerCollectives | None,
    p2p: float,
) -> tuple[list[StagePhases], list[tuple[ParallelConfig, Pass]]]:
    """(phases, (configuration, layer kernels)) of each stage: its layers' kernels and
    exposed collectives by phase, the head on the last stage, the embedding's and head's
    collectives on the end stages, each chunk gathering the slices it receives."""
    p, v = len(stages), parallel.pipelining.virtual_pipeline
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    phases, local = [], []
    passes: dict[tuple[int, int, int], tuple[Pass, Pass]] = {}  # stages alike share one
    priced: dict[tuple, tuple[StagePhases, ParallelConfig, Pass]] = {}
    for index, stage in enumerate(stages):
        first, last = index == 0, index == p - 1
        key = (stage.tensor, stage.data, stage.layers, first, last, stage.pool)
        if key not in priced:
            machines = on_pool(cluster, stage.pool)
            here = parallel.but(tensor=stage.tensor, data=stage.data,
                                micro_batch_size=sequences // stage.data)
            mesh = (stage.tensor, stage.data, stage.pool)
            if mesh not in passes:
                passes[mesh] = _layer_pass(model, here, machines, flash_attention, collectives)
            kernels, layer_comm = passes[mesh]
            replayed = recomputed_layers(parallel, stage.layers)
            head = _head_pass(model, here, machines.device, stage.tensor) if last \
                else Pass(0.0, 0.0)
            # The embedding's and the head's own collectives on the first and last stage.
            layout = rank_layout(here)
            ends = price(end_collectives(model, layout, first, last), here, machines)
            # Each of the stage's v chunks gathers the slices it receives and their
            # gradients.
            slices = price(boundary_collectives(model, layout, first and v == 1,
                                                last and v == 1), here, machines) \
                if p > 1 else Pass(0.0, 0.0)
            priced[key] = (StagePhases(
                forward=stage.layers * kernels.forward + head.forward,
                backward=stage.layers * kernels.backward + head.backward,
                recompute=replayed * kernels.recompute,
                forward_communication=stage.layers * layer_comm.forward + ends.forward
                + v * slices.forward,
                backward_communication=stage.layers * layer_comm.backward
                + replayed * layer_comm.recompute + ends.backward + ends.recompute
                + v * (slices.backward + slices.recompute),
                transfer=p2p,
            ), here, kernels)
        phase, here, kernels = priced[key]
        phases.append(phase)
        local.append((here, kernels))
    return phases, local


def _pipeline_p2p(
    model: TransformerConfig, parallel: ParallelConfig, stages: list[StageLayout],
    cluster: AnyCluster,
) -> float:
    """Activation out and gradient in, per micro-batch, across the slowest stage boundary;
    each rank sends its 1/t slice (sequence parallelism's, or Megatron's scatter-gather:
    the all-gathers that undo it are priced with the stage's collectives). On a pooled
    cluster, the stages of each pool as above on its machines, and each boundary from one
    pool to the next over the link between pools."""
    seq = model.seq_length / parallel.dims.context
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    element = activation_bytes(parallel.numerics.precision)

    def slice_bytes(group: list[StageLayout]) -> float:
        return max(sequences / stage.data * seq * model.hidden_size * element / stage.tensor
                   for stage in group)

    # Each pool's stages as one group, `devices` apart: it spans domains when they do.
    runs = [[s for s in stages if s.pool == pool]
            for pool in dict.fromkeys(stage.pool for stage in stages)]
    seconds = [2 * group_collective_time(
        "send_recv", slice_bytes(run), len(run),
        min(stage.devices for stage in run) * parallel.dims.context,
        on_pool(cluster, run[0].pool)) for run in runs if len(run) > 1]
    if isinstance(cluster, PooledCluster):  # and each boundary between two pools
        seconds += [2 * group_collective_time("send_recv", slice_bytes([a, b]), 2, 1,
                                              cluster.crossing)
                    for a, b in zip(stages, stages[1:]) if a.pool != b.pool]
    return max(seconds, default=0.0)


@dataclass(frozen=True)
class StageCosts:
    """Per-micro-batch time and memory of a stage on one (data x tensor) mesh, as linear
    functions of the layers it holds: what the inter-op DP needs for every split."""

    layer_s: float
    """Forward + backward (+ recomputation) of one layer, with its collectives."""
    head_s: float
    """Extra time of the last stage: final norm, output layer, loss."""
    p2p_s: float
    """Activation out and gradient in per micro-batch across one stage boundary."""
    state_bytes_per_layer: float
    """Weights, gradients and optimizer state of one layer on one GPU."""
    state_bytes_embedding: float
    """The same for the embedding (first stage) or output layer (last stage)."""
    activation_bytes_per_layer: float
    """Activations one layer keeps per micro-batch in flight."""
    head_activation_bytes: float
    """Activations of the output layer and loss on the last stage."""


def _layer_state_args(model: TransformerConfig, parallel: ParallelConfig
                      ) -> tuple[float, float, float, ParallelConfig, float]:
    """`engine_memory.model_state`'s arguments for one mean layer on one GPU."""
    other, expert = layer_parameters(model, parallel)
    return other, 0.0, 0.0, parallel, expert


def stage_mesh_costs(
    model: TransformerConfig, cluster: Cluster, parallel: ParallelConfig, tensor: int,
    data: int, flash_attention: bool | None = None, collectives: LayerCollectives | None = None,
) -> StageCosts:
    """Costs of a stage running `parallel`'s shared knobs on a `data` x `tensor` mesh,
    each micro-batch of `micro_batch_size x parallel.data` sequences split `data` ways."""
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    here = parallel.but(tensor=tensor, data=data, micro_batch_size=sequences // data)
    if flash_attention is None:
        flash_attention = cluster.device.flash_attention
    kernels, comm = _layer_pass(model, here, cluster, flash_attention, collectives)
    flash_attention = attention_backend(parallel, flash_attention) in SCORE_FREE_ATTENTION
    stage = StageLayout(1, tensor, data)
    # The engine's rules (`cost_models.engine_memory`, `saved_activations`), as linear
    # terms: its model state per parameter, what a layer keeps (its input alone under full
    # recomputation), and the loss's saved and working bytes on the last stage.
    state, _ = engine_memory.model_state(1.0, 0.0, 0.0, here)
    per_param = state.total
    if parallel.recomputation.recompute == "full":
        activations = checkpoint_bytes(model, here)
    else:
        activations = sum(saved_per_layer(model, here, flash_attention).values())
    loss_saved, loss_working = engine_memory.loss_bytes(model, here)
    return StageCosts(
        layer_s=kernels.total + comm.total,
        head_s=_head_pass(model, here, cluster.device, tensor).total,
        p2p_s=_pipeline_p2p(model, here, [stage, stage], cluster),
        state_bytes_per_layer=engine_memory.model_state(
            *_layer_state_args(model, here))[0].total,
        state_bytes_embedding=model.vocab_size * model.hidden_size / tensor * per_param,
        activation_bytes_per_layer=activations,
        head_activation_bytes=loss_saved + loss_working,
    )
