"""Exact and symmetry reductions of the intra-op assignment problem before it is solved.

- `tie_nodes`: nodes told to take the same choice become one node (identical blocks of a
  model take the same layout, as AutoParallel links the decision variables of repeated
  layers). Their costs and memory add up; their edges start or end at the leader.
- `merge_parallel_edges`: edges between the same two nodes become one, their matrices
  summed. Exact, and it is where tying pays: block k's edge u_k -> v_k and block k+1's
  u_{k+1} -> v_{k+1} are one edge after tying, so the ILP builds one transport block of
  edge variables for all the blocks instead of one per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solver import AssignmentProblem, SharedCost


@dataclass
class Tying:
    """How to expand the choices of a tied problem to the original nodes."""

    kept: list[int]
    """Index in the tied problem -> original node."""
    leader_of: list[int]
    """Original node -> the original node whose choice it takes (itself if kept)."""

    def expand(self, reduced_choices: list[int]) -> list[int]:
        choice = dict(zip(self.kept, reduced_choices))
        return [choice[leader] for leader in self.leader_of]


def tie_nodes(problem: AssignmentProblem,
              groups: list[list[int]]) -> tuple[AssignmentProblem, Tying]:
    """The problem in which the nodes of each group take one choice, that of its first
    node (all must have the same number of choices, index i meaning the same layout).
    Any assignment of the tied problem expands to one of the original with the same cost,
    memory and shared costs paid."""
    n = len(problem.node_costs)
    leader_of = list(range(n))
    for group in groups:
        for v in group[1:]:
            if len(problem.node_costs[v]) != len(problem.node_costs[group[0]]):
                raise ValueError(f"node {v} and its leader {group[0]} differ in choices")
            leader_of[v] = group[0]
    costs = [c.astype(float).copy() for c in problem.node_costs]
    memory = [m.astype(float).copy() for m in problem.node_memory]
    for v, leader in enumerate(leader_of):
        if leader != v:
            costs[leader] += costs[v]
            memory[leader] += memory[v]
    node_triggers = [{(leader_of[v], i) for v, i in s.node_triggers}
                     for s in problem.shared_costs]
    edge_triggers: list[set] = [set() for _ in problem.shared_costs]
    edges, new_edge = [], {}
    for k, (u, v, m) in enumerate(problem.edges):
        lu, lv = leader_of[u], leader_of[v]
        if lu == lv:  # both ends take one choice: only the diagonal is ever paid
            costs[lu] += np.diag(m)
            for s, (nt, _) in enumerate(zip(node_triggers, edge_triggers)):
                nt.update((lu, i) for kk, i, j in problem.shared_costs[s].edge_triggers
                          if kk == k and i == j)
            continue
        new_edge[k] = len(edges)
        edges.append((lu, lv, m))
    for s, shared in enumerate(problem.shared_costs):
        edge_triggers[s].update((new_edge[k], i, j) for k, i, j in shared.edge_triggers
                                if k in new_edge)
    kept = [v for v in range(n) if leader_of[v] == v]
    index = {v: i for i, v in enumerate(kept)}
    tied = AssignmentProblem(
        [costs[v] for v in kept], [memory[v] for v in kept],
        [(index[u], index[v], m) for u, v, m in edges], problem.memory_limit,
        [SharedCost(s.cost, sorted((index[v], i) for v, i in nt), sorted(et))
         for s, nt, et in zip(problem.shared_costs, node_triggers, edge_triggers)],
    )
    return tied, Tying(kept, leader_of)


def merge_parallel_edges(problem: AssignmentProblem) -> AssignmentProblem:
    """The same problem with the edges between any two nodes summed into one (either
    direction: a reversed edge is transposed). Edges a shared cost triggers on are kept
    apart, as their triggers name single entries of their own matrix."""
    triggered = {k for s in problem.shared_costs for k, _, _ in s.edge_triggers}
    merged: dict[tuple[int, int], int] = {}
    edges: list[list] = []
    new_index = {}
    for k, (u, v, m) in enumerate(problem.edges):
        if k in triggered:
            new_index[k] = len(edges)
            edges.append([u, v, m])
            continue
        key = (min(u, v), max(u, v))
        oriented = m if u <= v else m.T
        if key in merged:
            edges[merged[key]][2] = edges[merged[key]][2] + oriented
        else:
            merged[key] = len(edges)
            edges.append([key[0], key[1], oriented])
    shared = [SharedCost(s.cost, list(s.node_triggers),
                         [(new_index[k], i, j) for k, i, j in s.edge_triggers])
              for s in problem.shared_costs]
    return AssignmentProblem(list(problem.node_costs), list(problem.node_memory),
                             [(u, v, m) for u, v, m in edges], problem.memory_limit, shared)
