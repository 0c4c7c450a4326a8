"""planner.search.solver: the ILP against brute force, follower contraction, the greedy incumbent.

Random instances are drawn from seeded numpy generators (one seed per test case) so a
failure names the instance that broke and reruns identically.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from planner.search.presolve import contract_followers, prune_dominated
from planner.search.solver import (
    AssignmentProblem,
    InfeasibleError,
    SharedCost,
    capped,
    evaluate,
    memory_of,
    solve_brute_force,
    solve_greedy,
    solve_ilp,
)


# -- random instances ------------------------------------------------------------------------


def _random_matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """An edge matrix of one of the shapes the ILP treats specially."""
    kind = rng.choice(["zero", "uniform", "random", "dup_rows", "dup_cols"])
    if kind == "zero":
        return np.zeros((rows, cols))
    if kind == "uniform":
        return np.full((rows, cols), float(rng.integers(1, 5)))
    if kind == "random":
        return rng.uniform(0, 10, size=(rows, cols)).round(2)
    if kind == "dup_rows":  # several producer choices share a row: one row group
        distinct = rng.uniform(0, 10, size=(max(1, rows - 1), cols)).round(2)
        return distinct[rng.integers(0, len(distinct), size=rows)]
    distinct = rng.uniform(0, 10, size=(rows, max(1, cols - 1))).round(2)
    return distinct[:, rng.integers(0, distinct.shape[1], size=cols)]


def _has_duplicate_lines(matrix: np.ndarray) -> bool:
    rows = {r.tobytes() for r in matrix}
    cols = {c.tobytes() for c in matrix.T}
    uniform = len(rows) == 1 and len(cols) == 1
    return not uniform and (len(rows) < matrix.shape[0] or len(cols) < matrix.shape[1])


def random_problem(
    seed: int,
    *,
    min_nodes: int = 2,
    max_nodes: int = 6,
    shared: bool = True,
    grouped_edge_triggers: bool = True,
) -> AssignmentProblem:
    """A DAG-shaped problem: 2-6 nodes, 1-4 choices each, edges only from lower to higher
    node index. The memory limit is binding in about half the instances.

    Edge triggers of shared costs go on any edge, including ones with repeated rows or
    columns (which the ILP must then not group), unless `grouped_edge_triggers` is off.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(min_nodes, max_nodes + 1))
    sizes = [int(rng.integers(1, 5)) for _ in range(n)]
    costs = [rng.uniform(0, 10, size=k).round(2) for k in sizes]
    memory = [rng.integers(0, 50, size=k).astype(float) for k in sizes]
    edges = []
    for v in range(1, n):
        # Every node after the first has at least one producer; some have two.
        producers = {int(rng.integers(0, v))}
        if v >= 2 and rng.random() < 0.4:
            producers.add(int(rng.integers(0, v)))
        for u in sorted(producers):
            edges.append((u, v, _random_matrix(rng, sizes[u], sizes[v])))
    low = sum(float(m.min()) for m in memory)
    high = sum(float(m.max()) for m in memory)
    limit = math.inf if rng.random() < 0.5 else low + rng.uniform(0.2, 0.8) * (high - low)
    shared_costs = []
    if shared:
        for _ in range(int(rng.integers(0, 3))):
            node_triggers = [
                (v, int(rng.integers(0, sizes[v])))
                for v in rng.choice(n, size=int(rng.integers(0, 3)), replace=True)
            ]
            eligible = [
                k for k, (_, _, m) in enumerate(edges)
                if grouped_edge_triggers or not _has_duplicate_lines(m)
            ]
            edge_triggers = []
            for k in rng.choice(eligible, size=min(len(eligible), int(rng.integers(0, 3))),
                                replace=False) if eligible else []:
                u, v, _ = edges[k]
                edge_triggers.append(
                    (int(k), int(rng.integers(0, sizes[u])), int(rng.integers(0, sizes[v])))
                )
            shared_costs.append(
                SharedCost(float(rng.uniform(1, 15)), node_triggers, edge_triggers)
            )
    return AssignmentProblem(costs, memory, edges, limit, shared_costs)


def all_assignments(problem: AssignmentProblem):
    return itertools.product(*(range(len(c)) for c in problem.node_costs))


# -- evaluate and brute force on a hand-made instance ----------------------------------------


def test_evaluate_counts_nodes_edges_and_each_shared_cost_once() -> None:
    problem = AssignmentProblem(
        node_costs=[np.array([1.0, 2.0]), np.array([10.0, 20.0])],
        node_memory=[np.zeros(2), np.zeros(2)],
        edges=[(0, 1, np.array([[0.0, 5.0], [7.0, 0.0]]))],
        shared_costs=[SharedCost(100.0, node_triggers=[(0, 0), (1, 1)],
                                 edge_triggers=[(0, 0, 1)])],
    )
    assert evaluate(problem, [0, 0]) == pytest.approx(1 + 10 + 0 + 100)
    # All three triggers fire; the shared cost is still paid once.
    assert evaluate(problem, [0, 1]) == pytest.approx(1 + 20 + 5 + 100)
    assert evaluate(problem, [1, 0]) == pytest.approx(2 + 10 + 7)
    best = solve_brute_force(problem)
    assert best.choices == [1, 0]
    assert best.objective == pytest.approx(19.0)


def test_memory_limit_forces_a_dearer_choice() -> None:
    problem = AssignmentProblem(
        node_costs=[np.array([1.0, 5.0]), np.array([1.0, 3.0])],
        node_memory=[np.array([100.0, 10.0]), np.array([100.0, 10.0])],
        memory_limit=110.0,
    )
    for solve in (solve_brute_force, solve_ilp):
        result = solve(problem)
        # Both cheap choices need 200 bytes; the best that fits keeps node 0 cheap.
        assert result.choices == [0, 1]
        assert result.objective == pytest.approx(4.0)


# -- ILP == brute force ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(24))
def test_ilp_matches_brute_force(seed: int) -> None:
    problem = random_problem(seed)
    try:
        expected = solve_brute_force(problem)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_ilp(problem)
        return
    got = solve_ilp(problem)
    assert got.objective == pytest.approx(expected.objective, rel=1e-6, abs=1e-9)
    assert len(got.choices) == len(problem.node_costs)
    assert all(0 <= c < len(k) for c, k in zip(got.choices, problem.node_costs))
    assert memory_of(problem, got.choices) <= problem.memory_limit
    assert got.status == "OPTIMAL"
    assert got.gap == 0.0


def test_random_instances_exercise_the_interesting_cases() -> None:
    """Guard on the generator: the property test above is only worth something if its
    instances have binding memory limits, shared costs and grouped edge matrices."""
    problems = [random_problem(seed) for seed in range(24)]
    binding = 0
    for p in problems:
        if math.isfinite(p.memory_limit):
            unconstrained = AssignmentProblem(p.node_costs, p.node_memory, p.edges,
                                              math.inf, p.shared_costs)
            best = solve_brute_force(unconstrained)
            binding += memory_of(p, best.choices) > p.memory_limit
    assert binding >= 3
    assert sum(bool(s.edge_triggers) for p in problems for s in p.shared_costs) >= 3
    assert sum(bool(s.node_triggers) for p in problems for s in p.shared_costs) >= 3
    assert sum(_has_duplicate_lines(m) for p in problems for _, _, m in p.edges) >= 5
    assert sum(not m.any() for p in problems for _, _, m in p.edges) >= 3


@pytest.mark.parametrize("seed", range(3))
def test_infeasible_memory_limit_raises_in_both_solvers(seed: int) -> None:
    problem = random_problem(100 + seed, shared=False)
    problem.memory_limit = sum(float(m.min()) for m in problem.node_memory) - 1.0
    with pytest.raises(InfeasibleError):
        solve_brute_force(problem)
    with pytest.raises(InfeasibleError):
        solve_ilp(problem)


def test_exactly_fitting_memory_limit_is_feasible() -> None:
    problem = random_problem(7, shared=False)
    problem.memory_limit = sum(float(m.min()) for m in problem.node_memory)
    expected = solve_brute_force(problem)
    got = solve_ilp(problem)
    assert got.objective == pytest.approx(expected.objective, rel=1e-6)
    assert memory_of(problem, got.choices) <= problem.memory_limit


def test_ilp_edge_trigger_on_a_grouped_row_fires_only_for_its_own_choice() -> None:
    # Rows 0 and 1 of the edge matrix are identical, so the ILP groups them; the shared
    # cost is triggered only by (u=0, v=0), so (u=1, v=0) costs 0.5 and is the optimum.
    problem = AssignmentProblem(
        node_costs=[np.array([0.0, 0.5, 5.0]), np.array([0.0, 0.0])],
        node_memory=[np.zeros(3), np.zeros(2)],
        edges=[(0, 1, np.array([[0.0, 3.0], [0.0, 3.0], [3.0, 0.0]]))],
        shared_costs=[SharedCost(10.0, edge_triggers=[(0, 0, 0)])],
    )
    assert solve_brute_force(problem).objective == pytest.approx(0.5)
    assert solve_ilp(problem).objective == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(12))
def test_impossible_costs_capped_keep_the_optimum(seed: int) -> None:
    """Costs a million times the rest (the graph code's price of a move DTensor cannot
    make) are capped before solving: the ILP still finds brute force's optimum, and
    reports the objective of the uncapped problem."""
    problem = random_problem(200 + seed)
    rng = np.random.default_rng(seed)
    scale = 1e-6  # real costs of microseconds, like a training step's
    problem.node_costs = [c * scale for c in problem.node_costs]
    problem.shared_costs = [SharedCost(s.cost * scale, s.node_triggers, s.edge_triggers)
                            for s in problem.shared_costs]
    edges = []
    for u, v, m in problem.edges:
        m = m * scale
        m[rng.random(m.shape) < 0.3] = 1e6
        edges.append((u, v, m))
    problem.edges = edges
    try:
        expected = solve_brute_force(problem)
    except InfeasibleError:
        return
    got = solve_ilp(problem)
    assert got.objective == pytest.approx(expected.objective, rel=1e-6)


def test_capped_is_a_no_op_when_the_incumbent_bounds_nothing() -> None:
    """Over the memory limit (or with a negative cost) the greedy answer is no upper
    bound on the optimum, so nothing is capped."""
    problem = AssignmentProblem(
        node_costs=[np.array([1.0, 5e6]), np.array([1.0, 3.0])],
        node_memory=[np.array([100.0, 10.0]), np.array([100.0, 10.0])],
        memory_limit=110.0,
    )
    assert capped(problem, [0, 0]) is problem  # 200 bytes of 110
    negative = AssignmentProblem([np.array([-1.0, 5e6])], [np.zeros(2)])
    assert capped(negative, [0]) is negative
    fits = AssignmentProblem([np.array([1.0, 5e6])], [np.zeros(2)])
    assert list(capped(fits, [0]).node_costs[0]) == [1.0, 2.0]


# -- greedy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_greedy_returns_a_valid_assignment(seed: int) -> None:
    problem = random_problem(200 + seed)
    choices = solve_greedy(problem)
    assert len(choices) == len(problem.node_costs)
    assert all(isinstance(c, int) and 0 <= c < len(k)
               for c, k in zip(choices, problem.node_costs))


@pytest.mark.parametrize("seed", range(24))
def test_greedy_fits_the_memory_limit_whenever_some_assignment_does(seed: int) -> None:
    """Its answer bounds the optimum, so the ILP may cap costs by it."""
    problem = random_problem(seed)
    least = sum(float(m.min()) for m in problem.node_memory)
    if least <= problem.memory_limit:
        assert memory_of(problem, solve_greedy(problem)) <= problem.memory_limit


def test_greedy_follows_the_upstream_choice() -> None:
    # Node 0 is cheapest at 0; the edge then makes choice 1 of node 1 the cheap one even
    # though its own node cost prefers 0.
    problem = AssignmentProblem(
        node_costs=[np.array([0.0, 1.0]), np.array([0.0, 1.0])],
        node_memory=[np.zeros(2), np.zeros(2)],
        edges=[(0, 1, np.array([[5.0, 0.0], [0.0, 5.0]]))],
    )
    assert solve_greedy(problem) == [0, 1]


# -- follower contraction --------------------------------------------------------------------


def _with_follower(seed: int, *, argmin: bool = False, leaf: bool = False):
    """A random problem and one node v whose only in-edge is from u, given a follower
    mapping (random, or the per-row argmin of node_costs[v] + M when `argmin`). With
    `leaf`, v is the last node, so it has no out-edges."""
    problem = random_problem(seed, min_nodes=3, shared=not argmin)
    n = len(problem.node_costs)
    rng = np.random.default_rng(10_000 + seed)
    in_edges = {v: [k for k, e in enumerate(problem.edges) if e[1] == v] for v in range(n)}
    candidates = [v for v in range(1, n) if len(in_edges[v]) == 1]
    if leaf:
        problem.edges = [e for e in problem.edges if e[1] != n - 1]
        u = int(rng.integers(0, n - 1))
        k_u, k_v = len(problem.node_costs[u]), len(problem.node_costs[n - 1])
        problem.edges.append((u, n - 1, rng.uniform(0, 10, size=(k_u, k_v)).round(2)))
        v = n - 1
    else:
        v = int(rng.choice(candidates))
    (k,) = [k for k, e in enumerate(problem.edges) if e[1] == v]
    u, _, matrix = problem.edges[k]
    if argmin:
        f = np.argmin(problem.node_costs[v][None, :] + matrix, axis=1)
    else:
        f = rng.integers(0, len(problem.node_costs[v]), size=len(problem.node_costs[u]))
    problem.followers = {v: (u, f)}
    return problem, u, v


def _check_contraction(problem: AssignmentProblem) -> tuple[AssignmentProblem, object]:
    """Every assignment of the reduced problem expands to one of the original problem with
    the same cost and memory, in which each follower takes its mapped choice."""
    reduced, contraction = contract_followers(problem)
    n = len(problem.node_costs)
    assert len(reduced.node_costs) == n - len(contraction.follows)
    for choices in all_assignments(reduced):
        full = contraction.expand(list(choices), n)
        assert evaluate(problem, full) == pytest.approx(evaluate(reduced, list(choices)))
        assert memory_of(problem, full) == pytest.approx(memory_of(reduced, list(choices)))
        for v, (u, f) in problem.followers.items():
            if v in contraction.follows:
                assert full[v] == f[full[u]]
    return reduced, contraction


@pytest.mark.parametrize("seed", range(8))
def test_contracted_optimum_expands_to_an_assignment_of_the_same_cost(seed: int) -> None:
    problem, u, v = _with_follower(seed)
    reduced, contraction = contract_followers(problem)
    assert v in contraction.follows
    assert v not in contraction.kept and u in contraction.kept
    try:
        original = solve_brute_force(problem)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_brute_force(reduced)
        return
    try:
        best = solve_brute_force(reduced)
    except InfeasibleError:
        return  # the restriction may leave nothing that fits: allowed
    full = contraction.expand(best.choices, len(problem.node_costs))
    assert full[v] == problem.followers[v][1][full[u]]
    assert evaluate(problem, full) == pytest.approx(best.objective)
    assert memory_of(problem, full) <= problem.memory_limit
    # Merging restricts the original problem: never better than its optimum.
    assert best.objective >= original.objective - 1e-9
    _check_contraction(problem)


@pytest.mark.parametrize("seed", range(4))
def test_argmin_mapping_on_a_leaf_loses_nothing(seed: int) -> None:
    problem, u, v = _with_follower(seed, argmin=True, leaf=True)
    problem.memory_limit = math.inf  # the argmin ignores memory
    reduced, contraction = _check_contraction(problem)
    assert v in contraction.follows
    assert solve_brute_force(reduced).objective == pytest.approx(
        solve_brute_force(problem).objective
    )
    # The contracted problem is what the ILP would see; it must agree too.
    assert solve_ilp(reduced).objective == pytest.approx(solve_brute_force(problem).objective)


def _chain_problem() -> AssignmentProblem:
    """0 -> 1 -> 2 -> 3 where 1 follows 0 and 2 follows 1; 3 is a free consumer.
    A shared cost triggers on the follower edge 1 -> 2, another on 2 -> 3 and on node 2."""
    rng = np.random.default_rng(5)
    sizes = [3, 2, 3, 2]
    costs = [rng.uniform(0, 10, size=k).round(2) for k in sizes]
    memory = [rng.integers(0, 10, size=k).astype(float) for k in sizes]
    edges = [
        (0, 1, rng.uniform(0, 10, size=(3, 2)).round(2)),
        (1, 2, rng.uniform(0, 10, size=(2, 3)).round(2)),
        (2, 3, rng.uniform(0, 10, size=(3, 2)).round(2)),
        (0, 3, rng.uniform(0, 10, size=(3, 2)).round(2)),
    ]
    return AssignmentProblem(
        costs, memory, edges, math.inf,
        shared_costs=[
            SharedCost(25.0, edge_triggers=[(1, 0, 2)]),
            SharedCost(7.0, node_triggers=[(2, 0)], edge_triggers=[(2, 1, 0)]),
        ],
        followers={1: (0, np.array([1, 0, 1])), 2: (1, np.array([2, 0]))},
    )


def test_chain_of_followers_collapses_into_the_first_leader() -> None:
    problem = _chain_problem()
    reduced, contraction = _check_contraction(problem)
    assert contraction.kept == [0, 3]
    assert len(reduced.node_costs) == 2
    # Node 2 follows node 0 through node 1: 0 -> f1 -> f2.
    for i in range(3):
        full = contraction.expand([i, 0], 4)
        assert full[1] == [1, 0, 1][i]
        assert full[2] == [2, 0][full[1]]
    # The shared cost on the follower edge 1 -> 2 fires when node 1 takes 0 and node 2
    # takes 2, i.e. exactly when node 0 takes 1; merging must keep charging it there.
    free = _chain_problem()
    free.shared_costs[0] = SharedCost(0.0, edge_triggers=[(1, 0, 2)])
    reduced_free, _ = contract_followers(free)
    for i in range(3):
        for j in range(2):
            extra = evaluate(reduced, [i, j]) - evaluate(reduced_free, [i, j])
            assert extra == pytest.approx(25.0 if i == 1 else 0.0)
    best = solve_brute_force(reduced)
    assert solve_brute_force(problem).objective <= best.objective + 1e-9
    assert solve_ilp(reduced).objective == pytest.approx(best.objective)


def test_shared_cost_on_a_follower_edge_is_kept() -> None:
    """The trigger (u=1, v=0) on the follower's in-edge must still cost 50 after merging."""
    problem = AssignmentProblem(
        node_costs=[np.array([0.0, 1.0]), np.array([0.0, 0.0])],
        node_memory=[np.zeros(2), np.zeros(2)],
        edges=[(0, 1, np.zeros((2, 2)))],
        shared_costs=[SharedCost(50.0, edge_triggers=[(0, 1, 0)])],
        followers={1: (0, np.array([0, 0]))},
    )
    reduced, contraction = _check_contraction(problem)
    assert evaluate(reduced, [1]) == pytest.approx(51.0)
    assert evaluate(reduced, [0]) == pytest.approx(0.0)
    assert contraction.expand([1], 2) == [1, 0]


def test_follower_feeding_back_into_its_leader_becomes_a_node_cost() -> None:
    rng = np.random.default_rng(3)
    problem = AssignmentProblem(
        node_costs=[rng.uniform(0, 5, 3), rng.uniform(0, 5, 2)],
        node_memory=[np.zeros(3), np.zeros(2)],
        edges=[(0, 1, rng.uniform(0, 5, (3, 2))), (1, 0, rng.uniform(0, 5, (2, 3)))],
        shared_costs=[SharedCost(9.0, edge_triggers=[(1, 0, 2)])],
        followers={1: (0, np.array([1, 0, 0]))},
    )
    reduced, _ = _check_contraction(problem)
    assert reduced.edges == []


def test_node_with_two_producers_is_not_merged() -> None:
    problem = AssignmentProblem(
        node_costs=[np.array([0.0, 1.0])] * 3,
        node_memory=[np.zeros(2)] * 3,
        edges=[(0, 2, np.eye(2)), (1, 2, np.eye(2))],
        followers={2: (0, np.array([1, 0]))},
    )
    reduced, contraction = contract_followers(problem)
    assert contraction.kept == [0, 1, 2]
    assert len(reduced.edges) == 2


def test_two_triggers_on_a_follower_out_edge_survive_a_permuting_mapping() -> None:
    # The shared cost fires whenever node 2 takes 0 (whatever node 1 takes).
    problem = AssignmentProblem(
        node_costs=[np.zeros(2), np.zeros(2), np.array([0.0, 20.0])],
        node_memory=[np.zeros(2)] * 3,
        edges=[(0, 1, np.zeros((2, 2))), (1, 2, np.zeros((2, 2)))],
        shared_costs=[SharedCost(10.0, edge_triggers=[(1, 0, 0), (1, 1, 0)])],
        followers={1: (0, np.array([1, 0]))},
    )
    _check_contraction(problem)


# -- dominated choices -----------------------------------------------------------------------


def _with_dominated_copies(problem: AssignmentProblem, seed: int) -> tuple[AssignmentProblem, int]:
    """The problem with a worse copy of one choice of each node added: the same costs
    plus non-negative noise on its node cost, memory and every edge entry (or an exact
    copy, a tie). Returns it and the number of copies."""
    rng = np.random.default_rng(seed)
    costs = [c.copy() for c in problem.node_costs]
    memory = [m.copy() for m in problem.node_memory]
    edges = [[u, v, m.copy()] for u, v, m in problem.edges]
    for v in range(len(costs)):
        i = int(rng.integers(0, len(costs[v])))
        worse = rng.random() < 0.7
        noise = (lambda shape: rng.uniform(0, 3, size=shape).round(2)) if worse else np.zeros
        costs[v] = np.append(costs[v], costs[v][i] + noise(()))
        memory[v] = np.append(memory[v], memory[v][i] + noise(()))
        for edge in edges:
            u, w, m = edge
            if u == v:
                edge[2] = np.vstack([m, m[i] + noise(m.shape[1])])
            if w == v:
                edge[2] = np.hstack([edge[2], edge[2][:, [i]] + noise((edge[2].shape[0], 1))])
    return AssignmentProblem(costs, memory, [tuple(e) for e in edges], problem.memory_limit,
                             problem.shared_costs), len(costs)


@pytest.mark.parametrize("seed", range(16))
def test_pruning_dominated_choices_keeps_the_optimum(seed: int) -> None:
    problem, copies = _with_dominated_copies(random_problem(seed, shared=False), seed)
    pruned, pruning = prune_dominated(problem)
    # Every planted copy goes (it is a copy's own original, or better, that dominates it).
    removed = sum(len(a) - len(b) for a, b in zip(problem.node_costs, pruned.node_costs))
    assert removed >= copies
    try:
        expected = solve_brute_force(problem)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_brute_force(pruned)
        return
    got = solve_brute_force(pruned)
    choices = pruning.expand(got.choices)
    assert evaluate(problem, choices) == pytest.approx(expected.objective, rel=1e-9, abs=1e-9)
    assert memory_of(problem, choices) <= problem.memory_limit


def test_choices_a_shared_cost_names_are_never_pruned() -> None:
    # Choice 1 of node 0 triggers a shared cost, which elementwise comparison does not
    # see: it stays, though choice 0 is cheaper on every other count.
    problem = AssignmentProblem(
        [np.array([1.0, 2.0]), np.array([0.0])], [np.zeros(2), np.zeros(1)],
        [(0, 1, np.array([[0.0], [0.0]]))],
        shared_costs=[SharedCost(5.0, node_triggers=[(0, 1)])],
    )
    pruned, pruning = prune_dominated(problem)
    assert [list(k) for k in pruning.kept] == [[0, 1], [0]]
    assert len(pruned.shared_costs[0].node_triggers) == 1
