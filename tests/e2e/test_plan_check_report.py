"""One `plan check` report: an operator-level plan on a mesh, a training plan and a graph
plan write their JSON with the same top-level keys, read here alike and validated as the
one `PlanCheckReport` model; and none of the three prints a warning (the ranks' output
included: `make demo` runs the same checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli
from planner.checks.check_report import REPORT_KEYS, PlanCheckReport

REPO = Path(__file__).resolve().parents[2]
GPT = ["gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
       "--vocab-size", "64", "--seq-length", "8"]
CHECKS = {
    "mesh": ["demo:mlp", "--mesh", "2"],
    "training": [*GPT, "--gpus", "2", "--global-batch-size", "4",
                 "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"],
    "graph": [f"{REPO / 'tests/e2e/graph_models.py'}:narrow_mlp", "--cluster",
              str(REPO / "tests/fixtures/small_memory.yaml"), "--gpus", "2",
              "--global-batch-size", "8", "--micro-batch-size", "4"],
}


@pytest.mark.timeout(240)
def test_every_kind_of_check_writes_the_same_report(tmp_path: Path, capfd) -> None:
    for kind, argv in CHECKS.items():
        path = tmp_path / f"{kind}.json"
        assert cli.main(["check", *argv, "--steps", "2", "--json", str(path)]) == 0, kind
        out, err = capfd.readouterr()  # file descriptors: the forked ranks' output too
        assert "Warning" not in out + err and "warnings.warn" not in out + err, kind
        report = json.loads(path.read_text())
        assert tuple(report) == REPORT_KEYS, kind
        model = PlanCheckReport.from_json(path)  # the schema docs/plan-schema.md describes
        assert model.kind == kind and model.to_json() + "\n" == path.read_text()
        assert report["kind"] == kind and report["passed"] and not report["mismatches"]
        assert report["steps"] == len(report["losses"]) == len(report["reference_losses"]) == 2
        assert report["errors"]["max_rel"] < 1e-4
        assert len(report["ranks"]) == 2
        for rank in report["ranks"]:
            # Every collective as predicted, on every rank, and some were issued.
            assert rank["collectives"]["measured"] == rank["collectives"]["predicted"] != {}
            held = rank["held_bytes"]
            assert set(held["measured"]) == set(held["predicted"])
        if kind == "training":  # held bytes are measured on training plans
            assert report["ranks"][0]["held_bytes"]["measured"]
            assert report["ranks"][1]["coordinates"]["tp"] == 1
