"""planner.plan: the Plan's JSON round trip and the mistakes its validation catches."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from planner.plan import (
    CollectiveStats,
    GradientBucket,
    NodeSharding,
    Plan,
    Predicted,
    SolverReport,
)


def plan_data() -> dict:
    """A small valid plan on a 2x2 mesh, as plain JSON-able data."""
    return {
        "model": "demo:mlp",
        "cluster": "cpu",
        "mesh_shape": [2, 2],
        "graph_fingerprint": "abc123",
        "parameters": {"fc1.weight": "S(0)R", "fc1.bias": "RR"},
        "inputs": {"x": "S(0)R"},
        "nodes": {
            "addmm": {
                "op": "aten.addmm.default",
                "module": "fc1",
                "inputs": ["RR", "S(0)R", "RS(1)"],
                "outputs": ["PR"],
                "produced": "PR",
            },
            "getitem": {"op": "getitem", "inputs": ["RR"], "outputs": [None]},
        },
        "gradient_buckets": [
            {
                "members": ["fc1.bias", "loss"],
                "mesh_dims": [[0, 1]],
                "dtype": "float32",
                "nbytes": 132,
                "placements_before": ["PP", "PP"],
                "placements_after": ["RR", "RR"],
            }
        ],
        "communication": {"all_reduce": {"count": 2, "bytes": 4096}},
        "communication_by_phase": {
            "forward": {"all_reduce": {"count": 1, "bytes": 2048}},
            "gradient_sync": {"all_reduce": {"count": 1, "bytes": 2048}},
        },
        "predicted": {
            "step_time_s": 0.0125,
            "compute_s": 0.01,
            "communication_s": 0.0025,
            "memory_bytes_per_device": 3 * 2**30,
        },
        "fallback_ops": [{"node": "sort", "op": "aten.sort.default", "module": "head"}],
        "solver": {
            "backend": "SCIP",
            "status": "OPTIMAL",
            "gap": 0.0,
            "solve_time_s": 0.2,
            "num_variables": 42,
        },
    }


@pytest.fixture
def plan() -> Plan:
    return Plan.model_validate(plan_data())


def test_plan_built_from_parts() -> None:
    built = Plan(
        model="demo:mlp",
        cluster="cpu",
        mesh_shape=[2, 2],
        graph_fingerprint="abc123",
        parameters={"fc1.weight": "S(0)R", "fc1.bias": "RR"},
        inputs={"x": "S(0)R"},
        nodes={"mm": NodeSharding(op="aten.mm.default", inputs=["S(0)R", "RR"],
                                  outputs=["S(0)R"])},
        gradient_buckets=[GradientBucket(members=["fc1.bias"], mesh_dims=[[0]], dtype="float32",
                                         nbytes=4, placements_before=["PR"],
                                         placements_after=["RR"])],
        communication={"all_reduce": CollectiveStats(count=1, bytes=4)},
        communication_by_phase={"gradient_sync": {"all_reduce": CollectiveStats(count=1, bytes=4)}},
        predicted=Predicted(step_time_s=1.0, compute_s=0.5, communication_s=0.5,
                            memory_bytes_per_device=2**30),
        solver=SolverReport(backend="SCIP", status="OPTIMAL", gap=0.0, solve_time_s=0.1,
                            num_variables=3),
    )
    assert built.num_devices == 4
    assert built.version == 1
    assert built.nodes["mm"].phase == "forward"
    assert built.predicted.memory_gib_per_device == pytest.approx(1.0)
    assert Plan.from_json(built.to_json()) == built


def test_round_trip_through_a_file(tmp_path, plan: Plan) -> None:
    path = tmp_path / "plan.json"
    text = plan.to_json(path)
    assert path.read_text() == text + "\n"
    assert json.loads(text)["parameters"] == {"fc1.weight": "S(0)R", "fc1.bias": "RR"}
    loaded = Plan.from_json(path)
    assert loaded == plan
    assert Plan.from_json(str(path)) == plan
    assert loaded.nodes["getitem"].outputs == [None]
    assert loaded.communication["all_reduce"].bytes == 4096
    assert loaded.predicted.memory_gib_per_device == pytest.approx(3.0)


def test_round_trip_through_text(plan: Plan) -> None:
    text = plan.to_json()
    assert Plan.from_json(text) == plan
    # Leading whitespace is still JSON text, not a path.
    assert Plan.from_json("\n  " + text) == plan


def test_a_changed_plan_is_not_equal(plan: Plan) -> None:
    data = plan_data()
    data["parameters"]["fc1.bias"] = "S(0)R"
    assert Plan.model_validate(data) != plan


def _invalid(mutate) -> str:
    data = plan_data()
    mutate(data)
    with pytest.raises(ValidationError) as err:
        Plan.model_validate(data)
    # The same mistake is caught when the plan comes from JSON.
    with pytest.raises(ValidationError):
        Plan.from_json(json.dumps(data))
    return str(err.value)


def test_placement_with_too_few_entries_names_the_parameter() -> None:
    message = _invalid(lambda d: d["parameters"].update({"fc1.weight": "S(0)"}))
    assert "fc1.weight" in message
    assert "'S(0)'" in message
    assert "2 axes" in message


def test_placement_with_too_many_entries_in_a_node_is_refused() -> None:
    message = _invalid(lambda d: d["nodes"]["addmm"].update({"outputs": ["RRR"]}))
    assert "addmm output" in message


def test_unparsable_placement_is_refused() -> None:
    message = _invalid(lambda d: d["parameters"].update({"fc1.bias": "X(0)"}))
    assert "fc1.bias" in message
    assert "X(0)" in message


def test_unparsable_input_placement_is_refused() -> None:
    message = _invalid(lambda d: d["inputs"].update({"x": "RQ"}))
    assert "x:" in message


@pytest.mark.parametrize("table", ["communication", "communication_by_phase"])
def test_unknown_collective_kind_is_refused(table: str) -> None:
    def mutate(d: dict) -> None:
        stats = {"count": 1, "bytes": 8}
        if table == "communication":
            d["communication"]["broadcast"] = stats
        else:
            d["communication_by_phase"]["backward"] = {"broadcast": stats}

    message = _invalid(mutate)
    assert "broadcast" in message
    assert "all_reduce" in message  # the known kinds are listed


@pytest.mark.parametrize("shape", [[2, 0], [-1], []])
def test_non_positive_or_empty_mesh_is_refused(shape: list[int]) -> None:
    message = _invalid(lambda d: d.update({"mesh_shape": shape}))
    assert "mesh_shape" in message


def test_unknown_field_is_refused() -> None:
    message = _invalid(lambda d: d.update({"mesh": [2, 2]}))
    assert "mesh" in message
    assert "xtra" in message  # pydantic: "Extra inputs are not permitted"


def test_unknown_field_in_a_nested_model_is_refused() -> None:
    message = _invalid(lambda d: d["solver"].update({"threads": 4}))
    assert "threads" in message


def test_negative_collective_count_is_refused() -> None:
    _invalid(lambda d: d["communication"]["all_reduce"].update({"count": -1}))
