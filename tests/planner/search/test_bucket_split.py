"""planner.search.bucket_split: the problem's optimum is the least, over the sets of shared
costs paid up front, of what is paid plus the optimum of the problem with them decided."""

from __future__ import annotations

import pytest

from planner.search.bucket_split import decided, paid_sets, upfront
from planner.search.solver import (
    AssignmentProblem, InfeasibleError, SharedCost, evaluate, solve_brute_force,
)
from tests.planner.search.test_solver import random_problem


def _with_shared_costs(seed: int) -> AssignmentProblem:
    """The first of the random problems from `seed` on that has shared costs."""
    while not (problem := random_problem(seed, max_nodes=6)).shared_costs:
        seed += 1000
    return problem


@pytest.mark.parametrize("seed", range(30))
def test_the_least_over_the_paid_sets_is_the_brute_force_optimum(seed: int) -> None:
    problem = _with_shared_costs(seed)
    try:
        best = solve_brute_force(problem)
    except InfeasibleError:
        return
    # Any assignment's objective will do as the penalty; the optimum's is the tightest.
    penalty = best.objective
    parts = []
    for paid in paid_sets(problem):
        try:
            parts.append(upfront(problem, paid)
                         + solve_brute_force(decided(problem, paid, penalty)).objective)
        except InfeasibleError:
            continue
    assert min(parts) == pytest.approx(best.objective)


def test_a_set_pays_its_shared_costs_up_front_and_prices_the_others_triggers() -> None:
    problem = _with_shared_costs(0)
    problem.shared_costs = [SharedCost(3.0, [(0, 0)]), SharedCost(5.0, [(1, 0)])]
    assert len(paid_sets(problem)) == 4
    assert upfront(problem, (True, False)) == 3.0
    part = decided(problem, (True, False), penalty=100.0)
    assert part.shared_costs == []
    assert part.node_costs[0][0] == problem.node_costs[0][0]
    assert part.node_costs[1][0] == problem.node_costs[1][0] + 100.0
    # Both triggered: the first paid up front, the second's 5 replaced by its penalty.
    choices = [0] * len(problem.node_costs)
    assert evaluate(part, choices) + 3.0 == pytest.approx(evaluate(problem, choices) - 5.0 + 100.0)
