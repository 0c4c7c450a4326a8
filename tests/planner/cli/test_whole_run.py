"""`plan ... --train-tokens N`: every plan carries its whole run (days, GPU-hours, cost,
energy, failures) in its output and JSON, and `--objective` ranks plans by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main

BASE = ["gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch-size", "512",
        "--space", "megatron"]
KEYS = {"days", "gpu_hours", "cost_usd", "energy_kwh", "mttf_hours", "checkpoint_interval_s",
        "ettr", "expected_days", "expected_cost_usd"}


def plan_json(tmp_path: Path, *extra: str) -> dict:
    path = tmp_path / "plan.json"
    assert main([*BASE, *extra, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_a_run_of_n_tokens_is_totalled_in_the_plan(tmp_path: Path, capsys) -> None:
    plan = plan_json(tmp_path, "--train-tokens", "100B", "--gpu-hour-price", "3")
    training = plan["training"]
    assert KEYS <= training.keys()
    steps = -(-100e9 // (512 * 2048))
    assert training["steps"] == steps
    assert training["days"] == pytest.approx(steps * plan["predicted"]["step_time_s"] / 86400)
    assert training["cost_usd"] == pytest.approx(training["gpu_hours"] * 3)
    assert training["gpu_hours"] == pytest.approx(training["days"] * 24 * 64)
    assert 0 < training["ettr"] < 1
    out = " ".join(capsys.readouterr().out.split())
    assert "the whole run of each plan above" in out and "$3 per GPU-hour" in out


def test_iterations_instead_of_tokens(tmp_path: Path) -> None:
    assert plan_json(tmp_path, "--train-iters", "1000")["training"]["steps"] == 1000


def test_cost_objective_may_take_fewer_gpus(tmp_path: Path) -> None:
    """--gpus is a ceiling under --objective cost: the cheapest expected run wins, on
    however many of those GPUs (a run on half the GPUs takes about twice as long)."""
    fast = plan_json(tmp_path, "--train-tokens", "100B", "--objective", "time")
    cheap = plan_json(tmp_path, "--train-tokens", "100B", "--objective", "cost")
    assert cheap["num_gpus"] <= 64
    assert cheap["training"]["expected_cost_usd"] <= fast["training"]["expected_cost_usd"]
    assert fast["training"]["expected_days"] <= cheap["training"]["expected_days"]


CPU = ["gpt3-125m", "--cluster", "cpu", "--gpus", "8", "--global-batch-size", "64"]


@pytest.mark.parametrize(("argv", "fragment"), [
    ([*BASE, "--objective", "cost"], "--objective cost ranks plans by the whole run"),
    ([*BASE, "--train-tokens", "1T", "--train-iters", "5"], "give one"),
    ([*BASE, "--train-tokens", "lots"], "'lots' is not a token count"),
    ([*CPU, "--train-tokens", "1T"], "--cluster cpu has no run_costs"),
])
def test_bad_run_flags_get_one_line(argv: list[str], fragment: str, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert fragment in " ".join((captured.out + captured.err).split())
