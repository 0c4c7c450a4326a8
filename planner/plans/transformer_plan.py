"""Training plans of a transformer: the best configurations a search finds, as Plans.

`plan_training` searches a model's configurations on a cluster (the knobs given fixed)
and returns the best as Plans; `ranked_plans` turns a search's ranking into Plans;
`training_plan` predicts one configuration (or takes the search's prediction of it) and
packages it as the one `Plan` schema (`planner/vocabulary/plan.py`): every stage's layers, ranks and
logical mesh, the degrees as the first stage sees them, and Megatron-LM's flags where
Megatron-LM can run it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from cost_models.layer_collectives import LayerCollectives
from cost_models.memory import breakdown_gib, state_element_bytes
from cost_models.finetuned_parameters import finetuned_chunk
from cost_models.stage_parameters import placement, rank_state_bytes
from cost_models.offload import offloads
from cost_models.pipeline_memory import StageLayout, even_split, stage_memories
from cost_models.pipeline_schedule import stage_rank
from cost_models.saved_activations import tessel_counted, tessel_stage_bytes
from cost_models.step_time import (
    StepPrediction,
    predict_stages,
    rank_layout,
    stage_phases,
)
from cost_models.training_collectives import by_kind, rank_collectives
from planner.vocabulary.cluster import Cluster, calibration_of
from planner.vocabulary.pools import AnyCluster, PooledCluster, on_pool
from planner.vocabulary.evidence import Band, prediction_band
from planner.export.megatron import (
    megatron_flags,
    megatron_incompatibility,
    megatron_model_incompatibility,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import FixedKnobs, ParallelConfig
from planner.vocabulary.mesh_axes import stage_mesh, training_mesh
from planner.vocabulary.plan import (
    Breakdown,
    CollectiveStats,
    ParallelDegrees,
    Plan,
    Predicted,
    Provenance,
    RunSettings,
    Stage,
    StageMemory,
    tessel_version,
)
from planner.search import search
from planner.search.megatron_space import (
    Progress,
    SearchResult,
    SearchSpace,
    megatron_stage_splits,
)


def plan_training(
    name: str, model: TransformerConfig, cluster: Cluster, global_batch_size: int,
    fixed: FixedKnobs | None = None, space: SearchSpace = "auto", top: int = 1,
    parameter_names: Callable[[str], str] | None = None, progress: Progress | None = None,
) -> tuple[list[Plan], SearchResult]:
    """The `top` best training plans of `model` (named `name`) on `cluster` at
    `global_batch_size` sequences a step, best first, keeping the knobs in `fixed`
    (`planner.vocabulary.parallel.FixedKnobs`' names) and searching the rest in `space`; and the
    search itself (what it evaluated, how long it took). No plan: nothing fits."""
    result = search(model, cluster, global_batch_size, fixed or FixedKnobs(), space, progress)
    plans = ranked_plans(name, model, cluster, result, top, parameter_names=parameter_names)
    return plans, result


def ranked_plans(
    name: str, model: TransformerConfig, cluster: Cluster, result: SearchResult, top: int,
    collectives: LayerCollectives | None = None,
    parameter_names: Callable[[str], str] | None = None,
) -> list[Plan]:
    """The `top` best configurations of a search `result` as Plans, best first, with the
    search's predictions (not predicted again)."""
    return [
        training_plan(name, model, cluster, candidate.parallel,
                      list(candidate.layers_per_stage), candidate.stages, collectives,
                      prediction, parameter_names,
                      list(candidate.chunk_layers) if candidate.chunk_layers else None)
        for candidate, prediction in result.ranked[:top]
    ]


def training_plan(
    name: str, model: TransformerConfig, cluster: AnyCluster, parallel: ParallelConfig,
    layers_per_stage: list[int] | None = None, stages: tuple[StageLayout, ...] | None = None,
    collectives: LayerCollectives | None = None, prediction: StepPrediction | None = None,
    parameter_names: Callable[[str], str] | None = None,
    chunk_layers: list[int] | None = None,
) -> Plan:
    """Predict one configuration (unless the search's `prediction` of it is given) and
    package it as a plan. `stages` gives each stage its own mesh (Alpa's space); without
    it every stage runs on `parallel`'s mesh. `parameter_names` maps the zoo's parameter
    names to the model's own (a Hugging Face model's). `chunk_layers`: each model chunk's
    layers in model order where they differ (the embedding or the loss counted as a
    layer); `layers_per_stage` then holds their sums per stage."""
    if stages is None:
        parallel = parallel.resolve(cluster.num_devices)
        layers = layers_per_stage or _even(model.num_layers, parallel.dims.pipeline)
        layouts = [StageLayout(count, parallel.dims.tensor, parallel.dims.data) for count in layers]
    else:
        layouts, layers = list(stages), [stage.layers for stage in stages]
    if prediction is None:
        prediction = predict_stages(model, cluster, parallel, layouts, None, collectives)
    if stages is None:
        incompatibility = megatron_model_incompatibility(model) or \
            megatron_incompatibility(parallel, layers, chunk_layers)
    else:
        if isinstance(cluster, PooledCluster):
            used = dict.fromkeys(cluster.pools[stage.pool].name for stage in stages)
            incompatibility = (f"its pipeline stages run on different machines (pools "
                               f"{', '.join(used)}); Megatron-LM runs one kind of GPU")
        else:
            incompatibility = "its pipeline stages run on different meshes (Alpa's space)"
        first = stages[0]
        # Degrees as the first stage sees them; `stages` in the plan has every mesh.
        parallel = parallel.but(
            tensor=first.tensor, data=first.data, pipeline=len(stages),
            micro_batch_size=parallel.batch.micro_batch_size * parallel.dims.data // first.data,
        )
    flags = None if incompatibility else megatron_flags(model, parallel, layers, chunk_layers)
    plan = _plan(name, model, cluster, parallel, layouts, prediction, flags, incompatibility,
                 chunk_layers, collectives)
    if parameter_names is None:
        return plan
    return plan.model_copy(update={"stages": [
        stage.model_copy(update={"parameters": {
            parameter_names(fqn): p for fqn, p in stage.parameters.items()}})
        for stage in plan.stages
    ]})


def _plan(
    name: str, model: TransformerConfig, cluster: AnyCluster, parallel: ParallelConfig,
    layouts: list[StageLayout], prediction: StepPrediction, flags: list[str] | None,
    incompatibility: str | None, chunk_layers: list[int] | None = None,
    collectives: LayerCollectives | None = None,
) -> Plan:
    """The Plan of a configuration whose stages run on `layouts`' meshes, each stage with
    its phases and peak memory as the predictor priced them."""
    phases = stage_phases(model, cluster, parallel, layouts, None, collectives)
    peaks = stage_memories(model, on_pool(cluster, layouts[0].pool), parallel, layouts)
    stages, first_layer, first_device = [], 0, 0
    virtual = parallel.pipelining.virtual_pipeline
    interleaved = _chunk_bounds(chunk_layers) if chunk_layers and virtual > 1 \
        else _interleaved_chunks(sum(layout.layers for layout in layouts), len(layouts), virtual)
    bounds = [0]
    for layout in layouts:
        bounds.append(bounds[-1] + layout.layers)
    chunks = interleaved or list(zip(bounds, bounds[1:]))
    # Chunk c on stage c % p (Megatron-LM's order), or in V order under dualpipev.
    owner = [stage_rank(c, len(layouts), parallel.pipelining.schedule) for c in range(len(chunks))]
    for index, layout in enumerate(layouts):
        axes, shape = stage_mesh(layout.data, parallel.dims.context, layout.tensor)
        devices = layout.devices * parallel.dims.context
        layers = (first_layer, first_layer + layout.layers)
        stage = Stage(layers=layers, first_device=first_device, num_devices=devices,
                      pool=cluster.pools[layout.pool].name
                      if isinstance(cluster, PooledCluster) else None,
                      mesh_axes=axes, mesh_shape=shape,
                      virtual_chunks=parallel.pipelining.virtual_pipeline,
                      chunks=[c for c, at in zip(interleaved, owner) if at == index]
                      if interleaved else [layers])
        stage = _with_contents(stage, index, model, parallel, layout, chunks, len(layouts))
        peak = breakdown_gib(peaks[index], by_kind=False)
        peak["reserved"] = (peaks[index].reserved + peaks[index].reserve) / 2**30
        stages.append(stage.model_copy(update={
            "phases_s": asdict(phases[index]), "peak_memory_gib": peak}))
        first_layer, first_device = first_layer + layout.layers, first_device + devices
    dims = parallel.dims
    mesh_axes, mesh_shape = training_mesh(dims.data, dims.context, dims.tensor,
                                          [stage.mesh_shape for stage in stages])
    values = prediction.to_dict()
    breakdown = Breakdown(**{k: values.pop(k) for k in Breakdown.model_fields})
    communication = (breakdown.tensor_parallel_comm_s + breakdown.pipeline_comm_s
                     + breakdown.data_parallel_comm_s)
    machines = [on_pool(cluster, pool) for pool in dict.fromkeys(s.pool for s in layouts)]
    return Plan(
        model=name, architecture=model, cluster=cluster.name, num_gpus=first_device,
        devices_per_host=min(min(m.devices_per_host for m in machines), first_device),
        devices_per_node=min(min(m.devices_per_node for m in machines), first_device),
        mesh_axes=mesh_axes,
        mesh_shape=mesh_shape,
        parallel=ParallelDegrees.of(parallel, model.is_moe),
        run=RunSettings(**{name: parallel.knob(name) for name in RunSettings.model_fields}),
        global_batch_size=parallel.batch.global_batch_size,
        micro_batch_size=parallel.batch.micro_batch_size,
        num_micro_batches=parallel.num_micro_batches,
        recompute=parallel.recomputation.recompute, schedule=parallel.pipelining.schedule,
        precision=parallel.numerics.precision, stages=stages,
        predicted=Predicted(**values, compute_s=breakdown.compute_s,
                            communication_s=communication, breakdown=breakdown,
                            ).with_band(_band(model, parallel, machines)),
        megatron_flags=flags, megatron_incompatibility=incompatibility,
        provenance=Provenance(model_spec=name, cluster=cluster.name,
                              calibration="; ".join(
                                  f"{m.device.name}: {calibration_of(m.device)}"
                                  for m in machines) if len(machines) > 1
                              else calibration_of(machines[0].device),
                              tessel_version=tessel_version()),
    )


def _band(model: TransformerConfig, parallel: ParallelConfig, machines: list[Cluster]) -> Band:
    """The band of a plan on `machines` (one kind, or the pools a pipeline crosses): the
    evidence's for its kind of run; across pools, the widest of the pools' bands taken as
    uncalibrated, since no published run mixes GPU kinds."""
    bands = [prediction_band(parallel.execution.engine, model, m.device.name,
                             m.device.calibration is not None and len(machines) == 1,
                             offload_or_adapters=offloads(parallel)
                             or parallel.finetuning.adapters) for m in machines]
    widest = max(bands, key=lambda band: band.high / band.low)
    if len(machines) == 1:
        return widest
    return widest.model_copy(update={
        "method": f"a pipeline across pools of {' and '.join(m.device.name for m in machines)}"
                  f": no published run mixes GPU kinds, so the widest pool's band as "
                  f"uncalibrated ({widest.method})"})


def _with_contents(
    stage: Stage, index: int, model: TransformerConfig, parallel: ParallelConfig,
    layout: StageLayout, chunks: list[tuple[int, int]], num_stages: int,
) -> Stage:
    """The stage with its parameters' placements, the collectives one of its ranks issues
    in a step, the model state it holds and, for Tessel's runtime, what it saves for
    backward per micro-batch (`cost_models.stage_parameters`,
    `cost_models.training_collectives`, `cost_models.saved_activations`: what the runtime
    runs)."""
    last = len(chunks) - 1
    schedule = parallel.pipelining.schedule
    owner = tuple(stage_rank(c, num_stages, schedule) for c in range(len(chunks)))
    # Under LoRA and QLoRA the base frozen and the adapters beside it.
    params = [p for c, layers in enumerate(chunks) if owner[c] == index
              for p in finetuned_chunk(model, layers, c == 0, c == last,
                                       parallel.finetuning)]
    zero, expert = parallel.sharding.zero_stage, parallel.dims.expert
    shards = layout.data * parallel.dims.context
    # The stage's own mesh, with the sequences of one micro-batch split over its replicas.
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    here = parallel.but(tensor=layout.tensor, data=layout.data,
                        micro_batch_size=sequences // layout.data)
    rank = rank_layout(here, tuple(chunks), owner)
    collectives = rank_collectives(model, rank, index)
    steady = [c for c in collectives if c.phase != "setup"]
    once = [c for c in collectives if c.phase == "setup"]
    state = rank_state_bytes(params, layout.tensor, shards, zero, expert, model.num_experts,
                             state_element_bytes(parallel.numerics.precision))
    saved = []
    if parallel.execution.engine == "tessel" and tessel_counted(model):
        saved = [tessel_stage_bytes(model, here, stop - start, c == 0, c == last)
                 for c, (start, stop) in enumerate(chunks) if owner[c] == index]
    return stage.model_copy(update={
        "parameters": {p.name: placement(p, stage.mesh_axes, layout.tensor, zero, expert)
                       for p in params},
        "communication": {k: CollectiveStats(**v) for k, v in by_kind(steady).items()},
        "communication_once": {k: CollectiveStats(**v) for k, v in by_kind(once).items()},
        "memory": StageMemory(parameters_bytes=state[0], gradients_bytes=state[1],
                              optimizer_bytes=state[2]),
        "saved_activation_bytes": saved,
    })


def _even(num_layers: int, stages: int) -> list[int]:
    """Megatron-LM's split: even, or the most even one with smaller first and last
    stages when the layers do not divide."""
    splits = megatron_stage_splits(num_layers, stages)
    return list(splits[0]) if splits else even_split(num_layers, stages)


def _chunk_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """Layers [first, last) of chunks of `sizes` layers, in model order."""
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    return list(zip(bounds, bounds[1:]))


def _interleaved_chunks(num_layers: int, stages: int, virtual: int) -> list[tuple[int, int]]:
    """Megatron-LM's interleaved chunks: the layers cut into stages x virtual equal runs
    (chunk c runs on stage c % stages); empty without interleaving."""
    if virtual == 1:
        return []
    size = num_layers // (stages * virtual)
    return [(c * size, (c + 1) * size) for c in range(stages * virtual)]
