"""The layer table of a graph search: every layer's cost on every logical mesh, each layer
traced as a one-layer training step and solved by the intra-op ILP (on 1-D meshes at
once, on 2-D ones first only bounded), in forked workers."""

from __future__ import annotations

import math
import os
import queue
import time
from collections import deque

from passes.dtensor_rules import fake_mesh
from passes.model_layers import ModelLayers, op_signature
from passes.stage_graph import BOUNDARY, ForwardGraph, stage_graph, stage_program
from passes.strategies import enumerate_strategies
from planner.vocabulary.cluster import Cluster
from planner.search.layered_stage import renamed
from planner.search.stage_solve import StageCost, StageResult, bound_stage, solve_stage
from planner.search.workers import can_fork, forked_pool


def logical_meshes(devices: int, per_node: int) -> list[tuple[int, ...]]:
    """Alpa's logical meshes of `devices` devices: 1-D, and 2-D with the inner axis within
    a node (a whole number of nodes by devices of each). Within one node, where every link
    is alike, (a, b) prices as (b, a) with the axes swapped: one of the two is kept."""
    shapes = [(devices,)]
    for inner in range(2, min(devices, per_node + 1)):
        outer, rest = divmod(devices, inner)
        if rest or outer < 2 or (devices <= per_node and outer > inner):
            continue
        if devices > per_node and per_node % inner:
            continue
        shapes.append((outer, inner))
    return shapes


class LayerTable:
    """Every layer's cost on every logical mesh, `costs[(layer, shape, lean)]`: solved on 1-D
    meshes (as fast as it can go, and where memory is short with each parameter at its
    least), bounded on 2-D ones (`stage_solve.bound_stage`, a fraction of a solve) until
    `solve` is asked for them. Layers that compute the same thing (same ops, shapes and
    boundaries: a template) share every solve. The work runs in one forked process per
    core, the same workers throughout (their caches of DTensor's answers, programs and
    strategy tables carry over), as Alpa compiles stages in parallel workers; each worker
    traces the templates it is given."""

    def __init__(self, layers: ModelLayers, values: dict, inputs: tuple,
                 cluster: Cluster, sizes: list[int], time_limit_s: float, capacity: float,
                 m: int, modes: tuple[bool, ...] = (False, True)) -> None:
        self.num_layers = layers.num_layers
        graphs = []  # each template's graph, cut for its first layer
        index: dict[tuple, int] = {}  # template -> its place in `graphs`
        traced: dict[int, tuple[tuple, list[str]]] = {}  # traced layer -> template, FQNs
        self.template_of: list[int] = []
        """Each layer's template, as an index into `layers_of`."""
        self.names: list[list[str]] = []
        """Each layer's parameters' FQNs, in the order its graph reads them."""
        self.solved_names: list[list[str]] = []
        """Each template's, as its graph (and so its solves) names them."""
        for layer, r in enumerate(layers.source):
            if r not in traced:
                graph = stage_graph(layers.forward, layers.traced_cuts, r, r + 1, values)
                key = _template(layers.forward, layers.traced_cuts, r, graph)
                fqns = [n.target for n in graph.module.graph.nodes
                        if n.op == "get_attr" and not n.target.startswith(BOUNDARY)]
                if key not in index:
                    index[key] = len(graphs)
                    graphs.append(graph)
                    self.solved_names.append(fqns)
                traced[r] = key, fqns
            key, fqns = traced[r]
            self.template_of.append(index[key])
            self.names.append([layers.fqn(layer, f) for f in fqns])
        self.layers_of = [[layer for layer, t in enumerate(self.template_of) if t == template]
                          for template in range(len(graphs))]
        """Each template's layers, the one its graph was cut for first."""
        self.shapes = [shape for n in sizes if n < cluster.num_devices
                       for shape in logical_meshes(n, cluster.devices_per_node)]
        """The meshes a stage DP reads: not those of every device, as one stage on all of
        them is a layout of its own, which `bound` prices (its layers' solves would be of
        no use)."""
        self.capacity, self.m, self.modes = capacity, m, modes
        """`modes`: the lean settings a plan may take (`GraphKnobs.modes`)."""
        self.solver = _Solver(graphs, inputs, cluster, time_limit_s, m)
        self.costs: dict[tuple[int, tuple[int, ...], bool], StageCost] = {}
        self.lower: dict[tuple[int, tuple[int, ...]], float] = {}
        """(layer, mesh) -> the layer's bound (`bound_stage`'s time), where one was made."""
        self.results: dict[tuple[int, tuple[int, ...], bool], StageResult] = {}
        self.solves = self.bounds = 0
        self.seconds = 0.0
        """Time of the last batch of work."""

    def __enter__(self) -> LayerTable:
        start = time.perf_counter()
        self.solver.__enter__()
        # Of one micro-batch (a stage on every device) no mesh is left: `bound` is all.
        first = self.modes == (True,)  # lean only: the fast solves would go unread
        tasks = [(t, shape, first, "solve" if len(shape) == 1 else "bound")
                 for t in range(len(self.layers_of)) for shape in self.shapes]
        self._run(tasks)
        # A lean solve is made only where the fast ones leave too little memory: where the
        # whole model's fast state and all m micro-batches' activations (more than any
        # stage holds) on that mesh do not fit.
        short = [shape for shape in self.shapes if len(shape) == 1 and not _fast_fits(
            self.costs, self.num_layers, shape, self.capacity, self.m)
        ] if self.modes == (False, True) else []
        self._run([(t, shape, True, "solve") for t in range(len(self.layers_of))
                   for shape in short])
        self.seconds = time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        self.solver.__exit__(*exc)

    def layer_result(self, layer: int, shape: tuple[int, ...],
                     lean: bool) -> StageResult | None:
        """The solve of `layer` alone on `shape`, under its own parameters' names; None
        where the table holds none (a bound, or a mesh it was not asked for)."""
        if not self.solved(layer, shape, lean):
            return None
        template = self.template_of[layer]
        result = self.results[(self.layers_of[template][0], shape, lean)]
        return renamed(result, dict(zip(self.solved_names[template], self.names[layer])))

    def solved(self, layer: int, shape: tuple[int, ...], lean: bool) -> bool:
        """Whether the table holds a solve of `layer`'s template on `shape`."""
        return (self.layers_of[self.template_of[layer]][0], shape, lean) in self.results

    def is_bound(self, layer: int, shape: tuple[int, ...], lean: bool) -> bool:
        """Whether the table holds only a bound for this entry (a mesh off the table, as
        the baselines' data-parallel or one-device meshes may be, needs no solve)."""
        cost = self.costs.get((layer, shape, lean))
        return cost is not None and not cost.exact

    def solve(self, entries: list[tuple[int, tuple[int, ...], bool]]) -> None:
        """Solve the layers' templates on these (layer, mesh, lean) entries."""
        start = time.perf_counter()
        tasks = {(self.template_of[layer], shape, lean, "solve")
                 for layer, shape, lean in entries}
        self._run(sorted(tasks))
        self.seconds = time.perf_counter() - start

    def bound(self, shapes: list[tuple[int, ...]],
              enough: float = math.inf) -> dict[tuple[int, ...], float]:
        """On each of `shapes`, the sum of every layer's bound (bounding the layers where
        the table holds none), a quarter of the layers at a time; a mesh whose partial sum
        reaches `enough` is bounded no further, and its partial sum (a bound too: each
        layer's is at least zero) is what it gets."""
        start = time.perf_counter()
        sums = dict.fromkeys(shapes, 0.0)
        live = list(shapes)
        step = max(1, math.ceil(self.num_layers / 4))
        for first in range(0, self.num_layers, step):
            layers = range(first, min(first + step, self.num_layers))
            self._run(sorted({(self.template_of[layer], shape, False, "bound")
                              for layer in layers for shape in live
                              if (layer, shape) not in self.lower}))
            for shape in live:
                sums[shape] += sum(self.lower[(layer, shape)] for layer in layers)
            live = [shape for shape in live if sums[shape] < enough]
            if not live:
                break
        self.seconds = time.perf_counter() - start
        return sums

    def _run(self, tasks: list[tuple]) -> None:
        for (t, shape, lean, kind), answer in self.solver.solve(tasks).items():
            self.solves += kind == "solve"
            self.bounds += kind == "bound"
            cost = answer
            if isinstance(answer, StageResult):
                # The template's first layer is the one its graph was cut for: a stage of
                # that layer alone is this very solve (`predict_all` reuses it).
                self.results[(self.layers_of[t][0], shape, lean)] = answer
                cost = answer.cost
            for layer in self.layers_of[t]:
                if kind == "bound":
                    self.lower[(layer, shape)] = cost.micro_batch_s
                    # A bound holds for the fast solve and the lean one alike; it stands
                    # in for neither where the table holds a solve.
                    for variant in (False, True):
                        self.costs.setdefault((layer, shape, variant), cost)
                else:
                    self.costs[(layer, shape, lean)] = cost


# What forked workers read (stage graphs; traced programs do not pickle), and each
# worker's programs by template and strategy tables by (template, mesh): a lean solve
# reuses its fast solve's when it lands there.
_FORKED: tuple | None = None
_PROGRAMS: dict = {}
_STRATEGIES: dict = {}


class _Solver:
    """Layer solves in one forked process per core, the same workers for every batch of
    tasks (so their caches of DTensor's answers, programs and strategy tables carry over).
    A mesh's tasks of a batch go to one worker, the one that has worked on that mesh where
    that does not leave the others idle: a worker's first strategy table on a mesh asks
    DTensor afresh what its ops' rules answer only for that mesh's sizes, which costs a
    few bounds; so does a layer traced again. A batch of fewer meshes than workers is split
    task by task."""

    def __init__(self, graphs: list, inputs: tuple, cluster: Cluster,
                 time_limit_s: float, micro_batches: int) -> None:
        self.state = (graphs, inputs, cluster, time_limit_s, micro_batches)
        self.workers: list = []
        self.traced: list[set[int]] = []
        """The templates each worker has traced (its programs are kept)."""
        self.meshes: list[set[tuple[int, ...]]] = []
        """The meshes each worker has made strategy tables on."""

    def __enter__(self) -> _Solver:
        global _FORKED
        _FORKED = self.state
        processes = min(os.cpu_count() or 1, len(self.state[0]))
        if processes > 1 and can_fork():
            self.workers = [forked_pool(1) for _ in range(processes)]
            self.traced = [set() for _ in self.workers]
            self.meshes = [set() for _ in self.workers]
        return self

    def __exit__(self, *exc: object) -> None:
        global _FORKED
        for worker in self.workers:
            worker.terminate()
        _FORKED = None
        _PROGRAMS.clear()
        _STRATEGIES.clear()

    def solve(self, tasks: list[tuple]) -> dict:
        """Solve `tasks` ((template, mesh, lean, kind) each): each mesh's tasks on one
        worker, the one with the least work once it has them, counting the tables and
        traces it lacks (`_WORK` units; the most work first)."""
        if not self.workers or len(tasks) < 2:
            return {task: _solve_task(task) for task in tasks}
        groups: dict[tuple, list[tuple]] = {}
        split = len({task[1] for task in tasks}) < len(self.workers)
        for task in tasks:
            groups.setdefault((task[1], task[0]) if split else (task[1],), []).append(task)
        load = [0.0] * len(self.workers)
        shares: list[list[tuple]] = [[] for _ in self.workers]
        work = {key: sum(_WORK[(min(len(task[1]), 2), task[3])] for task in group)
                for key, group in groups.items()}

        def lacking(w: int, group: list[tuple]) -> float:
            templates = {task[0] for task in group} - self.traced[w]
            return (_WORK["trace"] * len(templates)
                    + (0.0 if group[0][1] in self.meshes[w] else _WORK["mesh"]))

        for key in sorted(groups, key=lambda key: -work[key]):
            ends = [load[w] + work[key] + lacking(w, groups[key])
                    for w in range(len(self.workers))]
            w = min(range(len(self.workers)), key=lambda w: (ends[w], w))
            load[w] = ends[w]
            shares[w] += groups[key]
            self.traced[w].update(task[0] for task in groups[key])
            self.meshes[w].add(groups[key][0][1])
        return self._run_shares(shares)

    def _run_shares(self, shares: list[list[tuple]]) -> dict:
        """Each worker's share, a task at a time; a worker whose share is done takes the
        last task of the longest share left, so that none idles while tasks wait (the
        routing's estimates are rough: one kind of task varies several-fold from layer to
        layer)."""
        queues = [deque(share) for share in shares]
        finished: queue.SimpleQueue = queue.SimpleQueue()
        answers: dict = {}
        running = 0

        def start(w: int) -> bool:
            if not queues[w]:
                longest = max(range(len(queues)), key=lambda v: len(queues[v]))
                if not queues[longest]:
                    return False
                queues[w].append(queues[longest].pop())
                self.traced[w].add(queues[w][0][0])
                self.meshes[w].add(queues[w][0][1])
            task = queues[w].popleft()
            self.workers[w].apply_async(
                _solve_task, (task,), callback=lambda answer: finished.put((w, task, answer)),
                error_callback=lambda error: finished.put((w, task, error)))
            return True

        for w in range(len(self.workers)):
            running += start(w)
        while running:
            w, task, answer = finished.get()
            if isinstance(answer, BaseException):
                raise answer
            answers[task] = answer
            running += start(w) - 1
        return answers


_WORK = {(1, "solve"): 2.0, (1, "bound"): 1.0, (2, "solve"): 8.0, (2, "bound"): 3.0,
         "trace": 3.0, "mesh": 3.0}
"""Rough cost of a task (a solve or a bound on a 1-D or 2-D mesh, its strategy table
included), of a layer's trace, and of a worker's first strategy table on a mesh, in
tenths of a second as timed on the 1B model's layers (docs/graph-plans.md, "Measured").
Only their ratios matter: they route tasks so that the workers' shares end together."""


def _solve_task(task: tuple[int, tuple[int, ...], bool, str]) -> StageResult | StageCost:
    """(template, mesh, lean, 'solve' or 'bound') -> the solve, or a bound of its costs."""
    graphs, inputs, cluster, time_limit_s, m = _FORKED
    index, shape, lean, kind = task
    graph = graphs[index]
    if index not in _PROGRAMS:
        _PROGRAMS[index] = stage_program(graph, inputs)
    program = _PROGRAMS[index]
    if (index, shape) not in _STRATEGIES:
        _STRATEGIES[(index, shape)] = enumerate_strategies(program, fake_mesh(shape),
                                                           cluster.device)
    strategies = _STRATEGIES[(index, shape)]
    if kind == "bound":
        return bound_stage(program, shape, cluster, m, len(graph.user_inputs), strategies)
    return solve_stage(program, shape, cluster, len(graph.user_inputs), graph.is_last,
                       lean=lean, time_limit_s=time_limit_s, strategies=strategies).result()


def _fast_fits(table: dict, num_layers: int, shape: tuple[int, ...], capacity: float,
               m: int) -> bool:
    """Whether the whole model on `shape`, fast, fits with m micro-batches in flight: then
    every stage of fewer layers fits too, and lean solves add nothing."""
    solves = [table[(layer, shape, False)] for layer in range(num_layers)]
    return sum(x.state_bytes + m * x.activation_bytes for x in solves) <= capacity


def _template(forward: ForwardGraph, cuts: list[int], layer: int, graph) -> tuple:
    """What a layer computes, up to its parameters' names."""
    return (
        op_signature(forward, cuts, layer),
        tuple(tuple(v.shape) for v in graph.inputs), tuple(tuple(v.shape) for v in graph.outputs),
        tuple(graph.user_inputs),
    )


