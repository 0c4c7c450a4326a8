"""`plan ... --bandwidth-sweep`: the best plan's step by each tier's bandwidth and where its
communication hides, printed after the plans; refused by name where there is no pipeline
to sweep."""

from __future__ import annotations

from cost_models.bandwidth_sweep import HIDDEN
from planner.cli.main import main


def test_plan_prints_the_best_plans_sweep(capsys) -> None:
    assert main(["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
                 "--global-batch-size", "1536", "--bandwidth-sweep"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the best plan's step by bandwidth, 1,024 x dgx-a100-80g" in out
    for tier in ("scale-up", "scale-out"):
        assert f"{tier}: communication hides (step within {HIDDEN:.0%} of an unbounded " \
               "link's" in out


def test_an_operator_level_plan_refuses_the_sweep_by_name(capsys) -> None:
    assert main(["demo:mlp", "--mesh", "2", "--bandwidth-sweep"]) == 2
    said = capsys.readouterr()
    assert "--bandwidth-sweep" in said.out + said.err
