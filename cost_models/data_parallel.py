"""The data-parallel collectives of a step left exposed: gradient reduction (all-reduce,
or reduce-scatter under ZeRO), the updated weights' all-gather, and ZeRO-3's gathers per
micro-batch, each hidden where Megatron-LM's bucketed overlap runs it beside compute.
"""

from __future__ import annotations

from cost_models import memory
from cost_models.comm import group_collective_time
from cost_models.kernel_time import Pass
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

# Megatron-LM's gradient buckets: max(40M, 1M x data-parallel size) parameters
# (megatron/core/distributed/distributed_data_parallel.py, bucket_size's default).
DDP_BUCKET_PARAMETERS = 40_000_000
DDP_BUCKET_PARAMETERS_PER_RANK = 1_000_000


def data_parallel_comm(
    params: float, parallel: ParallelConfig, cluster: Cluster, kernels: Pass, layers: int,
    replayed: int,
) -> float:
    """Exposed gradient reduction (and weight gathering) of a stage whose ranks hold
    `params` parameters, `layers` layers of `kernels` each, `replayed` of them recomputed
    in backward: what bucketed overlap with the last backward (and the next forward)
    leaves exposed."""
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
    if parallel.sharding.zero_stage == 3:
        # Weights gathered again for every micro-batch's forward, and once for the
        # backward (FSDP2 keeps them gathered between micro-batches' backwards): m + 1
        # gathers in all, as `cost_models.training_collectives` counts them. FSDP
        # prefetches them beside the compute, as bucketed reduction does.
        reduce += parallel.num_micro_batches * group_collective_time(
            "all_gather", params * element.params, d, stride, cluster
        )
    slowdown = cluster.device.efficiency.overlap_slowdown
    if parallel.overlap.overlap_grad_reduce:
        # Buckets reduce as the last micro-batch's backward produces them.
        window = layers * kernels.backward + replayed * kernels.recompute
        reduce = hidden(reduce, window, reduced(bucket), slowdown)
    if parallel.overlap.overlap_param_gather or (parallel.overlap.overlap_grad_reduce
                                         and parallel.sharding.zero_stage == 3):
        # The updated weights are gathered bucket by bucket as the next forward needs them.
        gather = hidden(gather, layers * kernels.forward, gathered(bucket), slowdown)
    return reduce + gather


def hidden(seconds: float, window: float, tail: float, slowdown: float) -> float:
    """Exposed time of `seconds` of communication run beside `window` seconds of compute:
    what the window cannot cover, at least the `tail` no compute is left to hide, plus
    the compute it slows while it runs beside it."""
    exposed = max(seconds - window, min(tail, seconds))
    return exposed + slowdown * (seconds - exposed)
