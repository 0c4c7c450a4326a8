"""How long a mixture-of-experts layer takes to send its tokens to their experts and the
outputs back, as Megatron-Core's token dispatchers run it (--moe-token-dispatcher-type).

One rank routes the tokens of its sequence shard (`ExpertSplit.sequence_shards`); the
expert group is `expert` ranks `expert_tensor` apart (Megatron-Core's expert rank order
puts the expert-tensor ranks innermost: Liu et al. 2025, "MoE Parallel Folding", arXiv
2504.14960), each rank holding num_experts / expert experts. Per layer and micro-batch:

- ``allgather``: the expert group all-gathers every token (and its routing
  probabilities), each rank runs its experts on the tokens routed to them, and a
  reduce-scatter returns the outputs; backward mirrors it.
- ``alltoall``: each (token, expert) row goes to its expert's rank in one all-to-all
  (dispatch) and back in another (combine); the expert-tensor ranks then all-gather the
  rows they share and reduce-scatter the outputs. Backward runs the same collectives.
- ``flex``: DeepEP's (or HybridEP's) fused kernels (DeepSeek-AI 2025, github.com/
  deepseek-ai/DeepEP): a token crosses the scale-out fabric once per remote *node*
  holding one of its experts and is forwarded over NVLink inside it; node-limited
  routing (--moe-router-num-groups / --moe-router-group-topk, DeepSeek-V3 report
  Sec. 2.1.2) caps those nodes at the group top-k.

The busiest rank sets the pace: with forced balance every rank gets its even share;
otherwise the expected maximum load of the ep ranks over rows routed uniformly at random
(Raab & Steger, "Balls into Bins", RANDOM 1998, Thm. 1: m balls into n bins, m >= n log
n, leave the fullest with m/n + sqrt(2 m ln n / n)), capped by the capacity factor. With
--overlap-moe-expert-parallel-comm the all-to-alls of one micro-batch run beside the
other's compute (Megatron-Core's combined 1F1B schedule, `overlapped_layer_seconds`):
each waits on the compute that produces its input, so what stays exposed depends on
where the weight gradients run (--delay-wgrad-compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cost_models.comm import group_collective_time
from cost_models.kernel_time import Pass, pass_seconds, weight_gradient_seconds
from cost_models.saved_activations import activation_element_bytes
from cost_models.transformer_ops import ExpertSplit, Op, projections
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig


@dataclass(frozen=True)
class DispatchShape:
    """One rank's tokens of one micro-batch entering an MoE layer, and its expert group."""

    tokens: float
    """Tokens the rank routes (its sequence shard of the micro-batch)."""
    expert: int
    """Expert-parallel degree."""
    expert_tensor: int
    """Tensor degree inside each expert; the expert group's ranks are this far apart."""
    element_bytes: int
    """Bytes of an activation element on the wire."""


def expected_load(rows_per_rank: float, expert: int, parallel: ParallelConfig) -> float:
    """Rows of the busiest expert-parallel rank over its even share: the capacity factor
    where inputs are padded to it; 1 under forced balance; else Raab & Steger's
    m/n + sqrt(2 m ln n / n) over m/n for m rows on n = ep ranks, at most the capacity
    factor."""
    cap = parallel.moe.moe_expert_capacity_factor
    if parallel.moe.moe_pad_expert_input_to_capacity and cap is not None:
        return cap  # every rank computes and sends its padded capacity
    if parallel.moe.moe_router_force_load_balancing or expert == 1 or rows_per_rank <= 0:
        return 1.0
    load = 1.0 + math.sqrt(2.0 * math.log(expert) / rows_per_rank)
    return min(load, cap) if cap is not None else load


def remote_nodes_per_token(model: TransformerConfig, nodes: int) -> float:
    """Expected nodes other than its own that one token's top-k experts live on, the
    experts spread evenly over `nodes` nodes and chosen uniformly (without replacement),
    among at most the group top-k nodes under group-limited routing (groups aligned with
    nodes, as DeepSeek-V3 lays them out)."""
    experts, k = model.num_experts or 1, model.moe_top_k
    candidates = nodes
    if model.moe_router_group_topk is not None and model.moe_router_num_groups:
        per_group = max(1, nodes // model.moe_router_num_groups)
        candidates = min(nodes, model.moe_router_group_topk * per_group)
    pool = experts * candidates / nodes
    per_node = experts / nodes
    # P(no expert on a given candidate node) = C(pool - per_node, k) / C(pool, k).
    empty = math.comb(int(pool - per_node), k) / math.comb(int(pool), k) \
        if pool - per_node >= k else 0.0
    distinct = candidates * (1.0 - empty)
    return distinct * (nodes - 1) / nodes


def dispatch_seconds(model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster,
                     shape: DispatchShape, load: float) -> float:
    """Seconds of one direction's dispatch and combine of one MoE layer, one micro-batch,
    on the busiest rank (the backward moves the same bytes)."""
    ep, etp = shape.expert, shape.expert_tensor
    h, e, k = model.hidden_size, shape.element_bytes, model.moe_top_k
    rows = shape.tokens * k * load
    seconds = 0.0
    if parallel.moe.moe_token_dispatcher == "allgather":
        group = ep * etp
        gathered = shape.tokens * group * (h * e + (model.num_experts or 0) * 4)
        seconds += group_collective_time("all_gather", gathered, group, 1, cluster)
        seconds += group_collective_time("reduce_scatter", shape.tokens * group * h * e,
                                         group, 1, cluster)
        return seconds
    if ep > 1:
        if parallel.moe.moe_token_dispatcher == "flex":
            exchange = _flex_seconds(model, cluster, shape, load)
        else:
            exchange = group_collective_time("all_to_all", rows * h * e, ep, etp, cluster)
        seconds += 2 * exchange / cluster.device.efficiency.alltoall_bandwidth
    if etp > 1:
        seconds += group_collective_time("all_gather", rows * h * e * etp, etp, 1, cluster)
        seconds += group_collective_time("reduce_scatter", rows * h * e * etp, etp, 1,
                                         cluster)
    return seconds


def _flex_seconds(model: TransformerConfig, cluster: Cluster, shape: DispatchShape,
                  load: float) -> float:
    """One DeepEP all-to-all: the scale-out bytes of each token's remote nodes and the
    scale-up bytes of its rows, moved at once (its kernels drive both links together)."""
    ep, etp = shape.expert, shape.expert_tensor
    h, e = model.hidden_size, shape.element_bytes
    rows_bytes = shape.tokens * model.moe_top_k * load * h * e
    if not cluster.spans_domains(etp, ep):
        return group_collective_time("all_to_all", rows_bytes, ep, etp, cluster)
    per_domain = cluster.ranks_per_domain(etp, ep)
    nodes = max(1, ep // per_domain)
    remote = remote_nodes_per_token(model, nodes) * shape.tokens * load * h * e
    eff = cluster.device.efficiency
    scale_out = cluster.inter_node.bandwidth_gbs * eff.inter_node_bandwidth * 1e9
    inside = group_collective_time("all_to_all", rows_bytes, per_domain, etp, cluster)
    return max(remote / scale_out + cluster.inter_node.latency_us * 1e-6 * nodes, inside)


@dataclass(frozen=True)
class SlotCompute:
    """One compute slot of an MoE layer as Megatron-Core's EP-overlap schedule runs it
    (megatron/core/models/gpt/fine_grained_callables.py, build_transformer_layer_
    callables): its forward, its backward's input gradients and its weight gradients."""

    forward: float
    input_grads: float
    """The backward but its projections' weight gradients (a replayed forward included)."""
    weight_grads: float


@dataclass(frozen=True)
class LayerSlots:
    """An MoE layer's compute in the schedule's two compute slots: pre-dispatch (norms,
    attention, router, permutation, shared experts) and the routed experts ("mlp")."""

    attention: SlotCompute
    experts: SlotCompute

    @property
    def total(self) -> float:
        return sum(slot.forward + slot.input_grads + slot.weight_grads
                   for slot in (self.attention, self.experts))


# The routed experts' kernels (`transformer_ops._mlp_ops`), the schedule's "mlp" slot;
# every other kernel of a layer runs in its pre-dispatch slot.
_EXPERT_SLOT = ("expert input", "expert activation", "expert output")


def layer_slots(ops: list[Op], compute: Pass, cluster: Cluster,
                parallel: ParallelConfig) -> LayerSlots:
    """`compute` (a layer's priced time) split into `LayerSlots` in the proportions of its
    kernels' GPU time: the routed experts' kernels against the rest, and each slot's
    backward into its projections' weight gradients and the remainder. A replayed
    forward runs before the backward it feeds: with the pre-dispatch input gradients."""
    device, eff = cluster.device, cluster.device.efficiency
    precision = parallel.numerics.precision

    def gpu(kernels: list[Op], backward: bool) -> float:
        return pass_seconds(kernels, device, eff, precision, backward=backward, graphed=True)

    forward_all, backward_all = gpu(ops, False) or 1.0, gpu(ops, True) or 1.0

    def slot(kernels: list[Op], recompute: float) -> SlotCompute:
        backward = compute.backward * gpu(kernels, True) / backward_all
        weights = compute.backward * sum(weight_gradient_seconds(op, device, eff, precision)
                                         for op in projections(kernels)) / backward_all
        return SlotCompute(compute.forward * gpu(kernels, False) / forward_all,
                           backward - weights + recompute, weights)

    experts = [op for op in ops if op.name.removesuffix(" fp8 cast") in _EXPERT_SLOT]
    others = [op for op in ops if op.name.removesuffix(" fp8 cast") not in _EXPERT_SLOT]
    return LayerSlots(slot(others, compute.recompute), slot(experts, 0.0))


def overlapped_layer_seconds(all_to_all: float, slots: LayerSlots, delayed: bool) -> float:
    """Time per layer of Megatron-Core's combined 1F1B schedule in steady state: one
    micro-batch's forward beside another's backward, layer after layer, the four
    all-to-alls (`all_to_all` seconds each) in order on the communication stream and the
    compute in order on the compute stream (megatron/core/models/common/
    model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):

        comm:    combine bwd   | dispatch fwd  dispatch bwd  | combine fwd
        compute: attention fwd | experts bwd   experts fwd   | attention bwd

    Each node waits for what produces its input: its micro-batch's event, recorded where
    that micro-batch's previous node ended (megatron/core/pipeline_parallel/utils.py,
    ScheduleNode); the next layer's backward combine waits for this one's attention
    backward, its forward attention for this one's forward combine. With `delayed`
    weight gradients (--delay-wgrad-compute) a slot's backward computes input gradients
    only and its weight gradients run after it on the compute stream, recording no event
    (TransformerLayerNode.backward_dw, megatron/core/models/common/utils.py): the
    backward dispatch waits for the experts' input gradients only, with their weight
    gradients beneath it, and the next layer's backward combine runs beneath the
    attention's weight gradients. Simulated over `_LAYERS_SIMULATED` layers, timed over
    the second half (the schedule is periodic by then)."""
    a, e = slots.attention, slots.experts
    comm = comp = grads_ready = inputs_ready = 0.0
    ends = []
    for _ in range(_LAYERS_SIMULATED):
        combine_backward = comm = max(comm, grads_ready) + all_to_all
        attention_forward = comp = max(comp, inputs_ready) + a.forward
        experts_input_grads = comp = max(comp, combine_backward) + e.input_grads \
            + (0.0 if delayed else e.weight_grads)
        comp += e.weight_grads if delayed else 0.0
        dispatch_forward = comm = max(comm, attention_forward) + all_to_all
        dispatch_backward = comm = max(comm, experts_input_grads) + all_to_all
        experts_forward = comp = max(comp, dispatch_forward) + e.forward
        inputs_ready = comm = max(comm, experts_forward) + all_to_all  # forward combine
        grads_ready = comp = max(comp, dispatch_backward) + a.input_grads \
            + (0.0 if delayed else a.weight_grads)
        comp += a.weight_grads if delayed else 0.0
        ends.append(max(comm, comp))
    half = _LAYERS_SIMULATED // 2
    return (ends[-1] - ends[half - 1]) / half


_LAYERS_SIMULATED = 16


def dispatch_pass(model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster,
                  shape: DispatchShape, load: float, slots: LayerSlots) -> Pass:
    """Exposed dispatch and combine of one MoE layer for one micro-batch, by phase. Under
    --overlap-moe-expert-parallel-comm: what the combined schedule's layer step
    (`overlapped_layer_seconds`) takes beyond the compute, plus the compute that the
    hidden all-to-alls slow, split evenly between forward and backward."""
    one_way = dispatch_seconds(model, parallel, cluster, shape, load)
    rerun = one_way if parallel.recomputation.recompute == "full" else 0.0
    if not parallel.moe.overlap_moe_expert_parallel_comm:
        return Pass(one_way, one_way, rerun)
    # One direction's dispatch and combine (`dispatch_seconds`) is two all-to-alls.
    step = overlapped_layer_seconds(one_way / 2, slots, parallel.moe.delay_wgrad_compute)
    exposed = max(0.0, step - slots.total)
    exposed += cluster.device.efficiency.overlap_slowdown * max(0.0, 2 * one_way - exposed)
    return Pass(exposed / 2, exposed / 2, 0.0)


def expert_split(model: TransformerConfig, parallel: ParallelConfig) -> ExpertSplit:
    """How a rank of `parallel` runs `model`'s MoE layers, the busiest rank's load
    included (`expected_load`)."""
    shards = parallel.dims.tensor if parallel.sharding.sequence_parallel else 1
    etp = parallel.dims.expert_tensor_degree if shards > 1 else parallel.dims.tensor
    split = ExpertSplit(expert_tensor=etp, sequence_shards=shards, expert=parallel.dims.expert,
                        grouped_gemm=parallel.moe.moe_grouped_gemm)
    tokens = parallel.batch.micro_batch_size * model.seq_length / parallel.dims.context
    rows = tokens * model.moe_top_k * split.routed_share
    return replace(split, load=expected_load(rows, parallel.dims.expert, parallel))


def moe_layer_comm(model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster,
                   split: ExpertSplit, compute: Pass, ops: list[Op]) -> Pass:
    """Exposed dispatch and combine of one MoE layer of `split` for one micro-batch
    beside `compute`, the time of its kernels `ops` (`dispatch_pass`)."""
    tokens = parallel.batch.micro_batch_size * model.seq_length / parallel.dims.context
    shape = DispatchShape(tokens=tokens / split.sequence_shards, expert=parallel.dims.expert,
                          expert_tensor=split.expert_tensor,
                          element_bytes=activation_element_bytes(parallel.numerics.precision))
    return dispatch_pass(model, parallel, cluster, shape, split.load,
                         layer_slots(ops, compute, cluster, parallel))


def host_sync(model: TransformerConfig, parallel: ParallelConfig, cluster: Cluster) -> Pass:
    """Host time an MoE layer leaves exposed (forward, and its replay where the MoE is
    recomputed): the dispatcher copies the tokens per expert to the host once per
    forward, and the GPU waits while the host launches the experts' GEMMs, one per local
    expert (Transformer Engine's GroupedLinear). Not under CUDA graphs, nor where the MoE
    preprocessing is graphed (Megatron-Core's --cuda-graph-scope moe_preprocess runs
    without the copy), nor for the all-gather dispatcher (no counts to copy)."""
    if parallel.moe.moe_token_dispatcher == "allgather" or parallel.execution.cuda_graphs \
            or "moe_preprocess" in parallel.execution.cuda_graph_scope:
        return Pass(0.0, 0.0)
    sync = cluster.device.efficiency.moe_sync_us * 1e-6 * (model.num_experts or 0) \
        / parallel.dims.expert
    recomputation = parallel.recomputation
    replays = recomputation.recompute == "full" or (
        recomputation.recompute == "selective" and "moe" in recomputation.recompute_modules)
    return Pass(sync, 0.0, sync if replays else 0.0)
