"""What CUDA graphs' private memory pool holds beside the memory the allocator reports.

Megatron-LM captures a layer, or parts of it (`--cuda-graph-impl transformer_engine
--cuda-graph-scope attn mlp ...`, or `local` for whole layers), after eager warm-up steps
(`cuda_graph_warmup_steps`, 3 in Megatron-Bridge's recipes). The mechanism, by its sources:

- PyTorch satisfies a capture's allocations from a graph-private pool, because a replay
  writes to the addresses fixed when it was captured (RFC pytorch/pytorch#51075; "Graph
  memory management" in torch.cuda's CUDA-graph notes). On replay only kernels run and the
  allocator sees nothing ("PyTorch CUDAGraph Integration", torch.compiler_cudagraph_trees):
  the graphed modules' saved tensors live in the pool, unseen by
  `torch.cuda.max_memory_allocated`, whose peak stays the eager warm-up's (what Tessel's
  allocated peak predicts).
- Transformer Engine's `make_graphed_callables`, as Megatron-Core's `TECudaGraphHelper`
  calls it (one pool for every graph, captured in the pipeline schedule's order, with
  `_reuse_graph_input_output_buffers`), reuses a micro-batch's buffers once its backward
  has run: the pool holds the graphed modules' saved tensors, and each one's static input
  (the hidden states it reads), for the micro-batches in flight.
- The pool cannot use the blocks the eager warm-up left cached, which the default
  allocator hands back to the device only as whole free segments, on a failed cudaMalloc
  (`release_cached_blocks`); `expandable_segments:True` unmaps them page by page.

So what the allocator may hold is the eager pool's reserved peak plus the graph pool. A
plan whose sum crosses the device runs or not by how its cached segments split, as
Megatron-Bridge's Llama 3 70B SFT run did (out of memory in 30-60% of runs at 58.8 GB
allocated; it passed with expandable segments, `published_memory.csv`), and is flagged,
not refused. Megatron-Bridge's account (skills/mbridge-perf-cuda-graphs): "CUDA graphs pin
all intermediate buffers for the graph's lifetime... full-iteration graphs can increase
peak memory by 1.5-2x".
"""

from __future__ import annotations

from cost_models.layer_mix import layer_variants
from cost_models.saved_activations import (
    activation_element_bytes,
    layer_shape,
    megatron_sublayers,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig


def graphed(parallel: ParallelConfig) -> bool:
    """Whether Megatron-LM runs part of each layer in CUDA graphs."""
    return parallel.execution.engine == "megatron" and bool(
        parallel.execution.cuda_graphs or parallel.execution.cuda_graph_scope)


def pool_bytes(
    model: TransformerConfig, parallel: ParallelConfig, kept: dict[str, float],
    layers: int, in_flight: float, score_free: bool,
) -> float:
    """Bytes the graph pool of a stage of `layers` layers holds with `in_flight`
    micro-batches in flight, whose layers keep `kept` (by kind, `stage_activations`)."""
    if not graphed(parallel):
        return 0.0
    whole = parallel.execution.cuda_graphs or {"full", "full_iteration"} & set(
        parallel.execution.cuda_graph_scope)
    if whole:
        return sum(bytes_ for kind, bytes_ in kept.items() if kind != "loss")
    x = layer_shape(model, parallel)
    static_input = activation_element_bytes(parallel.numerics.precision) * x.tokens * x.hidden \
        / x.sequence_shards
    per_layer = 0.0
    for variant, share in layer_variants(model):
        parts = megatron_sublayers(variant, parallel, score_free)
        for sublayer in _captured(variant, parallel.execution.cuda_graph_scope):
            per_layer += share * (sum(parts[sublayer].values()) + static_input)
    return per_layer * layers * in_flight


def _captured(model: TransformerConfig, scope: tuple[str, ...]) -> list[str]:
    """The sublayers of a layer of `model`'s kind that `scope` captures: "attn" its
    attention, "mlp" a dense MLP, "moe" an MoE layer's experts. The router scopes
    (moe_router, moe_preprocess) keep a router's scores, [tokens, experts], which the
    MoE sublayer's count holds already."""
    captured = ["attn"] if "attn" in scope else []
    if ("moe" if model.is_moe else "mlp") in scope:
        captured.append("mlp")
    return captured
