"""Exact solution of the intra-op assignment problem by variable elimination.

Without a memory limit the problem is a pairwise min-sum network: node costs plus edge
costs. Eliminating the nodes one at a time (Dechter's bucket elimination; Koller and
Friedman, "Probabilistic Graphical Models", ch. 9 and 13 for min-sum) solves it exactly in
time of the order of the largest table an elimination builds: a node's choices times
those of its neighbours at that point. Training graphs of layers that feed the next one
(an MLP's or a CNN's forward and backward) have few neighbours per node whatever the
order of their operations, so on a 2-D mesh a layer of a dozen matmuls, 150k variables
for the ILP, is a few tables of at most some millions of entries: a fraction of a second
in numpy, where SCIP takes seconds. Dense graphs (attention, long skip connections) make
tables too large; `solve_by_elimination` then declines and the ILP solves them.

A shared cost (a gradient bucket's latency, paid once if any of its triggers is chosen)
couples nodes far apart; it is handled by conditioning: for each set of buckets allowed to
be paid, the triggers of the others are forbidden and their costs dropped. Sets are
searched by branch and bound on the cost of the buckets they pay (a solve that forbids
more costs no less), so the usual case, where forbidding a bucket costs more than its
latency, solves a few networks, not 2^k.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time

import numpy as np

from planner.search.solver import Assignment, AssignmentProblem, evaluate, memory_of

MAX_TABLE_ENTRIES = 150_000_000
"""Most table entries one network's eliminations may build in all (about a second of numpy
here, where SCIP takes several on such problems); a problem that needs more goes to the
ILP."""
MAX_SHARED_COSTS = 6
"""Most shared costs conditioned on (2^k networks at worst)."""
MAX_WORK_ENTRIES = 600_000_000
"""Most table entries of all the networks conditioning may solve (2^k of them at worst),
so that elimination never takes much longer than the ILP would."""


def solve_by_elimination(
    problem: AssignmentProblem, max_entries: int = MAX_TABLE_ENTRIES
) -> Assignment | None:
    """The optimal assignment, or None (the ILP then decides) when one network's
    eliminations would build more than `max_entries` table entries, conditioning on the
    shared costs would build more than `MAX_WORK_ENTRIES` in all, or the optimum of the
    unconstrained problem breaks the memory limit."""
    start = time.perf_counter()
    if len(problem.shared_costs) > MAX_SHARED_COSTS:
        return None
    network = _Network(problem)
    planned = network.order(max_entries)
    if planned is None or planned[1] * 2 ** len(problem.shared_costs) > MAX_WORK_ENTRIES:
        return None
    order = planned[0]
    best: tuple[float, list[int]] | None = None
    shared = [s.cost for s in problem.shared_costs]
    # Largest allowed sets first: their solves bound those of their subsets from below.
    subsets = sorted(
        itertools.product((True, False), repeat=len(shared)), key=lambda a: -sum(a)
    )
    floors: dict[tuple[bool, ...], float] = {}
    for allowed in subsets:
        paid = sum(c for c, a in zip(shared, allowed) if a)
        floor = max((v for a, v in floors.items() if _superset(a, allowed)), default=0.0)
        if best is not None and paid + floor >= best[0]:
            floors[allowed] = floor
            continue
        solved = network.solve(order, _forbidden(problem, allowed))
        if solved is None:  # every assignment pays a forbidden bucket
            floors[allowed] = math.inf
            continue
        value, choices = solved
        floors[allowed] = value
        total = evaluate(problem, choices)  # pays exactly the buckets it triggers
        if best is None or total < best[0]:
            best = (total, choices)
    if best is None or memory_of(problem, best[1]) > problem.memory_limit:
        return None
    return Assignment(best[1], best[0], 0.0, "OPTIMAL", time.perf_counter() - start,
                      solver="elimination")


def _superset(a: tuple[bool, ...], b: tuple[bool, ...]) -> bool:
    return a != b and all(x or not y for x, y in zip(a, b))


def _forbidden(problem: AssignmentProblem, allowed: tuple[bool, ...]):
    """The choices (by node) and choice pairs (by edge) that trigger a bucket not allowed."""
    nodes: dict[int, list[int]] = {}
    edges: dict[int, list[tuple[int, int]]] = {}
    for shared, ok in zip(problem.shared_costs, allowed):
        if not ok:
            for v, i in shared.node_triggers:
                nodes.setdefault(v, []).append(i)
            for k, i, j in shared.edge_triggers:
                edges.setdefault(k, []).append((i, j))
    return nodes, edges


class _Network:
    """The problem's costs as tables over one or two nodes, parallel edges summed."""

    def __init__(self, problem: AssignmentProblem) -> None:
        self.problem = problem
        self.domains = [len(c) for c in problem.node_costs]
        self.neighbours: list[set[int]] = [set() for _ in self.domains]
        for u, v, _ in problem.edges:
            if u != v:
                self.neighbours[u].add(v)
                self.neighbours[v].add(u)

    def order(self, max_entries: int) -> tuple[list[int], float] | None:
        """A greedy min-weight elimination order (each step the node whose table, its
        choices times its neighbours', is smallest) and the entries its tables hold in
        all, or None past `max_entries`."""
        domains = self.domains
        adjacent = [set(n) for n in self.neighbours]
        log_domain = [math.log(max(d, 1)) for d in domains]

        def weight(v: int) -> float:
            return log_domain[v] + sum(log_domain[w] for w in adjacent[v])

        heap = [(weight(v), v) for v in range(len(domains))]
        heapq.heapify(heap)
        done = [False] * len(domains)
        order, entries = [], 0.0
        while heap:
            w, v = heapq.heappop(heap)
            if done[v] or w != weight(v):
                continue  # a stale entry: v was re-weighted since
            entries += math.exp(w)
            if entries > max_entries:
                return None
            done[v] = True
            order.append(v)
            around = adjacent[v]
            for a in around:
                adjacent[a] |= around - {a}
                adjacent[a].discard(v)
            for a in around:
                heapq.heappush(heap, (weight(a), a))
        return order, entries

    def solve(self, order: list[int], forbidden) -> tuple[float, list[int]] | None:
        """Min-sum elimination along `order` with the `forbidden` pairs at infinite cost:
        (the optimum, the choices), or None when it is infinite."""
        problem = self.problem
        bad_nodes, bad_edges = forbidden
        tables: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        holding: list[set[int]] = [set() for _ in self.domains]
        keys = itertools.count()

        def add(variables: tuple[int, ...], table: np.ndarray) -> None:
            key = next(keys)
            tables[key] = (variables, table)
            for v in variables:
                holding[v].add(key)

        records: list[tuple[int, tuple[int, ...], np.ndarray]] = []
        constant = 0.0
        pairs: dict[tuple[int, int], np.ndarray] = {}
        for k, (u, v, matrix) in enumerate(problem.edges):
            matrix = np.asarray(matrix, dtype=float)
            if k in bad_edges:
                matrix = matrix.copy()
                for i, j in bad_edges[k]:
                    matrix[i, j] = math.inf
            if u == v:
                pairs[(u, u)] = pairs.get((u, u), 0.0) + np.diag(matrix)
            elif u < v:
                pairs[(u, v)] = pairs.get((u, v), 0.0) + matrix
            else:
                pairs[(v, u)] = pairs.get((v, u), 0.0) + matrix.T
        for v, costs in enumerate(problem.node_costs):
            costs = np.asarray(costs, dtype=float).copy()
            costs[bad_nodes.get(v, [])] = math.inf
            if (v, v) in pairs:
                costs += pairs.pop((v, v))
            add((v,), costs)
        for (u, v), matrix in pairs.items():
            add((u, v), matrix)
        for v in order:
            held = holding[v]
            scope = sorted({w for k in held for w in tables[k][0]} - {v})
            axes = [*scope, v]
            shape = [self.domains[w] for w in axes]
            combined = np.zeros(shape)
            for k in list(held):
                variables, table = tables.pop(k)
                for w in variables:
                    if w != v:
                        holding[w].discard(k)
                combined += _broadcast(table, variables, axes)
            held.clear()
            best = combined.argmin(axis=-1)
            reduced = np.take_along_axis(combined, best[..., None], axis=-1)[..., 0]
            records.append((v, tuple(scope), best.astype(np.min_scalar_type(shape[-1]))))
            if scope:
                add(tuple(scope), reduced)
            else:
                constant += float(reduced)
        if not math.isfinite(constant):
            return None
        choices = [0] * len(self.domains)
        for v, scope, best in reversed(records):
            choices[v] = int(best[tuple(choices[w] for w in scope)])
        return constant, choices


def _broadcast(table: np.ndarray, variables: tuple[int, ...], axes: list[int]) -> np.ndarray:
    """`table` over `variables` laid out along `axes` (size 1 on axes it lacks)."""
    position = {w: a for a, w in enumerate(axes)}
    ordered = sorted(range(len(variables)), key=lambda a: position[variables[a]])
    view = np.transpose(table, ordered)
    shape = [1] * len(axes)
    for a in ordered:
        shape[position[variables[a]]] = table.shape[a]
    return view.reshape(shape)
