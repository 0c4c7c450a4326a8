"""Alpa for any model: layers -> (layers, submesh, logical mesh) priced by the intra-op
ILP -> the stage DP -> a pipeline of sharded stages, as a Plan the runtime runs.

For each number of micro-batches m (micro-batch b = B / m):
1. the model's forward at micro-batch b is cut into layers (`passes.stage_graph`);
2. every layer, traced as a one-layer stage, is solved by the intra-op ILP on every
   logical mesh of every submesh (1, 2, 4, ... devices of a node, then whole nodes, short
   of the whole cluster; 1-D and 2-D), twice: as fast as it can go, and with each
   parameter at its least memory (sharded as ZeRO-3 shards it). Layers that compute the
   same thing (a template) share one solve; on 2-D meshes a layer is first only bounded
   (`layer_table`);
3. a stage of layers i..j on a logical mesh is priced as the sum of its layers' per
   micro-batch time less their interior boundaries (moving a tensor to replicated to send
   it), plus its ends' transfers and its gradient synchronisation spread over the
   micro-batches; it fits when its parameters' state and 1F1B's micro-batches in flight
   (`in_flight`: one per stage from it to the last, at most m) fit the device. Every
   stage but the last may instead recompute: keep of each micro-batch in flight only its
   incoming tensors, one micro-batch's activations at a time, for one more first pass of
   its layers per micro-batch (the same solve, priced the other way);
4. `inter_op.stage_dp` chooses two or more stages, submeshes, their meshes and whether
   each recomputes.
The DP's plan and an even pipeline of one-device stages are then traced as whole stages,
solved again (in worker processes) and predicted exactly (`predict_all`). So is every
layout of one stage on every device — data parallelism (every parameter replicated, the
batch split) and each logical mesh, fast and lean — unless the sum of its layers' bounds
shows it cannot beat a plan already predicted (the layers bounded a quarter at a time,
only while that is not yet shown). The fastest that fits is the plan: never predicted
slower than any of those under the same cost model.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from cost_models.memory import FRAMEWORK_RESERVE_BYTES
from passes.stage_graph import (
    ForwardGraph,
    forward_at_batch,
    forward_graph,
    in_precision,
    layer_cuts,
    micro_batch_inputs,
    on_meta_device,
    stage_graph,
    stage_program,
)
from passes.strategies import training_state_bytes
from planner.cluster import Cluster
from planner.search.alpa_space import submeshes
from planner.search.inter_op import stage_dp
from planner.search.graph_knobs import GraphKnobs, in_flight
from planner.search.layer_table import LayerTable, logical_meshes
from planner.search.stage_costs import (
    boundary_link,
    route_time,
    stage_costs,
    stage_memory,
)
from planner.search.stage_solve import StageResult, solve_stage
from planner.search.tied import tie_syncs
from planner.search.workers import can_fork, forked_pool

MAX_LAYERS = 16
"""Layers a model without repeated blocks is cut into (Alpa clusters into a few tens)."""
MAX_MICRO_BATCHES = 16
MAX_REFITS = 4
"""Times the stage DP searches again after its plan's stages, solved whole, broke the
memory limit (each time without those stages in those meshes)."""


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
    schedule: str = "1f1b"
    """Pipeline schedule (`graph_knobs.in_flight`): 1f1b or gpipe."""

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
    forward: ForwardGraph | None = None
    """The traced forward at this candidate's micro-batch size, and its layer cuts."""
    layer_cuts: list[int] = field(default_factory=list)
    micro_batch_size: int = 0
    exact: bool = True
    """False: not solved, as its lower bound (`step_time_s`) is no less than the step of a
    plan that fits; whether it fits was not asked (`fits` is False)."""
    tie_collectives: list[tuple] = field(default_factory=list)
    """Per stage, the collectives summing its tied weights' gradients once per step
    (`planner.search.tied`)."""


@dataclass
class GraphSearch:
    """What the search found: the best candidate first, and where its time went."""

    candidates: list[Candidate]
    num_layers: int
    """Layers the model was cut into (at the first micro-batch count searched)."""
    timings: dict[str, float] = field(default_factory=dict)
    layer_solves: int = 0
    layer_bounds: int = 0
    """Layer solves on 2-D meshes bounded rather than made (`LayerTable`)."""
    layouts_bounded: int = 0
    """Layouts not solved because their bound is no less than a plan predicted."""
    costs: np.ndarray | None = None
    """The stage DP's cost array [layers, layers + 1, submeshes, stages after]."""
    submesh_sizes: list[int] = field(default_factory=list)


def usable_bytes(cluster: Cluster) -> float:
    """Device memory a plan may fill: less the framework's reserve (CUDA context, allocator
    slack), which on a small device (a test cluster's) is at most a tenth of it."""
    memory = cluster.device.memory_gib * 2**30
    return memory - min(FRAMEWORK_RESERVE_BYTES, memory / 10)


def default_micro_batches(global_batch_size: int) -> list[int]:
    """One step unpipelined, and the most micro-batches up to MAX_MICRO_BATCHES that split
    the batch evenly (enough to fill a pipeline of that many stages): each count is a
    search of its own, so Alpa takes it as given; `--micro-batch-size` picks another."""
    most = max(m for m in range(1, MAX_MICRO_BATCHES + 1) if global_batch_size % m == 0)
    return sorted({1, most})


def search_graph(
    model: nn.Module, example_inputs: tuple[Any, ...], cluster: Cluster,
    global_batch_size: int, loss_fn: Callable | None = None,
    micro_batches: int | None = None, max_layers: int = MAX_LAYERS,
    time_limit_s: float = 30.0, knobs: GraphKnobs = GraphKnobs(),
) -> GraphSearch:
    """The best graph plans of `model` on every device of `cluster`, best first.

    `example_inputs` give every input's shape past dim 0 (the batch); the batch of a step
    is `global_batch_size`, split into `micro_batches` (default: each count of
    `default_micro_batches`); `knobs` are what the user fixed."""
    on_meta, example_inputs = in_precision(on_meta_device(model), tuple(example_inputs),
                                           knobs.precision)
    values = {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}
    # The most micro-batches first: plans of several stages, predicted as each count's
    # search ends, bound the work of the counts after (a count of one micro-batch, whose
    # one stage on every device is only bounded, stops bounding once that shows it loses).
    counts = ([micro_batches] if micro_batches
              else sorted(default_micro_batches(global_batch_size), reverse=True))
    searches: list[tuple[GraphSearch, TracedForward, list]] = []
    timings = {"trace_s": 0.0, "layer_ilps_s": 0.0, "stage_dp_s": 0.0, "stage_ilps_s": 0.0}
    predicted: list[Candidate] = []
    first: tuple[ForwardGraph, int] | None = None
    for m in counts:
        size = global_batch_size // m
        inputs = micro_batch_inputs(tuple(example_inputs), size)
        start = time.perf_counter()
        # Another micro-batch size re-propagates the first trace's shapes where the graph
        # carries its batch through (an export of a large model takes seconds).
        forward = (forward_at_batch(*first, size) if first else None) or forward_graph(
            on_meta, inputs, loss_fn)
        first = first or (forward, size)
        cuts = layer_cuts(forward, max_layers)
        timings["trace_s"] += time.perf_counter() - start
        traced = TracedForward(forward, cuts, inputs, m)
        searches.append(_search_micro_batches(traced, values, cluster, time_limit_s, timings,
                                              predicted, knobs))
    # Every layout of one stage, traced and solved whole (one takes as long as many
    # one-layer stages), but for those whose bound shows they cannot beat a plan already
    # predicted.
    start = time.perf_counter()
    predicted += predict_all([(traced, layout, bound) for _, traced, layouts in searches
                              for layout, bound in layouts], values, cluster, time_limit_s,
                             predicted)
    timings["stage_ilps_s"] += time.perf_counter() - start
    best = searches[0][0]
    best.layer_solves = sum(found.layer_solves for found, _, _ in searches)
    best.layer_bounds = sum(found.layer_bounds for found, _, _ in searches)
    best.layouts_bounded = sum(not c.exact for c in predicted)
    best.candidates = sorted(predicted, key=lambda c: (not c.fits, not c.exact, c.step_time_s))
    best.timings = timings
    return best


@dataclass(frozen=True)
class TracedForward:
    """The model's forward at one micro-batch size, cut into layers."""

    forward: ForwardGraph
    cuts: list[int]
    inputs: tuple
    micro_batches: int
    solved: dict = field(default_factory=dict)
    """(layer, mesh, lean) -> the layer table's solve of that layer alone, where it made one."""


def _search_micro_batches(
    traced: TracedForward, values: dict, cluster: Cluster, time_limit_s: float,
    timings: dict[str, float], predicted: list[Candidate], knobs: GraphKnobs,
) -> tuple[GraphSearch, TracedForward, list[tuple[Layout, float]]]:
    """The layer table and stage DP at one micro-batch count. Its plans of several stages
    (the DP's and the even pipeline) are predicted here, into `predicted`; its layouts of
    one stage are returned with a lower bound on their step, bounded only until every one
    is shown no faster than the best plan predicted so far."""
    forward, cuts, inputs, m = traced.forward, traced.cuts, traced.inputs, traced.micro_batches
    num_layers = len(cuts) - 1
    devices = cluster.num_devices
    most = min(num_layers, devices, m) if m > 1 else 1
    sizes = usable_submeshes(submeshes(cluster), devices, most)
    capacity = usable_bytes(cluster)
    cut_bytes = [forward.cut_bytes(c) if 0 < c < len(forward.ops) else 0 for c in cuts]
    with LayerTable(forward, cuts, values, inputs, cluster, sizes, time_limit_s,
                    capacity, m, knobs.modes()) as table:
        timings["layer_ilps_s"] += table.seconds
        refused: set[tuple] = set()
        done: set[Layout] = set()
        for _ in range(MAX_REFITS + 1):
            costs, layouts = _dp_layouts(table, traced, sizes, most, capacity, cut_bytes,
                                         cluster, knobs, refused, timings)
            traced.solved.update(table.results)
            start = time.perf_counter()
            new = [layout for layout in _unique(layouts) if layout not in done]
            done.update(new)
            found_now = predict_all([(traced, layout, None) for layout in new], values,
                                    cluster, time_limit_s)
            predicted += found_now
            timings["stage_ilps_s"] += time.perf_counter() - start
            # The DP prices a stage by its layers' solves; the stage solved whole may hold
            # more (its ILP trades memory for time across layers). Where that breaks the
            # limit, the DP searches again without that stage in that mesh and mode.
            broke = [(c, k) for c in found_now if c.layout.name == "stage DP" and not c.fits
                     for k, nbytes in enumerate(c.memory_bytes) if nbytes > capacity]
            if not broke:
                break
            for c, k in broke:
                first, last, shape, lean = c.layout.stages[k]
                refused.add((first, last, shape, lean, c.layout.recomputes(k),
                             len(c.layout.stages) - 1 - k))
        # Layouts of one stage are solved whole, so their layers' solves would be of no
        # use: each is bounded by its layers' bounds (`bound_stage`: each layer's share of
        # the stage, less the moves between layers), m micro-batches of it, and solved
        # only if that bound is less than a plan already predicted (`predict_all`).
        whole = _one_stage_layouts(num_layers, devices, cluster.devices_per_node, knobs)
        stage_bounds = table.bound(sorted({layout.stages[0][2] for layout in whole}),
                                   _best_step(predicted) / m)
        timings["layer_ilps_s"] += table.seconds
    bounds = {layout: m * stage_bounds[layout.stages[0][2]] for layout in whole}
    found = GraphSearch([], num_layers, layer_solves=table.solves, layer_bounds=table.bounds,
                        costs=costs, submesh_sizes=sizes)
    return found, traced, list(bounds.items())


def _dp_layouts(table: LayerTable, traced: TracedForward, sizes: list[int], most: int,
                capacity: float, cut_bytes: list[float], cluster: Cluster, knobs: GraphKnobs,
                refused: set, timings: dict[str, float]) -> tuple[np.ndarray, list[Layout]]:
    """The stage DP's cost array and its plan of several stages (with the even pipeline),
    every layer they read solved.

    Bounds stand in for the 2-D solves until a plan needs them: the DP's plan is solved
    where it reads a bound, and searched again, until it reads solves only. Then no plan
    the bounds allowed beats it, nor can any plan of solves: the result is that of the
    whole table, solved."""
    num_layers, m, devices = table.num_layers, traced.micro_batches, cluster.num_devices
    while True:
        start = time.perf_counter()
        costs, chosen = stage_costs(table.costs, num_layers, sizes, m, most, capacity,
                                    cut_bytes, cluster, knobs, refused)
        # No stage of the DP's spans every device (the table holds no such mesh): one
        # stage on all of them is a layout of its own, bounded below.
        plan = stage_dp(costs, np.array(sizes), devices, m, most) if most > 1 else None
        timings["stage_dp_s"] += time.perf_counter() - start
        layouts = []
        if plan is not None:
            options = [chosen[(c.first_layer, c.last_layer, c.submesh,
                               len(plan.stages) - 1 - k)] for k, c in enumerate(plan.stages)]
            layouts.append(Layout(
                tuple((c.first_layer, c.last_layer, shape, lean)
                      for c, (shape, lean, _) in zip(plan.stages, options)),
                "stage DP", recompute=tuple(r for _, _, r in options),
                schedule=knobs.schedule))
        layouts += _even_pipeline(num_layers, devices, knobs)
        bounded = {(layer, shape, lean) for layout in layouts
                   for first, last, shape, lean in layout.stages
                   for layer in range(first, last)
                   if table.is_bound(layer, shape, lean)}
        if not bounded:
            return costs, layouts
        table.solve(sorted(bounded))
        timings["layer_ilps_s"] += table.seconds


def usable_submeshes(sizes: list[int], devices: int, most: int) -> list[int]:
    """The submesh sizes some plan of at most `most` stages uses: the stage DP gives every
    device to exactly one stage, so with one stage (one micro-batch) only the whole
    cluster is a submesh, and no layer need be solved on a smaller one."""
    reach = [{0}]  # reach[k]: the device counts k stages add up to
    for _ in range(most - 1):
        reach.append({r + n for r in reach[-1] for n in sizes if r + n <= devices})
    rest = set().union(*reach)
    return [n for n in sizes if devices - n in rest]


def _unique(layouts: list[Layout]) -> list[Layout]:
    return list({layout: None for layout in layouts})


def inputs_batch(inputs: tuple) -> int:
    return next(x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0)


def _even_pipeline(num_layers: int, devices: int, knobs: GraphKnobs) -> list[Layout]:
    """One device per stage, the layers split evenly (a pipeline of fewer micro-batches
    than stages only idles longer, which the prediction prices), where there are as many
    layers as devices or more; recomputing where the knobs say so."""
    stages = min(devices, num_layers)
    if stages < 2 or devices != stages:
        return []
    bounds = np.linspace(0, num_layers, stages + 1).round().astype(int)
    lean = knobs.lean is True
    recompute = tuple(bool(knobs.recompute) and k < stages - 1 for k in range(stages))
    return [Layout(tuple((int(a), int(b), (1,), lean) for a, b in zip(bounds, bounds[1:])),
                   "even pipeline", recompute=recompute if any(recompute) else (),
                   schedule=knobs.schedule)]


def _one_stage_layouts(num_layers: int, devices: int, per_node: int,
                       knobs: GraphKnobs) -> list[Layout]:
    """Data parallelism (every parameter replicated, the batch split; not under ZeRO-3),
    and every logical mesh of every device, fast and lean as the knobs allow: each a
    single intra-op mesh."""
    out = [] if knobs.lean else [Layout(((0, num_layers, (devices,), False),), "data parallel",
                                        replicate_parameters=True, shard_inputs_on=0,
                                        schedule=knobs.schedule)]
    out += [Layout(((0, num_layers, shape, lean),), "single mesh", schedule=knobs.schedule)
            for shape in logical_meshes(devices, per_node) for lean in knobs.modes()]
    return out


# -- exact prediction of a layout ---------------------------------------------------------


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
    best = _best_step([*predicted, *candidates])
    while bounded and bounded[0][0] < best:
        batch = [x for x in bounded[:os.cpu_count() or 1] if x[0] < best]
        del bounded[:len(batch)]
        candidates += _predict([(t, layout) for _, t, layout in batch], values, cluster,
                               time_limit_s)
        best = _best_step([*predicted, *candidates])
    for bound, traced, layout in bounded:
        candidates.append(Candidate(layout, traced.micro_batches, [], bound, [], False, 0.0, 0.0,
                                    0.0, traced.forward, traced.cuts, inputs_batch(traced.inputs),
                                    exact=False))
    return candidates


def _best_step(candidates: list[Candidate]) -> float:
    """The step of the fastest candidate that fits (infinite if none does)."""
    return min((c.step_time_s for c in candidates if c.fits), default=math.inf)


def _predict(layouts: list[tuple[TracedForward, Layout]], values: dict, cluster: Cluster,
             time_limit_s: float) -> list[Candidate]:
    """Each layout's stages traced whole and solved on their meshes, in forked workers
    (the largest stages first), and each layout predicted from them (`predict`). A stage
    two layouts share is solved once; a stage of one layer the layer table solved alone is
    not solved again."""
    capacity = usable_bytes(cluster)
    state_bytes = sum(training_state_bytes(v) for v in values.values()
                      if isinstance(v, nn.Parameter))
    tasks: dict[tuple, tuple] = {}
    for traced, layout in layouts:
        if _replicas_cannot_fit(layout, state_bytes, capacity):
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
                   key=lambda k: -(tasks[k][0].cuts[k[2]] - tasks[k][0].cuts[k[1]]))
    results.update(zip(order, _solve_stages([tasks[k] for k in order], values, cluster,
                                            time_limit_s)))
    candidates = []
    for traced, layout in layouts:
        if _replicas_cannot_fit(layout, state_bytes, capacity):
            # Every rank would hold all of the model's training state, which alone does not
            # fit: nothing to solve.
            candidates.append(Candidate(layout, traced.micro_batches, [], math.inf,
                                        [float(state_bytes)],
                                        False, 0.0, 0.0, 0.0, traced.forward, traced.cuts,
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
    """The step of `layout` from its stages' solves under 1F1B:

        T = sum_i t_i + (m - 1) max_i t_i + max_i sync_i,

    t_i a micro-batch's forward and backward on stage i with its transfers (the pipeline's
    fill and drain), sync_i its once-per-step gradient synchronisation (its tied weights'
    sums with other stages too, `planner.search.tied`); stage i of S holds
    `in_flight(S - i, m, schedule)` micro-batches' activations."""
    m = traced.micro_batches
    capacity = usable_bytes(cluster)
    p2p = _p2p_times(layout, traced.forward, traced.cuts, cluster)
    times = [x.cost.micro_batch_s + p + (x.cost.rerun_s if layout.recomputes(k) else 0.0)
             for k, (x, p) in enumerate(zip(solves, p2p))]
    ties = tie_syncs([shape for _, _, shape, _ in layout.stages],
                     [x.parameters for x in solves], traced.forward.parameter_values(), cluster)
    step = sum(times) + (m - 1) * max(times) + max(
        x.cost.step_comm_s + tie_s for x, (_, tie_s) in zip(solves, ties))
    memory = [stage_memory(x.cost.state_bytes, x.cost.activation_bytes, x.cost.checkpoint_bytes,
                           in_flight(len(solves) - k, m, layout.schedule), layout.recomputes(k))
              for k, x in enumerate(solves)]
    slowest = int(np.argmax(times))
    return Candidate(layout, m, solves, step, memory, max(memory) <= capacity,
                     tie_collectives=[collectives for collectives, _ in ties],
                     p2p_s=sum(p2p), compute_s=sum(x.compute_s for x in solves) * m,
                     communication_s=step - solves[slowest].compute_s * m,
                     forward=traced.forward, layer_cuts=traced.cuts,
                     micro_batch_size=inputs_batch(traced.inputs))


# What the workers of `_solve_stages` read: (stage graph, inputs, shape, lean, replicate,
# shard inputs on) per task, the cluster and the time limit.
_STAGE_TASKS: tuple | None = None


def _solve_stages(tasks: list[tuple], values: dict, cluster: Cluster,
                  time_limit_s: float) -> list[StageResult]:
    global _STAGE_TASKS
    _STAGE_TASKS = ([(stage_graph(t.forward, t.cuts, first, last, values), t.inputs, *rest)
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


def _p2p_times(layout: Layout, forward: ForwardGraph, cuts: list[int],
               cluster: Cluster) -> list[float]:
    """Per micro-batch, each stage's sends and receives (out and back) at its two ends."""
    sizes = [math.prod(shape) for _, _, shape, _ in layout.stages]
    firsts = np.cumsum([0, *sizes])
    times = [0.0] * len(sizes)
    for k in range(len(sizes) - 1):
        nbytes = forward.cut_bytes(cuts[layout.stages[k][1]])
        link = boundary_link(cluster, firsts[k + 2] - firsts[k])
        seconds = 2 * route_time(nbytes, sizes[k], sizes[k + 1], link)
        times[k] += seconds
        times[k + 1] += seconds
    return times

