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
The DP's plan and an even pipeline of one-device stages are then predicted exactly
(`graph_prediction`) twice: each stage traced whole and solved again (in worker
processes), and each stage run as its layers' programs, the table's solves as they are
(`layered_stage`: exactly the sum the DP read, no ILP more). A model traced at reduced
depth (`ReducedModel`, a transformer rebuilt with a few of its blocks) has no stage of
several layers to trace whole: its DP prices stages layered, and only those are
predicted. So is every
layout of one stage on every device — data parallelism (every parameter replicated, the
batch split) and each logical mesh, fast and lean — unless the sum of its layers' bounds
shows it cannot beat a plan already predicted (the layers bounded a quarter at a time,
only while that is not yet shown). The fastest that fits is the plan: never predicted
slower than any of those under the same cost model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
from torch import nn

from passes.model_layers import REDUCED_BLOCKS, ModelLayers
from passes.stage_graph import (
    PRECISION_DTYPES,
    ForwardGraph,
    floating_in,
    forward_at_batch,
    forward_graph,
    in_precision,
    micro_batch_inputs,
    on_meta_device,
)
from planner.vocabulary.cluster import Cluster
from planner.search.alpa_space import submeshes
from planner.search.inter_op import stage_dp
from planner.search.graph_knobs import GraphKnobs
from planner.search.graph_prediction import (
    Candidate,
    Layout,
    TracedForward,
    best_step,
    as_bound,
    predict_all,
    predict_layered,
    usable_bytes,
)
from planner.search.layer_table import LayerTable, logical_meshes
from planner.search.stage_costs import stage_costs

MAX_LAYERS = 16
"""Layers a model without repeated blocks is cut into (Alpa clusters into a few tens)."""
MAX_MICRO_BATCHES = 16
MAX_REFITS = 4
"""Times the stage DP searches again after its plan's stages, solved whole, broke the
memory limit (each time without those stages in those meshes)."""


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


def default_micro_batches(global_batch_size: int) -> list[int]:
    """One step unpipelined, and the most micro-batches up to MAX_MICRO_BATCHES that split
    the batch evenly (enough to fill a pipeline of that many stages): each count is a
    search of its own, so Alpa takes it as given; `--micro-batch-size` picks another."""
    most = max(m for m in range(1, MAX_MICRO_BATCHES + 1) if global_batch_size % m == 0)
    return sorted({1, most})


@dataclass(frozen=True)
class ReducedModel:
    """The model built with REDUCED_BLOCKS of its repeated blocks, to trace in its place
    (`passes.model_layers.ModelLayers.expanded`)."""

    model: nn.Module
    num_blocks: int
    """Blocks of the full model."""


def search_graph(
    model: nn.Module, example_inputs: tuple[Any, ...], cluster: Cluster,
    global_batch_size: int, loss_fn: Callable | None = None,
    micro_batches: int | None = None, max_layers: int = MAX_LAYERS,
    time_limit_s: float = 30.0, knobs: GraphKnobs = GraphKnobs(),
    reduced: ReducedModel | None = None,
) -> GraphSearch:
    """The best graph plans of `model` on every device of `cluster`, best first.

    `example_inputs` give every input's shape past dim 0 (the batch); the batch of a step
    is `global_batch_size`, split into `micro_batches` (default: each count of
    `default_micro_batches`); `knobs` are what the user fixed. `reduced`, where given, is
    traced instead of `model` and its layers described at the model's depth; its stages
    then run as their layers' programs (`Layout.layered`), and its default micro-batch is
    one sample (a transformer's activations per sequence are what limits its stages, as
    Megatron-LM's and Alpa's plans of large models take micro-batches of 1 or 2)."""
    if reduced is not None and reduced.num_blocks <= REDUCED_BLOCKS:
        reduced = None
    dtype = PRECISION_DTYPES[knobs.precision] if knobs.precision != "fp32" else None
    example_inputs = tuple(floating_in(x, dtype) for x in example_inputs)
    on_meta, values = _traceable(reduced.model if reduced else model, knobs)
    # The most micro-batches first: plans of several stages, predicted as each count's
    # search ends, bound the work of the counts after (a count of one micro-batch, whose
    # one stage on every device is only bounded, stops bounding once that shows it loses).
    counts = ([micro_batches] if micro_batches
              else [global_batch_size] if reduced
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
        layers = ModelLayers.expanded(forward, reduced.num_blocks) if reduced else None
        if reduced and layers is None:
            # Not one layer per block, or its middle blocks differ: the model traced whole.
            reduced = None
            on_meta, values = _traceable(model, knobs)
            forward = forward_graph(on_meta, inputs, loss_fn)
        first = first or (forward, size)
        layers = layers or ModelLayers.traced(forward, max_layers)
        timings["trace_s"] += time.perf_counter() - start
        traced = TracedForward(layers, inputs, m)
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


def _traceable(model: nn.Module, knobs: GraphKnobs) -> tuple[nn.Module, dict]:
    """`model` on the meta device in the knobs' precision, and its parameters and buffers
    by FQN."""
    on_meta, _ = in_precision(on_meta_device(model), (), knobs.precision)
    return on_meta, {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}


def _search_micro_batches(
    traced: TracedForward, values: dict, cluster: Cluster, time_limit_s: float,
    timings: dict[str, float], predicted: list[Candidate], knobs: GraphKnobs,
) -> tuple[GraphSearch, TracedForward, list[tuple[Layout, float]]]:
    """The layer table and stage DP at one micro-batch count. Its plans of several stages
    (the DP's and the even pipeline) are predicted here, into `predicted`; its layouts of
    one stage are returned with a lower bound on their step, bounded only until every one
    is shown no faster than the best plan predicted so far."""
    layers, inputs, m = traced.layers, traced.inputs, traced.micro_batches
    num_layers = layers.num_layers
    devices = cluster.num_devices
    most = min(num_layers, devices, m) if m > 1 else 1
    sizes = usable_submeshes(submeshes(cluster), devices, most)
    capacity = usable_bytes(cluster)
    cut_bytes = [layers.cut_bytes(boundary) for boundary in range(num_layers + 1)]
    with LayerTable(layers, values, inputs, cluster, sizes, time_limit_s,
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
            # Every plan runs as its layers' programs too, priced exactly from the table's
            # solves with no ILP more (a reduced trace has no stage of several layers to
            # solve whole).
            found_now = predict_all([(traced, layout, None) for layout in new
                                     if not layout.layered], values, cluster, time_limit_s)
            found_now += predict_layered(table, traced, [
                replace(layout, layered=True) for layout in new if layout.layered or any(
                    last - first > 1 for first, last, _, _ in layout.stages)], cluster)
            predicted += found_now
            timings["stage_ilps_s"] += time.perf_counter() - start
            # The DP prices a stage by its layers' solves; the stage solved whole may hold
            # more (its ILP trades memory for time across layers). Where that breaks the
            # limit, the DP searches again without that stage in that mesh and mode.
            broke = [(c, k) for c in found_now
                     if c.layout.name == "stage DP" and not c.fits and not c.layout.layered
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
        whole = _one_stage_layouts(num_layers, devices, cluster.devices_per_node, knobs,
                                   layers.reduced)
        stage_bounds = table.bound(sorted({layout.stages[0][2] for layout in whole}),
                                   best_step(predicted) / m)
        timings["layer_ilps_s"] += table.seconds
        bounds = {layout: m * stage_bounds[layout.stages[0][2]] for layout in whole}
        if layers.reduced:
            # Of a reduced trace, one stage runs as its layers' programs too: solved on
            # the whole cluster's mesh where its bound beats the best plan so far.
            start = time.perf_counter()
            predicted += _one_stage_layered(table, traced, bounds, predicted, cluster)
            timings["layer_ilps_s"] += time.perf_counter() - start
            bounds = {}
    found = GraphSearch([], num_layers, layer_solves=table.solves, layer_bounds=table.bounds,
                        costs=costs, submesh_sizes=sizes)
    return found, traced, list(bounds.items())


def _one_stage_layered(table: LayerTable, traced: TracedForward,
                       bounds: dict[Layout, float], predicted: list[Candidate],
                       cluster: Cluster) -> list[Candidate]:
    """Each layout of one stage whose bound is less than the best step of a plan that fits,
    in order of their bounds, its layers solved on its mesh and predicted layered; those
    left as their bounds."""
    out: list[Candidate] = []
    for layout, bound in sorted(bounds.items(), key=lambda item: item[1]):
        if bound >= best_step([*predicted, *out]):
            out.append(as_bound(traced, layout, bound))
            continue
        _, _, shape, lean = layout.stages[0]
        table.solve([(layer, shape, lean) for layer in range(table.num_layers)
                     if not table.solved(layer, shape, lean)])
        out += predict_layered(table, traced, [layout], cluster)
    return out


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
    reduced = traced.layers.reduced
    while True:
        start = time.perf_counter()
        costs, chosen = stage_costs(table.costs, num_layers, sizes, m, most, capacity,
                                    cut_bytes, cluster, knobs, refused, layered=reduced)
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
                schedule=knobs.schedule, layered=reduced))
        layouts += [replace(layout, layered=reduced)
                    for layout in _even_pipeline(num_layers, devices, knobs)]
        bounded = {(layer, shape, lean) for layout in layouts
                   for first, last, shape, lean in layout.stages
                   for layer in range(first, last)
                   if table.is_bound(layer, shape, lean)}
        if not bounded:
            return costs, layouts
        # Both modes of a mesh at once: once one's solve replaces its bound, the other's
        # bound (no more than that solve) is what the DP reads next; solved together, they
        # share a batch of workers.
        table.solve(sorted({(layer, shape, mode) for layer, shape, _ in bounded
                            for mode in knobs.modes() if table.is_bound(layer, shape, mode)}))
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
                       knobs: GraphKnobs, layered: bool = False) -> list[Layout]:
    """Data parallelism (every parameter replicated, the batch split; not under ZeRO-3),
    and every logical mesh of every device, fast and lean as the knobs allow: each a
    single intra-op mesh. `layered`: its layers run as programs of their own (a reduced
    trace's; the layer table has no data-parallel solves)."""
    if layered:
        return [Layout(((0, num_layers, shape, lean),), "single mesh", schedule=knobs.schedule,
                       layered=True)
                for shape in logical_meshes(devices, per_node) for lean in knobs.modes()]
    out = [] if knobs.lean else [Layout(((0, num_layers, (devices,), False),), "data parallel",
                                        replicate_parameters=True, shard_inputs_on=0,
                                        schedule=knobs.schedule)]
    out += [Layout(((0, num_layers, shape, lean),), "single mesh", schedule=knobs.schedule)
            for shape in logical_meshes(devices, per_node) for lean in knobs.modes()]
    return out
