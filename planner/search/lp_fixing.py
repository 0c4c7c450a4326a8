"""The exact intra-op ILP, narrowed first by its LP relaxation (reduced-cost fixing).

Most of a large solve is the simplex at SCIP's root, and most choices are out of reach of
any optimum. So, before `solver.solve_ilp`:

1. PDLP, a first-order primal-dual LP method (Applegate et al., "Practical Large-Scale
   Linear Programming using Primal-Dual Hybrid Gradient", NeurIPS 2021; in OR-Tools),
   solves the LP relaxation of the same formulation (`solver.build_model`), on large
   problems several times faster than a simplex (SoPlex's or GLOP's).
2. A lower bound from its duals, computed here (`dual_bound`) rather than read from the
   solver, so that it holds whatever PDLP's accuracy: for min c.x subject to
   lo <= Ax <= hi and l <= x <= u, any y signed as the rows allow gives
   c.x = y.Ax + r.x >= sum of y_i lo_i (y_i > 0) or y_i hi_i (y_i < 0) + sum of
   min(r_j l_j, r_j u_j), with r = c - A^T y (weak LP duality).
3. An incumbent: the ILP restricted to the choices the LP solution takes or prices within
   `SUPPORT` of the bound (RENS: Berthold, "RENS: the optimal rounding", Math. Prog.
   Comp. 6, 2014), or the greedy answer where that is cheaper.
4. An assignment that takes choice j costs at least bound + r_j, so where that exceeds
   the incumbent no optimum takes j and it is dropped (reduced-cost fixing: Nemhauser &
   Wolsey, Integer and Combinatorial Optimization, 1988; SCIP applies it inside its
   search, Achterberg, Constraint Integer Programming, 2007).

The exact ILP (SCIP's, HiGHS's from `HIGHS_FROM` variables) then solves what is left from
the incumbent, and its optimum is the problem's; where the incumbent is already within the
solver's gap of the bound, it is the answer. Where the LP solution pays for the shared costs
the incumbent triggers `SPLIT_GAP` of its objective less than it does (a bucket's latency
paid in part by a fractional solution), the problem is split on which of them are paid
(`bucket_split`), and steps 1-4 run on each part whose bound can still beat the best
assignment found. What fixing keeps and saves on benchmarks/vs_autoparallel.py's family:
docs/graph-plans.md, "Measured".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from planner.search import bucket_split
from planner.search.elimination import ilp_variables
from planner.search.forked_call import BothEnds, start_forked
from planner.search.presolve import restrict
from planner.search.solver import (
    RELATIVE_GAP, Assignment, AssignmentProblem, InfeasibleError, build_model, capped,
    cost_scale, evaluate, memory_of, shared_variable, solve_greedy, solve_ilp, triggered,
)

SUPPORT = 1e-4
"""RENS's neighbourhood: besides the choices the LP solution takes, those whose reduced
cost is within this fraction of the bound. PDLP's solution is approximate, and a choice
of an optimal LP face can sit at 0 in it, and without the margin RENS can miss the optimum
and hand the ILP a worse incumbent."""

TAKEN = 1e-3
"""An LP value above which a choice counts as taken."""

LP_SHARE = 0.25
"""Most of the time limit the LP relaxation, then RENS, may each take."""

HIGHS_FROM = 50_000
"""ILP variables from which the exact ILP is HiGHS's (`highs_mip`) rather than SCIP's: the
root LP is then most of a solve, and HiGHS's dual simplex the faster (docs/graph-plans.md,
"Measured")."""

SPLIT_GAP = 0.01
"""How much less than the incumbent (RENS's) the LP solution may pay for the shared costs
the incumbent triggers, as a fraction of its objective, before the problem is split on them
(`bucket_split`) rather than narrowed whole. The 2x4 ViT of benchmarks/vs_autoparallel.py's
seed 1 (3.8%: it pays 0.43, 0.14 and 0.43 of three buckets) solves in 30 s split, 98 s
whole. Under it: seed 0's 2x4 T5 (0.14%; split, its eight parts' LPs took 98 s on one core
and its parts' ILPs 20-43 s each, where the whole takes 120 s), and, at 0%, seed 7's 2x4 ViT
under AutoParallel's memory cap, whose 4.4% gap is the cap's (split 191 s, whole 47 s;
docs/graph-plans.md, "Measured")."""

SPLIT_SHARED_COSTS = 3
"""Most shared costs the problem is split on (2^k LP relaxations): one per mesh axis and one
over both, on a 2-D mesh."""

SMALLEST = 20_000
"""ILP variables (`elimination.ilp_variables`) below which the ILP is solved as it is:
SCIP's simplex is then as quick as PDLP and RENS, and the extra model builds cost more
than fixing saves (where the two cross: docs/graph-plans.md, "Measured")."""


@dataclass(frozen=True)
class LpRelaxation:
    """What the LP relaxation says about each node's choices, in the problem's units."""

    bound: float
    """A lower bound on every assignment's cost."""
    reduced_costs: list[np.ndarray]
    """reduced_costs[v][i]: an assignment where node v takes i costs at least bound + it."""
    values: list[np.ndarray]
    """values[v][i]: the LP solution's x_{v,i}."""
    shared: np.ndarray
    """shared[n]: the LP solution's share of shared cost n paid (1 in any assignment that
    triggers it)."""


def dual_bound(objective: np.ndarray, rows: np.ndarray, columns: np.ndarray,
               coefficients: np.ndarray, row_low: np.ndarray, row_high: np.ndarray,
               low: np.ndarray, high: np.ndarray,
               duals: np.ndarray) -> tuple[float, np.ndarray]:
    """The lower bound weak LP duality gives from `duals` on min objective.x subject to
    row_low <= Ax <= row_high, low <= x <= high (A's nonzeros as rows, columns,
    coefficients; every variable bounded), and the reduced costs. A dual of the wrong
    sign for a row that is infinite on that side counts as 0, so any vector is valid."""
    y = np.where((duals > 0) & np.isneginf(row_low), 0.0, duals)
    y = np.where((y < 0) & np.isposinf(row_high), 0.0, y)
    reduced = objective - np.bincount(columns, weights=coefficients * y[rows],
                                      minlength=len(objective))
    # The side of each row its dual prices (none where the dual is 0: an infinite side).
    side = np.where(y > 0, row_low, np.where(y < 0, row_high, 0.0))
    from_bounds = np.where(reduced > 0, reduced * low, reduced * high)
    return float((y * side).sum() + from_bounds.sum()), reduced


def lp_relaxation(problem: AssignmentProblem, time_limit_s: float) -> LpRelaxation | None:
    """The LP relaxation by PDLP, or None where it found no solution in time."""
    from ortools.linear_solver import linear_solver_pb2, pywraplp

    solver = pywraplp.Solver.CreateSolver("PDLP")
    if solver is None:
        return None
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    scale = cost_scale(problem)
    x = build_model(solver, problem, scale, integral=False)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    model = linear_solver_pb2.MPModelProto()
    solver.ExportModelToProto(model)
    lengths = [len(c.var_index) for c in model.constraint]
    columns = np.fromiter((j for c in model.constraint for j in c.var_index), dtype=np.int64)
    coefficients = np.fromiter((a for c in model.constraint for a in c.coefficient),
                               dtype=float)
    bound, reduced = dual_bound(
        np.array([v.objective_coefficient for v in model.variable]),
        np.repeat(np.arange(len(lengths)), lengths), columns, coefficients,
        np.array([c.lower_bound for c in model.constraint]),
        np.array([c.upper_bound for c in model.constraint]),
        np.array([v.lower_bound for v in model.variable]),
        np.array([v.upper_bound for v in model.variable]),
        np.array([c.dual_value() for c in solver.constraints()]))
    return LpRelaxation(
        (bound + model.objective_offset) / scale,
        [np.array([reduced[var.index()] for var in vars_v]) / scale for vars_v in x],
        [np.array([var.solution_value() for var in vars_v]) for vars_v in x],
        np.array([solver.LookupVariable(shared_variable(n)).solution_value()
                  for n in range(len(problem.shared_costs))]))


def solve_with_fixing(problem: AssignmentProblem, time_limit_s: float = 30.0,
                      backend: str = "SCIP", smallest: int = SMALLEST) -> Assignment:
    """The exact ILP (`solver.solve_ilp`, same answer and statuses) on the choices the
    LP relaxation leaves (module docstring); as it is below `smallest` ILP variables."""
    if ilp_variables(problem) < smallest:
        return solve_ilp(problem, time_limit_s, backend)
    start = time.perf_counter()
    deadline = start + time_limit_s
    greedy = solve_greedy(problem)
    relaxation = lp_relaxation(capped(problem, greedy), time_limit_s * LP_SHARE)
    incumbent = _rens(problem, relaxation, greedy, deadline, backend)
    if incumbent is None:
        return _exact(problem, _left(deadline), backend, greedy)
    if (0 < len(problem.shared_costs) <= SPLIT_SHARED_COSTS
            and _underpaid(problem, relaxation, incumbent)
            > SPLIT_GAP * abs(evaluate(problem, incumbent))):
        solved = _split(problem, incumbent, deadline, backend)
    else:
        solved = _fixed(problem, relaxation, incumbent, math.inf, deadline, backend)
    return replace(solved, solve_time_s=time.perf_counter() - start)


def _underpaid(problem: AssignmentProblem, relaxation: LpRelaxation,
               incumbent: list[int]) -> float:
    """How much less than `incumbent` the LP solution pays for the shared costs the
    incumbent triggers."""
    return sum(shared.cost * (1.0 - paid) for shared, paid, hit in zip(
        problem.shared_costs, relaxation.shared, triggered(problem, incumbent)) if hit)


def _rens(problem: AssignmentProblem, relaxation: LpRelaxation | None, greedy: list[int],
          deadline: float, backend: str) -> list[int] | None:
    """The better of `greedy` (where it fits the memory limit) and the optimum of the
    choices the LP solution takes or prices near its bound (RENS); None if neither, or
    where the LP found no bound (nothing to narrow by)."""
    if relaxation is None or not math.isfinite(relaxation.bound):
        return None
    incumbent = greedy if memory_of(problem, greedy) <= problem.memory_limit else None
    near = SUPPORT * abs(relaxation.bound)
    support = [_with(np.flatnonzero((x > TAKEN) | (r <= near)), i)
               for x, r, i in zip(relaxation.values, relaxation.reduced_costs, greedy)]
    try:
        rens = solve_ilp(restrict(problem, support), _left(deadline) * LP_SHARE,
                         backend, incumbent=_within(support, greedy))
        found = [int(support[v][i]) for v, i in enumerate(rens.choices)]
        if incumbent is None or evaluate(problem, found) < evaluate(problem, incumbent):
            incumbent = found
    except (InfeasibleError, RuntimeError):  # nothing within the support, or not in time
        pass
    return incumbent


def _fixed(problem: AssignmentProblem, relaxation: LpRelaxation, incumbent: list[int],
           ceiling: float, deadline: float, backend: str) -> Assignment:
    """The exact ILP on the choices whose reduced costs leave them under the better of
    `incumbent`'s objective and `ceiling` (an objective known elsewhere to be reached)."""
    start = time.perf_counter()
    objective = evaluate(problem, incumbent)
    ceiling = min(ceiling, objective)
    if ceiling - relaxation.bound <= RELATIVE_GAP * abs(ceiling):  # proven by the bound
        return Assignment(incumbent, objective, 0.0, "OPTIMAL", time.perf_counter() - start)
    slack = ceiling - relaxation.bound + 1e-9 * abs(ceiling)
    kept = [_with(np.flatnonzero(r <= slack), i)
            for r, i in zip(relaxation.reduced_costs, incumbent)]
    solved = _exact(restrict(problem, kept), _left(deadline), backend,
                    _within(kept, incumbent))
    choices = [int(kept[v][i]) for v, i in enumerate(solved.choices)]
    return Assignment(choices, solved.objective, _proven_gap(solved, problem, choices,
                                                             relaxation.bound),
                      solved.status, time.perf_counter() - start, solved.solver)


def _split(problem: AssignmentProblem, incumbent: list[int], deadline: float,
           backend: str) -> Assignment:
    """The optimum over the subproblems with the shared costs decided (`bucket_split`):
    each one's LP relaxation first, then, cheapest bound first, the narrowed ILP of those
    whose bound and up-front costs stay under the best objective found so far."""
    start = time.perf_counter()
    best, ceiling, found_by = incumbent, evaluate(problem, incumbent), "ILP"
    paid_sets = bucket_split.paid_sets(problem)
    decided = [bucket_split.decided(problem, paid, penalty=ceiling) for paid in paid_sets]
    greedy = [solve_greedy(part) for part in decided]
    relaxations = _relaxations([capped(p, g) for p, g in zip(decided, greedy)], deadline)
    upfront = [bucket_split.upfront(problem, paid) for paid in paid_sets]
    floors = [u + (-math.inf if r is None else r.bound) for u, r in zip(upfront, relaxations)]
    unproven = []  # lower bounds of the parts not solved to optimality
    for n in sorted(range(len(paid_sets)), key=floors.__getitem__):
        if floors[n] >= ceiling - RELATIVE_GAP * abs(ceiling):
            break  # this part and every later one cost at least the best found
        part, relaxation = decided[n], relaxations[n]
        try:
            own = _rens(part, relaxation, greedy[n], deadline, backend)
            solved = (_exact(part, _left(deadline), backend, greedy[n]) if own is None else
                      _fixed(part, relaxation, own, ceiling - upfront[n], deadline, backend))
        except InfeasibleError:  # no assignment of this part fits the memory limit
            continue
        total = evaluate(problem, solved.choices)
        if total < ceiling:
            best, ceiling, found_by = solved.choices, total, solved.solver
        if solved.status != "OPTIMAL":
            unproven.append(max(floors[n], upfront[n] + solved.objective * (1 - solved.gap)))
    bound = min([ceiling, *unproven])
    gap = 0.0 if ceiling <= 0 else max(0.0, (ceiling - bound) / ceiling)
    return Assignment(best, ceiling, gap, "OPTIMAL" if gap <= RELATIVE_GAP else "FEASIBLE",
                      time.perf_counter() - start, found_by)


def _relaxations(problems: list[AssignmentProblem],
                 deadline: float) -> list[LpRelaxation | None]:
    """Each problem's LP relaxation, on both cores: a forked child takes problems from the
    back of the list while this process takes them from the front."""
    ends = BothEnds(len(problems))

    def solve_from(next_index: Callable[[], int | None]) -> dict[int, LpRelaxation | None]:
        solved = {}
        while (i := next_index()) is not None:
            solved[i] = lp_relaxation(problems[i], _left(deadline) * LP_SHARE)
        return solved

    from_back = start_forked(solve_from, ends.back)
    solved = solve_from(ends.front)
    solved.update(from_back())
    return [solved[i] for i in range(len(problems))]


def _exact(problem: AssignmentProblem, time_limit_s: float, backend: str,
           incumbent: list[int]) -> Assignment:
    """The exact ILP from `incumbent`: SCIP's (or `backend`'s), HiGHS's where SCIP is asked
    for and the ILP has `HIGHS_FROM` variables or more."""
    large = backend == "SCIP" and ilp_variables(problem) >= HIGHS_FROM
    return solve_ilp(problem, time_limit_s, "HIGHS" if large else backend, incumbent=incumbent)


def _proven_gap(solved: Assignment, problem: AssignmentProblem, choices: list[int],
                bound: float) -> float:
    """The gap of a solve of the narrowed problem that stopped short of its optimum,
    against the better of its own bound and the LP relaxation's of the whole problem
    (a bound on every assignment, kept choices or not): a restricted ILP stopped in its
    root reports a bound near 0, and a gap near 100%, where the LP's proves 0.2%."""
    if solved.status == "OPTIMAL":
        return solved.gap
    objective = evaluate(problem, choices)
    if objective <= 0 or not math.isfinite(bound):
        return solved.gap
    return min(solved.gap, max(0.0, (objective - bound) / objective))


def _with(choices: np.ndarray, choice: int) -> np.ndarray:
    """`choices` (sorted) with `choice` among them."""
    return np.union1d(choices, [choice]).astype(np.int64)


def _within(kept: list[np.ndarray], choices: list[int]) -> list[int]:
    """`choices` as indices into `kept` (each must be there)."""
    return [int(np.searchsorted(k, i)) for k, i in zip(kept, choices)]


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.perf_counter())
