"""planner.search.highs_mip: HiGHS solves the same formulation to the brute-force optimum,
keeps the memory limit, starts from the incumbent it is handed, and large narrowed ILPs
go to it."""

from __future__ import annotations

import pytest

import planner.search.lp_fixing as lp_fixing
from planner.search.solver import (
    InfeasibleError, evaluate, memory_of, solve_brute_force, solve_greedy, solve_ilp,
)
from tests.planner.search.test_shared_reads import _with_reads
from tests.planner.search.test_solver import random_problem


@pytest.mark.parametrize("seed", range(30))
def test_highs_finds_the_brute_force_optimum(seed: int) -> None:
    """Node and edge costs, gradient buckets (shared costs), shared reads and a memory
    limit: the optimum, within the limit, or InfeasibleError where none fits."""
    problem = _with_reads(seed) if seed % 2 else random_problem(seed, max_nodes=7)
    try:
        best = solve_brute_force(problem).objective
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_ilp(problem, 10.0, "HIGHS")
        return
    solved = solve_ilp(problem, 10.0, "HIGHS")
    assert (solved.status, solved.solver, solved.gap) == ("OPTIMAL", "HiGHS", 0.0)
    assert solved.objective == pytest.approx(best)
    assert evaluate(problem, solved.choices) == pytest.approx(best)
    assert memory_of(problem, solved.choices) <= problem.memory_limit


def test_out_of_time_highs_keeps_the_incumbent_it_was_handed() -> None:
    """With no time to search, the answer is the incumbent (HiGHS checks it feasible and
    keeps it), never worse."""
    problem = random_problem(5, min_nodes=6, max_nodes=6)
    incumbent = solve_greedy(problem)
    solved = solve_ilp(problem, 0.0, "HIGHS", incumbent)
    assert solved.objective <= evaluate(problem, incumbent) + 1e-12


def test_narrowed_ilps_from_highs_from_variables_go_to_highs(monkeypatch) -> None:
    """`lp_fixing` hands SCIP's small ILPs to SCIP and its large ones to HiGHS."""
    problem = random_problem(7, min_nodes=5, max_nodes=5)
    best = solve_brute_force(problem).objective
    monkeypatch.setattr(lp_fixing, "HIGHS_FROM", 0)
    solved = lp_fixing.solve_with_fixing(problem, smallest=0)
    assert solved.objective == pytest.approx(best)
    assert solved.solver in ("HiGHS", "ILP")  # HiGHS, unless the LP bound proved it
    monkeypatch.setattr(lp_fixing, "HIGHS_FROM", 10**9)
    assert lp_fixing._exact(problem, 10.0, "SCIP", solve_greedy(problem)).solver == "ILP"
    monkeypatch.setattr(lp_fixing, "HIGHS_FROM", 0)
    assert lp_fixing._exact(problem, 10.0, "SCIP", solve_greedy(problem)).solver == "HiGHS"
    # CBC asked for is CBC's, whatever the size.
    assert lp_fixing._exact(problem, 10.0, "CBC", solve_greedy(problem)).solver == "ILP"
