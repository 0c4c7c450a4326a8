"""Per-layer collectives of a stage, chosen by the intra-op ILP on the traced template.

`plan ... --intra-op ilp` prices the tensor-parallel communication of every stage with the
sharding Alpa's intra-op ILP picks for the model's block template on each logical mesh
(1-D meshes of 2, 4, 8 ... GPUs), instead of assuming Megatron-LM's layout. Each ILP is
solved once per (template, mesh) on the model traced with two blocks at micro-batch 1, and
reused for every stage, micro-batch size and recomputation mode: the hidden-state
collectives it plans scale with the tokens of a micro-batch.

Only the forward collectives of the interior block are read (module paths of forward
nodes are exact; backward ones are inferred); the backward of a tensor-parallel layer
moves the same volume in mirror (an all-gather's gradient is a reduce-scatter), so it is
charged the same.
"""

from __future__ import annotations

import time

from cost_models.layer_collectives import LayerCollective, LayerCollectives
from cost_models.transformer_ops import ACTIVATION_BYTES
from passes.dtensor_rules import fake_mesh
from passes.model_graph import ModelGraph
from passes.strategies import enumerate_strategies
from planner.vocabulary.cluster import Cluster
from planner.search.intra_op import plan_intra_op
from planner.search.workers import can_fork, forked_pool


def layer_collectives(
    graph: ModelGraph, cluster: Cluster, degrees: list[int], time_limit_s: float = 30.0,
    processes: int = 1,
) -> tuple[LayerCollectives, dict[str, float]]:
    """The ILP's per-layer forward collectives for each degree (in a canonical order, so
    that equal layouts compare and price equal), and the seconds of work spent
    enumerating strategies and solving ILPs (summed over processes).

    With `processes` > 1 the degrees are solved in that many forked processes, as Alpa
    compiles stages in parallel workers: the ILPs are independent and the graph is shared
    copy-on-write."""
    todo = [d for d in degrees if d != 1]
    block = _interior_block(graph)
    if processes > 1 and len(todo) > 1 and can_fork():
        global _FORKED  # what forked workers read: the graph is not picklable
        _FORKED = (graph, block, cluster, time_limit_s)
        try:
            with forked_pool(min(processes, len(todo))) as pool:
                answers = pool.map(_solve_forked, todo)
        finally:
            _FORKED = None
    else:
        answers = [_solve(graph, block, cluster, d, time_limit_s) for d in todo]
    result: LayerCollectives = {1: ()}
    timings = {"strategies_s": 0.0, "intra_op_ilps_s": 0.0}
    for degree, (collectives, strategies_s, ilp_s) in zip(todo, answers):
        result[degree] = collectives
        timings["strategies_s"] += strategies_s
        timings["intra_op_ilps_s"] += ilp_s
    return result, timings


_FORKED: tuple[ModelGraph, str, Cluster, float] | None = None


def _solve_forked(degree: int) -> tuple[tuple[LayerCollective, ...], float, float]:
    graph, block, cluster, time_limit_s = _FORKED
    return _solve(graph, block, cluster, degree, time_limit_s)


def _solve(
    graph: ModelGraph, block: str, cluster: Cluster, degree: int, time_limit_s: float
) -> tuple[tuple[LayerCollective, ...], float, float]:
    """The forward collectives of `block` on a 1-D mesh of `degree`, and the seconds spent
    enumerating strategies and solving."""
    mesh = fake_mesh((degree,))
    start = time.perf_counter()
    table = enumerate_strategies(graph.program, mesh, cluster.device)
    strategies_s = time.perf_counter() - start
    start = time.perf_counter()
    # Only the interior block's collectives are read; the search checks memory itself (the
    # traced program, embedding and head included, need not fit one device). The layer
    # prices a Megatron-LM stage, whose linears each move their own input.
    solution = plan_intra_op(graph.program, table, mesh, cluster.with_unbounded_memory(),
                             time_limit_s, shared_moves=False)
    collectives = tuple(sorted(
        LayerCollective(collective.kind, _bf16(graph, collective.nbytes))
        for transfer in solution.transfers
        if transfer.phase == "forward" and _inside(graph, transfer.consumer, block)
        for collective in transfer.collectives
    ))
    return collectives, strategies_s, time.perf_counter() - start


def _interior_block(graph: ModelGraph) -> str:
    """Module path of a traced block with blocks on both sides in the full model."""
    blocks = [layer.source for layer in graph.layers if layer.source != layer.name]
    if not blocks:
        raise ValueError(
            "--intra-op ilp needs a model traced one block per template (a preset, a "
            "gpt/llama/mixtral shape or an hf: config)."
        )
    return blocks[-1]


def _inside(graph: ModelGraph, node: str, block: str) -> bool:
    module = graph.program.nodes[node].meta.get("tessel_module") or ""
    return module == block or module.startswith(block + ".")


def _bf16(graph: ModelGraph, nbytes: float) -> float:
    """Bytes per token in bf16 of a collective traced at the model's parameter dtype."""
    traced = next(iter(graph.program.parameters))
    element = graph.program.nodes[traced].meta["val"].element_size()
    return nbytes / graph.tokens * ACTIVATION_BYTES / element
