"""Shared reads as a pairwise network, for solvers that take only node and edge costs.

A `solver.SharedRead` (a value several nodes read, each placement paid once) is no sum
of edges: its cost is a hyperedge over the producer and every reader. It becomes pairwise
with one two-choice node per placement that costs a move and more than one reader can
need, "not moved" (0) or "moved" (1):

- producer -> node: the move's price from each producer choice, paid when moved;
- node -> each reader, when not moved: the reader's choices that need the placement pay
  the dearest move there themselves, so that no assignment is cheaper unmoved.

A placement one reader alone can need is priced on an edge to that reader. The minimum
over the added nodes is the read's cost, so the network's optimum is the problem's. It
is exact for any solver, but its LP relaxation lets each placement's node take the same
cheap producer choice, so the ILP builds reads itself (`solver._add_read`); variable
elimination takes a read as one table over the producer and its readers where that is
small, and this form where it is not.

Pure functions over arrays; the tests check them against brute force.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np

from planner.search.solver import Assignment, AssignmentProblem, SharedRead, evaluate

CERTIFIED_GAP = 1e-9
"""How far above the lower bound a plan's cost may be and still count as its optimum
(the floating-point noise of summing the same moves in another order)."""


def with_shared_reads(problem: AssignmentProblem,
                      reads: list[SharedRead] | None = None) -> AssignmentProblem:
    """`problem` with `reads` (of its own; all by default) as nodes and edges (module
    docstring), the others kept: its nodes come first and keep their indices. The optimum
    over the added nodes of any assignment of `problem`'s nodes is its `solver.evaluate`."""
    reads = problem.reads if reads is None else reads
    node_costs, node_memory = list(problem.node_costs), list(problem.node_memory)
    edges = list(problem.edges)
    for read in reads:
        wanted = np.zeros(read.prices.shape[1], dtype=int)
        for _, needs in read.readers:
            wanted[np.unique(needs)] += 1
        shared = read.prices.any(axis=0) & (wanted > 1)
        for v, needs in read.readers:
            alone = np.where(shared[needs], 0.0, read.prices[:, needs])
            if alone.any():
                edges.append((read.producer, v, alone))
        for p in np.flatnonzero(shared):
            moved = len(node_costs)
            node_costs.append(np.zeros(2))
            node_memory.append(np.zeros(2))
            price = np.zeros((len(read.prices), 2))
            price[:, 1] = read.prices[:, p]
            edges.append((read.producer, moved, price))
            for v, needs in read.readers:
                if (needs == p).any():
                    unmoved = np.zeros((2, len(needs)))
                    unmoved[0, needs == p] = read.prices[:, p].max()
                    edges.append((moved, v, unmoved))
    converted = {id(read) for read in reads}
    return AssignmentProblem(node_costs, node_memory, edges, problem.memory_limit,
                             problem.shared_costs, problem.followers,
                             [read for read in problem.reads if id(read) not in converted])


def pairwise_bounds(problem: AssignmentProblem) -> tuple[AssignmentProblem, AssignmentProblem]:
    """(upper, lower): `problem` with each read as one edge per reader, the reader paying
    its whole move in the upper, its share in the lower (1/k of a move to a placement k
    readers can need). Any assignment costs no more than the upper and no less than the
    lower (what k readers share, each pays 1/k of; what fewer share, more than 1/k)."""
    lower_edges = []
    for read in problem.reads:
        wanted = np.zeros(read.prices.shape[1])
        for _, needs in read.readers:
            wanted[np.unique(needs)] += 1
        share = read.prices / np.maximum(wanted, 1)
        lower_edges += [(read.producer, v, share[:, needs]) for v, needs in read.readers]
    upper_edges = [edge for read in problem.reads for edge in read.as_edges()]
    return (replace(problem, edges=problem.edges + upper_edges, reads=[]),
            replace(problem, edges=problem.edges + lower_edges, reads=[]))


def certified_by_bounds(problem: AssignmentProblem,
                        solve: Callable[[AssignmentProblem], Assignment | None]
                        ) -> Assignment | None:
    """An optimum of `problem` found by `solve` (an exact solver, None where it declines
    or cannot prove one) on its pairwise bounds, where they prove it: the lower bound's
    optimum where its exact cost is the bound, else, where elimination solved the lower
    bound (a fraction of a second), the upper bound's optimum where its exact cost is no
    more than the lower's. None where neither proves one: moves that readers share then
    decide the plan, and `problem` must be solved as it is."""
    start = time.perf_counter()
    upper, lower = pairwise_bounds(problem)
    bound = solve(lower)
    if bound is None:
        return None
    candidates = [bound]
    if bound.solver == "elimination":
        candidates.append(solve(upper))
    for candidate in candidates:
        if candidate is None:
            return None
        cost = evaluate(problem, candidate.choices)
        if cost <= bound.objective * (1 + CERTIFIED_GAP):
            return replace(candidate, objective=cost, solve_time_s=time.perf_counter() - start)
    return None
