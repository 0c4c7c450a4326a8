"""The assignment ILP (`solver.build_model`'s formulation) solved by HiGHS's MIP solver.

HiGHS (Huangfu and Hall, "Parallelizing the dual revised simplex method", Math. Prog.
Comp. 10, 2018; its branch and cut: highs.dev) is used for the large ILPs that
reduced-cost fixing leaves (`lp_fixing`): there the root LP is most of a solve, and
HiGHS's dual simplex solves it several times faster than SoPlex does inside SCIP; its
restarts then apply reduced-cost fixing again each time cuts raise the bound (the
measurements: docs/graph-plans.md, "Measured").

The model is built once with OR-Tools' coefficient API (`build_model`, the formulation
every backend shares) and handed to HiGHS as arrays.
"""

from __future__ import annotations

import time

import numpy as np

from planner.search.solver import (
    RELATIVE_GAP, Assignment, AssignmentProblem, InfeasibleError, build_model, capped,
    cost_scale, evaluate, memory_of, solve_greedy,
)


HIGHS_OPTIONS: dict[str, object] = {"output_flag": False, "mip_rel_gap": RELATIVE_GAP,
                                    "threads": 1}
"""HiGHS's settings: quiet, the same optimality gap as SCIP's (`solver.RELATIVE_GAP`), and
one thread: its MIP search runs one worker anyway, and a thread pool started in a process
that then forks (the layer table's workers, `workers`) would be missing in the children."""


def solve_highs(problem: AssignmentProblem, time_limit_s: float,
                incumbent: list[int] | None = None) -> Assignment:
    """The optimal assignment by HiGHS, from `incumbent` (by default the greedy answer),
    with `solver.solve_ilp`'s statuses: OPTIMAL, FEASIBLE (out of time, with the gap to
    HiGHS's bound) or GREEDY (out of time before a solution; the incumbent)."""
    import highspy
    from ortools.linear_solver import linear_solver_pb2, pywraplp

    start = time.perf_counter()
    hint = solve_greedy(problem) if incumbent is None else incumbent
    original, problem = problem, capped(problem, hint)
    scale = cost_scale(problem)
    builder = pywraplp.Solver.CreateSolver("SCIP")
    x = build_model(builder, problem, scale, integral=True)
    model = linear_solver_pb2.MPModelProto()
    builder.ExportModelToProto(model)
    highs = highspy.Highs()
    for option, value in HIGHS_OPTIONS.items():
        highs.setOptionValue(option, value)
    highs.setOptionValue("time_limit", max(0.1, time_limit_s - (time.perf_counter() - start)))
    highs.passModel(_as_highs_lp(model, highspy))
    chosen = np.array([vars_v[hint[v]].index() for v, vars_v in enumerate(x)], dtype=np.int32)
    highs.setSolution(len(chosen), chosen, np.ones(len(chosen)))
    highs.run()
    problem = original  # objectives are reported uncapped
    status = highs.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        raise InfeasibleError("no sharding fits the per-device memory limit")
    info = highs.getInfo()
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        if memory_of(problem, hint) > problem.memory_limit:
            raise RuntimeError(
                f"the ILP solver found no solution within {time_limit_s:g} s; raise the time limit"
            )
        return Assignment(hint, evaluate(problem, hint), 1.0, "GREEDY",
                          time.perf_counter() - start, solver="HiGHS")
    values = np.asarray(highs.getSolution().col_value)
    choices = [int(np.argmax(values[[var.index() for var in vars_v]])) for vars_v in x]
    objective = evaluate(problem, choices)
    optimal = status == highspy.HighsModelStatus.kOptimal
    bound = info.mip_dual_bound / scale
    gap = 0.0 if optimal else max(0.0, objective - bound) / max(abs(objective), 1e-12)
    return Assignment(choices, objective, gap, "OPTIMAL" if optimal else "FEASIBLE",
                      time.perf_counter() - start, solver="HiGHS")


def _as_highs_lp(model, highspy):
    """An OR-Tools MPModelProto as a HiGHS model (rows as a row-wise sparse matrix)."""
    lp = highspy.HighsLp()
    variables, constraints = model.variable, model.constraint
    lp.num_col_, lp.num_row_ = len(variables), len(constraints)
    lp.col_cost_ = np.array([v.objective_coefficient for v in variables])
    lp.col_lower_ = np.array([v.lower_bound for v in variables])
    lp.col_upper_ = np.array([v.upper_bound for v in variables])
    lp.row_lower_ = np.array([max(c.lower_bound, -highspy.kHighsInf) for c in constraints])
    lp.row_upper_ = np.array([min(c.upper_bound, highspy.kHighsInf) for c in constraints])
    lengths = [len(c.var_index) for c in constraints]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = np.fromiter((j for c in constraints for j in c.var_index),
                                      dtype=np.int32)
    lp.a_matrix_.value_ = np.fromiter((a for c in constraints for a in c.coefficient),
                                      dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger if v.is_integer
                       else highspy.HighsVarType.kContinuous for v in variables]
    lp.offset_ = model.objective_offset
    return lp
