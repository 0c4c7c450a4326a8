"""`plan --emit torchtitan`: TorchTitan 0.3's config function by default, 0.2's TOML with
--torchtitan-version 0.2.

- Planned configurations, written as torchtitan_config.py, read back by `plan predict
  --torchtitan FILE.py` to the plan's own prediction; `plan ... --emit torchtitan` in both
  forms round-trips through the command line.
- What 0.3 cannot run as priced (every k-th block checkpointed, per-tensor float8) is
  refused in one line, naming the fix.
- TorchTitan 0.3's own ConfigManager (in its environment, .venv/torchtitan-0.3) builds the
  emitted config with the plan's values, and builds each registry config Tessel knows
  with the values Tessel's table holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torchtitan03_env import config_managers

from planner import cli
from planner.export.torchtitan_config import (
    CONFIG_FILE,
    FUNCTION,
    MODULE,
    next_incompatibility,
    torchtitan_next_files,
)
from planner.models.presets import get_preset
from planner.plans.transformer_plan import training_plan
from planner.torchtitan.registry import CONFIGS
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan

CLUSTER = "dgx-h100"


def titan(**knobs: Any) -> ParallelConfig:
    zero = knobs.setdefault("zero_stage", 3)
    knobs.setdefault("sequence_parallel", knobs.get("tensor", 1) > 1)
    return ParallelConfig.of(engine="torchtitan", overlap_grad_reduce=True,
                             overlap_param_gather=zero >= 1, fp8_recipe="tensorwise", **knobs)


# name -> (preset, GPUs, the configuration planned)
PLANNED = {
    "8b-ddp": ("llama3-8b", 8, titan(data=8, zero_stage=0, micro_batch_size=2,
                                     global_batch_size=64)),
    "8b-tp2-never-reshard": ("llama3-8b", 16, titan(
        tensor=2, data=8, micro_batch_size=1, global_batch_size=64, recompute="full",
        fsdp_reshard_after_forward="never")),
    "70b-interleaved-context-async-tp": ("llama3-70b", 128, titan(
        tensor=8, pipeline=4, context=2, data=2, micro_batch_size=1, global_batch_size=32,
        recompute="full", schedule="interleaved", virtual_pipeline=2, compile=True,
        tp_comm_overlap=True)),
    "70b-gpipe-op-checkpointing": ("llama3-70b", 64, titan(
        tensor=8, pipeline=2, data=4, micro_batch_size=1, global_batch_size=32,
        recompute="selective", schedule="gpipe")),
    "8b-dualpipev-loss-compiled": ("llama3-8b", 32, titan(
        tensor=2, pipeline=4, data=4, micro_batch_size=1, global_batch_size=64,
        schedule="dualpipev", virtual_pipeline=2, compile_loss=True)),
    "8b-tp2-cpu-offload": ("llama3-8b", 16, titan(
        tensor=2, data=8, micro_batch_size=1, global_batch_size=64, recompute="full",
        offload_optimizer="cpu", offload_params="cpu")),
}


def plan_of(case: str) -> Plan:
    preset, gpus, parallel = PLANNED[case]
    return training_plan(preset, get_preset(preset),
                         Cluster.load(CLUSTER).with_devices(gpus), parallel)


def predict(argv: list[str], tmp_path: Path, capsys) -> dict:
    path = tmp_path / "predict.json"
    assert cli.main(["predict", "--cluster", CLUSTER, "--json", str(path), "--no-search",
                     *argv]) == 0
    capsys.readouterr()
    return json.loads(path.read_text())["job_config"]


def same_prediction(read: dict, planned: dict) -> None:
    assert read["predicted"] == planned["predicted"]
    assert read["run"] == planned["run"] and read["parallel"] == planned["parallel"]
    assert [s["layers"] for s in read["stages"]] == [s["layers"] for s in planned["stages"]]


@pytest.mark.parametrize("case", list(PLANNED))
def test_a_planned_configuration_round_trips_through_the_config_function(
        case: str, tmp_path: Path, capsys) -> None:
    plan = plan_of(case)
    files = torchtitan_next_files(plan, get_preset(plan.model))
    path = tmp_path / CONFIG_FILE
    path.write_text(files[CONFIG_FILE])
    read = predict(["--torchtitan", str(path)], tmp_path, capsys)
    same_prediction(read, json.loads(plan.to_json()))
    assert f"--module {MODULE} --config {FUNCTION}" in files["torchtitan.sh"]


@pytest.mark.parametrize(("version", "written"), [
    ([], ["torchtitan.sh", CONFIG_FILE]),
    (["--torchtitan-version", "0.2"], ["torchtitan.sh", "torchtitan.toml"]),
])
def test_plan_emit_torchtitan_round_trips_in_both_forms(
        version: list[str], written: list[str], tmp_path: Path, capsys) -> None:
    out, plan_json = tmp_path / "out", tmp_path / "plan.json"
    assert cli.main(["llama3-8b", "--gpus", "16", "--global-batch-size", "64", "--cluster",
                     CLUSTER, "--engine", "torchtitan", "--space", "megatron", "--top", "1",
                     "--emit", "torchtitan", str(out), *version, "--json",
                     str(plan_json)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == written
    read = predict(["--torchtitan", str(out / written[1])], tmp_path, capsys)
    same_prediction(read, json.loads(plan_json.read_text()))


@pytest.mark.parametrize(("knobs", "fragment"), [
    ({"recompute": "full", "recompute_every": 2},
     "TorchTitan 0.3 checkpoints every block or none, not one in every 2; emit with "
     "--torchtitan-version 0.2"),
    ({"precision": "fp8"},  # titan(): per-tensor scaling
     "TorchTitan 0.3 scales float8 per row (or per MX block), not per tensor; plan with "
     "--fp8-recipe rowwise (mxfp8 on Blackwell), or emit with --torchtitan-version 0.2"),
])
def test_what_0_3_cannot_run_as_priced_is_refused(knobs: dict, fragment: str) -> None:
    plan = training_plan("llama3-8b", get_preset("llama3-8b"),
                         Cluster.load(CLUSTER).with_devices(8),
                         titan(data=8, global_batch_size=64, **knobs))
    assert next_incompatibility(plan, get_preset("llama3-8b")) == fragment


def test_torchtitan_version_without_emit_torchtitan_is_refused(capsys) -> None:
    """Checks: exit 2, one line saying what is missing, before any planning."""
    assert cli.main(["llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--cluster",
                     CLUSTER, "--top", "1", "--torchtitan-version", "0.2"]) == 2
    assert capsys.readouterr().out.strip() == (
        "error: --torchtitan-version 0.2 says which TorchTitan config --emit writes: give "
        "--emit torchtitan DIR as well")


# ------------------------------------------------- TorchTitan 0.3's own config classes


REGISTRY_BUILT = [n for n in CONFIGS if n != "llama3_405b"]
"""The registry configs TorchTitan 0.3 builds here (llama3_405b's float8 needs torchao)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What TorchTitan 0.3's ConfigManager builds of each emitted config (by case) and each
    registry config (by name), in one process of its environment."""
    jobs = []
    for case in PLANNED:
        folder = tmp_path_factory.mktemp(case)
        plan = plan_of(case)
        (folder / CONFIG_FILE).write_text(
            torchtitan_next_files(plan, get_preset(plan.model))[CONFIG_FILE])
        jobs.append((folder, ["--module", MODULE, "--config", FUNCTION]))
    for name in REGISTRY_BUILT:
        jobs.append((tmp_path_factory.mktemp(name),
                     ["--module", CONFIGS[name].settings["model.module"], "--config", name]))
    return dict(zip([*PLANNED, *REGISTRY_BUILT], config_managers(jobs)))


@pytest.mark.parametrize("case", list(PLANNED))
def test_torchtitans_config_manager_builds_the_emitted_config(
        case: str, built: dict[str, dict[str, Any]]) -> None:
    """Checks: ConfigManager(--module torchtitan_config --config tessel_plan) builds the
    Trainer.Config, with the plan's degrees, batch, sequence, checkpointing and model."""
    plan, built = plan_of(case), built[case]
    assert "error" not in built, built.get("error")
    q, p = plan.parallel, built["parallelism"]
    data = p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"],
            p["context_parallel_degree"], data) == (q.tensor, q.pipeline, q.context, q.data)
    assert built["training"]["global_batch_size"] == plan.global_batch_size
    assert built["training"]["seq_len"] == get_preset(plan.model).seq_length
    assert built["activation_checkpoint"] == {"full": "FullAC.Config", "none": "NoneType",
                                              "selective": "SelectiveAC.Config"}[plan.recompute]
    assert built["model"] == ["llama3", plan.model.removeprefix("llama3-").upper()]
    assert built["compile"]["enable_async_tensor_parallel"] == plan.run.tp_comm_overlap
    assert built["training"]["enable_cpu_offload"] == (plan.run.offload_params == "cpu")


@pytest.mark.parametrize("name", REGISTRY_BUILT)
def test_torchtitans_config_manager_builds_the_registry_configs_as_tessel_holds_them(
        name: str, built: dict[str, dict[str, Any]]) -> None:
    """Checks: each registry config Tessel knows (but llama3_405b, whose float8 converter
    needs torchao), built by TorchTitan 0.3, has the degrees, batch, sequence, compile,
    checkpointing, loss and model of Tessel's table (TorchTitan's default where the table
    has none)."""
    settings, built = CONFIGS[name].settings, built[name]
    assert "error" not in built, built.get("error")
    for key, value in built["parallelism"].items():
        assert settings.get(f"parallelism.{key}", value) == value, key
    for section in ("training", "compile"):
        for key in ("local_batch_size", "seq_len", "steps", "disable_cuda_graphs", "enable",
                    "components", "enable_async_tensor_parallel"):
            if key in built[section]:
                assert settings.get(f"{section}.{key}", built[section][key]) == \
                    built[section][key], (section, key)
    assert built["activation_checkpoint"] == \
        {"full": "FullAC.Config", "selective": "SelectiveAC.Config"}[
            settings["activation_checkpoint"]]
    assert built["loss"] == f"{settings['loss']}.Config"
    assert built["model"] == [settings["model.module"], settings["model.flavor"]]
