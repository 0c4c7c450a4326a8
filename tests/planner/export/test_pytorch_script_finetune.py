"""`--emit pytorch` with LoRA adapters and FSDP2's CPU offload, built by torch itself.

- LoRA: the script's own adapters (no peft). Imported, the script builds rank 0's chunks on
  a fake process group with every base weight frozen and only the adapter factors
  trainable, each factor split exactly as the Plan lists it (beside a column-parallel
  linear A whole and B by rows, beside a row-parallel one A by columns and B whole; FSDP2
  over the data ranks on top), pipelined or not.
- CPU offload: with the optimizer and the parameters both offloaded (ZeRO-3), every
  fully_shard gets CPUOffloadPolicy; FSDP2 builds it on the CPU here (its pinned memory needs
  a GPU, so the script pins only where CUDA is). tests/e2e/test_emitted_pytorch_script.py
  trains such a script on four CPU ranks.
- What the script cannot run (one offload without the other, NVMe, a fraction of the
  optimizer, activations, QLoRA's 4-bit base) is refused in one line naming what does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor

from passes.dtensor_rules import placement_str
from planner.export.pytorch_script import lora_linears, pytorch_files, pytorch_incompatibility
from planner.models.presets import zoo_config
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.placement_text import placement_pieces
from planner.vocabulary.plan import Plan
from tests.planner.export.emitted_script import built_on_rank_0, imported

SHAPE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256,
         "seq_length": 16}
MODEL = zoo_config("llama", SHAPE)
LORA = dict(finetune="lora", lora_rank=4, lora_alpha=8.0)
OFFLOAD = dict(offload_optimizer="cpu", offload_params="cpu")


def plan_of(**knobs: Any) -> Plan:
    # dgx-h100: a cluster with host figures, which pricing the offload needs.
    knobs = {"micro_batch_size": 1, "global_batch_size": 8, "precision": "fp32", **knobs}
    return training_plan("llama", MODEL, Cluster.load("dgx-h100").with_devices(4),
                         ParallelConfig.of(**knobs))


def script_of(plan: Plan, tmp_path: Path, name: str) -> tuple[str, Any]:
    text = pytorch_files(plan, MODEL)["pytorch_train.py"]
    return text, imported(text, tmp_path, name)


def built(script: Any, plan: Plan) -> tuple[Any, list, list, Any]:
    """Rank 0's mesh, chunk indices, chunks and schedule, built on a fake process group
    of the plan's size."""
    return built_on_rank_0(script, plan.num_gpus)


def planned(plan: Plan, text: str, param: DTensor) -> str:
    """The Plan's placement text of a parameter on the axes of the mesh the script put it
    on (a stage's mesh lists tp even where it is 1; the script's dp-only mesh does not)."""
    pieces = dict(zip(plan.stages[0].mesh_axes, placement_pieces(text)))
    return "".join(f"{kind}({argument})" if argument else kind
                   for kind, argument in (pieces[axis]
                                          for axis in param.device_mesh.mesh_dim_names))


LORA_PLANS = {
    "tp2-dp2-zero3-full": dict(tensor=2, sequence_parallel=True, zero_stage=3,
                               recompute="full", **LORA),
    "pp2-tp2-zero1-selective": dict(tensor=2, pipeline=2, sequence_parallel=True,
                                    zero_stage=1, recompute="selective", **LORA),
    "dp4-qkv-and-proj-only": dict(zero_stage=3, lora_targets=("linear_qkv", "linear_proj"),
                                  **LORA),
}


@pytest.mark.parametrize("case", LORA_PLANS)
def test_a_lora_scripts_rank_0_trains_only_its_adapters_split_as_planned(
        case: str, tmp_path: Path) -> None:
    plan = plan_of(**LORA_PLANS[case])
    text, script = script_of(plan, tmp_path, case.replace("-", "_"))
    assert "no peft" in text and "import peft" not in text
    _, _, chunks, _ = built(script, plan)
    listed = plan.stages[0].parameters
    factors = 0
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            name = name.replace("_checkpoint_wrapped_module.", "")
            adapter = name.endswith((".lora_a.weight", ".lora_b.weight"))
            assert param.requires_grad == adapter, name
            if adapter:
                factors += 1
                assert name.rsplit(".", 3)[-3] in lora_linears(plan), name
                assert isinstance(param, DTensor)
                assert placement_str(param.placements) == planned(plan, listed[name],
                                                                  param), name
    adapted = {"linear_qkv": 3, "linear_proj": 1, "linear_fc1": 2, "linear_fc2": 1}
    per_layer = sum(adapted[t] for t in plan.run.lora_targets)
    layers = sum(len(chunk.layers) for chunk in chunks)
    assert factors == 2 * per_layer * layers


def test_a_cpu_offload_scripts_fully_shard_takes_cpu_offload_policy(tmp_path: Path) -> None:
    plan = plan_of(tensor=2, sequence_parallel=True, zero_stage=3, **OFFLOAD)
    text, script = script_of(plan, tmp_path, "offload")
    assert "CPU_OFFLOAD = True" in text and '"cuda:nccl,cpu:gloo"' in text
    _, _, chunks, _ = built(script, plan)
    for chunk in chunks:
        for module in [*chunk.layers.values(), chunk]:
            group = module._get_fsdp_state()._fsdp_param_group
            assert isinstance(group.offload_policy, CPUOffloadPolicy)
            assert all(p.offload_to_cpu for p in group.fsdp_params)


def test_a_plain_script_has_no_offload_and_no_adapters(tmp_path: Path) -> None:
    plan = plan_of(tensor=2, sequence_parallel=True, zero_stage=3)
    text, script = script_of(plan, tmp_path, "plain")
    assert "CPU_OFFLOAD = False" in text and "LORA_" not in text and "add_lora" not in text
    _, _, chunks, _ = built(script, plan)
    assert all(p.requires_grad for chunk in chunks for p in chunk.parameters())
    group = chunks[0]._get_fsdp_state()._fsdp_param_group
    assert not isinstance(group.offload_policy, CPUOffloadPolicy)


def test_a_bf16_gradient_plans_script_reduce_scatters_bf16(tmp_path: Path) -> None:
    # The plan prices bf16 reduce-scatters (main_grads_dtype): FSDP2's policy says so.
    plan = plan_of(zero_stage=3, precision="bf16", main_grads_dtype="bf16",
                   engine="torchtitan")
    _, script = script_of(plan, tmp_path, "bf16_reduce")
    _, _, chunks, _ = built(script, plan)
    policy = chunks[0]._get_fsdp_state()._fsdp_param_group.mp_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    default = plan_of(zero_stage=3, precision="bf16", engine="torchtitan")
    _, script = script_of(default, tmp_path, "fp32_reduce")
    _, _, chunks, _ = built(script, default)
    assert chunks[0]._get_fsdp_state()._fsdp_param_group.mp_policy.reduce_dtype \
        == torch.float32


@pytest.mark.parametrize(("knobs", "fragment"), [
    (dict(zero_stage=3, offload_optimizer="cpu"),
     "FSDP2's CPUOffloadPolicy puts parameters, gradients and the optimizer step on the "
     "host together: plan with both --offload-optimizer cpu and --offload-params cpu, or "
     "neither (--emit deepspeed offloads one alone)"),
    (dict(zero_stage=3, offload_params="cpu"), "plan with both --offload-optimizer cpu"),
    (dict(zero_stage=3, offload_optimizer="nvme", offload_params="nvme"),
     "NVMe offload is ZeRO-Infinity's: use --emit deepspeed"),
    (dict(zero_stage=3, **OFFLOAD, optimizer_offload_fraction=0.5),
     "not a fraction (--optimizer-offload-fraction is Megatron-LM's: --emit megatron)"),
    (dict(offload_activation_layers=2),
     "activation offload is Megatron-LM's (--cpu-offloading-num-layers, fewer layers than "
     "the model's: --emit megatron) and torchtune's (enable_activation_offloading), not "
     "FSDP2's"),
    (dict(optimizer="paged_adam8bit", engine="torchtitan"),
     "the script steps torch's AdamW after the backward, not bitsandbytes' 8-bit"),
    (dict(optimizer_in_backward=True, global_batch_size=4, engine="torchtitan"),
     "or a step in backward"),
    (dict(loss_chunks=8, engine="torchtitan"),
     "the script scores the whole output at once, not torchtune's chunked loss"),
    (dict(finetune="qlora", precision="bf16"),
     "QLoRA's 4-bit NF4 base needs torchao or bitsandbytes beyond torch's own pieces: plan "
     "with --finetune lora"),
])
def test_what_the_script_cannot_run_is_refused_in_one_line(knobs: dict, fragment: str) -> None:
    plan = plan_of(**knobs)
    why = pytorch_incompatibility(plan, MODEL)
    assert why is not None and "\n" not in why and fragment in why
    with pytest.raises(ValueError, match="the PyTorch script cannot run this plan"):
        pytorch_files(plan, MODEL)
