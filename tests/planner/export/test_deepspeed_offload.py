"""DeepSpeed's config of an offloading plan: Llama 3 405B on 32 H100 at 16 sequences of 8192
tokens does not fit without offload; planned for DeepSpeed (`--emit deepspeed`), it runs
ZeRO-3 with the optimizer's state and the parameters on the host, Ulysses over the
sequence, and DeepSpeed's own `DeepSpeedConfig` accepts the config written for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.export.deepspeed import NVME_PATH, ds_config
from planner.models.presets import zoo_config
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

ARGV = ["llama3-405b", "--cluster", "dgx-h100", "--gpus", "32", "--global-batch-size", "16",
        "--seq-length", "8192"]


def deepspeed_accepts(config: dict, data_parallel_world: int, monkeypatch) -> object:
    """DeepSpeed's DeepSpeedConfig on `config`, its process group faked at the plan's size."""
    ds = pytest.importorskip("deepspeed.runtime.config")
    world = data_parallel_world * config.get("sequence_parallel_size", 1)
    monkeypatch.setattr(ds.dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(ds.dist, "get_rank", lambda group=None: 0)
    return ds.DeepSpeedConfig(json.loads(json.dumps(config)))


def test_405b_on_32_h100_plans_with_offload_and_deepspeed_accepts_it(
        tmp_path: Path, monkeypatch, capsys) -> None:
    assert main([*ARGV, "--emit", "deepspeed", str(tmp_path), "--json",
                 str(tmp_path / "plan.json")]) == 0
    said = capsys.readouterr()
    out = said.out + said.err
    assert "offload: optimizer: cpu, parameters: cpu" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    run, predicted = plan["run"], plan["predicted"]
    assert (run["offload_optimizer"], run["offload_params"]) == ("cpu", "cpu")
    assert predicted["fits"] and predicted["breakdown"]["offload_s"] > 0
    assert predicted["host_memory_gib_per_host"] < 2048 * 0.9
    config = json.loads((tmp_path / "ds_config.json").read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    checked = deepspeed_accepts(config, plan["parallel"]["data"], monkeypatch)
    assert checked.zero_config.offload_optimizer.device == "cpu"
    assert checked.zero_config.offload_param.device == "cpu"
    assert checked.train_batch_size == 16


def test_nvme_offload_sections_pass_deepspeeds_checks(monkeypatch) -> None:
    model = zoo_config("llama3-70b", {"seq_length": 4096})
    cluster = Cluster.load("dgx-h100").with_devices(16)
    parallel = ParallelConfig.of(global_batch_size=32, zero_stage=3, recompute="full",
                                 offload_optimizer="nvme", offload_params="nvme",
                                 optimizer_offload_fraction=1.0)
    config = ds_config(training_plan("llama3-70b", model, cluster, parallel))
    zero = config["zero_optimization"]
    assert zero["offload_optimizer"]["nvme_path"] == zero["offload_param"]["nvme_path"] \
        == NVME_PATH
    checked = deepspeed_accepts(config, 16, monkeypatch)
    assert checked.zero_config.offload_optimizer.device == "nvme"
    assert checked.zero_config.offload_param.device == "nvme"
    partial = ds_config(training_plan("llama3-70b", model, cluster, parallel.but(
        offload_optimizer="cpu", offload_params="none", optimizer_offload_fraction=0.25)))
    assert partial["zero_optimization"]["offload_optimizer"]["ratio"] == 0.25
    assert deepspeed_accepts(partial, 16, monkeypatch).zero_config.offload_optimizer.ratio \
        == 0.25


def test_emit_deepspeed_refuses_degrees_it_cannot_run(capsys) -> None:
    assert main([*ARGV, "--tensor-model-parallel-size", "8", "--emit", "deepspeed",
                 "/tmp"]) == 2
    said = capsys.readouterr()
    assert "--emit deepspeed runs data parallelism, ZeRO and Ulysses sequence parallelism, " \
        "not --tensor-model-parallel-size 8" in said.out + said.err


AZURE_175B = ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "128", "--global-batch-size",
              "2048", "--seq-length", "1024", "--micro-batch-size", "16", "--zero-stage", "3",
              "--engine", "tessel", "--offload-optimizer", "cpu", "--offload-copies",
              "blocking"]


def test_deepspeeds_azure_recipe_offloads_its_checkpoints_and_deepspeed_accepts_it(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """DeepSpeed's 175B recipe with cpu_checkpointing, as its Azure post ran it on
    DeepSpeed 0.6 (blocking copies): the checkpointed inputs leave the GPU for the host,
    their copies cost time, and the config carries activation_checkpointing.cpu_
    checkpointing."""
    argv = [*AZURE_175B, "--recompute-granularity", "full", "--top", "1"]
    assert main([*argv, "--json", str(tmp_path / "kept.json")]) == 0
    assert main([*argv, "--offload-checkpoints", "--emit", "deepspeed", str(tmp_path),
                 "--json", str(tmp_path / "plan.json")]) == 0
    out = " ".join((capsys.readouterr().out).split())
    assert "checkpoints: cpu" in out
    kept = json.loads((tmp_path / "kept.json").read_text())["predicted"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    predicted = plan["predicted"]
    assert plan["run"]["offload_checkpoints"] is True
    checkpoints = "activations: checkpointed inputs"
    assert predicted["memory_breakdown_gib"][checkpoints] == pytest.approx(
        kept["memory_breakdown_gib"][checkpoints] / 96)
    assert predicted["breakdown"]["offload_s"] > kept["breakdown"]["offload_s"] + 5
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["activation_checkpointing"] == {"partition_activations": False,
                                                  "cpu_checkpointing": True}
    checked = deepspeed_accepts(config, 128, monkeypatch)
    assert checked.activation_checkpointing_config.cpu_checkpointing is True


def test_checkpoint_offload_without_full_recomputation_is_one_line(capsys) -> None:
    assert main([*AZURE_175B, "--offload-checkpoints"]) == 2
    said = capsys.readouterr()
    text = (said.out + said.err).strip()
    assert text == ("error: --offload-checkpoints offloads the inputs full recomputation "
                    "keeps; add --recompute-granularity full.")
