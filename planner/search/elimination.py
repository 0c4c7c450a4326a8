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
from dataclasses import replace

import numpy as np

from planner.search.shared_reads import with_shared_reads
from planner.search.solver import (
    Assignment,
    AssignmentProblem,
    SharedRead,
    evaluate,
    memory_of,
)

ENTRIES_PER_VARIABLE = 1_000
"""Most table entries one network's eliminations may build per variable of the ILP: a
table entry costs some thousand times less than an ILP variable costs SCIP (the two rates:
docs/graph-plans.md, "Measured"), so past this the ILP is likely the faster (a layer of an
MLP on a 2-D mesh builds about 400 per variable, a small GPT-2 block 2,600 and a Llama
block 100,000)."""
ENTRIES_PER_VARIABLE_WITH_READS = 20_000
"""The same with shared reads, whose ILP is slower per variable: its LP links every
reader's flow to the moves, so elimination stays the faster far past the plain limit
(docs/graph-plans.md, "Measured")."""
MAX_TABLE_ENTRIES = 4_000_000_000
"""Most table entries in all, whatever the ILP's size: past this elimination's time is no
longer small beside the search's time limit."""
MAX_SHARED_COSTS = 6
MAX_BUCKET_AXES = 60
"""Nodes one bucket's table may span: numpy arrays hold at most 64 dims (nodes of one
choice add no entries, but still an axis)."""
"""Most shared costs conditioned on (2^k networks at worst)."""


def _default_max_entries(problem: AssignmentProblem) -> float:
    per_variable = ENTRIES_PER_VARIABLE_WITH_READS if problem.reads else ENTRIES_PER_VARIABLE
    return min(per_variable * ilp_variables(problem), MAX_TABLE_ENTRIES)


def solve_by_elimination(
    problem: AssignmentProblem, max_entries: float | None = None
) -> Assignment | None:
    """The optimal assignment, or None (the ILP then decides) when one network's
    eliminations would build more than `max_entries` table entries (default: the least of
    `ENTRIES_PER_VARIABLE` per ILP variable, `ENTRIES_PER_VARIABLE_WITH_READS` with shared
    reads, and `MAX_TABLE_ENTRIES`), there are more than
    `MAX_SHARED_COSTS` shared costs to condition on, or the optimum of the unconstrained
    problem breaks the memory limit."""
    if max_entries is None:
        max_entries = _default_max_entries(problem)
    large = _large_reads(problem)
    if large:  # as a pairwise network, whose optimum is the problem's
        n = len(problem.node_costs)
        solved = solve_by_elimination(with_shared_reads(problem, large), max_entries)
        return None if solved is None else replace(solved, choices=solved.choices[:n])
    start = time.perf_counter()
    if not eliminable(problem, max_entries):
        return None
    network = _Network(problem)
    planned = network.order(max_entries)
    if planned is None:
        return None
    elimination = _Elimination(network, planned[0])
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
        solved = elimination.solve(allowed)
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


def eliminable(problem: AssignmentProblem, max_entries: float | None = None) -> bool:
    """Whether `solve_by_elimination` takes the problem on (its tables and shared costs
    are few enough); it may still return None, when the optimum breaks the memory limit."""
    if len(problem.shared_costs) > MAX_SHARED_COSTS:
        return False
    if max_entries is None:
        max_entries = _default_max_entries(problem)
    problem = with_shared_reads(problem, _large_reads(problem))
    return _Network(problem).order(max_entries) is not None


LOWER_BOUND_TABLE_ENTRIES = 1_000_000
"""Largest table `lower_bound` builds: larger tables make a bound slower without changing
what it decides (on the 1B distinct-layer model's layers on 2-D meshes, 3e6 entries led
the graph search to the same layer solves and the same layouts bounded out)."""


def lower_bound(problem: AssignmentProblem,
                max_table_entries: int = LOWER_BOUND_TABLE_ENTRIES) -> float:
    """A lower bound on the problem's optimum, memory limit and shared costs left out, by
    mini-bucket elimination (Dechter and Rish, "Mini-buckets: a general scheme for bounded
    inference", JACM 2003): each step's tables are split into groups whose combined table
    holds at most `max_table_entries`, and each group is minimised over the node apart.
    The sum of the groups' minima is at most the minimum of their sum, so every step, and
    the whole elimination, can only underestimate."""
    network = _Network(problem)
    order, _ = network.order(math.inf)
    domains = network.domains
    holding: list[dict[int, tuple[tuple[int, ...], np.ndarray]]] = [{} for _ in domains]
    keys = itertools.count()

    def add(variables: tuple[int, ...], table: np.ndarray) -> None:
        key = next(keys)
        for v in variables:
            holding[v][key] = (variables, table)

    for variables, table in network.factors:
        add(variables, table)
    total = 0.0
    for v in order:
        items = sorted(holding[v].items(), key=lambda item: -item[1][1].size)
        holding[v].clear()
        for key, (variables, _) in items:
            for w in variables:
                if w != v:
                    del holding[w][key]
        groups: list[tuple[set[int], list[tuple[tuple[int, ...], np.ndarray]]]] = []
        for _, (variables, table) in items:
            for scope, members in groups:
                if math.prod(domains[w] for w in scope | set(variables)) <= max_table_entries:
                    scope.update(variables)
                    members.append((variables, table))
                    break
            else:
                groups.append(({v, *variables}, [(variables, table)]))
        for scope, members in groups:
            rest = sorted(scope - {v})
            axes = [*rest, v]
            parts = sorted((_broadcast(t, variables, axes) for variables, t in members),
                           key=lambda a: a.size)
            reduced = _min_of_sum(parts, [domains[w] for w in axes])
            if rest:
                add(tuple(rest), reduced)
            else:
                total += float(reduced)
    return total


def ilp_variables(problem: AssignmentProblem) -> int:
    """Variables of the problem's ILP: one per node choice, one per edge entry, and for
    a shared read one per move and per entry of each reader's flow."""
    return (sum(len(c) for c in problem.node_costs)
            + sum(np.size(m) for _, _, m in problem.edges)
            + sum(read.prices.size + sum(len(read.prices) * len(np.unique(needs))
                                         for _, needs in read.readers)
                  for read in problem.reads))


READ_TABLE_ENTRIES = 250_000
"""Largest table of a shared read's cost over its producer and readers that elimination
builds (times its placements while building); a larger read enters as the pairwise
network of `shared_reads`."""


def _large_reads(problem: AssignmentProblem) -> list[SharedRead]:
    return [read for read in problem.reads
            if math.prod(len(problem.node_costs[v]) for v in _read_variables(read))
            > READ_TABLE_ENTRIES]


def _read_variables(read: SharedRead) -> tuple[int, ...]:
    return tuple(sorted({read.producer} | {v for v, _ in read.readers}))


def _read_table(read: SharedRead, domains: list[int]) -> np.ndarray:
    """The read's cost (`SharedRead.cost`) for every choice of its variables, in the
    order of `_read_variables`."""
    variables = _read_variables(read)
    placements = read.prices.shape[1]

    def along(v: int, values: np.ndarray) -> np.ndarray:
        shape = [1] * len(variables) + [placements]
        shape[variables.index(v)] = domains[v]
        return values.reshape(shape)

    needed = np.zeros([domains[w] for w in variables] + [placements], dtype=bool)
    for v, needs in read.readers:
        needed |= along(v, np.eye(placements, dtype=bool)[needs])
    return (needed * along(read.producer, read.prices)).sum(axis=-1)


def _superset(a: tuple[bool, ...], b: tuple[bool, ...]) -> bool:
    return a != b and all(x or not y for x, y in zip(a, b))


class _Network:
    """The problem's costs as factors over one or two nodes (node costs with their
    self-edges, parallel edges summed), and which choices each shared cost's triggers
    forbid in them."""

    def __init__(self, problem: AssignmentProblem) -> None:
        self.problem = problem
        self.domains = [len(c) for c in problem.node_costs]
        self.neighbours: list[set[int]] = [set() for _ in self.domains]
        nodes = [np.array(c, dtype=float) for c in problem.node_costs]
        pairs: dict[tuple[int, int], np.ndarray] = {}
        node_bans: list[dict[int, list[tuple[int, ...]]]] = [{} for _ in nodes]
        pair_bans: dict[tuple[int, int], dict[int, list[tuple[int, ...]]]] = {}
        edge_bans: dict[int, list[tuple[int, int, int]]] = {}
        for s, shared in enumerate(problem.shared_costs):
            for v, i in shared.node_triggers:
                node_bans[v].setdefault(s, []).append((i,))
            for k, i, j in shared.edge_triggers:
                edge_bans.setdefault(k, []).append((s, i, j))
        for k, (u, v, matrix) in enumerate(problem.edges):
            matrix = np.asarray(matrix, dtype=float)
            if u == v:  # one choice meets itself: only the diagonal can be paid
                nodes[u] += np.diag(matrix)
                for s, i, j in edge_bans.get(k, []):
                    if i == j:
                        node_bans[u].setdefault(s, []).append((i,))
                continue
            self.neighbours[u].add(v)
            self.neighbours[v].add(u)
            key, table = ((u, v), matrix) if u < v else ((v, u), matrix.T)
            pairs[key] = pairs[key] + table if key in pairs else table
            for s, i, j in edge_bans.get(k, []):
                entry = (i, j) if u < v else (j, i)
                pair_bans.setdefault(key, {}).setdefault(s, []).append(entry)
        self.factors: list[tuple[tuple[int, ...], np.ndarray]] = [
            ((v,), c) for v, c in enumerate(nodes)]
        self.bans = node_bans + [pair_bans.get(key, {}) for key in pairs]
        self.factors += [(key, table) for key, table in pairs.items()]
        for read in problem.reads:
            variables = _read_variables(read)
            for v in variables:
                self.neighbours[v].update(w for w in variables if w != v)
            self.factors.append((variables, _read_table(read, self.domains)))
            self.bans.append({})

    def order(self, max_entries: int) -> tuple[list[int], float] | None:
        """A greedy min-weight elimination order (each step the node whose table, its
        choices times its neighbours', is smallest) and the entries its tables hold in
        all, or None past `max_entries` or `MAX_BUCKET_AXES`."""
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
            if entries > max_entries or len(adjacent[v]) + 1 > MAX_BUCKET_AXES:
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


class _Elimination:
    """Min-sum elimination of a network along one order, for any set of allowed shared
    costs. Each step (a bucket) combines the tables that hold its node and passes their
    minimum over it on as a table of the rest; a bucket none of whose inputs a forbidden
    shared cost touches gives the same table whatever else is forbidden, so it is computed
    once for all the sets conditioning solves (most of a layer's buckets)."""

    def __init__(self, network: _Network, order: list[int]) -> None:
        self.network = network
        # Bucket b: (its node, the others in its scope, its inputs) where an input is
        # ("factor", f) or ("bucket", earlier b), and the shared costs it depends on.
        self.buckets: list[tuple[int, tuple[int, ...], list[tuple[str, int]]]] = []
        self.depends: list[tuple[int, ...]] = []
        holding: list[dict[tuple[str, int], tuple[int, ...]]] = [
            {} for _ in network.domains]
        for f, (variables, _) in enumerate(network.factors):
            for v in variables:
                holding[v][("factor", f)] = variables
        for v in order:
            held = holding[v]
            scope = tuple(sorted({w for variables in held.values() for w in variables} - {v}))
            inputs = list(held)
            depends: set[int] = set()
            for kind, i in inputs:
                depends.update(network.bans[i] if kind == "factor" else self.depends[i])
                for w in held[(kind, i)]:
                    if w != v:
                        del holding[w][(kind, i)]
            held.clear()
            b = len(self.buckets)
            self.buckets.append((v, scope, inputs))
            self.depends.append(tuple(sorted(depends)))
            for w in scope:
                holding[w][("bucket", b)] = scope
        self.done: list[dict[tuple[bool, ...], tuple[np.ndarray, list[np.ndarray]]]] = [
            {} for _ in self.buckets]

    def solve(self, allowed: tuple[bool, ...]) -> tuple[float, list[int]] | None:
        """(the optimum, the choices) with every trigger of a shared cost not `allowed` at
        infinite cost, or None when that optimum is infinite."""
        network = self.network
        results = []
        for b, (v, scope, inputs) in enumerate(self.buckets):
            key = tuple(allowed[s] for s in self.depends[b])
            if key not in self.done[b]:
                axes = [*scope, v]
                parts = []
                for kind, i in inputs:
                    if kind == "factor":
                        variables, table = network.factors[i]
                        table = self._banned(i, table, allowed)
                    else:
                        variables, table = self.buckets[i][1], results[i][0]
                    parts.append(_broadcast(table, variables, axes))
                parts.sort(key=lambda a: a.size)
                self.done[b][key] = (_min_of_sum(parts, [network.domains[w] for w in axes]),
                                     parts)
            results.append(self.done[b][key])
        constant = sum(float(reduced) for (_, scope, _), (reduced, _) in
                       zip(self.buckets, results) if not scope)
        if not math.isfinite(constant):
            return None
        choices = [0] * len(network.domains)
        for (v, scope, _), (_, parts) in zip(reversed(self.buckets), reversed(results)):
            at = tuple(choices[w] for w in scope)
            row = None
            for q in parts:  # the bucket's sum at the scope's choices, in its order
                cell = q[tuple(i if q.shape[a] > 1 else 0 for a, i in enumerate(at))]
                row = cell if row is None else row + cell
            choices[v] = int(np.argmin(np.broadcast_to(row, (network.domains[v],))))
        return constant, choices

    def _banned(self, f: int, table: np.ndarray, allowed: tuple[bool, ...]) -> np.ndarray:
        bans = [entry for s, entries in self.network.bans[f].items() if not allowed[s]
                for entry in entries]
        if not bans:
            return table
        table = table.copy()
        for entry in bans:
            table[entry] = math.inf
        return table


MIN_OF_SUM_CHUNK = 1 << 16
"""Entries of a table summed and minimised at a time (512 KiB of float64: within a core's
cache): a table of millions of entries is then never written out whole, which halves the
time of a 2-D layer's solve."""


def _min_of_sum(parts: list[np.ndarray], shape: list[int]) -> np.ndarray:
    """The sum of `parts`, added in their order (smallest first, so that only the last
    additions run over the whole `shape`), minimised over its last axis; a large table
    a slab of its first axis at a time, with the same additions in the same order."""
    entries = math.prod(shape)
    if entries <= 4 * MIN_OF_SUM_CHUNK or len(shape) < 2 or shape[0] < 2:
        return _slab_min_of_sum(parts, shape)
    rows = max(1, MIN_OF_SUM_CHUNK * shape[0] // entries)
    out = np.empty(shape[:-1])
    for lo in range(0, shape[0], rows):
        hi = min(lo + rows, shape[0])
        out[lo:hi] = _slab_min_of_sum([q[lo:hi] if q.shape[0] > 1 else q for q in parts],
                                      [hi - lo, *shape[1:]])
    return out


def _slab_min_of_sum(parts: list[np.ndarray], shape: list[int]) -> np.ndarray:
    if len(parts) == 1:
        return np.broadcast_to(parts[0], shape).min(axis=-1)
    combined = parts[0] + parts[1]  # a new array: the rest is added into it in place
    for q in parts[2:]:
        # Every part spans the bucket's axes, each of size 1 or its domain's (no
        # np.broadcast_shapes: it takes at most 32 axes, and a bucket may have more).
        if all(n <= c for n, c in zip(q.shape, combined.shape)):
            np.add(combined, q, out=combined)
        else:
            combined = combined + q
    return np.broadcast_to(combined, shape).min(axis=-1)


def _broadcast(table: np.ndarray, variables: tuple[int, ...], axes: list[int]) -> np.ndarray:
    """`table` over `variables` laid out along `axes` (size 1 on axes it lacks)."""
    position = {w: a for a, w in enumerate(axes)}
    ordered = sorted(range(len(variables)), key=lambda a: position[variables[a]])
    view = np.transpose(table, ordered)
    shape = [1] * len(axes)
    for a in ordered:
        shape[position[variables[a]]] = table.shape[a]
    return view.reshape(shape)
