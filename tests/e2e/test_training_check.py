"""`plan check MODEL --gpus N ...`: a training plan searched with the knobs given, trained
on N local gloo ranks and in one process; the two agree."""

from __future__ import annotations

import json

import pytest

from planner import cli

LLAMA = ["llama", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16"]


@pytest.mark.timeout(300)
def test_a_pp2_tp2_training_plan_trains_as_one_process(tmp_path, capsys) -> None:
    report = tmp_path / "check.json"
    code = cli.main(["check", *LLAMA, "--gpus", "4", "--global-batch-size", "8",
                     "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                     "--steps", "2", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out
    data = json.loads(report.read_text())
    plan, check = data["plan"], data["check"]
    assert (plan["parallel"]["tensor"], plan["parallel"]["pipeline"]) == (2, 2)  # kept
    assert plan["cluster"] == "cpu" and plan["precision"] == "fp32"
    assert check["world_size"] == 4 and len(check["losses"]) == 2
    assert check["loss_max_rel_error"] < 1e-4 and check["parameter_rel_error"] < 1e-4
    # Pipeline stages exchange activations and gradients point to point.
    assert check["collectives"][0]["send"]["count"] > 0
