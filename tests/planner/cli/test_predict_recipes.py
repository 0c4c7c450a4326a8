"""`plan predict` of the two MoE recipe lines of ../shared/calibration/moe_recipes.csv, run
as their launcher ran them (its environment with --env, its Slurm segments with
--segment): the band printed with its evidence, and the step each recipe measured inside
it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cost_models.moe_calibration import bridge_scale_up_domain
from planner import cli
from planner.calibration.evidence_rows import CALIBRATION
from planner.megatron.recipe_runs import RECIPE_ENVIRONMENT, RECIPES, SYSTEMS, recipe_words

pytestmark = pytest.mark.skipif(not (CALIBRATION / RECIPES).is_file(),
                                reason="../shared/calibration/ is not beside the repository")
EVIDENCE = {"Qwen3-235B-A22B": "Megatron-LM, MoE on Blackwell: 2 published runs",
            "DeepSeek-V3": "Megatron-LM, MLA+MoE on Hopper: 1 published run"}


def recipes() -> list[dict[str, str]]:
    if not (CALIBRATION / RECIPES).is_file():
        return []
    with open(CALIBRATION / RECIPES, encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", recipes(), ids=lambda row: row["model"])
def test_a_recipe_line_prints_its_band_and_evidence_and_lands_in_it(
        row: dict[str, str], capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cli.console, "_width", 400)
    preset, gpus = SYSTEMS[row["gpu"]], int(row["num_gpus"])
    argv = ["predict", "--cluster", preset, "--gpus", str(gpus), "--no-search",
            "--json", str(tmp_path / "prediction.json")]
    for name, value in RECIPE_ENVIRONMENT.get((row["model"], row["gpu"]), {}).items():
        argv += ["--env", f"{name}={value}"]
    domain = bridge_scale_up_domain(preset, gpus)
    if domain is not None:  # GB200: four racks of 64, as Bridge's launcher asks Slurm
        argv += ["--segment", str(domain // 4)]
    assert cli.main([*argv, "--", *recipe_words(row["megatron_flags"])]) == 0
    out = capsys.readouterr().out
    assert "expect a measured step of" in out and EVIDENCE[row["model"]] in out
    predicted = json.loads((tmp_path / "prediction.json").read_text())["launch_line"]
    low, high = predicted["predicted"]["step_time_band_s"]
    tokens = predicted["global_batch_size"] * predicted["architecture"]["seq_length"]
    measured_step = tokens / (float(row["value"]) * gpus)
    assert low <= measured_step <= high, (low, measured_step, high)
    assert predicted["predicted"]["band"]["rows"] >= 1
