"""The Plan of one training configuration: its stages, predicted numbers and launch flags.

`training_plan` predicts a configuration (or takes the search's prediction of it) and
packages it as the one `Plan` schema (`planner/plan.py`): every stage's layers, ranks and
logical mesh, the degrees as the first stage sees them, and Megatron-LM's flags where
Megatron-LM can run it.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.layer_collectives import LayerCollectives
from cost_models.step_time import StageLayout, StepPrediction, even_split, predict_stages
from planner.cluster import Cluster
from planner.export.megatron import megatron_flags, megatron_incompatibility
from planner.models.config import TransformerConfig
from planner.parallel import ParallelConfig
from planner.plan import (
    Breakdown,
    ParallelDegrees,
    Plan,
    Predicted,
    Provenance,
    Stage,
    stage_mesh,
    tessel_version,
    training_mesh,
)
from planner.search.megatron_space import megatron_stage_splits


def training_plan(
    name: str, model: TransformerConfig, cluster: Cluster, parallel: ParallelConfig,
    layers_per_stage: list[int] | None = None, stages: tuple[StageLayout, ...] | None = None,
    collectives: LayerCollectives | None = None, prediction: StepPrediction | None = None,
) -> Plan:
    """Predict one configuration (unless the search's `prediction` of it is given) and
    package it as a plan. `stages` gives each stage its own mesh (Alpa's space); without
    it every stage runs on `parallel`'s mesh."""
    if stages is None:
        parallel = parallel.resolve(cluster.num_devices)
        layers = layers_per_stage or _even(model.num_layers, parallel.pipeline)
        layouts = [StageLayout(count, parallel.tensor, parallel.data) for count in layers]
    else:
        layouts, layers = list(stages), [stage.layers for stage in stages]
    if prediction is None:
        prediction = predict_stages(model, cluster, parallel, layouts, collectives=collectives)
    if stages is None:
        incompatibility = megatron_incompatibility(parallel, layers)
    else:
        incompatibility = "its pipeline stages run on different meshes (Alpa's space)"
        first = stages[0]
        # Degrees as the first stage sees them; `stages` in the plan has every mesh.
        parallel = replace(
            parallel, tensor=first.tensor, data=first.data, pipeline=len(stages),
            micro_batch_size=parallel.micro_batch_size * parallel.data // first.data,
        )
    flags = None if incompatibility else megatron_flags(model, parallel, layers)
    return _plan(name, cluster, parallel, layouts, prediction, flags, incompatibility)


def _plan(
    name: str, cluster: Cluster, parallel: ParallelConfig, layouts: list[StageLayout],
    prediction: StepPrediction, flags: list[str] | None, incompatibility: str | None,
) -> Plan:
    """The Plan of a configuration whose stages run on `layouts`' meshes."""
    stages, first_layer, first_device = [], 0, 0
    interleaved = _interleaved_chunks(sum(layout.layers for layout in layouts), len(layouts),
                                      parallel.virtual_pipeline)
    for index, layout in enumerate(layouts):
        axes, shape = stage_mesh(layout.data, parallel.context, layout.tensor)
        devices = layout.devices * parallel.context
        layers = (first_layer, first_layer + layout.layers)
        stages.append(Stage(layers=layers, first_device=first_device, num_devices=devices,
                            mesh_axes=axes, mesh_shape=shape,
                            virtual_chunks=parallel.virtual_pipeline,
                            chunks=interleaved[index::len(layouts)] if interleaved else [layers]))
        first_layer, first_device = first_layer + layout.layers, first_device + devices
    mesh_axes, mesh_shape = training_mesh(parallel.data, parallel.context, parallel.tensor,
                                          [stage.mesh_shape for stage in stages])
    values = prediction.to_dict()
    breakdown = Breakdown(**{k: values.pop(k) for k in Breakdown.model_fields})
    communication = (breakdown.tensor_parallel_comm_s + breakdown.pipeline_comm_s
                     + breakdown.data_parallel_comm_s)
    return Plan(
        model=name, cluster=cluster.name, num_gpus=first_device,
        devices_per_node=min(cluster.devices_per_node, first_device), mesh_axes=mesh_axes,
        mesh_shape=mesh_shape,
        parallel=ParallelDegrees(
            data=parallel.data, tensor=parallel.tensor, pipeline=parallel.pipeline,
            context=parallel.context, expert=parallel.expert,
            sequence_parallel=parallel.sequence_parallel, zero_stage=parallel.zero_stage,
            virtual_pipeline=parallel.virtual_pipeline,
        ),
        global_batch_size=parallel.global_batch_size,
        micro_batch_size=parallel.micro_batch_size,
        num_micro_batches=parallel.num_micro_batches,
        recompute=parallel.recompute, schedule=parallel.schedule,
        precision=parallel.precision, stages=stages,
        predicted=Predicted(**values, compute_s=breakdown.compute_s,
                            communication_s=communication, breakdown=breakdown),
        megatron_flags=flags, megatron_incompatibility=incompatibility,
        provenance=Provenance(model_spec=name, cluster=cluster.name,
                              tessel_version=tessel_version()),
    )


def _even(num_layers: int, stages: int) -> list[int]:
    """Megatron-LM's split: even, or the most even one with smaller first and last
    stages when the layers do not divide."""
    splits = megatron_stage_splits(num_layers, stages)
    return list(splits[0]) if splits else even_split(num_layers, stages)


def _interleaved_chunks(num_layers: int, stages: int, virtual: int) -> list[tuple[int, int]]:
    """Megatron-LM's interleaved chunks: the layers cut into stages x virtual equal runs
    (chunk c runs on stage c % stages); empty without interleaving."""
    if virtual == 1:
        return []
    size = num_layers // (stages * virtual)
    return [(c * size, (c + 1) * size) for c in range(stages * virtual)]
