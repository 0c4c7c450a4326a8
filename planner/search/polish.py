"""Moves that lower what a plan runs, where the ILP's pairwise objective overcounts it.

The ILP prices each (producer, consumer) edge alone, so a value three consumers read at
the same placement is charged three moves; the runtime moves it once and every consumer
reads the copy (`intra_op._transfers`). The pairwise optimum can then run slower than a
plan whose consumers share their moves more (AutoParallel's, on two models of
`benchmarks/vs_autoparallel.py`'s family). Exact sharing is a hyperedge no pairwise
solver takes, so the optimum of the pairwise problem is polished instead: single moves
of a node (or of a tied group, all together), accepted while they lower the step as it
runs (each value's move to each placement charged once) and keep the memory limit.

Pure functions over the problem's arrays, apart from the graph code; the tests check
them against brute force.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solver import AssignmentProblem

# A move must gain at least this share of the step to count: the cost model is right to a
# few percent, so a smaller gain is no reason to leave the ILP's proven optimum (a layout
# a user can read, e.g. Megatron's column split) for a less familiar one.
MIN_GAIN = 1e-3


@dataclass(frozen=True)
class SharedRead:
    """Edges that read one value: each distinct placement they need is paid once."""

    edges: tuple[int, ...]
    """Indices into the problem's edges, all from the value's producer."""
    destinations: tuple[np.ndarray, ...]
    """For each of those edges, the placement (an id) its consumer's choice j needs."""


def _shared_cost(problem: AssignmentProblem, read: SharedRead, choices: list[int]) -> float:
    """What the value's moves cost under `choices`: each needed placement once."""
    paid: set[int] = set()
    total = 0.0
    for k, destination in zip(read.edges, read.destinations):
        u, v, matrix = problem.edges[k]
        where = int(destination[choices[v]])
        if where not in paid:
            paid.add(where)
            total += float(matrix[choices[u], choices[v]])
    return total


def run_cost(problem: AssignmentProblem, reads: list[SharedRead], choices: list[int]) -> float:
    """The cost of `choices` as the plan runs: `solver.evaluate` with every shared read's
    edges priced once per needed placement."""
    shared = {k for read in reads for k in read.edges}
    cost = sum(float(c[i]) for c, i in zip(problem.node_costs, choices))
    cost += sum(float(m[choices[u], choices[v]])
                for k, (u, v, m) in enumerate(problem.edges) if k not in shared)
    cost += sum(_shared_cost(problem, read, choices) for read in reads)
    triggers = _Triggers(problem)
    return cost + sum(bucket.cost for b, bucket in enumerate(problem.shared_costs)
                      if triggers.active(b, choices))


def polish(problem: AssignmentProblem, reads: list[SharedRead], choices: list[int],
           groups: list[list[int]], max_rounds: int = 8) -> list[int]:
    """`choices` improved by moves while each lowers `run_cost` by at least MIN_GAIN of the
    start's; the memory limit holds, and the nodes of each of `groups` (tied blocks) move
    as one, every other node alone. Two kinds of move:
    one unit to another choice, and the readers of one value all to choices that need it
    at one placement (each the cheapest such), which single moves cannot reach when
    every reader alone would pay the move. Only units that touch a shared read can gain,
    so only they move. Never worse than `choices`."""
    choices = list(choices)
    grouped = {v for group in groups for v in group}
    units = groups + [[v] for v in range(len(choices)) if v not in grouped]
    state = _State(problem, reads, units, choices)
    state.min_gain = max(MIN_GAIN * run_cost(problem, reads, choices), 1e-12)
    movable = [unit for unit in units if any(state.touching[v][1] for v in unit)]
    for _ in range(max_rounds):
        moved = False
        for unit in movable:
            options = range(len(problem.node_costs[unit[0]]))
            moved |= state.best_of([{v: option for v in unit} for option in options
                                    if option != state.choices[unit[0]]])
        for read in reads:
            moved |= state.best_of(state.aligned(read))
        if not moved:
            break
    return state.choices


class _State:
    """Choices, their memory, and what each node's choice enters, for `polish`."""

    def __init__(self, problem: AssignmentProblem, reads: list[SharedRead],
                 units: list[list[int]], choices: list[int]) -> None:
        self.problem, self.reads, self.choices = problem, reads, choices
        self.unit_of = {v: unit for unit in units for v in unit}
        self.memory = sum(float(m[i]) for m, i in zip(problem.node_memory, choices))
        self.touching = _terms(problem, reads)
        self.triggers = _Triggers(problem)
        self.min_gain = 0.0
        """What a move must gain (seconds) to be taken."""

    def best_of(self, moves: list[dict[int, int]]) -> bool:
        """Take the move (node -> choice) that lowers the cost most, if any does."""
        best, best_gain, best_extra = None, self.min_gain, 0.0
        for move in moves:
            extra = sum(float(self.problem.node_memory[v][i]
                              - self.problem.node_memory[v][self.choices[v]])
                        for v, i in move.items())
            if self.memory + extra > self.problem.memory_limit:
                continue
            nodes = list(move)
            trial = list(self.choices)
            for v, i in move.items():
                trial[v] = i
            gain = self._local(nodes, self.choices) - self._local(nodes, trial)
            if gain > best_gain:
                best, best_gain, best_extra = move, gain, extra
        if best is None:
            return False
        for v, i in best.items():
            self.choices[v] = i
        self.memory += best_extra
        return True

    def aligned(self, read: SharedRead) -> list[dict[int, int]]:
        """For each placement a reader of `read` can need: every reader's unit moved to its
        cheapest choice that needs the value there."""
        moves = []
        wanted = {int(p) for destination in read.destinations for p in destination}
        for placement in sorted(wanted):
            move: dict[int, int] = {}
            for k, destination in zip(read.edges, read.destinations):
                v = self.problem.edges[k][1]
                fitting = np.flatnonzero(destination == placement)
                if not len(fitting):
                    move = {}
                    break
                unit = self.unit_of.get(v, [v])
                option = int(fitting[np.argmin(self.problem.node_costs[v][fitting])])
                move.update({w: option for w in unit})
            if move and any(self.choices[v] != i for v, i in move.items()):
                moves.append(move)
        return moves

    def _local(self, nodes: list[int], choices: list[int]) -> float:
        return _local_cost(self.problem, self.reads, self.touching, self.triggers, nodes,
                           choices)


def _terms(problem: AssignmentProblem, reads: list[SharedRead]
           ) -> list[tuple[list[int], list[int], list[int]]]:
    """For each node: the pairwise edges, shared reads and shared costs its choice
    enters."""
    shared_edges = {k: r for r, read in enumerate(reads) for k in read.edges}
    terms: list[tuple[list[int], list[int], list[int]]] = [
        ([], [], []) for _ in problem.node_costs]
    for k, (u, v, _) in enumerate(problem.edges):
        for node in {u, v}:
            if k in shared_edges:
                if shared_edges[k] not in terms[node][1]:
                    terms[node][1].append(shared_edges[k])
            else:
                terms[node][0].append(k)
    for b, bucket in enumerate(problem.shared_costs):
        nodes = {v for v, _ in bucket.node_triggers}
        nodes |= {node for k, _, _ in bucket.edge_triggers for node in problem.edges[k][:2]}
        for node in nodes:
            terms[node][2].append(b)
    return terms


def _local_cost(problem: AssignmentProblem, reads: list[SharedRead],
                touching: list[tuple[list[int], list[int], list[int]]],
                triggers: _Triggers, unit: list[int], choices: list[int]) -> float:
    """The part of `run_cost` that `unit`'s choice can change."""
    edges = {k for v in unit for k in touching[v][0]}
    shared = {r for v in unit for r in touching[v][1]}
    buckets = {b for v in unit for b in touching[v][2]}
    cost = sum(float(problem.node_costs[v][choices[v]]) for v in unit)
    cost += sum(float(problem.edges[k][2][choices[problem.edges[k][0]],
                                         choices[problem.edges[k][1]]]) for k in edges)
    cost += sum(_shared_cost(problem, reads[r], choices) for r in shared)
    cost += sum(problem.shared_costs[b].cost for b in buckets if triggers.active(b, choices))
    return cost


class _Triggers:
    """Each shared cost's triggers as sets, to ask whether a choice pays it."""

    def __init__(self, problem: AssignmentProblem) -> None:
        self.edges = problem.edges
        self.nodes = [set(bucket.node_triggers) for bucket in problem.shared_costs]
        self.pairs = [set(bucket.edge_triggers) for bucket in problem.shared_costs]
        self.watched = [sorted({k for k, _, _ in bucket.edge_triggers})
                        for bucket in problem.shared_costs]
        self.by_node = [sorted({v for v, _ in bucket.node_triggers})
                        for bucket in problem.shared_costs]

    def active(self, b: int, choices: list[int]) -> bool:
        """Whether shared cost `b` is paid under `choices`."""
        if any((v, choices[v]) in self.nodes[b] for v in self.by_node[b]):
            return True
        return any((k, choices[self.edges[k][0]], choices[self.edges[k][1]]) in self.pairs[b]
                   for k in self.watched[b])
