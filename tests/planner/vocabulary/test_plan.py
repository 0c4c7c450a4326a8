"""planner.vocabulary.plan: one schema for training and operator-level plans; its JSON round
trip, the mistakes its validation catches, the migration of version-1 files, and every plan the CLI
writes validating as that one schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import planner.vocabulary.plan as schema
from planner import cli
from planner.vocabulary.plan_migration import migrate_v1
from planner.vocabulary.plan import (
    SCHEMA_VERSION,
    CollectiveStats,
    NodeSharding,
    OperatorShardings,
    Plan,
    Predicted,
    Provenance,
    SolverReport,
    Stage,
)


def plan_data_v1() -> dict:
    """A small valid operator-level plan on a 2x2 mesh as version 1 wrote it."""
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


def plan_data() -> dict:
    """The same plan in today's schema: one stage holding the operator shardings."""
    return migrate_v1(plan_data_v1())


@pytest.fixture
def plan() -> Plan:
    return Plan.model_validate(plan_data())


def test_plan_built_from_parts() -> None:
    operators = OperatorShardings(
        graph_fingerprint="abc123", inputs={"x": "S(0)R"},
        nodes={"mm": NodeSharding(op="aten.mm.default", inputs=["S(0)R", "RR"],
                                  outputs=["S(0)R"])},
        communication_by_phase={"gradient_sync": {"all_reduce": CollectiveStats(count=1, bytes=4)}},
        solver=SolverReport(backend="SCIP", status="OPTIMAL", gap=0.0, solve_time_s=0.1,
                            num_variables=3),
    )
    built = Plan(
        model="demo:mlp", cluster="cpu", num_gpus=4, mesh_axes=["axis0", "axis1"],
        mesh_shape=[2, 2],
        stages=[Stage(layers=(0, 1), num_devices=4, mesh_axes=["axis0", "axis1"],
                      mesh_shape=[2, 2], parameters={"fc1.weight": "S(0)R"},
                      operators=operators)],
        communication={"all_reduce": CollectiveStats(count=1, bytes=4)},
        predicted=Predicted(step_time_s=1.0, compute_s=0.5, communication_s=0.5,
                            memory_gib_per_gpu=1.0),
        provenance=Provenance(model_spec="demo:mlp", cluster="cpu", tessel_version="0.1.0"),
    )
    assert built.num_devices == 4 and built.version == SCHEMA_VERSION
    assert built.operators.nodes["mm"].phase == "forward"
    assert built.parameters == {"fc1.weight": "S(0)R"}
    assert built.predicted.memory_bytes_per_device == 2**30
    assert Plan.from_json(built.to_json()) == built


def test_round_trip_through_a_file(tmp_path, plan: Plan) -> None:
    path = tmp_path / "plan.json"
    text = plan.to_json(path)
    assert path.read_text() == text + "\n"
    assert json.loads(text)["stages"][0]["parameters"] == {"fc1.weight": "S(0)R",
                                                           "fc1.bias": "RR"}
    loaded = Plan.from_json(path)
    assert loaded == plan
    assert Plan.from_json(str(path)) == plan
    assert loaded.operators.nodes["getitem"].outputs == [None]
    assert loaded.communication["all_reduce"].bytes == 4096
    assert loaded.predicted.memory_gib_per_gpu == pytest.approx(3.0)


def test_round_trip_through_text(plan: Plan) -> None:
    text = plan.to_json()
    assert Plan.from_json(text) == plan
    # Leading whitespace is still JSON text, not a path.
    assert Plan.from_json("\n  " + text) == plan


def test_a_version_1_operator_plan_is_migrated(tmp_path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(plan_data_v1()))
    plan = Plan.from_json(path)
    assert plan.version == SCHEMA_VERSION and len(plan.stages) == 1
    assert plan.mesh_shape == [2, 2] and plan.num_gpus == 4
    assert plan.parameters == {"fc1.weight": "S(0)R", "fc1.bias": "RR"}
    assert plan.operators.inputs == {"x": "S(0)R"}
    assert plan.predicted.memory_gib_per_gpu == pytest.approx(3.0)


def test_a_version_1_training_plan_is_migrated() -> None:
    old = {
        "version": 1, "model": "gpt3-2.7b", "cluster": "dgx-a100-80g", "num_gpus": 16,
        "global_batch_size": 64,
        "parallel": {"data": 2, "tensor": 2, "pipeline": 2, "context": 2, "expert": 1,
                     "sequence_parallel": True, "zero_stage": 1, "virtual_pipeline": 1},
        "micro_batch_size": 1, "num_micro_batches": 32, "recompute": "full",
        "schedule": "1f1b",
        "stages": [{"layers": [0, 16], "num_devices": 8, "mesh_shape": [2, 2]},
                   {"layers": [16, 32], "num_devices": 8, "mesh_shape": [2, 2]}],
        "predicted": {"step_time_s": 2.0, "tokens_per_s": 1.0, "model_tflops_per_gpu": 1.0,
                      "hardware_tflops_per_gpu": 1.0, "mfu": 0.4, "memory_gib_per_gpu": 9.0,
                      "fits": True,
                      "breakdown": {"compute_s": 1.5, "tensor_parallel_comm_s": 0.2,
                                    "pipeline_comm_s": 0.1, "data_parallel_comm_s": 0.1,
                                    "bubble_s": 0.1, "optimizer_s": 0.0}},
        "megatron_flags": ["--num-layers 32"], "megatron_incompatibility": None,
    }
    plan = Plan.from_json(json.dumps(old))
    assert plan.mesh_axes == ["pp", "dp", "cp", "tp"] and plan.mesh_shape == [2, 2, 2, 2]
    assert [s.first_device for s in plan.stages] == [0, 8]
    assert plan.stages[0].mesh_axes == ["dp", "cp", "tp"]
    assert plan.predicted.communication_s == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [('{"version": 7, "model": "x"}', "version-7 plan; this Tessel reads versions 1 and 2"),
     ("[1, 2]", "not a Tessel plan"),
     ('{"version": 2, "model": "x"}', "is not a valid plan"),
     ('{"version": 2,', "is not JSON")],
)
def test_what_is_not_a_plan_is_refused_in_one_sentence(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as error:
        Plan.from_json(text)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_changed_plan_is_not_equal(plan: Plan) -> None:
    data = plan_data()
    data["stages"][0]["parameters"]["fc1.bias"] = "S(0)R"
    assert Plan.model_validate(data) != plan


def _invalid(mutate) -> str:
    data = plan_data()
    mutate(data)
    with pytest.raises(ValidationError) as err:
        Plan.model_validate(data)
    # The same mistake is caught when the plan comes from JSON, in one sentence.
    with pytest.raises(ValueError):
        Plan.from_json(json.dumps(data))
    return str(err.value)


def _stage(d: dict) -> dict:
    return d["stages"][0]


def test_placement_with_too_few_entries_names_the_parameter() -> None:
    message = _invalid(lambda d: _stage(d)["parameters"].update({"fc1.weight": "S(0)"}))
    assert "fc1.weight" in message
    assert "'S(0)'" in message
    assert "2 axes" in message


def test_placement_with_too_many_entries_in_a_node_is_refused() -> None:
    message = _invalid(
        lambda d: _stage(d)["operators"]["nodes"]["addmm"].update({"outputs": ["RRR"]}))
    assert "addmm output" in message


def test_unparsable_placement_is_refused() -> None:
    message = _invalid(lambda d: _stage(d)["parameters"].update({"fc1.bias": "X(0)"}))
    assert "fc1.bias" in message
    assert "X(0)" in message


def test_unparsable_input_placement_is_refused() -> None:
    message = _invalid(lambda d: _stage(d)["operators"]["inputs"].update({"x": "RQ"}))
    assert "x:" in message


@pytest.mark.parametrize("table", ["communication", "communication_by_phase"])
def test_unknown_collective_kind_is_refused(table: str) -> None:
    def mutate(d: dict) -> None:
        stats = {"count": 1, "bytes": 8}
        if table == "communication":
            d["communication"]["broadcast"] = stats
        else:
            _stage(d)["operators"]["communication_by_phase"]["backward"] = {"broadcast": stats}

    message = _invalid(mutate)
    assert "broadcast" in message
    assert "all_reduce" in message  # the known kinds are listed


@pytest.mark.parametrize("shape", [[2, 0], [-1], []])
def test_non_positive_or_empty_mesh_is_refused(shape: list[int]) -> None:
    message = _invalid(lambda d: d.update({"mesh_shape": shape}))
    assert "mesh_shape" in message


def test_a_stage_mesh_that_does_not_hold_its_devices_is_refused() -> None:
    message = _invalid(lambda d: _stage(d).update({"num_devices": 8}))
    assert "stage 0" in message and "8 devices" in message


def test_unknown_field_is_refused() -> None:
    message = _invalid(lambda d: d.update({"mesh": [2, 2]}))
    assert "mesh" in message
    assert "xtra" in message  # pydantic: "Extra inputs are not permitted"


def test_unknown_field_in_a_nested_model_is_refused() -> None:
    message = _invalid(lambda d: _stage(d)["operators"]["solver"].update({"threads": 4}))
    assert "threads" in message


def test_negative_collective_count_is_refused() -> None:
    _invalid(lambda d: d["communication"]["all_reduce"].update({"count": -1}))


# -- every plan the CLI writes is this one schema -------------------------------------------

CLI_PLANS = {
    "mesh": ["demo:mlp", "--mesh", "2x2"],
    "gpt3-175b-a100": ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
                       "--global-batch-size", "1536"],
    "llama3-70b-h100": ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "256",
                        "--global-batch-size", "1024"],
    "mixtral-h100-megatron": ["mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
                              "--global-batch-size", "256", "--space", "megatron"],
    "cpu": ["llama", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--vocab-size", "256", "--seq-length", "16", "--gpus", "8",
            "--global-batch-size", "8"],
    "what-if": ["gpt3-13b", "--cluster", "dgx-a100-80g", "--gpus", "64",
                "--global-batch-size", "512", "--tensor-model-parallel-size", "2",
                "--pipeline-model-parallel-size", "4", "--micro-batch-size", "2",
                "--context-parallel-size", "2"],
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple[Plan, dict]]:
    out = tmp_path_factory.mktemp("plans")
    plans = {}
    for name, argv in CLI_PLANS.items():
        path = out / f"{name}.json"
        assert cli.main([*argv, "--json", str(path)]) == 0, name
        plans[name] = (Plan.from_json(path), json.loads(path.read_text()))
    return plans


@pytest.mark.parametrize("name", list(CLI_PLANS))
def test_every_plan_the_cli_writes_validates_and_round_trips(written, name: str) -> None:
    plan, data = written[name]
    assert Plan.from_json(plan.to_json()) == plan
    assert data["version"] == SCHEMA_VERSION
    assert sum(stage.num_devices for stage in plan.stages) == plan.num_gpus
    devices = [(s.first_device, s.first_device + s.num_devices) for s in plan.stages]
    assert all(a[1] == b[0] for a, b in zip(devices, devices[1:]))  # contiguous ranks


def test_a_full_size_and_a_tiny_plan_are_one_schema(written) -> None:
    full, tiny = written["gpt3-175b-a100"][1], written["mesh"][1]
    assert set(full) == set(tiny)
    assert len(tiny["stages"]) == 1 and tiny["stages"][0]["operators"] is not None
    assert full["num_gpus"] == 1024 and full["parallel"] is not None
    what_if = written["what-if"][0]
    assert what_if.mesh_axes == ["pp", "dp", "cp", "tp"] and what_if.mesh_shape == [4, 4, 2, 2]
    assert all(s.mesh_axes == ["dp", "cp", "tp"] for s in what_if.stages)


def test_a_plan_for_the_cpu_cluster_runs_fp32(written) -> None:
    """A device without bf16 (the CPU preset) gets fp32 plans, not a refusal."""
    plan = written["cpu"][0]
    assert plan.precision == "fp32" and plan.cluster == "cpu" and plan.devices_per_node == 8
    assert written["gpt3-175b-a100"][0].precision == "bf16"
    assert "--bf16" not in " ".join(plan.megatron_flags or [])


@pytest.mark.parametrize(("path", "value"), [
    (("recompute",), "fulll"), (("schedule",), "zigzag"), (("precision",), "fp4"),
    (("run", "moe_token_dispatcher"), "deepep"), (("run", "recompute_modules"), ["mlp", "ffn"]),
])
def test_a_plan_naming_a_value_no_knob_takes_is_refused_on_load(
        written, path: tuple[str, ...], value: object) -> None:
    """Enumerated fields are Literals: a hand-edited plan with a typo does not load."""
    data = json.loads(json.dumps(written["gpt3-175b-a100"][1]))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError) as error:
        Plan.from_json(json.dumps(data))
    assert path[-1] in str(error.value) and "\n" not in str(error.value)


def test_the_schema_doc_lists_every_field_of_the_plans_models() -> None:
    """docs/plan-schema.md has a row for every field of the Plan and the models it holds,
    in its section and in order (a knob added to RunSettings is documented there too)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "plan-schema.md").read_text()
    text = text.split("## The plan check report")[0]
    for name, body in re.findall(r"^### (\w+)\n(.*?)(?=^#{2,3} |\Z)", text, re.M | re.S):
        model = getattr(schema, name)
        assert isinstance(model, type) and issubclass(model, BaseModel)
        rows = re.findall(r"^\| `(\w+)` \|", body, re.M)
        assert rows == list(model.model_fields), name
