"""Training plans on a mixed cluster: the best plans `search_pools` finds, as Plans.

A plan on one pool alone is that pool's plan (Megatron-LM's flags where it runs it), its
stages naming the pool; a pipeline across pools is a plan of stages that each name their
pool, ranks numbered in pipeline order (a pool's ranks together), so a launcher starts
each pool's hosts with their own devices per host.
"""

from __future__ import annotations

from planner.models.config import TransformerConfig
from planner.plans.transformer_plan import training_plan
from planner.search.megatron_space import SearchSpace
from planner.search.pool_space import search_pools
from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.plan import Plan
from planner.vocabulary.pools import PooledCluster


def plan_pools(
    name: str, model: TransformerConfig, pooled: PooledCluster, global_batch_size: int,
    fixed: FixedKnobs | None = None, space: SearchSpace = "auto", top: int = 1,
) -> tuple[list[Plan], int]:
    """The `top` best training plans of `model` on `pooled`, best first, and how many
    configurations were predicted. No plan: nothing fits."""
    found, evaluated = search_pools(model, pooled, global_batch_size, fixed or FixedKnobs(),
                                    space)
    plans = []
    for found_plan in found[:top]:
        candidate, prediction = found_plan.candidate, found_plan.prediction
        if found_plan.pool is None:
            plans.append(training_plan(name, model, pooled, candidate.parallel,
                                       stages=candidate.stages, prediction=prediction))
            continue
        pool = pooled.pools[found_plan.pool]
        plan = training_plan(name, model, pool.cluster, candidate.parallel,
                             list(candidate.layers_per_stage), candidate.stages,
                             prediction=prediction,
                             chunk_layers=list(candidate.chunk_layers)
                             if candidate.chunk_layers else None)
        plans.append(plan.model_copy(update={
            "cluster": pooled.name,
            "stages": [stage.model_copy(update={"pool": pool.name}) for stage in plan.stages],
            "provenance": plan.provenance.model_copy(update={"cluster": pooled.name})}))
    return plans, evaluated
