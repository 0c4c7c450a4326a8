"""The assignment problem with its shared costs decided: one subproblem per set of them paid.

A shared cost (a gradient bucket's latency, `solver.SharedCost`) is paid once if any of its
triggers is chosen, and its linearisation (a variable at least every trigger) is where the
LP relaxation is weak: a solution that spreads nodes over triggering and other choices pays
the latency in part. On the 2x4 ViT of benchmarks/vs_autoparallel.py's seed 1 (three buckets:
one per mesh axis and one over both) the LP bound is 1.8% under the optimum; with the buckets
decided, each of the eight subproblems' LPs is within 0.05% of its optimum (docs/graph-plans.md,
"Measured").

So the problem splits on them, as branch and bound would branch on the fixed charges first:
for each set `paid` of buckets, triggers of the others are forbidden and the buckets in it
are paid up front. An assignment whose triggers fall in exactly the set T is an assignment of
every subproblem whose `paid` holds T, and costs least in T's; so the optimum is the least,
over the sets, of `upfront` plus the subproblem's optimum. `elimination` conditions its
tables on the same sets.

A forbidden trigger is priced, not removed: at `penalty`, an incumbent's objective, no
assignment that takes one is cheaper than the incumbent, so every subproblem's assignments
below it are the problem's, and a subproblem's optimum at or above it decides nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from planner.search.solver import AssignmentProblem

Paid = tuple[bool, ...]
"""For each shared cost of the problem, in order: whether it is paid up front."""


def paid_sets(problem: AssignmentProblem) -> list[Paid]:
    """Every set of the problem's shared costs (2^k of them)."""
    return list(itertools.product((False, True), repeat=len(problem.shared_costs)))


def upfront(problem: AssignmentProblem, paid: Paid) -> float:
    """What the shared costs in `paid` cost together."""
    return sum(s.cost for s, p in zip(problem.shared_costs, paid) if p)


def decided(problem: AssignmentProblem, paid: Paid, penalty: float) -> AssignmentProblem:
    """The problem without shared costs: those in `paid` left out of the objective (the
    caller adds `upfront`), every trigger of the others priced at `penalty` more."""
    node_costs = [c.astype(float) for c in problem.node_costs]
    matrices = [m.astype(float) for _, _, m in problem.edges]
    for shared, is_paid in zip(problem.shared_costs, paid):
        if is_paid:
            continue
        for v, i in shared.node_triggers:
            node_costs[v][i] += penalty
        for k, i, j in shared.edge_triggers:
            matrices[k][i, j] += penalty
    edges = [(u, v, m) for (u, v, _), m in zip(problem.edges, matrices)]
    return replace(problem, node_costs=node_costs, edges=edges, shared_costs=[])
