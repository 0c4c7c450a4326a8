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


TORCHTUNE_8B = ["llama3-8b", "--cluster", "rtx-4090", "--gpus", "1", "--global-batch-size",
                "2", "--seq-length", "2048", "--finetune", "full", "--engine", "torchtitan"]


def test_torchtunes_single_gpu_full_fine_tune_is_planned_as_its_recipe_runs(
        tmp_path: Path, capsys) -> None:
    """8B_full_single_device.yaml on an RTX 4090: PagedAdamW8bit stepped in backward, a
    chunked loss, every layer's activations offloaded (torchtune's enable_activation_
    offloading, which Megatron-LM's rule of fewer than the layers does not bind)."""
    plan, out = planned([*TORCHTUNE_8B, "--optimizer", "paged_adam8bit",
                         "--optimizer-in-backward", "--loss-chunks", "8",
                         "--cpu-offloading-num-layers", "32", "--recompute-granularity",
                         "none"], tmp_path, capsys)
    run, predicted = plan["run"], plan["predicted"]
    assert (run["optimizer"], run["optimizer_in_backward"], run["loss_chunks"],
            run["offload_activation_layers"]) == ("paged_adam8bit", True, 8, 32)
    assert plan["micro_batch_size"] == 2  # one micro-batch: nothing to accumulate
    assert predicted["memory_breakdown_gib"]["optimizer"] == 0.0  # paged, off the allocator
    assert predicted["pcie_gb_per_step"] > 0
    assert "opt:paged act:32" in out


def test_megatron_offloads_fewer_activation_layers_than_the_model_has(capsys) -> None:
    argv = [*TORCHTUNE_8B[:-2], "--cpu-offloading-num-layers", "32"]
    assert main(argv) == 2
    said = capsys.readouterr()
    assert (said.out + said.err).strip() == ("error: --cpu-offloading-num-layers 32 must be "
                                             "fewer than the model's 32 layers.")
    assert main([*TORCHTUNE_8B, "--cpu-offloading-num-layers", "33"]) == 2
    said = capsys.readouterr()
    assert "must be at most the model's 32 layers" in said.out + said.err
