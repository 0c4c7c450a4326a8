"""The data-parallel collectives of a step left exposed: gradient reduction (all-reduce,
or reduce-scatter under ZeRO), the updated weights' all-gather, and ZeRO-3's gathers per
micro-batch, each hidden where Megatron-LM's bucketed overlap runs it beside compute, or
where FSDP2's per-block gathers and reduce-scatters run beside TorchTitan's blocks
(`fsdp2_comm`); or, where ZeRO-3's offloaded gradients are copied to the host one bucket
at a time (`offload_copies` blocking, DeepSpeed before v0.15.4), each bucket's
reduce-scatter beside no compute (`deepspeed_buckets`).
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models import memory
from cost_models.comm import group_collective_time
from cost_models.kernel_time import Pass
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

# Megatron-LM's gradient buckets: max(40M, 1M x data-parallel size) parameters
# (megatron/core/distributed/distributed_data_parallel.py, bucket_size's default).
DDP_BUCKET_PARAMETERS = 40_000_000
DDP_BUCKET_PARAMETERS_PER_RANK = 1_000_000
DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed's zero_optimization.reduce_bucket_size default, in elements
(deepspeed/runtime/zero/config.py)."""


def deepspeed_buckets(gradients: Sequence[float], bucket: float) -> list[float]:
    """The buckets ZeRO-3 reduces, in elements, as DeepSpeed's stage3.py fills them from
    `gradients` in the order backward makes them (reduce_independent_p_g_buckets_and_remove_
    grads): a gradient that would overflow a bucket already holding some has that bucket
    reduced first, so one larger than `bucket` is reduced alone and the small ones between
    two large ones together."""
    buckets, filled = [], 0.0
    for n in gradients:
        if filled and filled + n > bucket:
            buckets.append(filled)
            filled = 0.0
        filled += n
    return buckets + [filled] if filled else buckets


def blocking_reductions(parallel: ParallelConfig) -> bool:
    """Whether ZeRO-3 reduces its gradients one bucket at a time beside no compute: each
    reduced partition of an offloaded optimizer is copied to the host before the CPU goes
    on (`offload_copies` blocking: stage3.py's __partition_grads copies with a blocking
    copy_ on the reduction stream, which waited for the compute stream; DeepSpeed PR #6670,
    v0.15.4, calls that copy the backward's bottleneck and makes it async)."""
    return (parallel.offload.offload_copies == "blocking" and parallel.sharding.zero_stage == 3
            and parallel.offload.offload_optimizer != "none")


def data_parallel_comm(
    params: float, parallel: ParallelConfig, cluster: Cluster, kernels: Pass, layers: int,
    replayed: int, block_params: float | None = None, trained: float | None = None,
    layer_gradients: Sequence[float] = (),
) -> float:
    """Exposed gradient reduction (and weight gathering) of a stage whose ranks hold
    `params` parameters, `layers` layers of `kernels` each (of `block_params` parameters;
    default an even share), `replayed` of them recomputed in backward: what bucketed
    overlap with the last backward (and the next forward) leaves exposed, or under
    TorchTitan's FSDP2 what its per-block overlap leaves (`fsdp2_comm`). `trained`: the
    parameters with gradients (default all; a LoRA stage's adapters), the only ones
    reduced and, once updated, gathered; ZeRO-3 gathers every parameter each pass.
    `layer_gradients`: one layer's gradients by tensor in the order backward makes them,
    which blocking reductions bucket as DeepSpeed does (default: the layer as one)."""
    if parallel.execution.engine == "torchtitan" and parallel.sharding.zero_stage == 3:
        block = params / max(layers, 1) if block_params is None else block_params
        return fsdp2_comm(params, block, parallel, cluster, kernels, layers, replayed,
                          1.0 if trained is None else trained / max(params, 1.0))
    all_params, params = params, params if trained is None else trained
    d = parallel.dims.data
    if d == 1:
        return 0.0
    stride = parallel.dims.tensor * parallel.dims.context
    element = memory.state_element_bytes(parallel.numerics.precision)
    # Bucketed overlap cannot hide the last bucket's reduction (the backward is over) nor
    # the first bucket's gather (the forward waits for it). --ddp-bucket-size, where given,
    # is the bucket (DistributedDataParallelConfig.bucket_size: parameters per bucket).
    bucket = min(params, parallel.overlap.ddp_bucket_size
                 or max(DDP_BUCKET_PARAMETERS, DDP_BUCKET_PARAMETERS_PER_RANK * d))
    reduce_kind = "all_reduce" if parallel.sharding.zero_stage == 0 else "reduce_scatter"

    def reduced(n: float) -> float:
        return group_collective_time(reduce_kind, n * element.grads, d, stride, cluster)

    def gathered(n: float) -> float:
        return group_collective_time("all_gather", n * element.params, d, stride, cluster)

    # ZeRO 1-3 reduce-scatter the gradients and all-gather the updated weights.
    reduce, gather = reduced(params), gathered(params) if parallel.sharding.zero_stage else 0.0
    # ZeRO-3 gathers the weights again for every micro-batch's forward, and once for the
    # backward (FSDP2 keeps them gathered between micro-batches' backwards): m + 1 gathers
    # in all, as `cost_models.training_collectives` counts them.
    forwards = parallel.num_micro_batches * group_collective_time(
        "all_gather", all_params * element.params, d, stride, cluster
    ) if parallel.sharding.zero_stage == 3 else 0.0
    slowdown = cluster.device.efficiency.overlap_slowdown
    if blocking_reductions(parallel):
        # The forward's gathers are prefetched beside the forward (and the recomputation);
        # the reductions run one bucket after another beside nothing.
        window = parallel.num_micro_batches * (layers * kernels.forward
                                               + replayed * kernels.recompute)
        reduce = serial_reductions(params, layer_gradients, layers, parallel, cluster) \
            + hidden(forwards, window, gathered(all_params / max(layers, 1)), slowdown)
    elif parallel.overlap.overlap_grad_reduce:
        # Buckets reduce as the last micro-batch's backward produces them; FSDP prefetches
        # ZeRO-3's gathers beside the compute, as bucketed reduction does.
        window = layers * kernels.backward + replayed * kernels.recompute
        reduce = hidden(reduce + forwards, window, reduced(bucket), slowdown)
    else:
        reduce += forwards
    if parallel.overlap.overlap_param_gather or (parallel.overlap.overlap_grad_reduce
                                         and parallel.sharding.zero_stage == 3):
        # The updated weights are gathered bucket by bucket as the next forward needs them.
        gather = hidden(gather, layers * kernels.forward, gathered(bucket), slowdown)
    return reduce + gather


def serial_reductions(params: float, layer_gradients: Sequence[float], layers: int,
                      parallel: ParallelConfig, cluster: Cluster) -> float:
    """ZeRO-3's gradient reduce-scatters under blocking copies (`blocking_reductions`):
    each bucket's waits for the compute before it and holds the CPU until its partition is
    on the host, so they run one after another, beside no compute, each paying its
    latency, in the training's 16 bits (stage3.py asserts a 16-bit communication_data_
    type). The buckets are DeepSpeed's (`deepspeed_buckets`) over `layers` layers of
    `layer_gradients` (default: a layer as one tensor), the root (embeddings, final norm,
    output) out of backward last; --ddp-bucket-size is DeepSpeed's reduce_bucket_size."""
    layer = list(layer_gradients) or [params / max(layers, 1)]
    root = max(params - layers * sum(layer), 0.0)
    size = parallel.overlap.ddp_bucket_size or DEEPSPEED_REDUCE_BUCKET
    element = memory.state_element_bytes(parallel.numerics.precision).params
    d, stride = parallel.dims.data, parallel.dims.tensor * parallel.dims.context
    return sum(group_collective_time("reduce_scatter", n * element, d, stride, cluster)
               for n in deepspeed_buckets(layer * layers + [root], size))


def hidden(seconds: float, window: float, tail: float, slowdown: float) -> float:
    """Exposed time of `seconds` of communication run beside `window` seconds of compute:
    what the window cannot cover, at least the `tail` no compute is left to hide, plus
    the compute it slows while it runs beside it."""
    exposed = max(seconds - window, min(tail, seconds))
    return exposed + slowdown * (seconds - exposed)


def fsdp2_comm(
    params: float, block_params: float, parallel: ParallelConfig, cluster: Cluster,
    kernels: Pass, layers: int, replayed: int, trained_share: float = 1.0,
) -> float:
    """Exposed time of FSDP2's collectives in a TorchTitan step, and of the copies it runs on
    the compute stream (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py and
    _fsdp_collectives.py; TorchTitan's apply_fsdp, parallelisms/parallelize_llama.py
    @9dec370): each block is one FSDP unit, gathered in one all-gather of its bf16 (or, with
    float8 all-gather, fp8) weights and reduce-scattered in one fp32 reduce-scatter
    (MixedPrecisionPolicy reduce_dtype float32, TorchTitan's only choice then); the root
    (embedding, final norm, output) is another. All-gathers run on their own stream: in
    forward the next block's is issued while the current block computes (implicit
    prefetch), in backward one block ahead (explicit prefetch); reduce-scatters run on a
    third stream beside the next block's backward. Exposed: the root's and the first block's
    gathers in forward, the root's again when backward starts (it is resharded after
    forward; TorchTitan keeps the last block gathered), the first block's and the root's
    reduce-scatters after the last backward, what overruns the compute, and the slowdown of
    the compute they run beside (`hidden`). On the compute stream: each gather's copy-out
    from the gathered buffer into the parameters (read and write); on the reduce-scatter
    stream, each reduce-scatter's copy-in of the bf16 gradients into its fp32 input.

    Sharded over the data x context ranks (TorchTitan's dp_shard_cp mesh). Per step: without
    a pipeline every micro-batch gathers for its forward and (if resharded after forward)
    again for its backward, and reduce-scatters; under a pipeline `PipelineStage` keeps the
    gradients and their gathered weights until the last micro-batch: m + 1 gathers (one if
    kept after forward) and one reduce-scatter."""
    group = parallel.dims.data * parallel.dims.context
    if group == 1:
        return 0.0
    stride, device = parallel.dims.tensor, cluster.device
    numerics = parallel.numerics
    gathered = 1 if numerics.precision == "fp8" and numerics.fp8_param_gather else \
        memory.state_element_bytes(numerics.precision).params
    reduced = memory.gradient_element_bytes(numerics.main_grads_dtype)
    bandwidth = device.memory_bandwidth_gbs * 1e9 * device.efficiency.memory
    slowdown = device.efficiency.overlap_slowdown

    def gather(n: float) -> float:
        return group_collective_time("all_gather", n * gathered, group, stride, cluster)

    def reduce(n: float) -> float:  # with its copy-in of the bf16 gradients
        n *= trained_share  # only trained parameters have gradients
        return group_collective_time("reduce_scatter", n * reduced, group, stride, cluster) \
            + n * (2 + reduced) / bandwidth

    root = max(params - layers * block_params, 0.0)
    others = max(layers - 1, 0)  # blocks but one, each its own collective
    m, pipelined = parallel.num_micro_batches, parallel.dims.pipeline > 1
    policy = parallel.sharding.fsdp_reshard_after_forward
    kept = policy == "never" or (policy == "default" and pipelined)
    forwards = 1 if pipelined and kept else m  # forwards that gather
    backwards = 1 if pipelined else m  # backwards that reduce-scatter
    # Forward: the root's and the first block's gathers wait; each other block's runs
    # beside the block before it.
    forward = forwards * hidden(
        gather(root) + layers * gather(block_params), others * kernels.forward,
        gather(root) + gather(block_params), slowdown)
    # Backward: unless kept, the root (resharded after forward) is gathered again before
    # the output layer's backward, and every block but the last (which TorchTitan never
    # reshards) beside the block after it; each block's reduce-scatter runs beside the
    # block before it, the first block's and the root's after the last compute.
    regathered = 0.0 if kept else root + others * block_params
    first = 0.0 if kept else gather(root)
    backward = backwards * hidden(
        first + (0.0 if kept else others * gather(block_params)) + reduce(root)
        + layers * reduce(block_params),
        layers * kernels.backward + replayed * kernels.recompute,
        first + reduce(block_params) + reduce(root), slowdown)
    copies = 2 * gathered * (forwards * (root + layers * block_params)
                             + backwards * regathered) / bandwidth
    return forward + backward + copies
