"""The `plan` command end to end: planning, JSON, per-rank code, and `plan check`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.vocabulary.plan import Plan

REPO = Path(__file__).parents[2]


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )


def test_plan_writes_json_and_one_program_per_rank(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    code_dir = tmp_path / "code"
    result = run_plan("demo:mlp", "--mesh", "4", "--json", str(plan_path),
                      "--emit-code", str(code_dir))
    assert result.returncode == 0, result.stderr
    assert "fc1" in result.stdout and "S(0)" in result.stdout  # the summary names shardings
    plan = Plan.from_json(plan_path)
    assert plan.mesh_shape == [4]
    assert plan.parameters["fc1.weight"] == "S(0)" and plan.parameters["fc2.weight"] == "S(1)"
    programs = sorted(code_dir.glob("rank*.py"))
    assert [p.name for p in programs] == ["rank0.py", "rank1.py", "rank2.py", "rank3.py"]
    for program in programs:
        text = program.read_text()
        compile(text, str(program), "exec")  # valid Python
        assert len(re.findall(r"_c10d_functional\.all_reduce\.default", text)) == 1
        # Each rank holds a quarter of fc1's [4096, 1024] weight: [1024, 1024].
        assert "(arg0_1, [1024, 1024])" in text


def test_plan_check_reports_agreement_as_json(tmp_path: Path) -> None:
    report_path = tmp_path / "check.json"
    result = run_plan("check", "demo:mlp", "--mesh", "4", "--steps", "2",
                      "--json", str(report_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    assert report["errors"]["max_rel"] < 1e-4
    assert report["errors"]["max_abs"] < 1e-4
    # Every rank: one all-reduce of fc1's gradient a step, over the 2 steps.
    assert [rank["collectives"] for rank in report["ranks"]] == 4 * [
        {"measured": {"all_reduce": {"count": 2, "bytes": 65536}},
         "predicted": {"all_reduce": {"count": 2, "bytes": 65536}}}]
    assert len(report["losses"]) == 2


def test_plan_models_lists_presets_with_parameter_counts() -> None:
    result = run_plan("models")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()
            if line.strip() and line.split()[0] in ("gpt3-175b", "llama3-70b", "mixtral-8x7b",
                                                    "deepseek-v3")}
    assert rows["gpt3-175b"][1:3] == ["174.62", "-"]
    assert rows["llama3-70b"][1] == "70.55"
    assert rows["mixtral-8x7b"][1:3] == ["46.70", "12.88"]
    # DeepSeek-V3: 671B, 37B active (its report), 256 routed experts and a shared one.
    assert rows["deepseek-v3"][1:3] == ["671.03", "37.55"]
    assert rows["deepseek-v3"][-2:] == ["256+sh", "top-8"]


def test_a_plan_cut_short_by_the_time_limit_says_so(monkeypatch, capsys) -> None:
    """An ILP stopped before it proves optimality (here after 0.05 s, whatever the machine:
    the 2-D GPT demo's root LP alone takes seconds) gives the best plan found so far, and
    the output tells the user how to get a better one. (The demo is small enough for exact
    elimination, which never stops short, so the test sends it to the ILP.)"""
    from planner import cli
    from planner.search import intra_op

    solve = intra_op.solve_with_fixing

    def cut_short(problem, time_limit_s, backend):
        return solve(problem, time_limit_s=0.05, backend=backend)

    monkeypatch.setattr(intra_op, "solve_by_elimination", lambda problem: None)
    monkeypatch.setattr(intra_op, "solve_with_fixing", cut_short)
    assert cli.main(["demo:gpt", "--mesh", "2x2", "--time-limit", "60"]) == 0
    out = capsys.readouterr().out
    assert "not proven optimal" in out
    assert "raise --time-limit" in out


def test_plan_check_gpus_plans_and_trains_a_model_of_ones_own(tmp_path: Path) -> None:
    """`plan check FILE.py:function --gpus N`: the graph plan (stages on submeshes), trained
    on N gloo ranks; the report holds the Plan and the check, and they agree."""
    out = tmp_path / "report.json"
    result = run_plan(
        "check", f"{REPO / 'tests/e2e/graph_models.py'}:narrow_mlp", "--cluster",
        str(REPO / "tests/fixtures/small_memory.yaml"), "--gpus", "4",
        "--global-batch-size", "16", "--micro-batch-size", "4", "--steps", "1",
        "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    report = json.loads(out.read_text())
    plan = Plan.model_validate(report["plan"])
    assert plan.layer_cuts and plan.num_gpus == 4
    assert sum(stage.num_devices for stage in plan.stages) == 4
    assert report["details"]["communication_matches"]


def test_a_graph_plan_prices_the_whole_run(tmp_path: Path) -> None:
    """`--train-iters N` on a model of one's own: the run's days, GPU-hours and cost from
    the plan's predicted step, and a checkpoint of its weights and AdamW state."""
    out = tmp_path / "plan.json"
    result = run_plan(
        f"{REPO / 'tests/e2e/graph_models.py'}:narrow_mlp", "--cluster", "aws-p3.16xlarge",
        "--gpus", "4", "--global-batch-size", "16", "--train-iters", "1000000",
        "--gpu-hour-price", "3", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the whole run of each plan above: 1,000,000 steps" in result.stdout
    plan = Plan.model_validate_json(out.read_text())
    totals = plan.training
    step = plan.predicted.step_time_s
    assert totals.steps == 1_000_000
    assert totals.gpu_hours == pytest.approx(1_000_000 * step * 4 / 3600)
    assert totals.cost_usd == pytest.approx(3 * totals.gpu_hours)
    # narrow_mlp: 32*48 + 48 + 48*64 + 64 + 64*40 + 40 + 40*16 + 16 parameters; fp32
    # weights and AdamW's two moments are written (gradients are not).
    assert totals.checkpoint_bytes == (1584 + 3136 + 2600 + 656) * (4 + 8)
