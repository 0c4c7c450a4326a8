"""planner.search.elimination: exact min-sum elimination against brute force and the ILP.

Instances are drawn from seeded generators (one seed per case), so a failure names the
instance that broke and reruns identically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.search.elimination import (
    MIN_OF_SUM_CHUNK,
    _min_of_sum,
    ilp_variables,
    lower_bound,
    solve_by_elimination,
)
from planner.search.solver import (
    AssignmentProblem,
    SharedCost,
    evaluate,
    solve_brute_force,
    solve_ilp,
)


def network(seed: int, nodes: int, choices: int, extra_edges: int,
            shared: int = 0) -> AssignmentProblem:
    """A chain of `nodes` with `extra_edges` more edges between random pairs (parallel
    edges, edges back to an earlier node and self-edges included) and `shared` shared
    costs, each triggered by a few random choices and choice pairs."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, choices + 1)) for _ in range(nodes)]
    costs = [rng.uniform(0, 10, size=k).round(2) for k in sizes]
    pairs = [(v - 1, v) for v in range(1, nodes)]
    pairs += [tuple(int(x) for x in rng.integers(0, nodes, size=2)) for _ in range(extra_edges)]
    edges = [(u, v, rng.uniform(0, 10, size=(sizes[u], sizes[v])).round(2)) for u, v in pairs]
    shared_costs = []
    for _ in range(shared):
        node_triggers = [(int(v), int(rng.integers(0, sizes[v])))
                         for v in rng.choice(nodes, size=2)]
        edge_triggers = []
        for k in rng.choice(len(edges), size=min(3, len(edges)), replace=False):
            u, v, _ = edges[k]
            edge_triggers.append((int(k), int(rng.integers(0, sizes[u])),
                                  int(rng.integers(0, sizes[v]))))
        shared_costs.append(SharedCost(float(rng.uniform(1, 8)), node_triggers, edge_triggers))
    memory = [np.zeros(k) for k in sizes]
    return AssignmentProblem(costs, memory, edges, math.inf, shared_costs)


@pytest.mark.parametrize("seed", range(60))
def test_small_networks_match_brute_force(seed: int) -> None:
    problem = network(seed, nodes=int(2 + seed % 5), choices=4, extra_edges=seed % 4,
                      shared=seed % 3)
    got = solve_by_elimination(problem)
    expected = solve_brute_force(problem)
    assert got is not None
    assert (got.status, got.gap, got.solver) == ("OPTIMAL", 0.0, "elimination")
    assert got.objective == pytest.approx(expected.objective, abs=1e-9)
    assert evaluate(problem, got.choices) == pytest.approx(got.objective, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_larger_networks_match_the_ilp(seed: int) -> None:
    # Beyond brute force: 40 nodes of up to 6 choices, a few long-range edges.
    problem = network(100 + seed, nodes=40, choices=6, extra_edges=6, shared=seed % 4)
    got = solve_by_elimination(problem)
    expected = solve_ilp(problem)
    assert got is not None and expected.status == "OPTIMAL"
    assert got.objective == pytest.approx(expected.objective, rel=1e-7)


def test_a_bucket_is_left_unpaid_when_avoiding_it_is_cheaper() -> None:
    # Node 0's choice 0 is cheaper by 1 but triggers a bucket of 5: the optimum avoids it.
    problem = AssignmentProblem(
        node_costs=[np.array([1.0, 2.0]), np.array([0.0, 0.0])],
        node_memory=[np.zeros(2), np.zeros(2)],
        edges=[(0, 1, np.array([[0.0, 3.0], [3.0, 0.0]]))],
        shared_costs=[SharedCost(5.0, node_triggers=[(0, 0)])],
    )
    got = solve_by_elimination(problem)
    assert got is not None and got.choices[0] == 1
    assert got.objective == pytest.approx(2.0)


def test_declines_a_problem_whose_tables_would_be_too_large() -> None:
    # Every node adjacent to every other: the first elimination spans all of them.
    rng = np.random.default_rng(0)
    n, k = 9, 8
    edges = [(u, v, rng.uniform(0, 1, size=(k, k))) for u in range(n) for v in range(u + 1, n)]
    problem = AssignmentProblem([rng.uniform(0, 1, size=k) for _ in range(n)],
                                [np.zeros(k) for _ in range(n)], edges)
    assert solve_by_elimination(problem, max_entries=10**6) is None
    # By default too: 8^9 entries is far more than ENTRIES_PER_VARIABLE per ILP variable
    # (2,376 variables), where the ILP is likely the faster.
    assert ilp_variables(problem) == 9 * 8 + 36 * 64
    assert solve_by_elimination(problem) is None


def test_leaves_a_binding_memory_limit_to_the_ilp() -> None:
    problem = AssignmentProblem(
        node_costs=[np.array([0.0, 1.0])], node_memory=[np.array([10.0, 1.0])],
        memory_limit=5.0,
    )
    assert solve_by_elimination(problem) is None
    relaxed = AssignmentProblem(problem.node_costs, problem.node_memory, memory_limit=50.0)
    got = solve_by_elimination(relaxed)
    assert got is not None and got.choices == [0]


@pytest.mark.parametrize("seed", range(20))
def test_the_lower_bound_never_passes_the_optimum(seed: int) -> None:
    # Small tables force mini-buckets (the bound then falls short); a table as large as
    # the whole problem makes it the exact optimum of the network without shared costs.
    problem = network(200 + seed, nodes=int(3 + seed % 4), choices=4, extra_edges=2 + seed % 3,
                      shared=seed % 2)
    optimum = solve_brute_force(problem).objective
    bound = lower_bound(problem, max_table_entries=4)
    assert bound <= optimum + 1e-9
    plain = AssignmentProblem(problem.node_costs, problem.node_memory, problem.edges)
    assert lower_bound(plain, max_table_entries=10**9) == pytest.approx(
        solve_brute_force(plain).objective, abs=1e-9)


@pytest.mark.parametrize("shape", [(700, 30, 40), (3, 200_000, 2), (9000, 33)])
def test_a_large_table_is_summed_and_minimised_by_slabs_to_the_same_bits(shape) -> None:
    """Tables past a few slabs (`MIN_OF_SUM_CHUNK` entries) are reduced a slab of their
    first axis at a time, never whole: the same additions in the same order, so the same
    floats as numpy's sum over the whole table, broadcast parts and all."""
    assert math.prod(shape) > 4 * MIN_OF_SUM_CHUNK
    rng = np.random.default_rng(sum(shape))
    masks = [(1, 1, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1)][: 4 if len(shape) == 3 else 0] or [
        (1, 0), (0, 1), (1, 1)]
    parts = [rng.random([n if keep else 1 for n, keep in zip(shape, mask)])
             for mask in masks]
    whole = parts[0]
    for part in parts[1:]:
        whole = whole + part
    expected = np.broadcast_to(whole, shape).min(axis=-1)
    got = _min_of_sum(parts, list(shape))
    assert got.shape == expected.shape and np.array_equal(got, expected)


def test_a_bucket_over_more_than_32_nodes_is_eliminated() -> None:
    """A node tied to 35 nodes of one choice each is eliminated first (its table is the
    smallest), leaving a bucket over 36 axes: past numpy's 32-operand broadcasting limit,
    which a Llama block's ILP on a 4-device mesh reaches."""
    rng = np.random.default_rng(35)
    leaves = range(1, 36)
    costs = [rng.uniform(0, 10, size=3).round(2), *([rng.uniform(0, 10, size=1).round(2)]
                                                      * 35), rng.uniform(0, 10, 2).round(2)]
    edges = [(0, v, rng.uniform(0, 10, size=(3, 1)).round(2)) for v in leaves]
    edges += [(v, 36, rng.uniform(0, 10, size=(1, 2)).round(2)) for v in leaves]
    problem = AssignmentProblem(costs, [np.zeros(len(c)) for c in costs], edges)
    got = solve_by_elimination(problem)
    assert got is not None
    assert got.objective == pytest.approx(solve_brute_force(problem).objective, abs=1e-9)


def test_a_bucket_over_more_axes_than_numpy_holds_is_left_to_the_ilp() -> None:
    """A node tied to 70 nodes of one choice each: its bucket would span 71 axes, more
    than a numpy array's 64 dims (a whole Hugging Face model traced as one layer reached
    65), so elimination declines and the ILP solves it."""
    rng = np.random.default_rng(70)
    leaves = range(1, 71)
    costs = [rng.uniform(0, 10, size=3).round(2),
             *([rng.uniform(0, 10, size=1).round(2)] * 70)]
    edges = [(0, v, rng.uniform(0, 10, size=(3, 1)).round(2)) for v in leaves]
    problem = AssignmentProblem(costs, [np.zeros(len(c)) for c in costs], edges)
    assert solve_by_elimination(problem) is None
