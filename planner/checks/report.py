"""One JSON report for every `plan check`: an operator-level plan on a mesh (``mesh``), a
training plan of a transformer (``training``) and a graph plan of any model (``graph``)
are written with the same top-level keys (`REPORT_KEYS`), so that a script reads any of
them alike; what only one kind measures goes under ``details``.

- ``kind``: mesh, training or graph; ``plan``: the Plan checked (its JSON);
- ``passed``: losses and parameters within tolerance of one process, and every measured
  collective and held byte as predicted;
- ``steps``; ``losses`` and ``reference_losses`` per step (null for a batch skipped on
  divergence);
- ``errors``: ``max_abs`` and ``max_rel``, over the losses and the final parameters;
- ``ranks``: per rank, its ``coordinates`` on the mesh axes (training plans), its
  ``collectives`` measured and predicted over the steps (count and bytes per kind) and
  its ``held_bytes`` measured and predicted per kind (training plans; empty otherwise);
- ``mismatches``: one line per measurement that differs from its prediction;
- ``details``: the kind's own report (training: the run's `TrainingCheck` and the
  comparison's rows; mesh and graph: `planner.checks.operator.CheckReport`).
"""

from __future__ import annotations

import json
from typing import Any

from planner.checks.operator import CheckReport
from planner.vocabulary.plan import Plan
from planner.checks.training import PlanComparison

REPORT_KEYS = ("kind", "plan", "passed", "steps", "losses", "reference_losses", "errors",
               "ranks", "mismatches", "details")


def operator_report(kind: str, plan: Plan, report: CheckReport) -> dict[str, Any]:
    """The report of a mesh or graph plan's check."""
    return {
        "kind": kind, "plan": json.loads(plan.to_json()), "passed": report.passed,
        "steps": report.steps, "losses": report.losses,
        "reference_losses": report.reference_losses,
        "errors": {"max_abs": report.max_abs_error, "max_rel": report.max_rel_error},
        "ranks": [{"rank": rank, "coordinates": {}, "collectives": collectives,
                   "held_bytes": {"measured": {}, "predicted": {}}}
                  for rank, collectives in enumerate(report.rank_communication)],
        "mismatches": list(report.mismatches),
        "details": report.to_dict(),
    }


def training_report(plan: Plan, check: Any, comparison: PlanComparison,
                    passed: bool) -> dict[str, Any]:
    """The report of a training plan's check (`check`: `planner.checks.training.TrainingCheck`)."""
    ranks = []
    for rank, coordinates in enumerate(check.coordinates):
        rows = [row for row in comparison.memory if row.rank == rank]
        ranks.append({
            "rank": rank, "coordinates": coordinates,
            "collectives": {"measured": comparison.measured[rank],
                            "predicted": comparison.predicted[rank]},
            "held_bytes": {"measured": {row.kind: row.measured for row in rows},
                           "predicted": {row.kind: row.predicted for row in rows}},
        })
    return {
        "kind": "training", "plan": json.loads(plan.to_json()), "passed": passed,
        "steps": len(check.losses), "losses": check.losses,
        "reference_losses": check.reference_losses,
        "errors": {"max_abs": max(check.loss_max_abs_error, check.parameter_max_abs_error),
                   "max_rel": max(check.loss_max_rel_error, check.parameter_rel_error)},
        "ranks": ranks, "mismatches": list(comparison.mismatches),
        "details": {"check": check.to_dict(), "comparison": comparison.to_dict()},
    }
