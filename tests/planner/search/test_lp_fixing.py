"""planner.search.lp_fixing: the LP bound holds whatever the duals, every choice it drops
is in no optimum, and the narrowed ILP keeps the brute-force optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from planner.search import lp_fixing
from planner.search.lp_fixing import dual_bound, lp_relaxation, solve_with_fixing
from planner.search.solver import (
    AssignmentProblem, InfeasibleError, evaluate, memory_of, solve_brute_force,
)
from tests.planner.search.test_shared_reads import _with_reads
from tests.planner.search.test_solver import random_problem


def _small_lp(duals: np.ndarray) -> tuple[float, np.ndarray]:
    """min x0 + 2 x1 subject to x0 + x1 = 1 and x0 <= 0.7, 0 <= x <= 1: optimum 1.3 at
    (0.7, 0.3), whose duals are 2 and -1."""
    return dual_bound(np.array([1.0, 2.0]), np.array([0, 0, 1]), np.array([0, 1, 0]),
                      np.array([1.0, 1.0, 1.0]), np.array([1.0, -np.inf]),
                      np.array([1.0, 0.7]), np.zeros(2), np.ones(2), duals)


def test_the_dual_bound_is_the_lp_optimum_at_its_duals_and_below_it_anywhere_else() -> None:
    bound, reduced = _small_lp(np.array([2.0, -1.0]))
    assert bound == pytest.approx(1.3)
    assert reduced == pytest.approx([0.0, 0.0])
    rng = np.random.default_rng(0)
    # Any vector, a wrongly signed dual of the <= row included, bounds the optimum.
    for duals in rng.uniform(-5, 5, size=(200, 2)):
        assert _small_lp(duals)[0] <= 1.3 + 1e-12


def _cheapest_with(problem: AssignmentProblem, v: int, i: int) -> float:
    """The least cost of an assignment within the memory limit where node v takes i."""
    return min((evaluate(problem, list(c)) for c in itertools.product(
        *(range(len(costs)) if w != v else [i] for w, costs in enumerate(problem.node_costs)))
        if memory_of(problem, list(c)) <= problem.memory_limit), default=math.inf)


@pytest.mark.parametrize("seed", range(30))
def test_an_assignment_taking_a_choice_costs_at_least_the_bound_plus_its_reduced_cost(
        seed: int) -> None:
    """What fixing relies on, checked choice by choice against brute force."""
    problem = _with_reads(seed) if seed % 2 else random_problem(seed)
    relaxation = lp_relaxation(problem, 10.0)
    assert relaxation is not None
    tolerance = 1e-6 * max(1.0, abs(relaxation.bound))
    for v, reduced in enumerate(relaxation.reduced_costs):
        for i, r in enumerate(reduced):
            assert _cheapest_with(problem, v, i) >= relaxation.bound + r - tolerance


@pytest.mark.parametrize("seed", range(40))
def test_the_narrowed_ilp_keeps_the_brute_force_optimum(seed: int) -> None:
    problem = _with_reads(seed) if seed % 2 else random_problem(seed, max_nodes=7)
    try:
        best = solve_brute_force(problem).objective
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_with_fixing(problem, smallest=0)
        return
    solved = solve_with_fixing(problem, smallest=0)
    assert solved.status == "OPTIMAL"
    assert solved.objective == pytest.approx(best)
    assert evaluate(problem, solved.choices) == pytest.approx(best)
    assert memory_of(problem, solved.choices) <= problem.memory_limit


def test_a_chain_under_a_memory_limit_of_gigabytes_is_bounded_at_its_optimum() -> None:
    """A chain's LP is integral, so its bound is its optimum and each node's other
    choices all cost more. A limit of 24 GiB beside one-hot rows of 1 once let PDLP call
    x = 0 optimal at its first iterate (bound 0, nothing fixed)."""
    rng = np.random.default_rng(7)
    n, k = 8, 4
    problem = AssignmentProblem(
        [rng.uniform(1, 10, k) for _ in range(n)],
        [rng.uniform(1e6, 1e8, k) for _ in range(n)],
        [(v, v + 1, rng.uniform(0, 10, (k, k))) for v in range(n - 1)],
        memory_limit=24 * 2.0**30)
    best = solve_brute_force(problem)
    relaxation = lp_relaxation(problem, 10.0)
    assert relaxation.bound == pytest.approx(best.objective, rel=1e-6)
    for v, reduced in enumerate(relaxation.reduced_costs):
        near = np.flatnonzero(reduced <= 1e-6 * best.objective)
        assert best.choices[v] in near


def test_a_memory_limit_no_assignment_reaches_adds_no_row_and_no_solver_warning(capfd) -> None:
    """A caller that checks memory itself passes a limit of 2^70 bytes: in units of the
    limit its row held coefficients of 1e-21, and PDLP warned ("Constraint matrix has
    largest absolute value 1 and smallest non-zero absolute value 3.38813e-21"). The row
    constrains nothing, so it is left out: the same bound, no warning; a limit that binds
    keeps its row and moves the bound."""
    from planner.search.lp_fixing import lp_relaxation

    rng = np.random.default_rng(0)
    n = 50
    costs = [rng.random(4) for _ in range(n)]
    memory = [np.array([4.0, 8.0, 1e6, 2e9]) for _ in range(n)]
    edges = [(v, v + 1, rng.random((4, 4))) for v in range(n - 1)]
    unbounded = AssignmentProblem(costs, memory, edges, memory_limit=2.0 ** 70)
    bound = lp_relaxation(unbounded, 10).bound
    assert "WARNING" not in capfd.readouterr().err
    assert bound == pytest.approx(lp_relaxation(
        AssignmentProblem(costs, memory, edges), 10).bound, rel=1e-6)
    # Room for the two smallest choices only (8 B a node): the others are out of reach.
    binding = AssignmentProblem(costs, memory, edges, memory_limit=8.0 * n)
    assert lp_relaxation(binding, 10).bound > bound + 1e-3


def test_a_solve_stopped_short_reports_its_gap_against_the_lp_bound() -> None:
    """The narrowed ILP stopped in its root reports its own bound near 0 (a gap of 99.6%
    on the 2x4 T5 of benchmarks/vs_autoparallel.py, seed 0); the LP relaxation's bound
    holds for every assignment, so the gap reported is the smaller of the two."""
    from planner.search.lp_fixing import _proven_gap
    from planner.search.solver import Assignment

    problem = random_problem(3)
    choices = [0] * len(problem.node_costs)
    objective = evaluate(problem, choices)
    stopped = Assignment(choices, objective, 0.996, "FEASIBLE", 60.0)
    assert _proven_gap(stopped, problem, choices, 0.998 * objective) == pytest.approx(0.002)
    # The solver's own gap where it is the smaller, and an optimum's as it is.
    assert _proven_gap(stopped, problem, choices, 0.0) == 0.996
    optimal = Assignment(choices, objective, 0.0, "OPTIMAL", 1.0)
    assert _proven_gap(optimal, problem, choices, 0.5 * objective) == 0.0


def test_the_familys_largest_model_plans_without_a_solver_warning(capfd) -> None:
    """Seed 1's 2x2 MoE of depth 3 in benchmarks/model_family.py (461k ILP variables, the
    largest of seeds 0 and 1), planned as `plan --mesh 2x2` plans it: PDLP, SCIP and HiGHS
    print nothing, a warning of badly scaled rows least of all. Under a short limit (the
    whole solve takes about 40 s): the warnings come from the models' build and the
    solvers' start, which it runs through."""
    import re

    from benchmarks.model_family import build, draw_family
    from planner.api import plan_model

    spec = next(s for s in draw_family(1, 12) if s.name == "moe-w96-d3-split-hand-b4s128@2x2")
    model, example = build(spec)
    planned = plan_model(model, (example,), spec.mesh, "cpu", time_limit_s=10.0)
    assert planned.plan.operators.solver.num_variables > 400_000
    printed = capfd.readouterr()
    assert not re.search(r"warning|^W\d{4} ", printed.out + printed.err,
                         re.IGNORECASE | re.MULTILINE)


@pytest.mark.parametrize("seed", range(20))
def test_split_on_its_shared_costs_the_ilp_keeps_the_brute_force_optimum(
    seed: int, monkeypatch
) -> None:
    monkeypatch.setattr(lp_fixing, "SPLIT_GAP", -1.0)  # split whatever the LP's gap
    problem = _with_reads(seed) if seed % 2 else random_problem(seed, max_nodes=7)
    try:
        best = solve_brute_force(problem).objective
    except InfeasibleError:
        return
    solved = solve_with_fixing(problem, smallest=0)
    assert solved.status == "OPTIMAL"
    assert evaluate(problem, solved.choices) == pytest.approx(best)
    assert memory_of(problem, solved.choices) <= problem.memory_limit
