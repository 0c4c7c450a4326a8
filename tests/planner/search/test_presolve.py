"""planner.search.presolve and symmetry: tying identical blocks, merging parallel edges and
the whole reduction chain, checked against brute force on small random problems; and on a
traced model, identical blocks always get the same layout."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from planner.search.presolve import (
    contract_followers,
    merge_parallel_edges,
    prune_dominated,
    tie_nodes,
)
from planner.search.solver import (
    AssignmentProblem,
    InfeasibleError,
    evaluate,
    memory_of,
    solve_brute_force,
)
from tests.planner.search.test_solver import random_problem


def _brute_force_or_none(problem: AssignmentProblem):
    try:
        return solve_brute_force(problem)
    except InfeasibleError:
        return None


def _same_size_groups(problem: AssignmentProblem, rng: np.random.Generator) -> list[list[int]]:
    """Random groups of nodes with equally many choices, as identical blocks have."""
    by_size: dict[int, list[int]] = {}
    for v, c in enumerate(problem.node_costs):
        by_size.setdefault(len(c), []).append(v)
    groups = []
    for nodes in by_size.values():
        if len(nodes) >= 2 and rng.random() < 0.8:
            groups.append([int(v) for v in rng.permutation(nodes)[:2]])
    return groups


@pytest.mark.parametrize("seed", range(60))
def test_tied_optimum_is_the_best_assignment_whose_tied_nodes_agree(seed: int) -> None:
    problem = random_problem(seed, max_nodes=5)
    groups = _same_size_groups(problem, np.random.default_rng(seed))
    tied, tying = tie_nodes(problem, groups)
    solved = _brute_force_or_none(tied)
    # Brute force over the original, keeping only assignments in which each group agrees.
    best = None
    for combo in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        if any(len({combo[v] for v in g}) > 1 for g in groups):
            continue
        if memory_of(problem, list(combo)) > problem.memory_limit:
            continue
        cost = evaluate(problem, list(combo))
        best = cost if best is None else min(best, cost)
    if best is None:
        assert solved is None
        return
    assert solved is not None
    expanded = tying.expand(solved.choices)
    assert all(len({expanded[v] for v in g}) == 1 for g in groups)
    assert evaluate(problem, expanded) == pytest.approx(solved.objective, abs=1e-9)
    assert memory_of(problem, expanded) == pytest.approx(memory_of(tied, solved.choices))
    assert solved.objective == pytest.approx(best, abs=1e-9)


@pytest.mark.parametrize("seed", range(60))
def test_merging_parallel_edges_keeps_every_assignments_cost(seed: int) -> None:
    problem = random_problem(seed, max_nodes=5)
    rng = np.random.default_rng(1000 + seed)
    # Add reversed and repeated copies of some edges, as tying blocks makes them.
    extra = [(v, u, rng.uniform(0, 5, size=m.T.shape).round(2))
             for u, v, m in problem.edges if rng.random() < 0.5]
    extra += [(u, v, m.copy()) for u, v, m in problem.edges if rng.random() < 0.3]
    problem = AssignmentProblem(problem.node_costs, problem.node_memory,
                                problem.edges + extra, problem.memory_limit,
                                problem.shared_costs)
    merged = merge_parallel_edges(problem)
    assert len(merged.edges) <= len(problem.edges)
    for combo in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        assert evaluate(merged, list(combo)) == pytest.approx(evaluate(problem, list(combo)))


@pytest.mark.parametrize("seed", range(80))
def test_chain_merge_tie_and_pruning_keep_the_brute_force_optimum(seed: int) -> None:
    """The whole reduction chain of `plan_intra_op` (followers merged into the op they
    follow, parallel edges merged, dominated choices pruned) has the original optimum."""
    problem = random_problem(seed, max_nodes=6)
    rng = np.random.default_rng(2000 + seed)
    followers = {}
    for u, v, m in problem.edges:
        if v not in followers and rng.random() < 0.5:
            followers[v] = (u, rng.integers(0, len(problem.node_costs[v]),
                                            size=len(problem.node_costs[u])))
    problem.followers = followers
    # The merge restricts v to f[u's choice]: the brute force of that restriction is
    # what the reduced problem must reach.
    contracted, contraction = contract_followers(problem)
    reduced, pruning = prune_dominated(merge_parallel_edges(contracted))
    solved = _brute_force_or_none(reduced)
    best = None
    for combo in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        if any(combo[v] != f[combo[u]] for v, (u, f) in followers.items()
               if v not in contraction.kept):
            continue
        if memory_of(problem, list(combo)) <= problem.memory_limit:
            cost = evaluate(problem, list(combo))
            best = cost if best is None else min(best, cost)
    if best is None:
        assert solved is None
        return
    expanded = contraction.expand(pruning.expand(solved.choices), len(problem.node_costs))
    assert evaluate(problem, expanded) == pytest.approx(best, abs=1e-9)
    assert memory_of(problem, expanded) <= problem.memory_limit


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class BlockStack(nn.Module):
    """An embedding, `depth` blocks made by `block(width)`, and a head of `outputs`."""

    def __init__(self, block=_Block, depth: int = 2, width: int = 32,
                 outputs: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(block(width) for _ in range(depth))
        self.head = nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_two_identical_blocks_always_get_the_same_layout() -> None:
    from planner.api import plan_model
    from planner.search.symmetry import identical_block_groups

    planned = plan_model(BlockStack(), (torch.randn(8, 16, 32),), mesh_shape=(2, 2),
                         time_limit_s=60.0)
    parameters = planned.plan.parameters
    block0 = {fqn[len("blocks.0."):]: p for fqn, p in parameters.items()
              if fqn.startswith("blocks.0.")}
    block1 = {fqn[len("blocks.1."):]: p for fqn, p in parameters.items()
              if fqn.startswith("blocks.1.")}
    assert block0 and block0 == block1
    # Every parameter of one block has its partner in a tied group.
    from passes.dtensor_rules import fake_mesh
    from passes.strategies import enumerate_strategies
    from planner.vocabulary.cluster import Cluster

    table = enumerate_strategies(planned.program, fake_mesh((2, 2)), Cluster.load("cpu").device)
    groups = identical_block_groups(planned.program, table)
    tied_fqns = {planned.program.parameters[g[0]] for g in groups
                 if g[0] in planned.program.parameters}
    assert tied_fqns == {f"blocks.0.{name}" for name in block0}
