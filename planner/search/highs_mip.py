"""The assignment ILP (`solver.build_model`'s formulation) solved by HiGHS's MIP solver.

HiGHS (Huangfu and Hall, "Parallelizing the dual revised simplex method", Math. Prog.
Comp. 10, 2018; its branch and cut: highs.dev) is used for the large ILPs that
reduced-cost fixing leaves (`lp_fixing`): there the root LP is most of a solve, and
HiGHS's dual simplex solves it several times faster than SoPlex does inside SCIP; its
restarts then apply reduced-cost fixing again each time cuts raise the bound (the
measurements: docs/graph-plans.md, "Measured").

`solver.solve_ilp(..., backend="HIGHS")` builds the model once with OR-Tools'
coefficient API (the formulation every backend shares) and hands it here, as arrays.
"""

from __future__ import annotations

import numpy as np

HIGHS_OPTIONS: dict[str, object] = {"output_flag": False, "threads": 1}
"""HiGHS's settings (the optimality gap is the caller's, `solver.RELATIVE_GAP`): quiet, and
one thread: its MIP search runs one worker anyway, and a thread pool started in a process
that then forks (the layer table's workers, `workers`) would be missing in the children."""


def run_highs(builder, x: list[list], hint: list[int], time_limit_s: float,
              relative_gap: float) -> tuple[str, list[np.ndarray], float]:
    """Solve the model built in the OR-Tools solver `builder` (node variables `x`) with
    HiGHS from `hint`: `solver._run_ortools`'s status, values and bound."""
    import highspy
    from ortools.linear_solver import linear_solver_pb2

    model = linear_solver_pb2.MPModelProto()
    builder.ExportModelToProto(model)
    highs = highspy.Highs()
    for option, value in HIGHS_OPTIONS.items():
        highs.setOptionValue(option, value)
    highs.setOptionValue("time_limit", float(time_limit_s))
    highs.setOptionValue("mip_rel_gap", relative_gap)
    highs.passModel(_as_highs_lp(model, highspy))
    chosen = np.array([vars_v[hint[v]].index() for v, vars_v in enumerate(x)], dtype=np.int32)
    highs.setSolution(len(chosen), chosen, np.ones(len(chosen)))
    highs.run()
    if highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return "INFEASIBLE", [], 0.0
    info = highs.getInfo()
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return "NONE", [], 0.0
    columns = np.asarray(highs.getSolution().col_value)
    values = [columns[[var.index() for var in vars_v]] for vars_v in x]
    optimal = highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return "OPTIMAL" if optimal else "FEASIBLE", values, info.mip_dual_bound


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
