"""A training Plan's configuration in the cost model's terms: the `ParallelConfig` and the
stage layouts it was predicted with, read back from the plan (no search)."""

from __future__ import annotations

from cost_models.pipeline_memory import StageLayout
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan, RunSettings


def plan_model(plan: Plan, model: TransformerConfig | None) -> TransformerConfig | None:
    """The model's shape: as given, else as the plan records it (`Plan.architecture`)."""
    return model if model is not None else plan.architecture


def one_layout_problem(plan: Plan) -> str | None:
    """Why `plan` is not one training layout on one kind of machine, what an engine's
    config describes (one line), or None: an operator-level plan has no degrees or batch;
    an Alpa-space plan gives each stage its own mesh; a plan across a mixed cluster's
    pools runs its stages on different machines."""
    if plan.parallel is None or plan.micro_batch_size is None or plan.global_batch_size is None:
        return "it is an operator-level plan (no data-parallel degree or batch)"
    if plan.mesh_axes == ["device"]:
        return "its pipeline stages run on different meshes"
    pools = dict.fromkeys(stage.pool for stage in plan.stages)
    if len(pools) > 1:
        return f"its pipeline stages run on different machines (pools {', '.join(map(str, pools))})"
    return None


def parallel_config(plan: Plan) -> ParallelConfig:
    """The knobs `plan` shares across its stages. An Alpa-space plan records the degrees
    as its first stage sees them; the sequences of one micro-batch (micro-batch size x
    data), which each stage splits over its own replicas, are the same either way."""
    if plan.parallel is None or plan.global_batch_size is None or plan.micro_batch_size is None:
        raise ValueError("an operator-level plan has no pipeline to report; plan with --gpus")
    q, run = plan.parallel, plan.run or RunSettings()
    return ParallelConfig.of(
        tensor=q.tensor, pipeline=len(plan.stages), data=q.data, context=q.context,
        expert=q.expert, expert_tensor=q.expert_tensor, sequence_parallel=q.sequence_parallel,
        micro_batch_size=plan.micro_batch_size, global_batch_size=plan.global_batch_size,
        recompute=plan.recompute, zero_stage=q.zero_stage, schedule=plan.schedule or "1f1b",
        virtual_pipeline=q.virtual_pipeline, precision=plan.precision,
        **{name: getattr(run, name) for name in RunSettings.model_fields},
    )


def stage_layouts(plan: Plan) -> list[StageLayout]:
    """Each stage's layers and (data x tensor) mesh, as the step-time model takes them."""
    layouts = []
    for stage in plan.stages:
        size = dict(zip(stage.mesh_axes, stage.mesh_shape))
        layouts.append(StageLayout(stage.layers[1] - stage.layers[0], size.get("tp", 1),
                                   size.get("dp", 1)))
    return layouts
