"""Each pipeline stage's forward, backward, recomputation and exposed communication per
micro-batch, for drawing a Plan's schedule.

A Plan records its step time and breakdown, not each stage's phases, so they are
predicted again here from the plan's own configuration with the step-time model's public
pieces (`cost_models.step_time`, `kernel_time`, `transformer_ops`,
`training_collectives`), stage by stage as `predict_stages` does; nothing is searched.
The layer's kernels are split by phase as the kernel model times them; its exposed
collectives are the step-time model's own total per layer (`stage_costs`, overlap with
matmuls included), split by phase as their unoverlapped prices are.

Nothing here prices the pipeline: the timeline runs these phases through the schedule's
actions (`schedule_timeline`), and the plan's own pipeline time is read from its
breakdown (`plan_pipeline_seconds`) to be shown beside it. The slowest stage's phases sum
to the breakdown's compute, tensor-parallel and pipeline communication per micro-batch
(the tests check it), except where the plan's layer collectives came from the intra-op
ILP (a search given `collectives`, `planner.search.stage_ilp`), which a Plan does not keep.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.comm import group_collective_time
from cost_models.kernel_time import Pass, pass_seconds
from cost_models.pipeline_memory import StageLayout, attention_backend, recomputed_layers
from cost_models.step_time import activation_bytes, price, rank_layout, stage_costs
from cost_models.training_collectives import (
    boundary_collectives,
    end_collectives,
    layer_collectives,
)
from cost_models.transformer_ops import attention_kernels, fp8_casts, head_ops, layer_ops
from planner.cluster import Cluster
from planner.export.plan_config import parallel_config, stage_layouts
from planner.export.schedule_timeline import StagePhases
from planner.models.config import TransformerConfig
from planner.parallel import ParallelConfig
from planner.plan import Plan


@dataclass(frozen=True)
class StageTimes:
    """A plan's stages, one micro-batch each, and the plan's pipeline time."""

    phases: list[StagePhases]
    """Each stage's seconds per micro-batch by phase."""
    pipeline_s: float
    """The plan's predicted pipeline time: its step less data-parallel and optimizer."""


def plan_pipeline_seconds(plan: Plan) -> float:
    """Fill, steady state and drain of `plan`'s pipeline, as its breakdown records them."""
    b = plan.predicted.breakdown
    if b is None:
        raise ValueError("the plan has no step-time breakdown to draw")
    return b.compute_s + b.tensor_parallel_comm_s + b.pipeline_comm_s + b.bubble_s


def stage_times(plan: Plan, model: TransformerConfig, cluster: Cluster) -> StageTimes:
    """The phases of `plan`'s stages (a training plan of `model` on `cluster`)."""
    parallel = parallel_config(plan)
    layouts = stage_layouts(plan)
    p, v = len(layouts), parallel.virtual_pipeline
    sequences = parallel.micro_batch_size * parallel.data
    p2p = _pipeline_p2p(model, parallel, layouts, cluster) if p > 1 else 0.0
    phases = []
    for index, layout in enumerate(layouts):
        here = replace(parallel, tensor=layout.tensor, data=layout.data,
                       micro_batch_size=sequences // layout.data)
        kernels = _layer_kernels(model, here, cluster)
        comm = _layer_communication(model, parallel, here, cluster, kernels)
        replayed = recomputed_layers(parallel, layout.layers)
        forward = layout.layers * kernels.forward
        backward = layout.layers * kernels.backward
        if index == p - 1:  # the final norm, output layer and loss
            head = head_ops(model, here.micro_batch_size, model.seq_length / here.context,
                            here.tensor)
            forward += pass_seconds(head, cluster.device, cluster.device.efficiency,
                                    here.precision)
            backward += pass_seconds(head, cluster.device, cluster.device.efficiency,
                                     here.precision, backward=True)
        ends = _ends(model, here, cluster, index, p, v)
        phases.append(StagePhases(
            forward=forward, backward=backward, recompute=replayed * kernels.recompute,
            forward_communication=layout.layers * comm.forward + ends.forward,
            backward_communication=layout.layers * comm.backward + replayed * comm.recompute
            + ends.backward + ends.recompute,
            transfer=p2p,
        ))
    return StageTimes(phases, plan_pipeline_seconds(plan))


def _layer_kernels(model: TransformerConfig, here: ParallelConfig, cluster: Cluster) -> Pass:
    """One layer's kernels for one micro-batch on the stage's mesh: forward, backward,
    and what recomputation replays (the whole forward, or the attention core)."""
    device, eff = cluster.device, cluster.device.efficiency
    ops = layer_ops(model, here.micro_batch_size, model.seq_length / here.context,
                    here.tensor, here.sequence_parallel,
                    attention_backend(here, device.flash_attention), here.context)
    if here.precision == "fp8":
        ops += fp8_casts(ops, here.fp8_recipe)

    def seconds(kernels: list, backward: bool = False) -> float:
        return pass_seconds(kernels, device, eff, here.precision, backward=backward,
                            graphed=here.cuda_graphs)

    forward = seconds(ops)
    replay = {"none": 0.0, "selective": seconds(attention_kernels(ops)), "full": forward}
    return Pass(forward, seconds(ops, backward=True), replay[here.recompute])


def _layer_communication(model: TransformerConfig, parallel: ParallelConfig,
                         here: ParallelConfig, cluster: Cluster, kernels: Pass) -> Pass:
    """One layer's exposed collectives for one micro-batch, by phase: the step-time
    model's per-layer time less the kernels, split as the collectives' prices are."""
    costs = stage_costs(model, cluster, parallel, here.tensor, here.data)
    exposed = max(costs.layer_s - kernels.total, 0.0)
    issued = price(layer_collectives(model, rank_layout(here)), here, cluster)
    if issued.total <= 0:
        return Pass(0.0, 0.0, 0.0)
    share = exposed / issued.total
    return Pass(issued.forward * share, issued.backward * share, issued.recompute * share)


def _ends(model: TransformerConfig, here: ParallelConfig, cluster: Cluster, index: int,
          p: int, v: int) -> Pass:
    """The embedding's and head's collectives on the first and last stage, and each of the
    stage's v chunks gathering the sequence slices it receives (and their gradients)."""
    layout = rank_layout(here)
    ends = price(end_collectives(model, layout, index == 0, index == p - 1), here, cluster)
    if p == 1:
        return ends
    slices = price(boundary_collectives(model, layout, index == 0 and v == 1,
                                        index == p - 1 and v == 1), here, cluster)
    return Pass(ends.forward + v * slices.forward, ends.backward + v * slices.backward,
                ends.recompute + v * slices.recompute)


def _pipeline_p2p(model: TransformerConfig, parallel: ParallelConfig,
                  layouts: list[StageLayout], cluster: Cluster) -> float:
    """Activation out and gradient in per micro-batch across the slowest boundary, each
    rank sending its 1/t slice, the pipeline as one group `devices` apart (as the
    step-time model prices them)."""
    sequences = parallel.micro_batch_size * parallel.data
    nbytes = max(sequences / s.data * model.seq_length / parallel.context * model.hidden_size
                 * activation_bytes(parallel.precision) / s.tensor for s in layouts)
    stride = min(s.devices for s in layouts) * parallel.context
    return 2 * group_collective_time("send_recv", nbytes, len(layouts), stride, cluster)
