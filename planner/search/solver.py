"""The intra-op assignment problem and its solvers, as pure functions over numpy arrays.

Alpa's formulation (Zheng et al., OSDI 2022, section 5.1): pick one strategy per node to
minimise node costs plus edge (resharding) costs under a memory limit. Node choices are
one-hot binaries; each edge cost is linearised with a transport-shaped block of continuous
variables whose marginals are the two endpoints' one-hot vectors, which keeps the LP
relaxation tight. Rows (columns) of an edge matrix that are identical share one marginal,
so an edge costs |distinct producer placements| x |distinct consumer placements|
variables, not |strategies|^2.

Kept apart from the graph code so that it can be checked against brute force.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np


# Stop when the incumbent is proven within this fraction of the optimum (the default,
# 1e-4, would let the solver ignore the memory tie-breaks in the objective).
RELATIVE_GAP = 1e-7
# SCIP's presolve probing spent 4 s of an 18 s solve on demo:gpt 2x2 and fixed nothing:
# the transport linearisation's LP relaxation is integral at the root there, so there is
# nothing for probing to tighten.
SCIP_PARAMETERS = "propagating/probing/maxprerounds = 0"


@dataclass
class AssignmentProblem:
    """Choose one index per node."""

    node_costs: list[np.ndarray]
    """node_costs[v][i]: cost of node v taking choice i."""
    node_memory: list[np.ndarray]
    """node_memory[v][i]: bytes per device held when node v takes choice i."""
    edges: list[tuple[int, int, np.ndarray]] = field(default_factory=list)
    """(u, v, C): cost C[i, j] is paid when u takes i and v takes j."""
    memory_limit: float = math.inf
    """Upper bound on the summed memory of the chosen strategies."""
    shared_costs: list[SharedCost] = field(default_factory=list)
    """Costs paid once if any of their triggers is chosen (a gradient bucket's latency)."""
    followers: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)
    """Node v -> (its producer u, f): v may be merged into u, taking choice f[i] whenever
    u takes choice i (see `contract_followers`)."""


@dataclass
class SharedCost:
    cost: float
    node_triggers: list[tuple[int, int]] = field(default_factory=list)
    """(v, i): node v taking choice i triggers the cost."""
    edge_triggers: list[tuple[int, int, int]] = field(default_factory=list)
    """(k, i, j): edge k's endpoints taking choices i and j trigger the cost."""


@dataclass
class Assignment:
    choices: list[int]
    objective: float
    gap: float
    """Relative optimality gap reported by the solver (0 when proven optimal)."""
    status: str
    solve_time_s: float
    solver: str = "ILP"
    """What found it: 'elimination' (`planner.search.elimination`), 'ILP' or 'brute force'."""


class InfeasibleError(RuntimeError):
    """No assignment fits the memory limit."""


def evaluate(problem: AssignmentProblem, choices: list[int]) -> float:
    """Total cost of an assignment."""
    cost = sum(float(c[i]) for c, i in zip(problem.node_costs, choices))
    cost += sum(float(m[choices[u], choices[v]]) for u, v, m in problem.edges)
    for shared in problem.shared_costs:
        by_node = any(choices[v] == i for v, i in shared.node_triggers)
        by_edge = any(
            choices[problem.edges[k][0]] == i and choices[problem.edges[k][1]] == j
            for k, i, j in shared.edge_triggers
        )
        cost += shared.cost if by_node or by_edge else 0.0
    return cost


def memory_of(problem: AssignmentProblem, choices: list[int]) -> float:
    return sum(float(m[i]) for m, i in zip(problem.node_memory, choices))


def solve_brute_force(problem: AssignmentProblem) -> Assignment:
    """Enumerate every assignment; for tests on tiny problems."""
    start = time.perf_counter()
    best: tuple[float, list[int]] | None = None
    for combo in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        choices = list(combo)
        if memory_of(problem, choices) > problem.memory_limit:
            continue
        cost = evaluate(problem, choices)
        if best is None or cost < best[0] - 1e-15:
            best = (cost, choices)
    if best is None:
        raise InfeasibleError("no assignment fits the memory limit")
    return Assignment(best[1], best[0], 0.0, "OPTIMAL", time.perf_counter() - start,
                      solver="brute force")


def solve_greedy(problem: AssignmentProblem) -> list[int]:
    """Each node in order takes its cheapest choice given the choices already made
    upstream, among those that leave room for the nodes after it in their smallest
    choices: a quick incumbent for the ILP, within the memory limit whenever any
    assignment is (memory adds up node by node). Where none is, the least memory."""
    choices: list[int | None] = [None] * len(problem.node_costs)
    # room[v]: the least memory nodes v, v+1, ... can take together.
    least = [float(m.min()) if len(m) else 0.0 for m in problem.node_memory]
    room = np.concatenate([np.cumsum(least[::-1])[::-1], [0.0]])
    used = 0.0
    # Costs of an edge as seen from each end: rows for its producer, columns for its consumer.
    seen_from: dict[int, list] = {}
    for u, v, m in problem.edges:
        seen_from.setdefault(v, []).append((u, m))
        seen_from.setdefault(u, []).append((v, m.T))
    for v, costs in enumerate(problem.node_costs):
        total = costs.astype(float).copy()
        for other, m in seen_from.get(v, []):
            if choices[other] is not None:
                total += m[choices[other], :]
        memory = problem.node_memory[v]
        fits = used + memory + room[v + 1] <= problem.memory_limit
        choices[v] = int(np.argmin(np.where(fits, total, np.inf))) if fits.any() else int(
            np.argmin(memory))
        used += float(memory[choices[v]])
    return _one_opt(problem, [int(c) for c in choices], seen_from, used)


# Sweeps of `_one_opt` at most: each is a pass over the edges.
ONE_OPT_SWEEPS = 8


def _one_opt(
    problem: AssignmentProblem, choices: list[int], seen_from: dict[int, list], used: float
) -> list[int]:
    """Improve an assignment one node at a time, each taking its cheapest choice given
    all its neighbours' (the greedy pass saw only the upstream ones) within the memory
    limit, until no node moves. Shared costs are not counted."""
    for _ in range(ONE_OPT_SWEEPS):
        moved = False
        for v, costs in enumerate(problem.node_costs):
            total = costs.astype(float).copy()
            for other, m in seen_from.get(v, []):
                total += m[choices[other], :]
            memory = problem.node_memory[v]
            fits = used - memory[choices[v]] + memory <= problem.memory_limit
            best = int(np.argmin(np.where(fits, total, np.inf)))
            if fits[best] and total[best] < total[choices[v]]:
                used += float(memory[best] - memory[choices[v]])
                choices[v], moved = best, True
        if not moved:
            break
    return choices


def solve_ilp(
    problem: AssignmentProblem, time_limit_s: float = 30.0, backend: str = "SCIP"
) -> Assignment:
    """Solve with an OR-Tools MIP backend (SCIP or CBC), within a time limit."""
    from ortools.linear_solver import pywraplp

    start = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools has no {backend} backend; use SCIP or CBC")
    solver.SetTimeLimit(int(time_limit_s * 1000))
    if backend == "SCIP":
        solver.SetSolverSpecificParametersAsString(SCIP_PARAMETERS)
    # A greedy incumbent: with a time limit the answer is never worse than it.
    hint = solve_greedy(problem)
    original, problem = problem, _capped(problem, hint)
    scale = _cost_scale(problem)

    # Built with the solver's coefficient API: expression objects cost ~2x the build time.
    objective = solver.Objective()
    x = [
        [solver.BoolVar(f"x{v}_{i}") for i in range(len(costs))]
        for v, costs in enumerate(problem.node_costs)
    ]
    for costs, vars_v in zip(problem.node_costs, x):
        _constraint(solver, 1.0, 1.0, [(var, 1.0) for var in vars_v])
        for c, var in zip(costs, vars_v):
            if c != 0:
                objective.SetCoefficient(var, float(c) * scale)
    edge_vars = []
    # A shared cost triggered by one (i, j) pair must see that pair alone, not its group.
    triggered = {k for s in problem.shared_costs for k, _, _ in s.edge_triggers}
    for k, (u, v, matrix) in enumerate(problem.edges):
        edge_vars.append(_add_edge(solver, objective, k, x[u], x[v], matrix * scale,
                                   group=k not in triggered))
    for n, shared in enumerate(problem.shared_costs):
        y = solver.BoolVar(f"shared{n}")
        for v, i in shared.node_triggers:
            _constraint(solver, 0.0, math.inf, [(y, 1.0), (x[v][i], -1.0)])
        for k, i, j in shared.edge_triggers:
            e, row_of, col_of = edge_vars[k]
            u, v, _ = problem.edges[k]
            if e:
                _constraint(solver, 0.0, math.inf, [(y, 1.0), (e[row_of[i]][col_of[j]], -1.0)])
            else:  # a uniform matrix has no e-block: trigger on the endpoints
                _constraint(solver, -1.0, math.inf,
                            [(y, 1.0), (x[u][i], -1.0), (x[v][j], -1.0)])
        objective.SetCoefficient(y, shared.cost * scale)
    if math.isfinite(problem.memory_limit):
        _constraint(solver, -math.inf, problem.memory_limit, [
            (var, float(m))
            for mem, vars_v in zip(problem.node_memory, x)
            for m, var in zip(mem, vars_v)
            if m != 0
        ])
    objective.SetMinimization()
    solver.SetHint(
        [var for vars_v in x for var in vars_v],
        [1.0 if i == hint[v] else 0.0 for v, vars_v in enumerate(x) for i in range(len(vars_v))],
    )
    parameters = pywraplp.MPSolverParameters()
    parameters.SetDoubleParam(parameters.RELATIVE_MIP_GAP, RELATIVE_GAP)
    status = solver.Solve(parameters)
    problem = original  # objectives are reported uncapped
    if status == pywraplp.Solver.INFEASIBLE:
        raise InfeasibleError("no sharding fits the per-device memory limit")
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        if memory_of(problem, hint) > problem.memory_limit:
            raise RuntimeError(
                f"the ILP solver found no solution within {time_limit_s:g} s; raise the time limit"
            )
        # Out of time before a first incumbent: the greedy answer, with an unknown gap.
        return Assignment(hint, evaluate(problem, hint), 1.0, "GREEDY", time.perf_counter() - start)
    choices = [int(np.argmax([var.solution_value() for var in vars_v])) for vars_v in x]
    objective = evaluate(problem, choices)
    if status != pywraplp.Solver.OPTIMAL:
        # Stopped by the time limit: SCIP may not have used the hint as its incumbent.
        greedy = evaluate(problem, hint)
        if greedy < objective and memory_of(problem, hint) <= problem.memory_limit:
            choices, objective = hint, greedy
    bound = solver.Objective().BestBound() / scale
    gap = (
        0.0
        if status == pywraplp.Solver.OPTIMAL
        else max(0.0, objective - bound) / max(abs(objective), 1e-12)
    )
    return Assignment(
        choices,
        objective,
        gap,
        "OPTIMAL" if status == pywraplp.Solver.OPTIMAL else "FEASIBLE",
        time.perf_counter() - start,
    )


def _capped(problem: AssignmentProblem, incumbent: list[int]) -> AssignmentProblem:
    """The problem with every cost above twice the incumbent's objective lowered to that.

    With no negative cost, an assignment that pays such a cost costs more than the
    incumbent, before and after the cap, so the optimum and the optimal assignments are
    the same. It matters for the numerics: the graph code prices impossible moves at
    1e6 s against plans of a millisecond, and scaling by that largest cost pushed every
    real cost below the LP's tolerances (SoPlex then took 6x the iterations). Returned
    unchanged when the incumbent breaks the memory limit (it bounds nothing then) or
    some cost is negative.
    """
    arrays = [*problem.node_costs, *(m for _, _, m in problem.edges)]
    if any(a.size and a.min() < 0 for a in arrays) or any(
        s.cost < 0 for s in problem.shared_costs
    ):
        return problem
    if memory_of(problem, incumbent) > problem.memory_limit:
        return problem
    cap = 2 * evaluate(problem, incumbent)
    if cap <= 0:
        return problem
    return replace(
        problem,
        node_costs=[np.minimum(c, cap) for c in problem.node_costs],
        edges=[(u, v, np.minimum(m, cap)) for u, v, m in problem.edges],
    )


def _cost_scale(problem: AssignmentProblem) -> float:
    """Factor that brings the median nonzero cost to 1e3: the costs that decide between
    plans are then well above the LP's tolerances, whatever the few largest are (the
    largest are still capped where an incumbent allows, to keep the range sane)."""
    values = np.abs(np.concatenate(
        [np.ravel(c) for c in problem.node_costs] + [np.ravel(m) for _, _, m in problem.edges]
        + [np.array([s.cost for s in problem.shared_costs])]
    ))
    values = values[values > 0]
    return 1e3 / float(np.median(values)) if values.size else 1.0


def _constraint(solver, low: float, high: float, terms: list) -> None:
    """low <= sum(coefficient * variable) <= high; a variable may appear more than once."""
    constraint = solver.Constraint(low, high)
    for var, coefficient in terms:
        constraint.SetCoefficient(var, constraint.GetCoefficient(var) + coefficient)


def _add_edge(
    solver, objective, k: int, xu: list, xv: list, matrix: np.ndarray, group: bool = True
) -> tuple[list, list[int], list[int]]:
    """Transport-shaped linearisation of x_u^T M x_v over distinct rows and columns; adds
    its cost to `objective`.

    Returns the block of edge variables (empty when the matrix is uniform) and the
    row/column group of every choice."""
    if group:
        rows, row_of = _distinct(matrix)
        cols, col_of = _distinct(matrix.T)
    else:
        rows, row_of = list(range(len(xu))), list(range(len(xu)))
        cols, col_of = list(range(len(xv))), list(range(len(xv)))
    if len(rows) == 1 and len(cols) == 1:
        if matrix[0, 0]:  # paid whatever u chooses: sum(x_u) is 1
            for var in xu:
                objective.SetCoefficient(var, objective.GetCoefficient(var) + float(matrix[0, 0]))
        return [], row_of, col_of
    e = [
        [solver.NumVar(0.0, 1.0, f"e{k}_{r}_{c}") for c in range(len(cols))]
        for r in range(len(rows))
    ]
    # Marginals: each row of e sums to the indicator that u's choice falls in that row
    # group, each column to the indicator for v's choice.
    for r in range(len(rows)):
        _constraint(solver, 0.0, 0.0, [(var, 1.0) for var in e[r]]
                    + [(xu[i], -1.0) for i in range(len(xu)) if row_of[i] == r])
    for c in range(len(cols)):
        _constraint(solver, 0.0, 0.0, [(e[r][c], 1.0) for r in range(len(rows))]
                    + [(xv[j], -1.0) for j in range(len(xv)) if col_of[j] == c])
    for r, i in enumerate(rows):
        for c, j in enumerate(cols):
            if matrix[i, j] != 0:
                objective.SetCoefficient(e[r][c], float(matrix[i, j]))
    return e, row_of, col_of


def _distinct(matrix: np.ndarray) -> tuple[list[int], list[int]]:
    """Representative row indices, and for every row the index of its representative group."""
    groups: dict[bytes, int] = {}
    reps: list[int] = []
    group_of: list[int] = []
    for i, row in enumerate(matrix):
        key = row.tobytes()
        if key not in groups:
            groups[key] = len(reps)
            reps.append(i)
        group_of.append(groups[key])
    return reps, group_of


@dataclass
class Contraction:
    """How to expand the solution of a contracted problem to the original nodes."""

    kept: list[int]
    """Index in the contracted problem -> original node."""
    follows: dict[int, tuple[int, np.ndarray]]
    """Original node -> (the node it follows, its choice for each of that node's choices)."""

    def expand(self, reduced_choices: list[int], num_nodes: int) -> list[int]:
        choice: dict[int, int] = dict(zip(self.kept, reduced_choices))

        def resolve(v: int) -> int:
            if v not in choice:
                leader, mapping = self.follows[v]
                choice[v] = int(mapping[resolve(leader)])
            return choice[v]

        return [resolve(v) for v in range(num_nodes)]


def contract_followers(problem: AssignmentProblem) -> tuple[AssignmentProblem, Contraction]:
    """Merge each follower node into the producer it follows.

    Alpa's operator merging (Zheng et al. 2022, section 5.1): a simple op (view, permute,
    elementwise) runs in whatever placement its operand arrives in, so it needs no
    decision of its own. Its costs fold into the producer and its consumers' edges start
    from the producer, so the ILP keeps one decision per chain of simple ops. Any solution
    of the contracted problem expands to one of the original with the same cost.
    """
    n = len(problem.node_costs)
    costs = [c.astype(float).copy() for c in problem.node_costs]
    memory = [m.astype(float).copy() for m in problem.node_memory]
    edges: dict[int, list] = {k: [u, v, m] for k, (u, v, m) in enumerate(problem.edges)}
    in_edges: dict[int, list[int]] = {v: [] for v in range(n)}
    out_edges: dict[int, list[int]] = {v: [] for v in range(n)}
    for k, (u, v, _) in edges.items():
        out_edges[u].append(k)
        in_edges[v].append(k)
    node_triggers = [set(s.node_triggers) for s in problem.shared_costs]
    edge_triggers = [set(s.edge_triggers) for s in problem.shared_costs]
    follows: dict[int, tuple[int, np.ndarray]] = {}

    for v in sorted(problem.followers):
        u, f = problem.followers[v]
        while u in follows:  # the leader was merged itself: follow its leader
            u, g = follows[u]
            f = f[g]
        if u == v or any(edges[k][0] != u for k in in_edges[v]):
            continue
        f = np.asarray(f)
        rows = np.arange(len(f))
        costs[u] += costs[v][f]
        memory[u] += memory[v][f]
        for k in list(in_edges[v]):
            _, _, m = edges.pop(k)
            out_edges[u].remove(k)
            costs[u] += m[rows, f]
            for nt, et in zip(node_triggers, edge_triggers):
                for kk, i, j in [t for t in et if t[0] == k]:
                    et.discard((kk, i, j))
                    nt.update((u, int(r)) for r in rows if r == i and f[r] == j)
        in_edges[v].clear()
        for nt in node_triggers:
            for w, j in [t for t in nt if t[0] == v]:
                nt.discard((w, j))
                nt.update((u, int(i)) for i in np.flatnonzero(f == j))
        for kk in list(out_edges[v]):
            _, w, mm = edges[kk]
            moved = mm[f, :]
            out_edges[v].remove(kk)
            for nt, et in zip(node_triggers, edge_triggers):
                old = [t for t in et if t[0] == kk]
                et.difference_update(old)  # rewrite all at once: old and new may coincide
                for _, j, jw in old:
                    for i in np.flatnonzero(f == j):
                        if w != u:
                            et.add((kk, int(i), jw))
                        elif i == jw:
                            nt.add((u, int(i)))
            if w == u:  # the follower feeds back into its leader: a diagonal cost
                costs[u] += np.diag(moved)
                edges.pop(kk)
                in_edges[u].remove(kk)
            else:
                edges[kk] = [u, w, moved]
                out_edges[u].append(kk)
        follows[v] = (u, f)

    kept = [v for v in range(n) if v not in follows]
    new_index = {v: i for i, v in enumerate(kept)}
    edge_ids = sorted(edges)
    new_edge = {k: i for i, k in enumerate(edge_ids)}
    shared = [
        SharedCost(
            s.cost,
            sorted((new_index[v], i) for v, i in nt),
            sorted((new_edge[k], i, j) for k, i, j in et),
        )
        for s, nt, et in zip(problem.shared_costs, node_triggers, edge_triggers)
    ]
    reduced = AssignmentProblem(
        [costs[v] for v in kept],
        [memory[v] for v in kept],
        [(new_index[edges[k][0]], new_index[edges[k][1]], edges[k][2]) for k in edge_ids],
        problem.memory_limit,
        shared,
    )
    return reduced, Contraction(kept, follows)


@dataclass
class Pruning:
    """Which choices of each node a pruned problem kept."""

    kept: list[np.ndarray]
    """kept[v][i]: the original index of choice i of node v in the pruned problem."""

    def expand(self, choices: list[int]) -> list[int]:
        return [int(self.kept[v][i]) for v, i in enumerate(choices)]


def prune_dominated(problem: AssignmentProblem) -> tuple[AssignmentProblem, Pruning]:
    """Drop every choice another choice of the same node dominates: no more node cost, no
    more memory, and no more cost on any edge whatever the neighbour chooses (rows of the
    node's outgoing edge matrices, columns of its incoming ones, compared elementwise).
    Any assignment that uses a dominated choice costs at least as much as the one that
    swaps in its dominator, and needs no less memory, so the pruned problem has the same
    optimum (ties keep the lowest index). Choices a shared cost names are kept, and
    dominate nothing, since the costs they trigger are not elementwise. Repeated until
    nothing changes: pruning a neighbour's choices removes matrix columns, which can make
    more rows comparable.
    """
    n = len(problem.node_costs)
    kept = [np.arange(len(c)) for c in problem.node_costs]
    pinned: list[set[int]] = [set() for _ in range(n)]
    for shared in problem.shared_costs:
        for v, i in shared.node_triggers:
            pinned[v].add(i)
        for k, i, j in shared.edge_triggers:
            u, w, _ = problem.edges[k]
            pinned[u].add(i)
            pinned[w].add(j)
    outgoing: list[list[int]] = [[] for _ in range(n)]
    incoming: list[list[int]] = [[] for _ in range(n)]
    for k, (u, w, _) in enumerate(problem.edges):
        outgoing[u].append(k)
        incoming[w].append(k)

    def profile(v: int) -> np.ndarray:
        """One row per kept choice of v: its node cost, memory and every edge cost it
        can incur, over the neighbours' kept choices."""
        rows = kept[v]
        parts = [problem.node_costs[v][rows, None], problem.node_memory[v][rows, None]]
        for k in outgoing[v]:
            _, w, m = problem.edges[k]
            parts.append(m[np.ix_(rows, kept[w])])
        for k in incoming[v]:
            u, _, m = problem.edges[k]
            parts.append(m[np.ix_(kept[u], rows)].T)
        return np.hstack([np.asarray(p, dtype=float) for p in parts])

    changed = True
    while changed:
        changed = False
        for v in range(n):
            if len(kept[v]) < 2:
                continue
            rows = profile(v)
            free = np.array([int(i) not in pinned[v] for i in kept[v]])
            # dominates[a, b]: choice a is nowhere worse than b.
            dominates = (rows[:, None, :] <= rows[None, :, :]).all(axis=2)
            dominates &= free[:, None] & free[None, :]
            equal = dominates & dominates.T
            drop = np.zeros(len(rows), dtype=bool)
            for b in range(len(rows)):
                # b goes if something strictly better dominates it, or an equal one
                # with a lower index survives.
                strict = dominates[:, b] & ~equal[:, b]
                tie = equal[:b, b] & ~drop[:b]
                drop[b] = strict.any() or tie.any()
            if drop.any():
                kept[v] = kept[v][~drop]
                changed = True
    edges = [(u, w, m[np.ix_(kept[u], kept[w])]) for u, w, m in problem.edges]
    where = [{int(i): r for r, i in enumerate(k)} for k in kept]
    shared = [
        SharedCost(
            s.cost,
            [(v, where[v][i]) for v, i in s.node_triggers],
            [(k, where[problem.edges[k][0]][i], where[problem.edges[k][1]][j])
             for k, i, j in s.edge_triggers],
        )
        for s in problem.shared_costs
    ]
    pruned = AssignmentProblem(
        [c[k] for c, k in zip(problem.node_costs, kept)],
        [m[k] for m, k in zip(problem.node_memory, kept)],
        edges, problem.memory_limit, shared,
    )
    return pruned, Pruning(kept)
