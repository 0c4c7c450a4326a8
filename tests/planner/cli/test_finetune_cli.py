"""`plan` for fine-tuning and offload, as a user sees it: a LoRA and a QLoRA plan of Llama 3
70B on 8 H100 with memory by kind, a full fine-tune of it on the same GPUs reported with
the offload it needs, and a warning (not a refusal) where NVMe offload runs on slow drives."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from planner.cli.main import main
from planner.vocabulary.cluster import Cluster

ARGV = ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "32",
        "--seq-length", "4096"]


def planned(argv: list[str], tmp_path: Path, capsys) -> tuple[dict, str]:
    assert main([*argv, "--json", str(tmp_path / "plan.json")]) == 0
    said = capsys.readouterr()
    return json.loads((tmp_path / "plan.json").read_text()), said.out + said.err


def test_lora_and_qlora_of_70b_on_8_gpus_break_memory_down(tmp_path: Path, capsys) -> None:
    plan, out = planned([*ARGV, "--finetune", "lora", "--lora-rank", "16"], tmp_path, capsys)
    kinds = plan["predicted"]["memory_breakdown_gib"]
    assert {"frozen weights", "adapters", "adapters' gradients", "adapters' optimizer"} \
        <= set(kinds)
    assert plan["run"]["finetune"] == "lora" and plan["run"]["lora_rank"] == 16
    assert "memory per GPU by kind (GiB): frozen weights" in " ".join(out.split())
    assert "Megatron-Bridge's PEFT" in " ".join(out.split())  # Megatron-LM has no adapters
    qlora, _ = planned([*ARGV, "--finetune", "qlora"], tmp_path, capsys)
    q_kinds = qlora["predicted"]["memory_breakdown_gib"]
    # The 4-bit base: about a quarter of the 16-bit one on the same tensor degree.
    t_lora, t_qlora = plan["parallel"]["tensor"], qlora["parallel"]["tensor"]
    per_rank = kinds["frozen weights"] * t_lora / t_qlora
    assert q_kinds["frozen weights"] < 0.4 * per_rank


def test_a_full_fine_tune_of_70b_on_8_gpus_offloads_what_it_must(tmp_path: Path,
                                                                  capsys) -> None:
    plan, out = planned([*ARGV, "--finetune", "full"], tmp_path, capsys)
    assert plan["run"]["offload_optimizer"] == "cpu"
    assert plan["predicted"]["host_memory_gib_per_host"] > 0
    words = " ".join(out.split())
    assert "offload: optimizer: cpu" in words and "; host memory" in words
    assert "PCIe" in words and "it adds" in words


def test_nvme_offload_on_slow_drives_is_a_warning(tmp_path: Path, capsys) -> None:
    cluster = Cluster.load("dgx-h100").model_dump()
    cluster["host"].update(nvme_read_gbs=3.5, nvme_write_gbs=2.0)
    cluster["name"] = "slow-nvme"
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(cluster))
    argv = ["llama3-70b", "--cluster", str(path), "--gpus", "8", "--global-batch-size", "32",
            "--seq-length", "4096", "--offload-optimizer", "nvme"]
    plan, out = planned(argv, tmp_path, capsys)
    assert plan["run"]["offload_optimizer"] == "nvme"
    words = " ".join(out.split())
    assert "warning: slow-nvme's NVMe reads 3.5 GB/s per host, below the 7 GB/s" in words
