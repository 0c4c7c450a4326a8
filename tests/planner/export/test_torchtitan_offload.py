"""TorchTitan's one offload, FSDP2's CPUOffloadPolicy (`training.enable_cpu_offload`, applied
in `apply_fsdp`: sharded parameters, their gradients and the optimizer step on the host,
together), written in both forms and read back; every other offload, and LoRA or QLoRA
adapters, refused in one line naming what runs them.

(The knob registry's round trip, tests/planner/vocabulary/test_knobs.py, holds the 0.2
key; tests/planner/export/test_torchtitan_config.py has TorchTitan 0.3's own
ConfigManager build an offloading config.)
"""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from planner.export.torchtitan import torchtitan_files, torchtitan_incompatibility
from planner.export.torchtitan_config import next_incompatibility, torchtitan_next_files
from planner.models.presets import get_preset
from planner.plans.transformer_plan import training_plan
from planner.torchtitan.job import torchtitan_job
from planner.torchtitan.next_job import load_job
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan

MODEL = get_preset("llama3-8b")
TITAN = dict(engine="torchtitan", zero_stage=3, overlap_grad_reduce=True,
             overlap_param_gather=True, fp8_recipe="tensorwise")


def plan_of(gpus: int = 8, **knobs: Any) -> Plan:
    knobs = {"global_batch_size": 64, "micro_batch_size": 1, **knobs}
    return training_plan("llama3-8b", MODEL, Cluster.load("dgx-h100").with_devices(gpus),
                         ParallelConfig.of(**knobs))


BOTH = dict(offload_optimizer="cpu", offload_params="cpu")


@pytest.mark.parametrize("engine", ["torchtitan", "megatron"])
def test_cpu_offload_of_both_is_enable_cpu_offload_in_both_forms(engine: str,
                                                                 tmp_path) -> None:
    """Checks: a ZeRO-3 plan offloading the optimizer and the parameters to the CPU (priced
    as TorchTitan runs it, or translated from Megatron-LM's pricing) writes [training]
    enable_cpu_offload = true in 0.2's TOML and TrainingConfig(enable_cpu_offload=True)
    in 0.3's config function; each reads back as both offloads on the CPU."""
    base = TITAN if engine == "torchtitan" else dict(zero_stage=3)
    plan = plan_of(**base, **BOTH)
    assert torchtitan_incompatibility(plan, MODEL) is None
    tables = tomllib.loads(torchtitan_files(plan, MODEL)["torchtitan.toml"])
    assert tables["training"]["enable_cpu_offload"] is True
    offload = torchtitan_job(tables, None, "torchtitan.toml").parallel.offload
    assert (offload.offload_optimizer, offload.offload_params) == ("cpu", "cpu")

    text = torchtitan_next_files(plan, MODEL)["torchtitan_config.py"]
    assert "enable_cpu_offload=True" in text
    path = tmp_path / "torchtitan_config.py"
    path.write_text(text)
    offload = load_job(str(path), [], None).parallel.offload
    assert (offload.offload_optimizer, offload.offload_params) == ("cpu", "cpu")


def test_no_offload_writes_no_key() -> None:
    plan = plan_of(**TITAN)
    assert "enable_cpu_offload" not in torchtitan_files(plan, MODEL)["torchtitan.toml"]
    assert "enable_cpu_offload" not in \
        torchtitan_next_files(plan, MODEL)["torchtitan_config.py"]


@pytest.mark.parametrize(("knobs", "fragment"), [
    (dict(TITAN, offload_optimizer="cpu"),
     "FSDP2's CPUOffloadPolicy puts parameters, gradients and the optimizer step on the "
     "host together: plan with both --offload-optimizer cpu and --offload-params cpu, or "
     "neither"),
    (dict(TITAN, offload_params="cpu"), "plan with both --offload-optimizer cpu"),
    (dict(TITAN, offload_optimizer="nvme", offload_params="nvme"),
     "NVMe offload is ZeRO-Infinity's: use --emit deepspeed"),
    (dict(TITAN, **BOTH, optimizer_offload_fraction=0.5),
     "FSDP2's CPUOffloadPolicy moves all of the optimizer's state to the host, not a "
     "fraction"),
    (dict(zero_stage=3, offload_activation_layers=2),
     "activation offload is Megatron-LM's (--cpu-offloading-num-layers, fewer layers than "
     "the model's: --emit megatron) and torchtune's (enable_activation_offloading), not "
     "FSDP2's"),
    (dict(TITAN, finetune="lora"),
     "lora adapters are not written for TorchTitan (0.2 has none; 0.3's LoRAConverter "
     "adapts its fused wqkv with one adapter, not one per projection as priced): use "
     "--emit pytorch"),
    (dict(TITAN, finetune="qlora"), "qlora adapters are not written for TorchTitan"),
    (dict(TITAN, optimizer="adam8bit"),
     "TorchTitan steps torch's Adam after the backward here, not bitsandbytes' 8-bit "
     "optimizers"),
    (dict(TITAN, loss_chunks=8),
     "TorchTitan's ChunkedLossWrapper runs each chunk's backward at once, not torchtune's "
     "chunked loss (--loss-chunks) this plan prices"),
])
def test_what_torchtitan_cannot_run_is_refused_in_one_line_by_both_forms(
        knobs: dict, fragment: str) -> None:
    plan = plan_of(**knobs)
    why = torchtitan_incompatibility(plan, MODEL)
    assert why is not None and "\n" not in why and fragment in why
    assert next_incompatibility(plan, MODEL) == why
    for write in (torchtitan_files, torchtitan_next_files):
        with pytest.raises(ValueError, match="TorchTitan cannot run this plan"):
            write(plan, MODEL)


def test_a_lora_converter_in_a_0_3_config_is_refused_by_name(tmp_path) -> None:
    """Checks: a 0.3 config with TorchTitan's LoRAConverter is refused in one line, naming
    it and what runs LoRA instead."""
    path = tmp_path / "lora.py"
    path.write_text(
        "from torchtitan.components.lora import LoRAConverter\n"
        "from torchtitan.config import ParallelismConfig, TrainingConfig\n"
        "from torchtitan.models.llama3 import model_registry\n"
        "from torchtitan.trainer import Trainer\n\n\n"
        "def lora() -> Trainer.Config:\n"
        "    return Trainer.Config(\n"
        '        model_spec=model_registry("8B", converters=[LoRAConverter.Config(\n'
        '            rank=8, alpha=16.0, target_modules=["wqkv", "wo"])]),\n'
        "        training=TrainingConfig(disable_cuda_graphs=True),\n"
        "        parallelism=ParallelismConfig(data_parallel_shard_degree=8),\n"
        "    )\n")
    from planner.torchtitan.errors import JobConfigError

    with pytest.raises(JobConfigError) as refused:
        load_job(str(path), [], 8)
    message = str(refused.value)
    assert "\n" not in message and "LoRAConverter" in message and "--emit pytorch" in message
