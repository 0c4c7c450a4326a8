"""The intra-op assignment problem and its solvers, as pure functions over numpy arrays.

Alpa's formulation (Zheng et al., OSDI 2022, section 5.1): pick one strategy per node to
minimise node costs plus edge (resharding) costs under a memory limit. Node choices are
one-hot binaries; each edge cost is linearised with a transport-shaped block of continuous
variables whose marginals are the two endpoints' one-hot vectors, which keeps the LP
relaxation tight. Rows (columns) of an edge matrix that are identical share one marginal,
so an edge costs |distinct producer placements| x |distinct consumer placements|
variables, not |strategies|^2.

A value several consumers read is moved once per placement and every consumer needing it
there reads the copy, as the runtime does (`intra_op._transfers`): a `SharedRead`, whose
cost is no sum of edges. Each reader keeps its transport block (no cost of its own) and
the move from producer placement s to placement p is a variable at least every reader's
flow from s to p, priced once: the facility-location linearisation of a shared resource
(one facility per move, open for all the readers it serves), as tight as a pairwise edge
where a value has one reader.

Kept apart from the graph code so that it can be checked against brute force.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np


DEFAULT_TIME_LIMIT_S = 600.0
"""Seconds the choice of shardings may take unless told (`plan --time-limit`,
`planner.api.plan_model`): a safety net, not where a solve stops; the largest untied ILPs
of benchmarks/vs_autoparallel.py's family end OPTIMAL well inside it (docs/graph-plans.md,
"Measured")."""

# Stop when the incumbent is proven within this fraction of the optimum (the default,
# 1e-4, would let the solver ignore the memory tie-breaks in the objective).
RELATIVE_GAP = 1e-7
# SCIP's settings for this formulation (what they save: docs/graph-plans.md, "Measured").
# Presolve probing is off: the transport linearisation's LP relaxation is integral at the
# root, so probing has nothing to tighten and fixes nothing. The root LP is most of a large
# solve, and the optimum is proven at the root node on every model of
# benchmarks/vs_autoparallel.py's family, so restarts are off (a restart after
# reduced-cost fixing solves that LP again from scratch) and so is the feasibility pump
# (it solves more LPs for an incumbent diving finds anyway); the optimum is the same
# without either. The hint sets only the node choices, a few percent of the variables:
# SCIP ignores a partial solution with more than 85% of its variables unknown unless told
# to complete it, and the incumbent reduced-cost fixing hands it shortens the solve.
SCIP_PARAMETERS = "\n".join([
    "propagating/probing/maxprerounds = 0",
    "presolving/maxrestarts = 0",
    "heuristics/feaspump/freq = -1",
    "heuristics/completesol/maxunknownrate = 1",
])


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
    u takes choice i (see `presolve.contract_followers`)."""
    reads: list[SharedRead] = field(default_factory=list)
    """Values several nodes read, each placement paid once (no edge prices them)."""


@dataclass(frozen=True)
class SharedRead:
    """One value and the nodes that read it: each placement they need it at is paid once,
    from where the producer makes it."""

    producer: int
    prices: np.ndarray
    """prices[i, p]: cost of moving the value from the producer's choice i to placement p."""
    readers: tuple[tuple[int, np.ndarray], ...]
    """(node, needs): needs[j] is the placement (a column of `prices`) the node's choice j
    reads the value at."""

    def cost(self, choices: list[int]) -> float:
        """What the value's moves cost under `choices`: each needed placement once."""
        needed = {int(needs[choices[v]]) for v, needs in self.readers}
        return float(sum(self.prices[choices[self.producer], p] for p in needed))

    def as_edges(self) -> list[tuple[int, int, np.ndarray]]:
        """The read as one edge per reader, each paying its move: never less than `cost`."""
        return [(self.producer, v, self.prices[:, needs]) for v, needs in self.readers]


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
    cost += sum(shared.cost for shared, paid in zip(problem.shared_costs,
                                                    triggered(problem, choices)) if paid)
    return cost + sum(read.cost(choices) for read in problem.reads)


def triggered(problem: AssignmentProblem, choices: list[int]) -> list[bool]:
    """For each shared cost of the problem: whether the assignment triggers it."""
    return [
        any(choices[v] == i for v, i in shared.node_triggers)
        or any(choices[problem.edges[k][0]] == i and choices[problem.edges[k][1]] == j
               for k, i, j in shared.edge_triggers)
        for shared in problem.shared_costs
    ]


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
    # Costs of an edge as seen from each end: rows for its producer, columns for its
    # consumer. A shared read counts as a move per reader (an incumbent only).
    seen_from: dict[int, list] = {}
    for u, v, m in problem.edges + [e for read in problem.reads for e in read.as_edges()]:
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
    problem: AssignmentProblem, time_limit_s: float = 30.0, backend: str = "SCIP",
    incumbent: list[int] | None = None,
) -> Assignment:
    """Solve with an OR-Tools MIP backend (SCIP or CBC) or HiGHS ("HIGHS",
    `highs_mip`), within a time limit, from `incumbent` (by default the greedy answer):
    with a time limit the answer is never worse than it."""
    from ortools.linear_solver import pywraplp

    start = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver("SCIP" if backend == "HIGHS" else backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools has no {backend} backend; use SCIP, CBC or HIGHS")
    hint = solve_greedy(problem) if incumbent is None else incumbent
    original, problem = problem, capped(problem, hint)
    scale = cost_scale(problem)
    x = build_model(solver, problem, scale, integral=True)
    if backend == "HIGHS":
        from planner.search.highs_mip import run_highs

        status, values, bound = run_highs(
            solver, x, hint, max(0.1, time_limit_s - (time.perf_counter() - start)),
            RELATIVE_GAP)
    else:
        status, values, bound = _run_ortools(solver, x, hint, time_limit_s, backend)
    problem = original  # objectives are reported uncapped
    if status == "INFEASIBLE":
        raise InfeasibleError("no sharding fits the per-device memory limit")
    name = "HiGHS" if backend == "HIGHS" else "ILP"
    if status == "NONE":
        if memory_of(problem, hint) > problem.memory_limit:
            raise RuntimeError(
                f"the ILP solver found no solution within {time_limit_s:g} s; raise the time limit"
            )
        # Out of time before a first incumbent: the greedy answer, with an unknown gap.
        return Assignment(hint, evaluate(problem, hint), 1.0, "GREEDY",
                          time.perf_counter() - start, solver=name)
    choices = [int(np.argmax(v)) for v in values]
    objective = evaluate(problem, choices)
    if status != "OPTIMAL":
        # Stopped by the time limit: the solver may not have used the hint as its incumbent.
        greedy = evaluate(problem, hint)
        if greedy < objective and memory_of(problem, hint) <= problem.memory_limit:
            choices, objective = hint, greedy
    bound /= scale
    gap = 0.0 if status == "OPTIMAL" else max(0.0, objective - bound) / max(abs(objective), 1e-12)
    return Assignment(choices, objective, gap, status, time.perf_counter() - start,
                      solver=name)


def _run_ortools(solver, x: list[list], hint: list[int], time_limit_s: float,
                 backend: str) -> tuple[str, list[np.ndarray], float]:
    """Solve the built model with OR-Tools' `backend` from `hint`: the status (OPTIMAL,
    FEASIBLE, INFEASIBLE, or NONE where no solution was found), each node's variables'
    values and the solver's bound, in the model's units."""
    from ortools.linear_solver import pywraplp

    solver.SetTimeLimit(int(time_limit_s * 1000))
    if backend == "SCIP":
        solver.SetSolverSpecificParametersAsString(SCIP_PARAMETERS)
    solver.SetHint(
        [var for vars_v in x for var in vars_v],
        [1.0 if i == hint[v] else 0.0 for v, vars_v in enumerate(x) for i in range(len(vars_v))],
    )
    parameters = pywraplp.MPSolverParameters()
    parameters.SetDoubleParam(parameters.RELATIVE_MIP_GAP, RELATIVE_GAP)
    status = solver.Solve(parameters)
    named = {pywraplp.Solver.OPTIMAL: "OPTIMAL", pywraplp.Solver.FEASIBLE: "FEASIBLE",
             pywraplp.Solver.INFEASIBLE: "INFEASIBLE"}.get(status, "NONE")
    if named not in ("OPTIMAL", "FEASIBLE"):
        return named, [], 0.0
    values = [np.array([var.solution_value() for var in vars_v]) for vars_v in x]
    return named, values, solver.Objective().BestBound()


def build_model(solver, problem: AssignmentProblem, scale: float, integral: bool) -> list[list]:
    """Add the problem's formulation (module docstring) to an OR-Tools `solver`, costs
    multiplied by `scale`, node choices binary or (`integral=False`, the LP relaxation)
    in [0, 1]; its node variables, x[v][i]."""
    # Built with the solver's coefficient API: building an expression object per term is
    # most of the time of a large model's build.
    objective = solver.Objective()
    x = [
        [solver.BoolVar(f"x{v}_{i}") if integral else solver.NumVar(0.0, 1.0, f"x{v}_{i}")
         for i in range(len(costs))]
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
    for n, read in enumerate(problem.reads):
        _add_read(solver, objective, n, x, read, scale)
    for n, shared in enumerate(problem.shared_costs):
        name = shared_variable(n)
        y = solver.BoolVar(name) if integral else solver.NumVar(0.0, 1.0, name)
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
    # A limit no assignment reaches (a caller that checks memory itself passes 2^70 bytes)
    # constrains nothing: its row, in units of the limit, would hold coefficients of 1e-21
    # beside the one-hot rows' 1, which the LP solver warns of ("Constraint matrix has
    # largest absolute value 1 and smallest non-zero absolute value 3.38813e-21").
    most = sum(float(m.max()) for m in problem.node_memory if len(m))
    if math.isfinite(problem.memory_limit) and most > problem.memory_limit:
        # The LP's row in units of the limit: PDLP measures its residuals against the
        # rows' bounds, and one of 2.5e10 bytes beside the one-hot rows' 1 let it call
        # x = 0 optimal at its first iterate (hf llama, 2x2).
        unit = 1.0 if integral or problem.memory_limit <= 0 else problem.memory_limit
        _constraint(solver, -math.inf, problem.memory_limit / unit, [
            (var, float(m) / unit)
            for mem, vars_v in zip(problem.node_memory, x)
            for m, var in zip(mem, vars_v)
            if m != 0
        ])
    objective.SetMinimization()
    return x


def shared_variable(n: int) -> str:
    """The name `build_model` gives shared cost n's variable (paid: 1, or its LP share)."""
    return f"shared{n}"


def capped(problem: AssignmentProblem, incumbent: list[int]) -> AssignmentProblem:
    """The problem with every cost above twice the incumbent's objective lowered to that.

    With no negative cost, an assignment that pays such a cost costs more than the
    incumbent, before and after the cap, so the optimum and the optimal assignments are
    the same. It matters for the numerics: the graph code prices impossible moves at
    1e6 s against plans of a millisecond, and scaling by that largest cost pushed every
    real cost below the LP's tolerances (SoPlex then needs many more iterations). Returned
    unchanged when the incumbent breaks the memory limit (it bounds nothing then) or
    some cost is negative.
    """
    arrays = [*problem.node_costs, *(m for _, _, m in problem.edges),
              *(read.prices for read in problem.reads)]
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
        reads=[replace(read, prices=np.minimum(read.prices, cap)) for read in problem.reads],
    )


def cost_scale(problem: AssignmentProblem) -> float:
    """Factor that brings the median nonzero cost to 1e3: the costs that decide between
    plans are then well above the LP's tolerances, whatever the few largest are (the
    largest are still capped where an incumbent allows, to keep the range sane)."""
    values = np.abs(np.concatenate(
        [np.ravel(c) for c in problem.node_costs] + [np.ravel(m) for _, _, m in problem.edges]
        + [np.ravel(read.prices) for read in problem.reads]
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


def _add_read(solver, objective, n: int, x: list, read: SharedRead, scale: float) -> None:
    """The linearisation of a shared read (module docstring); adds its cost to `objective`.

    Rows: the producer's choices grouped by their prices; columns: the placements some
    choice pays a move to. Each reader's flow goes from the producer's row to the column
    its choice needs, placements no move costs anything to lumped into one free column."""
    rows, row_of = _distinct(read.prices)
    priced = {int(p) for p in np.flatnonzero(read.prices.any(axis=0))}
    move = {(r, int(p)): solver.NumVar(0.0, 1.0, f"m{n}_{r}_{p}")
            for r, i in enumerate(rows) for p in sorted(priced) if read.prices[i, p] != 0}
    for (r, p), var in move.items():
        objective.SetCoefficient(var, float(read.prices[rows[r], p]) * scale)
    xu = x[read.producer]
    for k, (v, needs) in enumerate(read.readers):
        column = [int(p) if int(p) in priced else -1 for p in needs]
        columns = sorted(set(column))
        column_of = [columns.index(c) for c in column]
        flow = [[solver.NumVar(0.0, 1.0, f"f{n}_{k}_{r}_{c}") for c in columns]
                for r in range(len(rows))]
        for r in range(len(rows)):
            _constraint(solver, 0.0, 0.0, [(var, 1.0) for var in flow[r]]
                        + [(xu[i], -1.0) for i in range(len(xu)) if row_of[i] == r])
        for c, p in enumerate(columns):
            _constraint(solver, 0.0, 0.0, [(flow[r][c], 1.0) for r in range(len(rows))]
                        + [(x[v][j], -1.0) for j in range(len(needs)) if column_of[j] == c])
            for r in range(len(rows)):
                if (r, p) in move:
                    _constraint(solver, 0.0, math.inf, [(move[r, p], 1.0), (flow[r][c], -1.0)])


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
