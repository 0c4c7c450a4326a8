"""A value several nodes read, moved once per placement: every solver and every reduction
of the problem prices it exactly, checked against brute force on small problems."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from planner.search import elimination
from planner.search.elimination import solve_by_elimination
from planner.search.presolve import contract_followers, merge_parallel_edges, prune_dominated
from planner.search.shared_reads import certified_by_bounds, pairwise_bounds, with_shared_reads
from planner.search.solver import (
    Assignment,
    AssignmentProblem,
    InfeasibleError,
    SharedRead,
    evaluate,
    memory_of,
    solve_brute_force,
    solve_greedy,
    solve_ilp,
)
from planner.search.tied_solve import solve_tied
from tests.planner.search.test_solver import random_problem


def _two_readers() -> AssignmentProblem:
    """A producer (one choice) whose value two consumers read. Either consumer can read
    it at placement A (a move of 3, no compute) or B (no move, 2 of compute): alone, B is
    cheaper (2 < 3); together, one move to A serves both (3 < 4)."""
    return AssignmentProblem(
        node_costs=[np.array([0.0]), np.array([0.0, 2.0]), np.array([0.0, 2.0])],
        node_memory=[np.zeros(1), np.zeros(2), np.zeros(2)],
        reads=[SharedRead(0, np.array([[3.0, 0.0]]),
                          ((1, np.array([0, 1])), (2, np.array([0, 1]))))])


def test_readers_that_would_each_pay_a_move_share_one() -> None:
    problem = _two_readers()
    upper, lower = pairwise_bounds(problem)
    assert solve_brute_force(upper).choices == [0, 1, 1]  # each reader alone: 2 + 2
    for solver in (solve_brute_force, solve_ilp, solve_by_elimination):
        solved = solver(problem)
        assert (solved.choices, solved.objective) == ([0, 0, 0], 3.0)


def _with_reads(seed: int) -> AssignmentProblem:
    """`random_problem` plus two values each read by up to three later nodes (a reader
    may read one value twice, or read its own value), prices drawn per placement."""
    problem = random_problem(seed, min_nodes=4, max_nodes=6)
    rng = np.random.default_rng(seed + 1000)
    sizes = [len(c) for c in problem.node_costs]
    reads = []
    for producer in rng.choice(len(sizes) - 1, size=2, replace=False):
        placements = int(rng.integers(1, 4))
        prices = rng.uniform(0, 3, (sizes[producer], placements)).round(2)
        prices[rng.random(prices.shape) < 0.3] = 0.0
        readers = rng.choice(np.arange(producer, len(sizes)), size=int(rng.integers(1, 4)))
        reads.append(SharedRead(int(producer), prices, tuple(
            (int(v), rng.integers(0, placements, sizes[v])) for v in readers)))
    return replace(problem, reads=reads)


def _optimum(problem: AssignmentProblem) -> float | None:
    try:
        return solve_brute_force(problem).objective
    except InfeasibleError:
        return None


def _by_hand(problem: AssignmentProblem, choices: list[int]) -> float:
    """Node and edge costs, shared costs, and each read's distinct placements once."""
    without = replace(problem, reads=[])
    return evaluate(without, choices) + sum(
        sum(read.prices[choices[read.producer], p]
            for p in {int(needs[choices[v]]) for v, needs in read.readers})
        for read in problem.reads)


@pytest.mark.parametrize("seed", range(40))
def test_every_solver_and_reduction_keeps_the_brute_force_optimum(seed: int) -> None:
    problem = _with_reads(seed)
    for choices in itertools.islice(
            itertools.product(*(range(len(c)) for c in problem.node_costs)), 50):
        assert evaluate(problem, list(choices)) == pytest.approx(_by_hand(problem, list(choices)))
    best = _optimum(problem)
    # The pairwise network has the same optimum, and the bounds bound it.
    network = with_shared_reads(problem)
    assert not network.reads and _optimum(network) == pytest.approx(best)
    upper, lower = pairwise_bounds(problem)
    if best is None:
        assert _optimum(upper) is None and _optimum(lower) is None
        return
    assert _optimum(lower) <= best + 1e-9 <= _optimum(upper) + 2e-9
    # Reductions, each solved by brute force, then expanded.
    contracted, contraction = contract_followers(problem)
    assert _optimum(contracted) == pytest.approx(best)
    pruned, pruning = prune_dominated(merge_parallel_edges(problem))
    kept = solve_brute_force(pruned)
    assert evaluate(problem, pruning.expand(kept.choices)) == pytest.approx(best)
    # The exact solvers.
    solved = solve_ilp(problem)
    assert solved.objective == pytest.approx(best)
    assert evaluate(problem, solved.choices) == pytest.approx(best)
    eliminated = solve_by_elimination(problem)
    if eliminated is not None:  # None: the optimum breaks the memory limit
        assert eliminated.objective == pytest.approx(best)
    certified = certified_by_bounds(problem, solve_by_elimination)
    if certified is not None:
        assert certified.objective == pytest.approx(best)
        assert evaluate(problem, certified.choices) == pytest.approx(best)
    tied, _ = solve_tied(problem, [], 30.0, "SCIP")
    assert tied.objective == pytest.approx(best)


@pytest.mark.parametrize("seed", range(10))
def test_a_binding_memory_limit_is_solved_by_one_exact_ilp(seed: int) -> None:
    """Where the cheapest layout memory aside breaks the limit, elimination and the bounds
    cannot prove the optimum the limit shapes: neither is tried, one ILP of the problem as
    posed finds the brute-force optimum."""
    problem = _with_reads(seed)
    unlimited = replace(problem, memory_limit=math.inf)
    greedy = memory_of(problem, solve_greedy(unlimited))
    least = sum(float(m.min()) for m in problem.node_memory)
    if greedy <= least:
        pytest.skip("no limit both fits and binds")
    problem = replace(problem, memory_limit=(least + greedy) / 2)
    posed = []

    def ilp(posed_problem: AssignmentProblem, **options) -> Assignment:
        posed.append(posed_problem)
        return solve_ilp(posed_problem, **options)

    def eliminate(_: AssignmentProblem) -> None:
        raise AssertionError("elimination tried under a binding memory limit")

    solved, _ = solve_tied(problem, [], 30.0, "SCIP", eliminate=eliminate, ilp=ilp)
    assert len(posed) == 1 and len(posed[0].reads) == len(merge_parallel_edges(problem).reads)
    assert solved.objective == pytest.approx(_optimum(problem))


@pytest.mark.parametrize("seed", range(10))
def test_a_large_read_is_eliminated_as_a_pairwise_network(seed: int,
                                                          monkeypatch) -> None:
    problem = _with_reads(seed)
    best = _optimum(problem)
    monkeypatch.setattr(elimination, "READ_TABLE_ENTRIES", 0)  # every read is "large"
    assert len(elimination._large_reads(problem)) == len(problem.reads)
    eliminated = solve_by_elimination(problem)
    if eliminated is not None:
        assert eliminated.objective == pytest.approx(best)


def test_tied_blocks_reading_alike_merge_into_one_read() -> None:
    """Two blocks, each a producer read by two consumers, tied: one read whose prices are
    the blocks' summed, with the optimum of the untied problem taking one layout."""
    def block(offset: int) -> SharedRead:
        return SharedRead(offset, np.array([[3.0, 0.0]]),
                          ((offset + 1, np.array([0, 1])), (offset + 2, np.array([0, 1]))))

    costs = [np.array([0.0]), np.array([0.0, 2.0]), np.array([0.0, 2.0])] * 2
    problem = AssignmentProblem(costs, [np.zeros(len(c)) for c in costs],
                                reads=[block(0), block(3)])
    solved, _ = solve_tied(problem, [[0, 3], [1, 4], [2, 5]], 30.0, "SCIP")
    assert (solved.choices, solved.objective) == ([0, 0, 0, 0, 0, 0], 6.0)
    from planner.search.presolve import tie_nodes
    tied, _ = tie_nodes(problem, [[0, 3], [1, 4], [2, 5]])
    merged = merge_parallel_edges(tied)
    assert len(merged.reads) == 1 and merged.reads[0].prices.tolist() == [[6.0, 0.0]]


def test_a_follower_that_reads_a_shared_value_is_not_contracted() -> None:
    """A follower's input is an edge to fold into its producer; one read through a shared
    move stays a node, so the move is still priced once."""
    problem = replace(_two_readers(), followers={1: (0, np.array([1]))})
    contracted, contraction = contract_followers(problem)
    assert contraction.kept == [0, 1, 2]
    assert solve_brute_force(contracted).objective == 3.0
    assert math.isclose(evaluate(problem, [0, 0, 0]), 3.0)
