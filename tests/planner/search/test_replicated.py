"""A plan in which every rank computes the whole step says why, in the ILP's own prices
(`planner.search.replicated`): the most any sharding could save against data parallelism's
gradient all-reduce; a plan that splits its work says nothing."""

from __future__ import annotations

import re

from planner.api import plan_model
from planner.cli.main import main
from planner.models.demo import gpt, mlp


def test_a_replicated_plan_names_the_saving_and_the_all_reduce() -> None:
    model, inputs = gpt()
    plan = plan_model(model, inputs, (2, 2), "cpu").plan
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    [note] = plan.replicated_notes()
    match = re.fullmatch(
        r"replicated: each of the 4 ranks computes the whole step, as splitting its "
        r"operators saves at most ([\d.]+) of their ([\d.]+) ms per micro-batch(.*), while "
        r"data parallelism's gradient all-reduce alone costs ([\d.]+) ms per step "
        r"\(([\d,]+) B in 1 bucket\)", note)
    assert match, note
    saved, compute, _, sync, nbytes = match.groups()
    assert float(compute) == round(plan.predicted.compute_s * 1e3, 3)
    assert 0 <= float(saved) <= float(compute)
    # Replicated is the better plan: the all-reduce costs more than the compute it saves.
    assert float(sync) > float(saved)
    assert int(nbytes.replace(",", "")) == parameter_bytes
    assert not plan.communication  # no collective at all


def test_a_plan_that_splits_its_work_says_nothing() -> None:
    model, inputs = mlp(batch=64, in_features=1024, hidden=4096)
    plan = plan_model(model, inputs, (4,), "dgx-h100").plan
    assert plan.communication and plan.replicated_notes() == []


def test_plan_prints_the_reason(capsys) -> None:
    assert main(["demo:gpt", "--mesh", "4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "replicated: each of the 4 ranks computes the whole step" in out
