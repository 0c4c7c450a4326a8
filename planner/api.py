"""Python API: plan a model, and parallelize it on an initialized process group."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cost_models.profiled_costs import ProfileDatabase
from passes.deadline import Deadline
from passes.dtensor_rules import fake_mesh
from passes.lower import RankProgram
from passes.strategies import enumerate_strategies
from passes.program import TracedProgram
from passes.trace import trace
from planner.vocabulary.cluster import Cluster, calibration_of
from planner.vocabulary.evidence import prediction_band
from planner.plans.graph_plan import graph_plan
from planner.search.graph_knobs import GraphKnobs
from planner.search.graph_space import search_graph
from planner.search.intra_op import IntraOpSolution, plan_intra_op
from planner.search.shardings import operator_shardings, stats
from planner.search.solver import DEFAULT_TIME_LIMIT_S
from planner.vocabulary.mesh_axes import logical_axes
from planner.vocabulary.plan import (
    Plan,
    Predicted,
    Provenance,
    Stage,
    tessel_version,
)
from runtime.graph_pipeline import StagedTrainer
from runtime.trainer import ShardedTrainer, training_state

logger = logging.getLogger("planner")
"""What `parallelize` tells the user about the plan it runs (warnings reach stderr without
any logging set up: Python's last-resort handler)."""


@dataclass
class PlanTimings:
    """Where planning time went, in seconds."""

    trace_s: float = 0.0
    strategies_s: float = 0.0
    ilp_s: float = 0.0


@dataclass
class PlannedModel:
    """A plan together with the traced program it was made for."""

    plan: Plan
    program: TracedProgram
    timings: PlanTimings = field(default_factory=PlanTimings)


def plan_model(
    model: nn.Module,
    example_inputs: Sequence[Any],
    mesh_shape: Sequence[int] = (4,),
    cluster: str | Cluster = "cpu",
    loss_fn: Callable[..., torch.Tensor] | None = None,
    name: str | None = None,
    mesh: DeviceMesh | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    profile: str | Path | ProfileDatabase | None = None,
) -> PlannedModel:
    """Trace `model` and choose a sharding of its training step over `mesh_shape`, within
    `time_limit_s` seconds after tracing (DeadlinePassed if strategies and the ILP's
    build take longer; the solver keeps the best plan it has found by then).

    Needs no process group: the mesh is built on a fake one unless `mesh` is given.
    `profile` (a database or its path, from `plan profile`) prices ops and collectives
    with measured times where it has them.
    """
    cluster_spec = cluster if isinstance(cluster, Cluster) else Cluster.load(cluster)
    if profile is not None and not isinstance(profile, ProfileDatabase):
        profile = ProfileDatabase.load(profile)
    timings = PlanTimings()
    start = time.perf_counter()
    program = trace(model, tuple(example_inputs), loss_fn)
    timings.trace_s = time.perf_counter() - start
    mesh = mesh if mesh is not None else fake_mesh(tuple(mesh_shape))
    deadline = Deadline.after(time_limit_s)
    start = time.perf_counter()
    table = enumerate_strategies(program, mesh, cluster_spec.device, profile, deadline)
    timings.strategies_s = time.perf_counter() - start
    start = time.perf_counter()
    solution = plan_intra_op(
        program, table, mesh, cluster_spec, time_limit_s=time_limit_s, profile=profile,
        deadline=deadline,
    )
    timings.ilp_s = time.perf_counter() - start
    plan = _assemble(
        program, table, solution, list(mesh_shape), cluster_spec,
        name or type(model).__name__,
        profile.cost_source if profile is not None else "analytical",
    )
    return PlannedModel(plan, program, timings)


def _assemble(
    program, table, solution: IntraOpSolution, mesh_shape, cluster: Cluster, name: str,
    cost_source: str,
) -> Plan:
    parameters, operators = operator_shardings(program, table, solution)
    mesh = list(mesh_shape)
    # The whole traced step is one stage: "layers" are the graph's, [0, 1).
    stage = Stage(layers=(0, 1), num_devices=math.prod(mesh), mesh_axes=logical_axes(len(mesh)),
                  mesh_shape=mesh, parameters=parameters, operators=operators)
    return Plan(
        model=name,
        cluster=cluster.name,
        num_gpus=math.prod(mesh),
        devices_per_node=min(cluster.devices_per_node, math.prod(mesh)),
        mesh_axes=logical_axes(len(mesh)),
        mesh_shape=mesh,
        stages=[stage],
        communication=stats(solution.collectives_by_kind()),
        predicted=Predicted(
            step_time_s=solution.compute_s + solution.communication_s,
            compute_s=solution.compute_s,
            communication_s=solution.communication_s,
            memory_gib_per_gpu=solution.memory_bytes / 2**30,
            fits=solution.memory_bytes <= cluster.usable_memory_bytes,
        ).with_band(prediction_band("tessel", None, cluster.device.name,
                                    cluster.device.calibration is not None)),
        provenance=Provenance(model_spec=name, cluster=cluster.name, cost_source=cost_source,
                              calibration=calibration_of(cluster.device),
                              tessel_version=tessel_version()),
    )


def parallelize(
    model: nn.Module,
    example_inputs: Sequence[Any],
    mesh_shape: Sequence[int] = (4,),
    cluster: str | Cluster = "cpu",
    loss_fn: Callable[..., torch.Tensor] | None = None,
    device_type: str = "cpu",
    *,
    gpus: int | None = None,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    knobs: GraphKnobs | None = None,
) -> tuple[Plan, ShardedTrainer | StagedTrainer]:
    """Plan `model` and return the plan and this rank's trainer, whose `step(*batch)`
    runs forward, backward and the optimizer step.

    Call on every rank of an initialized process group (e.g. started by torchrun). Rank 0
    plans and broadcasts the plan (as its JSON text in a byte tensor: nothing is
    unpickled); each rank takes its shard of `model`'s current parameters, so every rank
    must hold the same initial model.

    With `gpus` (the group's size) and `global_batch_size`, the plan is a graph plan for
    `cluster`: pipeline stages on submeshes, each sharded by the intra-op ILP, with
    micro-batches (`micro_batch_size`, or searched) and `knobs` (recomputation, schedule,
    ZeRO-3) fixed where given; `step` takes a whole global batch and
    returns the loss on the last stage's ranks. Without them, every operator is sharded
    over one mesh of `mesh_shape`. Either trainer's `save(root)` / `load(path)` write and
    read sharded checkpoints (`runtime.checkpoint`), which load onto another plan too.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "parallelize needs an initialized process group; call "
            "torch.distributed.init_process_group first (or use plan_model to only plan)"
        )
    if gpus is not None:
        return _parallelize_graph(model, tuple(example_inputs), gpus, cluster, loss_fn,
                                  device_type, global_batch_size, micro_batch_size, knobs)
    world = math.prod(mesh_shape)
    if dist.get_world_size() != world:
        raise ValueError(
            f"mesh_shape {tuple(mesh_shape)} needs {world} ranks but the process group has "
            f"{dist.get_world_size()}; change mesh_shape or the world size"
        )
    mesh = init_device_mesh(device_type, tuple(mesh_shape))
    planned: list[PlannedModel] = []

    def make() -> Plan:
        planned.append(plan_model(model, example_inputs, mesh_shape, cluster, loss_fn,
                                  mesh=mesh))
        return planned[0].plan

    # The other ranks trace while rank 0 plans.
    program = trace(model, tuple(example_inputs), loss_fn) if dist.get_rank() else None
    plan = plan_on_rank_0(make, device_type)
    program = planned[0].program if planned else program
    trainer = ShardedTrainer(RankProgram(program, plan, mesh), training_state(model))
    _say_why_replicated(plan)
    return plan, trainer


def _parallelize_graph(
    model: nn.Module, example_inputs: tuple, gpus: int, cluster: str | Cluster,
    loss_fn: Callable | None, device_type: str, global_batch_size: int | None,
    micro_batch_size: int | None, knobs: GraphKnobs | None,
) -> tuple[Plan, StagedTrainer]:
    if dist.get_world_size() != gpus:
        raise ValueError(f"gpus={gpus} but the process group has {dist.get_world_size()} "
                         "ranks; pass the world size")
    if global_batch_size is None:
        raise ValueError("gpus= needs global_batch_size= (samples per optimizer step)")
    if micro_batch_size is not None and global_batch_size % micro_batch_size:
        raise ValueError(f"micro_batch_size={micro_batch_size} must divide "
                         f"global_batch_size={global_batch_size}")
    plan = plan_on_rank_0(
        lambda: plan_graph(model, example_inputs, gpus, cluster, global_batch_size, loss_fn,
                           micro_batch_size, knobs=knobs),
        device_type)
    _say_why_replicated(plan)
    return plan, StagedTrainer(plan, model, example_inputs, loss_fn, training_state(model),
                               device_type)


def _say_why_replicated(plan: Plan) -> None:
    """On rank 0, a warning (the `planner` logger's) for each stage every rank of which
    computes all of it: why, in the planner's prices (`Plan.replicated_notes`)."""
    if dist.get_rank() == 0:
        for note in plan.replicated_notes():
            logger.warning(note)


def plan_graph(
    model: nn.Module, example_inputs: Sequence[Any], gpus: int, cluster: str | Cluster,
    global_batch_size: int, loss_fn: Callable[..., torch.Tensor] | None = None,
    micro_batch_size: int | None = None, name: str | None = None,
    knobs: GraphKnobs | None = None,
) -> Plan:
    """The best graph plan of `model` on `gpus` devices of `cluster` (stages of the traced
    model on submeshes, each sharded by the intra-op ILP, `knobs` fixed where given);
    ValueError when none fits."""
    spec = cluster if isinstance(cluster, Cluster) else Cluster.load(cluster)
    spec = spec.with_devices(gpus)
    micro_batches = global_batch_size // micro_batch_size if micro_batch_size else None
    knobs = knobs or GraphKnobs()
    problem = knobs.precision_problem(spec.device.peak_tflops, spec.device.name)
    if problem:
        raise ValueError(f"knobs.precision {problem}")
    found = search_graph(model, tuple(example_inputs), spec, global_batch_size, loss_fn,
                         micro_batches=micro_batches, knobs=knobs)
    best = found.candidates[0]
    if not best.fits:
        raise ValueError(
            f"no plan fits: the model needs {max(best.memory_bytes) / 2**20:,.1f} MiB per "
            f"device at best, more than a {spec.device.name}'s {spec.device.memory_gib:g} GiB"
        )
    return graph_plan(best, spec, name or type(model).__name__, global_batch_size)


def plan_on_rank_0(make: Callable[[], Plan], device_type: str) -> Plan:
    """The plan rank 0 makes, on every rank: every rank, rank 0 included, runs the plan read
    back from the same JSON text. When rank 0 fails, the others learn there is no plan."""
    if dist.get_rank() == 0:
        try:
            plan = make()
        except BaseException:
            _broadcast_text(None, device_type)
            raise
        return Plan.from_json(_broadcast_text(plan.to_json(), device_type))
    text = _broadcast_text(None, device_type)
    if text is None:
        raise RuntimeError("rank 0 could not plan the model; its error says why")
    return Plan.from_json(text)


def _broadcast_text(text: str | None, device_type: str) -> str | None:
    """Rank 0's `text` on every rank (None: rank 0 has none), sent as its length and its
    UTF-8 bytes in tensors rather than pickled, so a rank runs no code it receives."""
    payload = text.encode() if text is not None else b""
    length = torch.tensor([len(payload) if text is not None else -1], dtype=torch.int64,
                          device=device_type)
    dist.broadcast(length, src=0)
    size = int(length.item())
    if size <= 0:
        return None if size < 0 else ""
    if dist.get_rank() == 0:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device_type)
    else:
        data = torch.empty(size, dtype=torch.uint8, device=device_type)
    dist.broadcast(data, src=0)
    return data.cpu().numpy().tobytes().decode()
