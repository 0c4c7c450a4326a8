"""Polishing the ILP's pairwise optimum where readers share a move: checked against brute
force on small problems."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.search.polish import SharedRead, polish, run_cost
from planner.search.solver import AssignmentProblem, SharedCost, evaluate, solve_brute_force


def _two_readers() -> tuple[AssignmentProblem, list[SharedRead]]:
    """A producer (one choice) whose value two consumers read. Either consumer can read
    it at placement A (a move of 3, no compute) or B (no move, 2 of compute): alone, B is
    cheaper (2 < 3); together, one move to A serves both (3 < 4)."""
    move_to = np.array([[3.0, 0.0]])  # producer choice 0 -> consumer choice A (0), B (1)
    problem = AssignmentProblem(
        node_costs=[np.array([0.0]), np.array([0.0, 2.0]), np.array([0.0, 2.0])],
        node_memory=[np.zeros(1), np.zeros(2), np.zeros(2)],
        edges=[(0, 1, move_to), (0, 2, move_to)])
    needs = np.array([7, 8])  # placement ids: A, B
    return problem, [SharedRead((0, 1), (needs, needs))]


def _run_cost_by_hand(problem: AssignmentProblem, reads: list[SharedRead],
                      choices: list[int]) -> float:
    """Every edge's move, less the repeats of a (value, placement) already paid."""
    cost = evaluate(problem, choices)
    for read in reads:
        seen = set()
        for k, needs in zip(read.edges, read.destinations):
            u, v, matrix = problem.edges[k]
            placement = int(needs[choices[v]])
            if placement in seen:
                cost -= float(matrix[choices[u], choices[v]])
            seen.add(placement)
    return cost


def test_readers_that_would_each_pay_a_move_share_one() -> None:
    problem, reads = _two_readers()
    pairwise = solve_brute_force(problem).choices
    assert pairwise == [0, 1, 1] and run_cost(problem, reads, pairwise) == 4.0
    polished = polish(problem, reads, pairwise, [[0], [1], [2]])
    assert polished == [0, 0, 0] and run_cost(problem, reads, polished) == 3.0


def test_a_tied_group_moves_as_one_and_the_memory_limit_holds() -> None:
    problem, reads = _two_readers()
    problem.node_memory = [np.zeros(1), np.array([0.0, 0.0]), np.array([5.0, 0.0])]
    problem.memory_limit = 4.0  # consumer 2 cannot take A
    assert polish(problem, reads, [0, 1, 1], [[0], [1, 2]]) == [0, 1, 1]


def _random(seed: int) -> tuple[AssignmentProblem, list[SharedRead]]:
    rng = np.random.default_rng(seed)
    sizes = [1 + int(rng.integers(3)) for _ in range(5)]
    edges, reads = [], []
    for u in range(2):  # two values, each read by the three later nodes
        read_edges, needs = [], []
        for v in range(2, 5):
            placements = rng.integers(0, 2, sizes[v])
            matrix = rng.uniform(0, 3, (sizes[u], 2))[:, placements]
            read_edges.append(len(edges))
            needs.append(placements)
            edges.append((u, v, matrix))
        reads.append(SharedRead(tuple(read_edges), tuple(needs)))
    memory = [rng.uniform(0, 2, n) for n in sizes]
    problem = AssignmentProblem([rng.uniform(0, 2, n) for n in sizes], memory, edges,
                                memory_limit=float(sum(m.max() for m in memory)) * 0.8,
                                shared_costs=[SharedCost(0.5, node_triggers=[(0, 0)])])
    return problem, reads


@pytest.mark.parametrize("seed", range(30))
def test_polish_is_never_worse_and_prices_the_run_as_it_runs(seed: int) -> None:
    problem, reads = _random(seed)
    try:
        start = solve_brute_force(problem).choices
    except Exception:  # noqa: BLE001 - an infeasible draw has nothing to polish
        pytest.skip("no assignment fits this draw's memory limit")
    polished = polish(problem, reads, start, [[v] for v in range(5)])
    assert run_cost(problem, reads, polished) <= run_cost(problem, reads, start) + 1e-12
    assert sum(m[i] for m, i in zip(problem.node_memory, polished)) <= problem.memory_limit
    for choices in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        assert run_cost(problem, reads, list(choices)) == pytest.approx(
            _run_cost_by_hand(problem, reads, list(choices)))
