"""A layout of a graph search (`graph_space`) traced, solved and predicted exactly: each
stage solved whole by the intra-op ILP on its mesh (in worker processes), or run as its
layers' programs from the layer table's solves (`layered_stage`), and the step of the
pipeline under its schedule from those solves."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from cost_models.comm import collective_time
from cost_models.memory import FRAMEWORK_RESERVE_BYTES
from cost_models.pipeline_schedule import in_flight
from cost_models.pipeline_timing import pipeline_time
from passes.model_layers import ModelLayers
from passes.stage_graph import OVERFLOW_FLAG_BYTES, stage_graph, stage_program
from passes.strategies import training_state_bytes
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.schedules import Schedule
from planner.search.layer_table import LayerTable
from planner.search.layered_stage import layered
from planner.search.stage_costs import boundary_link, peak_stage_bytes, route_time
from planner.search.stage_solve import StageResult, solve_stage
from planner.search.tied import tie_syncs
from planner.search.workers import can_fork, forked_pool


@dataclass(frozen=True)
class Layout:
    """Where each stage runs: layers [first, last), devices and logical mesh."""

    stages: tuple[tuple[int, int, tuple[int, ...], bool], ...]
    """(first layer, last layer, logical mesh shape, lean) per stage."""
    name: str = field(compare=False)
    """What found it: 'stage DP', 'data parallel', 'single mesh', 'even pipeline'."""
    replicate_parameters: bool = False
    shard_inputs_on: int | None = None
    recompute: tuple[bool, ...] = ()
    """Per stage, whether it recomputes its first pass rather than keep its activations
    (empty: no stage does)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: one of `graph_knobs.GRAPH_SCHEDULES`."""
    layered: bool = False
    """Whether each stage runs its layers as programs of their own, the layer table's solves
    (`planner.search.layered_stage`), rather than as one program solved whole."""

    def recomputes(self, stage: int) -> bool:
        return bool(self.recompute) and self.recompute[stage]


@dataclass
class Candidate:
    """A layout traced, solved and predicted."""

    layout: Layout
    micro_batches: int
    solves: list[StageResult]
    step_time_s: float
    memory_bytes: list[float]
    """Peak bytes per device of each stage."""
    fits: bool
    p2p_s: float
    compute_s: float
    communication_s: float
    layers: ModelLayers | None = None
    """The model's layers at this candidate's micro-batch size."""
    micro_batch_size: int = 0
    exact: bool = True
    """False: not solved, as its lower bound (`step_time_s`) is no less than the step of a
    plan that fits; whether it fits was not asked (`fits` is False)."""
    tie_collectives: list[tuple] = field(default_factory=list)
    """Per stage, the collectives summing its tied weights' gradients once per step
    (`planner.search.tied`)."""


def usable_bytes(cluster: Cluster) -> float:
    """Device memory a plan may fill: less the framework's reserve (CUDA context, allocator
    slack), which on a small device (a test cluster's) is at most a tenth of it."""
    memory = cluster.usable_memory_bytes
    return memory - min(FRAMEWORK_RESERVE_BYTES, memory / 10)


@dataclass(frozen=True)
class TracedForward:
    """The model's forward at one micro-batch size, cut into layers."""

    layers: ModelLayers
    inputs: tuple
    micro_batches: int
    solved: dict = field(default_factory=dict)
    """(layer, mesh, lean) -> the layer table's solve of that layer alone, where it made one."""


def inputs_batch(inputs: tuple) -> int:
    return next(x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0)


def predict_all(layouts: list[tuple[TracedForward, Layout, float | None]], values: dict,
                cluster: Cluster, time_limit_s: float = 30.0,
                predicted: list[Candidate] = ()) -> list[Candidate]:
    """Each layout predicted (`_predict`), those with a lower bound on their step last, in
    order of their bounds, a batch of one per core at a time, until the bound of the next
    is no less than the best step of a plan that fits (of these, or of those `predicted`
    before): those left are not solved."""
    candidates = _predict([(t, layout) for t, layout, bound in layouts if bound is None],
                          values, cluster, time_limit_s)
    bounded = sorted(((bound, t, layout) for t, layout, bound in layouts if bound is not None),
                     key=lambda x: x[0])
    best = best_step([*predicted, *candidates])
    while bounded and bounded[0][0] < best:
        batch = [x for x in bounded[:os.cpu_count() or 1] if x[0] < best]
        del bounded[:len(batch)]
        candidates += _predict([(t, layout) for _, t, layout in batch], values, cluster,
                               time_limit_s)
        best = best_step([*predicted, *candidates])
    candidates += [as_bound(traced, layout, bound) for bound, traced, layout in bounded]
    return candidates


def as_bound(traced: TracedForward, layout: Layout, bound: float) -> Candidate:
    """A layout left unsolved, as its lower bound."""
    return Candidate(layout, traced.micro_batches, [], bound, [], False, 0.0, 0.0, 0.0,
                     traced.layers, inputs_batch(traced.inputs), exact=False)


def best_step(candidates: list[Candidate]) -> float:
    """The step of the fastest candidate that fits (infinite if none does)."""
    return min((c.step_time_s for c in candidates if c.fits), default=math.inf)


def _predict(layouts: list[tuple[TracedForward, Layout]], values: dict, cluster: Cluster,
             time_limit_s: float) -> list[Candidate]:
    """Each layout's stages traced whole and solved on their meshes, in forked workers
    (the largest stages first), and each layout predicted from them (`predict`). A stage
    two layouts share is solved once; a stage of one layer the layer table solved alone is
    not solved again."""
    capacity = usable_bytes(cluster)
    tasks: dict[tuple, tuple] = {}
    state_bytes = {id(traced): sum(map(training_state_bytes,
                                       traced.layers.parameter_values().values()))
                   for traced, _ in layouts}
    for traced, layout in layouts:
        if _replicas_cannot_fit(layout, state_bytes[id(traced)], capacity):
            continue
        for first, last, shape, lean in layout.stages:
            key = (id(traced), first, last, shape, lean, layout.replicate_parameters,
                   layout.shard_inputs_on)
            tasks.setdefault(key, (traced, first, last, shape, lean,
                                   layout.replicate_parameters, layout.shard_inputs_on))
    results = {}
    for key, (traced, first, last, shape, lean, replicate, shard_inputs_on) in tasks.items():
        if last == first + 1 and not replicate and shard_inputs_on is None:
            if (first, shape, lean) in traced.solved:
                results[key] = traced.solved[(first, shape, lean)]
    order = sorted((k for k in tasks if k not in results),
                   key=lambda k: -(tasks[k][0].layers.cuts[k[2]] - tasks[k][0].layers.cuts[k[1]]))
    results.update(zip(order, _solve_stages([tasks[k] for k in order], values, cluster,
                                            time_limit_s)))
    candidates = []
    for traced, layout in layouts:
        if _replicas_cannot_fit(layout, state_bytes[id(traced)], capacity):
            # Every rank would hold all of the model's training state, which alone does not
            # fit: nothing to solve.
            candidates.append(Candidate(layout, traced.micro_batches, [], math.inf,
                                        [float(state_bytes[id(traced)])],
                                        False, 0.0, 0.0, 0.0, traced.layers,
                                        inputs_batch(traced.inputs)))
            continue
        solves = [results[(id(traced), first, last, shape, lean, layout.replicate_parameters,
                           layout.shard_inputs_on)]
                  for first, last, shape, lean in layout.stages]
        candidates.append(predict(layout, solves, traced, cluster))
    return candidates


def _replicas_cannot_fit(layout: Layout, state_bytes: float, capacity: float) -> bool:
    return layout.replicate_parameters and state_bytes > capacity


def predict(layout: Layout, solves: list[StageResult], traced: TracedForward,
            cluster: Cluster) -> Candidate:
    """The step of `layout` from its stages' solves under its schedule:

        T = pipeline + max_i sync_i,

    the pipeline of t_i per micro-batch, a micro-batch's forward and backward on stage i
    with its transfers, as the schedule runs them (`pipeline_timing.pipeline_time`:
    Alpa's objective for GPipe and 1F1B), sync_i stage i's once-per-step gradient
    synchronisation (its tied weights' sums with other stages too, `planner.search.tied`);
    stage i of S holds the micro-batches' activations `pipeline_schedule.in_flight` counts
    as the graph runtime runs it (its last stage eager)."""
    m = traced.micro_batches
    capacity = usable_bytes(cluster)
    p2p = _p2p_times(layout, traced.layers, cluster)
    times = [x.cost.micro_batch_s + p + (x.cost.rerun_s if layout.recomputes(k) else 0.0)
             for k, (x, p) in enumerate(zip(solves, p2p))]
    ties = tie_syncs([shape for _, _, shape, _ in layout.stages],
                     [x.parameters for x in solves], traced.layers.parameter_values(), cluster)
    step = pipeline_time(layout.schedule, times, m).seconds + max(
        x.cost.step_comm_s + tie_s for x, (_, tie_s) in zip(solves, ties))
    if traced.layers.loss_scaled:  # every rank agrees whether a gradient overflowed
        step += collective_time("all_reduce", OVERFLOW_FLAG_BYTES, cluster.num_devices,
                                boundary_link(cluster, cluster.num_devices))
    memory = [peak_stage_bytes(x.cost.state_bytes, x.cost.activation_bytes,
                               x.cost.checkpoint_bytes,
                               int(in_flight(layout.schedule, len(solves), k, m, eager_last=True)),
                               layout.recomputes(k))
              for k, x in enumerate(solves)]
    slowest = int(np.argmax(times))
    return Candidate(layout, m, solves, step, memory, max(memory) <= capacity,
                     tie_collectives=[collectives for collectives, _ in ties],
                     p2p_s=sum(p2p), compute_s=sum(x.compute_s for x in solves) * m,
                     communication_s=step - solves[slowest].compute_s * m,
                     layers=traced.layers,
                     micro_batch_size=inputs_batch(traced.inputs))


# What the workers of `_solve_stages` read: (stage graph, inputs, shape, lean, replicate,
# shard inputs on) per task, the cluster and the time limit.
_STAGE_TASKS: tuple | None = None


def _solve_stages(tasks: list[tuple], values: dict, cluster: Cluster,
                  time_limit_s: float) -> list[StageResult]:
    global _STAGE_TASKS
    _STAGE_TASKS = ([(stage_graph(t.layers.forward, t.layers.traced_cuts, first, last, values),
                      t.inputs, *rest)
                     for t, first, last, *rest in tasks], cluster, time_limit_s)
    try:
        processes = min(os.cpu_count() or 1, len(tasks))
        if processes > 1 and can_fork():
            pool = forked_pool(processes)
            try:
                return pool.map(_solve_stage_task, range(len(tasks)), chunksize=1)
            finally:
                pool.terminate()
        return [_solve_stage_task(i) for i in range(len(tasks))]
    finally:
        _STAGE_TASKS = None


def _solve_stage_task(index: int) -> StageResult:
    tasks, cluster, time_limit_s = _STAGE_TASKS
    graph, inputs, shape, lean, replicate, shard_inputs_on = tasks[index]
    program = stage_program(graph, inputs)
    return solve_stage(program, shape, cluster, len(graph.user_inputs), graph.is_last,
                       lean=lean, time_limit_s=time_limit_s, replicate_parameters=replicate,
                       shard_inputs_on=shard_inputs_on).result()


def _p2p_times(layout: Layout, layers: ModelLayers, cluster: Cluster) -> list[float]:
    """Per micro-batch, each stage's sends and receives (out and back) at its two ends."""
    sizes = [math.prod(shape) for _, _, shape, _ in layout.stages]
    firsts = np.cumsum([0, *sizes])
    times = [0.0] * len(sizes)
    for k in range(len(sizes) - 1):
        nbytes = layers.cut_bytes(layout.stages[k][1])
        link = boundary_link(cluster, firsts[k + 2] - firsts[k])
        seconds = 2 * route_time(nbytes, sizes[k], sizes[k + 1], link)
        times[k] += seconds
        times[k + 1] += seconds
    return times



def predict_layered(table: LayerTable, traced: TracedForward, layouts: list[Layout],
                    cluster: Cluster) -> list[Candidate]:
    """Each layout whose stages' layers the table has solved, its stages run as their
    layers' programs (`layered_stage`), predicted: no ILP more. A layout two of whose
    layers hold a parameter (a tied weight) in different placements on one stage is
    left out."""
    out = []
    for layout in layouts:
        solves = []
        for first, last, shape, lean in layout.stages:
            parts = [table.layer_result(layer, shape, lean) for layer in range(first, last)]
            stage = layered(parts) if all(p is not None for p in parts) else None
            if stage is None:
                break
            solves.append(stage)
        else:
            out.append(predict(layout, solves, traced, cluster))
    return out
