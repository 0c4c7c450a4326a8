"""Tessel's side of `benchmarks/vs_autoparallel.py`: plan one model of the family three ways.

1. Under AutoParallel's constraints (what the ratio compares): the input batch split on
   mesh axis 0 and replicated on the others, and the parameters' memory capped as
   AutoParallel caps it (`autoparallel_parameter_budget`).
2. Unconstrained: Tessel's own problem (its per-device memory limit only).
3. AutoParallel's parameter placements pinned (when given): the step Tessel's cost model
   predicts for the best plan with AutoParallel's layout of the parameters, its identical
   blocks tied as AutoParallel ties them, and (a lower bound) untied.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch.distributed.tensor import Replicate, Shard

from model_family import ModelSpec, build
from passes.dtensor_rules import Placements, fake_mesh
from passes.strategies import NodeStrategies, enumerate_strategies
from passes.trace import trace
from planner.search.intra_op import MemoryBudget, plan_intra_op
from planner.vocabulary.cluster import Cluster


def run_tessel(spec: ModelSpec, pinned: dict[str, list[str]] | None,
               start: float | None = None) -> dict:
    """The three plans of `spec`; `planned_s` is the time from `start` (the process's
    first line, by default now) to the plan under AutoParallel's constraints."""
    start = time.perf_counter() if start is None else start
    model, example = build(spec)
    program = trace(model, (example,))
    mesh = fake_mesh(spec.mesh)
    cluster = Cluster.load("cpu")
    table = enumerate_strategies(program, mesh, cluster.device)
    prepared = time.perf_counter()
    batch = (Shard(0),) + (Replicate(),) * (len(spec.mesh) - 1)
    inputs = {name: batch for name in program.user_inputs}
    budget = autoparallel_parameter_budget(program, table, mesh)
    like = _solve(program, _pinned(table, inputs), mesh, cluster, budget)
    answer = {"prepare_s": prepared - start, "planned_s": time.perf_counter() - start,
              "like_autoparallel": like,
              # The same problem without tying identical blocks: what tying buys.
              "like_untied": _solve(program, _pinned(table, inputs), mesh, cluster, budget,
                                    tie_blocks=False),
              "free": _solve(program, table, mesh, cluster, None, tie_blocks=False)}
    if pinned:
        by_fqn = {fqn: name for name, fqn in program.parameters.items()}
        wanted = {by_fqn[fqn]: tuple(_placement(p) for p in texts)
                  for fqn, texts in pinned.items() if fqn in by_fqn}
        constrained = _pinned(table, {**inputs, **wanted})
        # AutoParallel's plan ties its repeated blocks (forward and backward, clustered by
        # op, stack trace and strategies), so its layout is priced with the blocks tied as
        # Tessel ties them; the untied completion, a lower bound on any plan with these
        # placements, is shown beside it.
        answer["autoparallel_layout"] = _solve(program, constrained, mesh, cluster, None)
        answer["autoparallel_layout_untied"] = _solve(program, constrained, mesh, cluster,
                                                      None, tie_blocks=False)
        answer["autoparallel_layout"]["unmatched"] = sorted(
            program.parameters[n] for n, p in wanted.items()
            if constrained[n].strategies[0].outputs[0] != p)
        # What AutoParallel's layout spends of the budget, counted as Tessel counts it.
        answer["autoparallel_layout"]["budget_used"] = sum(
            constrained[n].strategies[0].memory_bytes
            / max(s.memory_bytes for s in table[n].strategies)
            for n in program.parameters if n in wanted) / budget.limit
    return answer


def autoparallel_parameter_budget(program, table: dict[str, NodeStrategies],
                                  mesh) -> MemoryBudget:
    """AutoParallel's parameter memory constraint (`add_parameter_memory_constraint` with
    its defaults): the sum over parameters of the fraction each device holds is at most
    the sum over parameters of max(its least fraction, 1 / devices). Counted per
    parameter, not per byte, as it does."""
    devices = math.prod(mesh.shape)
    amounts, limit = {}, 0.0
    for name in program.parameters:
        full = max(s.memory_bytes for s in table[name].strategies)
        fractions = np.array([s.memory_bytes / full for s in table[name].strategies])
        amounts[name] = fractions
        limit += max(float(fractions.min()), 1.0 / devices)
    return MemoryBudget(amounts, limit * (1 + 1e-9))


def _placement(text: str):
    if text == "R":
        return Replicate()
    if text.startswith("S("):
        return Shard(int(text[2:-1]))
    raise ValueError(f"a parameter placed as {text!r} has no Tessel strategy")


def _pinned(table: dict[str, NodeStrategies],
            wanted: dict[str, Placements]) -> dict[str, NodeStrategies]:
    """The table with each node of `wanted` keeping only the strategies that place it so
    (all of them where none does)."""
    out = dict(table)
    for name, placements in wanted.items():
        keep = [s for s in table[name].strategies if s.outputs[0] == placements]
        if keep:
            node = table[name]
            out[name] = NodeStrategies(node.name, node.kind, node.sources, keep)
    return out


# Reductions of the ILP the benchmark can switch off, to show what each one buys
# (`--without tie_blocks`): keyword arguments of `plan_intra_op`.
SWITCHED_OFF: dict[str, bool] = {}


def _solve(program, table, mesh, cluster, budget: MemoryBudget | None, **options) -> dict:
    start = time.perf_counter()
    solution = plan_intra_op(program, table, mesh, cluster, time_limit_s=600.0,
                             memory_budget=budget,
                             # AutoParallel ties identical blocks: so does the like-for-like
                             # run (unless switched off); Tessel's own plans do not.
                             **{"tie_blocks": True, **SWITCHED_OFF, **options})
    a = solution.assignment
    return {"variables": solution.num_variables, "status": a.status, "gap": a.gap,
            "solver": a.solver, "solve_s": a.solve_time_s,
            "ilp_s": time.perf_counter() - start,
            "objective_s": a.objective,
            "step_s": solution.compute_s + solution.communication_s}


if __name__ == "__main__":  # quick look at one model: python benchmarks/family_planning.py
    import json
    import sys

    from model_family import draw_family

    torch.set_num_threads(1)
    print(json.dumps(run_tessel(draw_family(0, 12)[int(sys.argv[1])], None), indent=1))
