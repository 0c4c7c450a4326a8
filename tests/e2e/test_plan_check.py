"""Plans trained for real on gloo ranks, against one process.

Every test here plans a model, then trains it on forked gloo ranks and on one process
(`planner.checks.operator.check_plan`): losses and final parameters must agree in fp32, and each
rank must issue exactly the collectives the plan predicted, kind by kind, in count and
bytes.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

from planner.api import PlannedModel, plan_model
from planner.checks.operator import CheckReport, check_plan
from planner.vocabulary.cluster import Cluster
from planner.models import demo

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "models"))
sys.path.insert(0, str(HERE))

import hf_tiny  # noqa: E402
from models_without_rules import nearest_centers  # noqa: E402

# Devices that compute slowly next to their links, so that the tiny models are
# compute-bound as real ones are on GPUs (on the `cpu` preset they are latency-bound and
# the optimum replicates everything, which would make these checks trivial).
COMPUTE_BOUND = Cluster.load(str(HERE.parent / "fixtures" / "compute_bound.yaml"))

MODELS = {
    "demo:gpt": lambda: (*demo.gpt(), None),
    "hf:gpt2": hf_tiny.gpt2,
    "hf:llama": hf_tiny.llama,
    "demo:mlp": lambda: (*demo.mlp(), None),
    "demo:mlp-wide-batch": lambda: (
        *demo.mlp(batch=4096, in_features=64, hidden=64, out_features=64),
        None,
    ),
    "cdist": lambda: (*nearest_centers(), None),
}


@functools.lru_cache(maxsize=None)
def planned(name: str, mesh: tuple[int, ...], cluster: str) -> tuple[tuple, PlannedModel]:
    import torch

    torch.manual_seed(0)
    model, inputs, loss_fn = MODELS[name]()
    spec = COMPUTE_BOUND if cluster == "compute-bound" else cluster
    # A 2x2 mesh gives the ILP tens of thousands of variables; the greedy incumbent and a
    # time limit keep the test short (any plan must train correctly, and train as it is
    # predicted to).
    result = plan_model(model, inputs, mesh, spec, loss_fn, name=name, time_limit_s=20)
    return (model, inputs, loss_fn), result


@functools.lru_cache(maxsize=None)
def checked(name: str, mesh: tuple[int, ...], cluster: str, steps: int = 3) -> CheckReport:
    (model, inputs, loss_fn), result = planned(name, mesh, cluster)
    return check_plan(model, result.program, result.plan, loss_fn, inputs, steps=steps)


def assert_matches_single_process(report: CheckReport) -> None:
    assert report.max_rel_error < 1e-4, report
    assert report.measured_communication == report.predicted_communication
    assert report.communication_matches, report.mismatches
    assert report.passed


def by_phase(plan, phase: str) -> dict[str, tuple[int, int]]:
    return {k: (v.count, v.bytes) for k, v in plan.operators.communication_by_phase[phase].items()}


def test_small_batch_mlp_is_column_then_row_parallel() -> None:
    _, result = planned("demo:mlp", (4,), "cpu")
    plan = result.plan
    assert plan.parameters["fc1.weight"] == "S(0)"  # split by output features
    assert plan.parameters["fc1.bias"] == "S(0)"
    assert plan.parameters["fc2.weight"] == "S(1)"  # split by input features
    # One all-reduce of the [8, 1024] fp32 output in the forward pass, nothing else.
    assert by_phase(plan, "forward") == {"all_reduce": (1, 8 * 1024 * 4)}
    assert by_phase(plan, "backward") == {}
    assert by_phase(plan, "gradient_sync") == {}
    assert_matches_single_process(checked("demo:mlp", (4,), "cpu"))


def test_wide_batch_mlp_is_data_parallel() -> None:
    _, result = planned("demo:mlp-wide-batch", (4,), "cpu")
    plan = result.plan
    assert set(plan.parameters.values()) == {"R"}
    assert list(plan.operators.inputs.values()) == ["S(0)"]
    assert by_phase(plan, "forward") == {}
    assert by_phase(plan, "backward") == {}
    # One bucket: both weights and biases (64*64*2 + 64*2 floats) and the scalar loss.
    assert by_phase(plan, "gradient_sync") == {"all_reduce": (1, (64 * 64 * 2 + 64 * 2 + 1) * 4)}
    assert_matches_single_process(checked("demo:mlp-wide-batch", (4,), "cpu"))


# Every model on one mesh shape, demo:gpt on both: a 2-D plan of an HF model costs
# 25-35 s of the suite's time (tests/planner/search covers their 2-D ILPs).
@pytest.mark.parametrize(("name", "mesh"), [("demo:gpt", (4,)), ("demo:gpt", (2, 2)),
                                            ("hf:gpt2", (4,)), ("hf:llama", (2, 2))],
                         ids=["demo:gpt-4", "demo:gpt-2x2", "hf:gpt2-4", "hf:llama-2x2"])
def test_transformers_train_like_one_process(name: str, mesh: tuple[int, ...]) -> None:
    _, result = planned(name, mesh, "compute-bound")
    assert result.plan.communication, "a sharded plan communicates"
    assert_matches_single_process(checked(name, mesh, "compute-bound"))


# Parameters that hold the attention heads and the MLP hidden units, and the dimension
# their output features lie on (nn.Linear: 0; GPT-2's Conv1D stores weights transposed).
SPLIT_PARAMETERS = {
    "demo:gpt": (["attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                  "mlp.fc1.weight"], "S(0)"),
    "hf:gpt2": (["attn.c_attn.weight", "mlp.c_fc.weight"], "S(1)"),
    "hf:llama": (["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"],
                 "S(0)"),
}


@pytest.mark.parametrize("name", list(SPLIT_PARAMETERS))
def test_small_batch_splits_attention_heads_and_mlp_hidden(name: str) -> None:
    _, result = planned(name, (4,), "compute-bound")
    plan = result.plan
    suffixes, placement = SPLIT_PARAMETERS[name]
    for suffix in suffixes:
        matching = {f: p for f, p in plan.parameters.items() if f.endswith(suffix)}
        assert len(matching) == 2, suffix  # one per block
        assert set(matching.values()) == {placement}, matching
    attention = [n for n in plan.operators.nodes.values()
                 if "flash_attention_for_cpu.default" in n.op]
    assert len(attention) == 2
    for node in attention:
        assert node.inputs[:3] == ["S(1)"] * 3  # q, k, v split by heads
        assert node.outputs[0] == "S(1)"


def test_op_without_sharding_rule_is_replicated_and_listed() -> None:
    _, result = planned("cdist", (2,), "cpu")
    ops = {f.op for f in result.plan.operators.fallback_ops}
    assert ops == {"aten._cdist_forward.default", "aten._cdist_backward.default"}
    for fallback in result.plan.operators.fallback_ops:
        node = result.plan.operators.nodes[fallback.node]
        assert set(node.inputs) == {"R"} and set(node.outputs) == {"R"}
    assert_matches_single_process(checked("cdist", (2,), "cpu"))


def test_plans_report_how_they_were_solved() -> None:
    for name, mesh in [("demo:mlp", (4,)), ("demo:gpt", (2, 2))]:
        cluster = "cpu" if name == "demo:mlp" else "compute-bound"
        solver = planned(name, mesh, cluster)[1].plan.operators.solver
        assert solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY")
        assert 0.0 <= solver.gap <= 1.0
