"""planner.checks.check_report: the `plan check` report as one pydantic model. Built here
from hand-made check results (no ranks): the JSON it writes has the layout the report had
as a dict, it reads back equal, NaN and Infinity survive, a wrong report is refused, and
docs/plan-schema.md describes every field as the models do. `tests/e2e/test_plan_check_report.py`
writes it from real checks of every kind."""

from __future__ import annotations

import json
import math
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from planner.checks.check_report import (
    REPORT_KEYS,
    ActivationRowReport,
    CheckErrors,
    CollectiveCount,
    ComparisonDetails,
    GroupCollectives,
    HeldBytes,
    MemoryRowReport,
    OperatorCheckDetails,
    PlanCheckReport,
    RankCollectives,
    RankReport,
    TrainingCheckDetails,
    TrainingRunDetails,
    operator_report,
    training_report,
)
from planner.checks.operator import CheckReport
from planner.checks.training_check import ActivationRow, MemoryRow, PlanComparison, TrainingCheck
from planner.vocabulary.plan import Plan
from tests.planner.vocabulary.test_plan import plan_data

REPO = Path(__file__).resolve().parents[3]
SCHEMA_DOC = REPO / "docs" / "plan-schema.md"
# The report's models in the order docs/plan-schema.md lists them.
DOCUMENTED = (PlanCheckReport, CheckErrors, RankReport, RankCollectives, CollectiveCount,
              HeldBytes, OperatorCheckDetails, TrainingCheckDetails, TrainingRunDetails,
              GroupCollectives, ComparisonDetails, MemoryRowReport, ActivationRowReport)

ALL_REDUCE = {"all_reduce": {"count": 2, "bytes": 4096}}


@pytest.fixture
def plan() -> Plan:
    return Plan.model_validate(plan_data())


def operator_check() -> CheckReport:
    over_steps = {"measured": {"all_reduce": {"count": 4, "bytes": 8192}},
                  "predicted": {"all_reduce": {"count": 4, "bytes": 8192}}}
    return CheckReport(
        passed=True, steps=2, max_abs_error=1e-7, max_rel_error=2e-7, losses=[1.5, 1.25],
        reference_losses=[1.5, 1.25], measured_communication=ALL_REDUCE,
        predicted_communication=ALL_REDUCE, communication_matches=True,
        rank_communication=[over_steps, over_steps],
    )


def training_check() -> tuple[TrainingCheck, PlanComparison]:
    per_rank = {"all_reduce": {"count": 6, "bytes": 96}, "send": {"count": 2, "bytes": 64}}
    group = {"kind": "all_reduce", "ranks": [0, 1], "count": 6, "bytes": 96}
    check = TrainingCheck(
        world_size=2, losses=[4.0, None, 3.5], reference_losses=[4.0, None, 3.5],
        loss_max_abs_error=0.0, loss_max_rel_error=1e-8, parameter_max_abs_error=3e-8,
        parameter_rel_error=2e-8, collectives=[per_rank, per_rank],
        collectives_by_group=[[group], [{**group, "ranks": None}]],
        collectives_per_step=[[ALL_REDUCE] * 3, [ALL_REDUCE] * 3],
        local_bytes=[{"parameters": 1024}, {"parameters": 1024}],
        saved_activations=[{0: [512, 512]}, {1: [256, 256]}],
        coordinates=[{"pp": 0, "dp": 0, "tp": 0}, {"pp": 0, "dp": 0, "tp": 1}],
        steps_run=3, attempt=1, resumed_from=2, skipped=[1], stragglers={1: 2.5},
    )
    comparison = PlanComparison(
        measured=[per_rank, per_rank], predicted=[per_rank, per_rank],
        memory=[MemoryRow(rank=r, kind="parameters", measured=1024, predicted=1024)
                for r in range(2)],
        activations=[ActivationRow(rank=0, stage=0, micro_batch=0, measured=512,
                                   predicted=512, note="")],
    )
    return check, comparison


def legacy_operator_report(kind: str, plan: Plan, report: CheckReport) -> dict:
    """The report as `plan check --json` wrote it when it was a dict (before the model)."""
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


def legacy_training_report(plan: Plan, check: TrainingCheck, comparison: PlanComparison,
                           passed: bool) -> dict:
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


@pytest.mark.parametrize("kind", ["mesh", "graph"])
def test_an_operator_report_writes_the_dicts_layout_and_reads_back(kind: str,
                                                                   plan: Plan) -> None:
    check = operator_check()
    report = operator_report(kind, plan, check)
    text = report.to_json()
    legacy = json.dumps(legacy_operator_report(kind, plan, check), indent=2)
    assert text == legacy
    assert tuple(json.loads(text)) == REPORT_KEYS
    read = PlanCheckReport.from_json(text)
    assert read == report and isinstance(read.details, OperatorCheckDetails)
    assert read.plan == plan
    assert read.ranks[1].collectives.measured["all_reduce"].bytes == 8192


def test_a_training_report_writes_the_dicts_layout_and_reads_back(tmp_path: Path,
                                                                  plan: Plan) -> None:
    check, comparison = training_check()
    report = training_report(plan, check, comparison, passed=True)
    path = tmp_path / "report.json"
    text = report.to_json(path)
    assert path.read_text() == text + "\n"
    legacy = legacy_training_report(plan, check, comparison, True)
    assert text == json.dumps(legacy, indent=2)
    read = PlanCheckReport.from_json(path)
    assert read == report and isinstance(read.details, TrainingCheckDetails)
    assert read.details.check.saved_activations[1] == {1: [256, 256]}
    assert read.details.check.stragglers == {1: 2.5}
    assert read.details.comparison.passed
    assert read.ranks[1].coordinates["tp"] == 1
    assert read.ranks[0].held_bytes == HeldBytes(measured={"parameters": 1024},
                                                 predicted={"parameters": 1024})


def test_a_diverged_runs_nan_and_infinity_survive_the_round_trip(plan: Plan) -> None:
    check = operator_check()
    check.max_abs_error, check.losses = math.inf, [math.nan, 1.0]
    text = operator_report("mesh", plan, check).to_json()
    assert '"max_abs": Infinity' in text and "NaN" in text  # as json.dumps writes them
    read = PlanCheckReport.from_json(text)
    assert read.errors.max_abs == math.inf and math.isnan(read.losses[0])


def test_a_wrong_report_is_refused(plan: Plan) -> None:
    data = json.loads(operator_report("mesh", plan, operator_check()).to_json())
    with pytest.raises(ValidationError, match="kind"):
        PlanCheckReport.model_validate({**data, "kind": "cluster"})
    with pytest.raises(ValidationError, match="errors"):
        PlanCheckReport.model_validate({k: v for k, v in data.items() if k != "errors"})
    with pytest.raises(ValidationError, match="extra"):
        PlanCheckReport.model_validate({**data, "verdict": "ok"})


# -- docs/plan-schema.md, "The plan check report" -------------------------------------------


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return annotation.__name__


def model_section(model: type[BaseModel]) -> str:
    """A model's heading, docstring and field table, as docs/plan-schema.md writes them."""
    doc = " ".join((model.__doc__ or "").split())
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [f"| `{name}` | {cell(_type_name(f.annotation))} | "
            f"{'required' if f.is_required() else repr(f.default)} | {cell(f.description)} |"
            for name, f in model.model_fields.items()]
    return "\n".join([f"### {model.__name__}", "", doc, "",
                      "| field | type | default | meaning |", "|---|---|---|---|", *rows])


def test_the_schema_doc_describes_every_field_of_the_report() -> None:
    text = SCHEMA_DOC.read_text()
    assert "## The plan check report" in text
    missing = [model.__name__ for model in DOCUMENTED if model_section(model) not in text]
    assert not missing, ("docs/plan-schema.md differs from these models; regenerate its "
                         "tables with `python -m tests.planner.checks.test_check_report`: "
                         f"{missing}")
    # Every model the report holds is documented (the Plan has its own section above).
    assert set(DOCUMENTED) == _nested_models(PlanCheckReport) - {Plan}


def _nested_models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        if current is Plan:
            continue
        for f in current.model_fields.values():
            stack = [f.annotation]
            while stack:
                a = stack.pop()
                stack.extend(typing.get_args(a))
                if isinstance(a, type) and issubclass(a, BaseModel):
                    todo.append(a)
    return found


if __name__ == "__main__":  # python -m tests.planner.checks.test_check_report
    print("\n\n".join(model_section(model) for model in DOCUMENTED))
