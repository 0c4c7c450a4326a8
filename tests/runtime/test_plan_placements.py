"""A training Plan's parameter placements and per-rank model state are what the runtime
builds: each stage's first rank is built on a fake process group (no processes) and its
DTensor placements and local shard bytes are read back."""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.pool

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from cost_models.memory import state_element_bytes
from passes.dtensor_rules import placement_str
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from runtime.spec import from_training_plan
from runtime.pipeline_trainer import PipelineTrainer

GPT = TransformerConfig(
    num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16,
)
LLAMA = TransformerConfig(
    num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16,
    norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=False,
    tie_embeddings=False,
)
MIXTRAL = LLAMA.model_copy(update={"num_experts": 4, "moe_top_k": 2})
# DeepSeek-V3's shape, tiny: MLA (its down projections replicated, up column- and output
# row-parallel), a dense first layer, shared and routed experts, an MTP layer (with the
# embedding's copy on the last stage).
DEEPSEEK_V3 = LLAMA.model_copy(update=dict(
    num_layers=2, ffn_hidden_size=96, multi_latent_attention=True, q_lora_rank=24,
    kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8, num_experts=8,
    moe_top_k=2, moe_ffn_hidden_size=16, moe_shared_expert_intermediate_size=16,
    moe_layer_freq=[0, 1], moe_router_score_function="sigmoid", moe_router_num_groups=4,
    moe_router_group_topk=2, mtp_num_layers=1))

CASES = {
    "gpt-pp2-tp2-dp2-zero3-sp": (GPT, dict(pipeline=2, tensor=2, zero_stage=3,
                                           sequence_parallel=True)),
    "llama-pp2-tp2-dp2-interleaved-zero1": (LLAMA, dict(pipeline=2, tensor=2, zero_stage=1,
                                                        schedule="interleaved",
                                                        virtual_pipeline=2)),
    "gpt-dp8-zero0": (GPT, dict(zero_stage=0)),
    "gpt-tp4-dp2-zero2": (GPT, dict(tensor=4, zero_stage=2)),
    "mixtral-dp4-ep2-zero3": (MIXTRAL, dict(expert=2, zero_stage=3)),
    "deepseek-v3-pp2-tp2-dp2-ep2-zero1": (DEEPSEEK_V3, dict(pipeline=2, tensor=2, expert=2,
                                                            zero_stage=1)),
    # LoRA: each adapted linear's factors beside it (A whole and B by rows beside a
    # column-parallel weight, A by columns and B whole beside a row-parallel one).
    "llama-pp2-tp2-dp2-zero3-lora": (LLAMA, dict(pipeline=2, tensor=2, zero_stage=3,
                                                 finetune="lora", lora_rank=4)),
}


def _plan(model: TransformerConfig, knobs: dict):
    cluster = Cluster.load("cpu").with_devices(8)
    parallel = ParallelConfig.of(micro_batch_size=1, global_batch_size=16, precision="fp32",
                              **{"schedule": "1f1b", **knobs})
    return training_plan("test", model, cluster, parallel)


def _placement(param, axes: list[str]) -> str:
    """The runtime parameter's placement written over the plan's stage axes."""
    if not isinstance(param, DTensor):
        return "R" * len(axes)
    by_axis = {}
    for name, p in zip(param.device_mesh.mesh_dim_names, param.placements, strict=True):
        for axis in name.split("_"):  # FSDP over data x context runs on a flattened dp_cp
            by_axis[axis] = placement_str([p])
    return "".join(by_axis.get(axis, "R") for axis in axes)


def _build_rank(model: TransformerConfig, spec, rank: int, world: int, axes: list[str]):
    """(placements by parameter name, local elements) of `rank`'s stages, built on a fake
    process group. Runs in a fresh child of a fork server (`_fresh_process`): torch's
    DeviceMesh and DTensor keep per-process state (group names, cached shardings) that a
    second rank's build in the same process, or a child forked from this test process,
    would inherit."""
    torch.set_num_threads(1)  # as a rank runs: the cores are shared
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        trainer = PipelineTrainer(model, spec, optimizer="adamw")
        held = {}
        for module in trainer.modules.values():
            for name, param in module.named_parameters():
                held[name.replace("_checkpoint_wrapped_module.", "")] = param
    finally:
        dist.destroy_process_group()
    local = sum(math.prod((p.to_local() if isinstance(p, DTensor) else p).shape)
                for p in held.values())
    return {n: _placement(p, axes) for n, p in held.items()}, local


BUILD_TIMEOUT_S = 120


def _fresh_process() -> multiprocessing.pool.Pool:
    """One worker forked from a fork server, which imports the runtime once and never runs
    a model itself: no DTensor cache, process group or OpenMP thread team to inherit."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["runtime.pipeline_trainer"])
    return context.Pool(1)


@pytest.mark.parametrize("case", CASES)
def test_every_stage_holds_the_plans_placements_and_bytes(case: str) -> None:
    model, knobs = CASES[case]
    plan = _plan(model, knobs)
    spec = from_training_plan(plan)
    element = state_element_bytes("fp32")
    for stage in plan.stages:
        with _fresh_process() as pool:
            placements, local = pool.apply_async(
                _build_rank, (model, spec, stage.first_device, plan.num_gpus, stage.mesh_axes),
            ).get(timeout=BUILD_TIMEOUT_S)
        # The rank's experts are those of its expert group; the plan lists every expert.
        listed = {n: p for n, p in stage.parameters.items()
                  if ".experts." not in n or n in placements}
        assert placements == listed
        # Parameters at rest are the rank's shards under every ZeRO stage FSDP2 runs.
        assert stage.memory is not None
        # (Under LoRA only the adapters have optimizer state: ZeRO-3's parameters tell.)
        at_rest = stage.memory.optimizer_bytes // element.optimizer \
            if plan.parallel.zero_stage in (1, 2) \
            else stage.memory.parameters_bytes // element.params
        assert local == at_rest
