"""A training plan's whole-run totals: how many steps the run takes, what one checkpoint
of the plan holds, and `cost_models.economics` applied to the plan's prediction."""

from __future__ import annotations

import math

from cost_models.economics import RunAssumptions, training_totals
from cost_models.memory import state_element_bytes
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan, TrainingTotals


def run_steps(model: TransformerConfig, global_batch_size: int, train_tokens: float | None,
              train_iters: int | None) -> int:
    """Optimizer steps of a run of `train_iters` steps, or of `train_tokens` tokens in
    batches of `global_batch_size` sequences (the last batch rounded up)."""
    if train_iters is not None:
        return train_iters
    assert train_tokens is not None
    return math.ceil(train_tokens / (global_batch_size * model.seq_length))


def checkpoint_bytes(plan: Plan, num_parameters: float) -> tuple[float, float]:
    """(bytes of one checkpoint of the whole model of `num_parameters`, bytes the fullest
    rank writes): the weights and the optimizer state (fp32 master weights and Adam's
    moments under mixed precision); gradients are not saved. Replicated shards are written
    once."""
    element = state_element_bytes(plan.precision)
    total = num_parameters * (element.params + element.optimizer)
    per_rank = max((stage.memory.parameters_bytes + stage.memory.optimizer_bytes)
                   for stage in plan.stages if stage.memory is not None)
    return float(total), float(per_rank)


def plan_totals(plan: Plan, num_parameters: float, cluster: Cluster, steps: int,
                settings: RunAssumptions) -> TrainingTotals:
    """The totals of `steps` steps of `plan` of a model of `num_parameters` on `cluster`
    (whose `run_costs` give power)."""
    assert cluster.run_costs is not None
    predicted = plan.predicted
    total, per_rank = checkpoint_bytes(plan, num_parameters)
    return training_totals(
        steps=steps, step_time_s=predicted.step_time_s,
        compute_fraction=predicted.compute_s / predicted.step_time_s,
        gpus=plan.num_gpus, checkpoint_bytes=total, rank_checkpoint_bytes=per_rank,
        devices_per_host=plan.devices_per_host or plan.devices_per_node,
        costs=cluster.run_costs, settings=settings,
    )
