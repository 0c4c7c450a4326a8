"""Solve the intra-op problem with identical blocks tied to one layout, as fast as it goes.

Tying (`presolve.tie_nodes`) shrinks the ILP, but it closes each block's template into a
ring (block k's output feeds block k+1's input, now the same node), which widens the
network variable elimination works on: on a 2-block GPT the largest tables grow from
8e7 entries to 6e8, past what elimination takes on. So the tied problem is solved by
the first of:

0. where the memory limit binds, the ILP of the tied problem (the rest cannot prove an
   optimum the limit shapes);
1. elimination of the tied network, where its tables are small enough (first of its
   pairwise bounds where several ops read one value: `shared_reads.certified_by_bounds`);
2. where the tied network is too wide, elimination of the untied network, whose optimum
   is the tied one whenever it already gives every tied group one choice (the tied
   problem only removes assignments);
3. the ILP of the tied problem.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from planner.search.elimination import eliminable, ilp_variables, solve_by_elimination
from planner.search.lp_fixing import solve_with_fixing
from planner.search.presolve import merge_parallel_edges, prune_dominated, tie_nodes
from planner.search.shared_reads import certified_by_bounds
from planner.search.solver import (
    Assignment, AssignmentProblem, memory_of, solve_greedy,
)


BOUND_ILP_S = 5.0
"""Most seconds the ILP of a pairwise bound may take (`certified_by_bounds`): a bound pays
only when it proves the optimum sooner than the exact ILP would, and one that proves
nothing is time lost, so it is cut off at about what a mid-sized exact ILP takes (the
cases: docs/graph-plans.md, "Measured")."""


BOUND_ILP_VARIABLES = 200_000
"""Most ILP variables of a pairwise bound solved by the ILP (where elimination declines
it): past this the bound's ILP cannot end in `BOUND_ILP_S`, and its time is lost to the
exact solve (a 2x4 T5's 322k variables: 9 s; docs/graph-plans.md, "Measured")."""


def solve_tied(problem: AssignmentProblem, groups: list[list[int]], time_limit_s: float,
               backend: str, eliminate: Callable = solve_by_elimination,
               ilp: Callable = solve_with_fixing) -> tuple[Assignment, int]:
    """The optimal assignment of `problem` in which the nodes of each group take one choice
    (its `choices` are `problem`'s), and the variables of the problem the solver saw.
    `eliminate` and `ilp` are the two exact solvers (the caller's, so that a test can
    stand in for either)."""
    tied, tying = tie_nodes(problem, groups)
    reduced, pruning = prune_dominated(merge_parallel_edges(tied))
    variables = ilp_variables(reduced)
    # Where the memory limit shapes the plan, elimination (which finds the optimum memory
    # aside) and the pairwise bounds (readers of one value then split over placements, so
    # the moves they share decide the plan) prove nothing: on every model of
    # vs_autoparallel's family under AutoParallel's cap they were time lost.
    if _memory_binds(reduced):
        solved = ilp(reduced, time_limit_s=time_limit_s, backend=backend)
        return _with_choices(solved, tying.expand(pruning.expand(solved.choices))), variables
    # Shared reads make elimination's tables larger (the readers of a value meet in one)
    # and the LP slower (a variable per move and reader): where the moves readers could
    # share decide nothing, the pairwise bounds prove the optimum faster.
    eliminated = not reduced.reads  # whether a bound was solved by elimination

    def pairwise(bound: AssignmentProblem) -> Assignment | None:
        nonlocal eliminated
        solved = eliminate(bound)
        eliminated = eliminated or solved is not None
        if solved is None and ilp_variables(bound) >= BOUND_ILP_VARIABLES:
            return None
        if solved is None:  # the ILP, for a while: the rest is the exact solve's
            solved = ilp(bound, time_limit_s=min(time_limit_s / 2, BOUND_ILP_S),
                         backend=backend)
        return solved if solved.status == "OPTIMAL" else None

    solved = certified_by_bounds(reduced, pairwise) if reduced.reads else None
    # With shared reads elimination's tables outgrow the bounds' (a 2x4 ViT's 8e7 entries
    # become 8e8): worth building only where a bound's were built and its optimum kept
    # the memory limit, else the ILP answers.
    if solved is None and eliminated:
        solved = eliminate(reduced)
    # Where the tied network was eliminated and its optimum broke the memory limit, an
    # untied optimum that is symmetric would be a tied optimum too: not worth the
    # elimination's time, the ILP answers exactly.
    if solved is None and groups and eliminated and not eliminable(reduced):
        free, free_pruning = prune_dominated(merge_parallel_edges(problem))
        untied = eliminate(free)
        if untied is not None:
            choices = free_pruning.expand(untied.choices)
            if all(len({choices[v] for v in group}) == 1 for group in groups):
                return _with_choices(untied, choices), ilp_variables(free)
    if solved is None:
        solved = ilp(reduced, time_limit_s=time_limit_s, backend=backend)
    return _with_choices(solved, tying.expand(pruning.expand(solved.choices))), variables


def _memory_binds(problem: AssignmentProblem) -> bool:
    """Whether the cheapest layout a greedy pass finds, memory aside, breaks the limit."""
    unlimited = replace(problem, memory_limit=math.inf)
    return memory_of(problem, solve_greedy(unlimited)) > problem.memory_limit


def _with_choices(assignment: Assignment, choices: list[int]) -> Assignment:
    return Assignment(choices, assignment.objective, assignment.gap, assignment.status,
                      assignment.solve_time_s, assignment.solver)
