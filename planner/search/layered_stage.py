"""A stage run as its layers' programs in turn, each as the layer table solved it.

Between two layers of such a stage the runtime (`runtime.graph_pipeline`) does what it does between
two stages on the same devices, without sending: the earlier layer's outputs are moved to
replicated and become the later one's incoming tensors, whose gradients are moved to
replicated on the way back. So the stage costs exactly the sum of its layers' solves, with
no whole-stage ILP to trace and solve, and a layer that repeats a template (one of a GPT's
identical blocks) reuses the template's solve under its own parameters' names. A
recomputing stage runs every layer's first pass again, the moves between its layers too.
"""

from __future__ import annotations

from dataclasses import replace

from passes.stage_graph import BOUNDARY
from planner.search.stage_solve import StageCost, StageResult


def renamed(result: StageResult, names: dict[str, str]) -> StageResult:
    """The solve of one layer, `result`, for a layer that computes the same thing on other
    parameters: `names` maps each solved parameter's FQN to this layer's."""
    if all(old == new for old, new in names.items()):
        return result
    buckets = [bucket.model_copy(update={"members": [names.get(m, m) for m in bucket.members]})
               for bucket in result.operators.gradient_buckets]
    return replace(
        result, parameters={names.get(f, f): p for f, p in result.parameters.items()},
        operators=result.operators.model_copy(update={"gradient_buckets": buckets}))


def layered(results: list[StageResult]) -> StageResult | None:
    """The stage of these layers' solves (in layer order), each layer its own program; None
    where two of them hold one parameter in different placements (the stage keeps one copy
    of it)."""
    parameters: dict[str, str] = {}
    for k, result in enumerate(results):
        for fqn, placement in result.parameters.items():
            if fqn.startswith(BOUNDARY + ".") and k:
                continue  # an interior boundary: the previous layer's outputs
            if parameters.setdefault(fqn, placement) != placement:
                return None
    costs = [r.cost for r in results]
    first, last = costs[0], costs[-1]
    # The moves of every layer's outputs but the last's are part of the first pass.
    interior = [c for r in results[:-1] for c in r.outgoing]
    cost = StageCost(
        micro_batch_s=sum(c.micro_batch_s for c in costs), incoming_s=first.incoming_s,
        outgoing_s=last.outgoing_s, step_comm_s=sum(c.step_comm_s for c in costs),
        state_bytes=sum(c.state_bytes for c in costs),
        activation_bytes=sum(c.activation_bytes for c in costs),
        exact=all(c.exact for c in costs),
        rerun_s=sum(c.rerun_s for c in costs) + sum(c.outgoing_s for c in costs[:-1]),
        checkpoint_bytes=first.checkpoint_bytes)
    return StageResult(
        cost, compute_s=sum(r.compute_s for r in results),
        per_micro_batch=tuple(c for r in results for c in r.per_micro_batch),
        per_step=tuple(c for r in results for c in r.per_step),
        parameters=parameters, operators=None,
        rerun=tuple(c for r in results for c in r.rerun) + tuple(interior),
        outgoing=results[-1].outgoing,
        layer_operators=tuple(r.operators for r in results))
