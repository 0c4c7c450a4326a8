"""NeuronX Distributed Training: a Hydra config (`neuronx.yaml`) and its launch (`neuronx.sh`).

Written for aws-neuron/neuronx-distributed-training@9169aa03f39efd4eb02da63891a7ed98defb1714:
the keys are those `docs/general/config_overview.rst` documents and
`src/neuronx_distributed_training/lightning_modules/model/base.py` reads
(`distributed_strategy.*` into `nxd.neuronx_distributed_config`, `data.micro_batch_size` and
`global_batch_size`, from which it derives the gradient accumulation), in the form of
`examples/conf/hf_llama3_8B_config.yaml`. The file is a Hydra config whose `defaults` list
names one of those example configs (Llama 3 8B for a Llama-style model, its trn2 variant on
Trn2; Mixtral 8x7B for a Mixtral-style one) and overrides what the plan decides; it goes
into the examples' `conf/` folder and `neuronx.sh` starts `training_orchestrator.py` on it,
as `examples/train.sh` does (Hydra composes it with the example: checked by hand with
hydra-core on the examples at that commit).

What a device is: Tessel's Trainium presets count chips (planner/presets/trn1.yaml,
trn2.yaml); NeuronX Distributed runs one rank per NeuronCore and counts its degrees in them:
2 per Trainium1 chip (32 per trn1.32xlarge), 4 logical per Trainium2 chip (8 physical
NeuronCore-v3 run in pairs, LNC=2: 64 per trn2.48xlarge, `trainer.lnc: 2`). The chip's
cores are the plan's tensor degree times that many: `tensor_model_parallel_size` counts
cores (TP 32 is one trn1.32xlarge, as the published configs run), the other degrees are the
plan's, and so the data degree and the gradient accumulation come out as planned. A plan with
no tensor parallelism splits each chip's layers over its cores with sequence parallelism, so
a chip holds the bytes the plan priced. The Plan names its cluster, not its chip: a cluster
whose name says neither trn1 nor trn2 (Trainium) is refused.

How the rest maps: `pipeline_model_parallel_size` with the plan's own stage split as
`model.pipeline_cuts` (NxD's pipeline runs 1F1B; interleaved with
`virtual_pipeline_model_parallel_size`), `context_parallel_size` with
`model.fusions.ring_attention`, `expert_model_parallel_size` (carved from the data ranks),
`zero1` (ZeRO-1), `sequence_parallel`, `kv_replicator` (KV heads copied up to the tensor
degree), `activations_checkpoint_granularity` (full, selective with the modules of the
plan's `recompute_modules`: CoreAttention, the MLP, the RMSNorm; null for none), and
`precision.type` (bf16: mixed_precision, fp32 master weights and gradient accumulation;
fp32: fp32). Refused in one line: ZeRO-2 and ZeRO-3 (NxD shards the optimizer only), ZeRO-0
in bf16 (NxD keeps fp32 master weights only with zero1), GPipe and DualPipeV schedules,
fp16 and fp8, LoRA adapters, and any knob set away from its default that NxD has no key for.
The Neuron compiler schedules collectives and picks kernels itself: the plan's overlap,
bucket, CUDA graph, compile, attention-backend and dispatcher knobs are not written.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from planner.export.plan_config import one_layout_problem, plan_model
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import unmapped_knob
from planner.vocabulary.plan import Plan

SOURCE = "aws-neuron/neuronx-distributed-training@9169aa03f39efd4eb02da63891a7ed98defb1714"
CONFIG_NAME = "neuronx"
CONFIG_FILE = f"{CONFIG_NAME}.yaml"
LAUNCH_FILE = "neuronx.sh"
MASTER_PORT = 29500
TRAINIUM = {  # cluster-name fragment -> (NxD ranks per chip, trainer.lnc or None)
    "trn2": (4, 2), "trainium2": (4, 2),
    "trn1": (2, None), "trainium1": (2, None),
}
BASE_CONFIGS = {  # (MoE, Trainium2) -> the example config the file overrides
    (False, False): "hf_llama3_8B_config", (False, True): "hf_llama3_8B_trn2_config",
    (True, False): "hf_mixtral_8x7b_config", (True, True): "hf_mixtral_8x7b_config",
}
RECOMPUTE_MODULES = {  # Tessel's recompute module -> NxDT's class, (Llama, Mixtral)
    "core_attn": ("CoreAttention", "CoreAttention"),
    "mlp": ("LlamaMLP", None),  # Mixtral's MLPs are its experts (moe)
    "layernorm": ("LlamaRMSNorm", "MixtralRMSNorm"),
    "moe": (None, "MoE"),
}
"""The module classes the HF Llama and Mixtral modules checkpoint by name
(lightning_modules/model/hf_models/llama_model.py, mixtral_model.py): a name they do not
import is ignored there, so only these are written."""
HANDLED = frozenset({
    "tensor", "pipeline", "context", "expert", "expert_tensor", "data", "micro_batch_size",
    "global_batch_size", "zero_stage", "recompute", "recompute_modules", "sequence_parallel",
    "virtual_pipeline", "schedule", "precision", "main_grads_dtype", "exp_avg_dtype",
    "moe_expert_capacity_factor", "engine", "finetune"})
NOT_WRITTEN = frozenset({  # the Neuron compiler schedules and picks these itself
    "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "attention_backend",
    "ddp_bucket_size", "cuda_graphs", "cuda_graph_scope", "compile", "compile_loss",
    "fsdp_reshard_after_forward", "moe_token_dispatcher", "moe_grouped_gemm",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
    # and these only qualify fp8 and adapters, which are refused
    "fp8_recipe", "lora_rank", "lora_alpha", "lora_targets"})


def trainium(plan: Plan) -> tuple[int, int | None] | None:
    """(NxD ranks per chip, trainer.lnc) of the plan's Trainium cluster, by its name; None
    for a cluster whose name says no Trainium generation."""
    name = plan.cluster.lower()
    return next((value for fragment, value in TRAINIUM.items() if fragment in name), None)


def _family(model: TransformerConfig) -> str | None:
    """'llama' or 'mixtral' where NxDT's HF modules build the shape, else None."""
    if (model.norm, model.activation, model.position_embedding, model.bias) != (
            "rmsnorm", "swiglu", "rope", False):
        return None
    if (model.multi_latent_attention or model.window_size or model.qk_layernorm
            or model.moe_shared_expert_intermediate_size or model.mtp_num_layers
            or model.moe_layer_freq != 1 or model.qkv_bias):
        return None
    return "mixtral" if model.is_moe else "llama"


def neuronx_incompatibility(plan: Plan, model: TransformerConfig | None) -> str | None:
    """Why NeuronX Distributed Training cannot run `plan` of `model` (one line), or None."""
    problem = one_layout_problem(plan)
    if problem:
        return problem
    q, run, shape = plan.parallel, plan.run, plan_model(plan, model)
    assert q is not None
    if trainium(plan) is None:
        return (f"it runs on Trainium, and this plan was priced on {plan.cluster}: plan with "
                "--cluster trn1 or trn2")
    if shape is None:
        return "the plan's model shape is unknown (plan a preset or give its shape flags)"
    if _family(shape) is None:
        return (f"its Hugging Face models are Llama and Mixtral; {plan.model}'s shape is "
                "neither")
    if q.zero_stage >= 2:
        return (f"it shards the optimizer's state (zero1), not gradients or weights as ZeRO-"
                f"{q.zero_stage} does: plan with --zero-stage 1")
    if plan.precision in ("fp16", "fp8"):
        return f"it trains in bf16 or fp32, not {plan.precision}: plan with --precision bf16"
    if plan.precision == "bf16" and q.zero_stage == 0:
        return ("it keeps fp32 master weights only with its ZeRO-1 optimizer (zero1): plan "
                "with --zero-stage 1")
    if q.expert > 1 and (q.data % q.expert or q.dims.expert_tensor_degree != q.tensor):
        return (f"its expert ranks are carved from the data ranks, each expert split over the "
                f"tensor degree; this plan folds {q.expert} expert ranks over {q.data} data "
                f"ranks with expert tensor degree {q.dims.expert_tensor_degree}")
    why = _pipeline_refusal(plan) or _recompute_refusal(plan, shape)
    if why is not None:
        return why
    if run is not None and run.finetune in ("lora", "qlora"):
        return f"{run.finetune} adapters are not written for it: use --emit pytorch"
    if run is not None and (run.main_grads_dtype, run.exp_avg_dtype) != ("fp32", "fp32"):
        return ("its mixed precision accumulates gradients and keeps Adam's state in fp32: "
                "plan without --main-grads-dtype / --exp-avg-dtype bf16")
    return _unmapped(plan)


def _pipeline_refusal(plan: Plan) -> str | None:
    """Why NxD's pipeline cannot run the plan's (one line), or None."""
    q = plan.parallel
    assert q is not None
    if q.pipeline == 1:
        return None
    if plan.schedule not in ("1f1b", "interleaved"):
        return (f"its pipeline runs 1F1B (interleaved with virtual stages), not "
                f"{plan.schedule}: plan with --schedule 1f1b")
    sizes = {stop - start for stage in plan.stages for start, stop in [stage.layers]}
    if q.virtual_pipeline > 1 and len(sizes) != 1:
        return "its interleaved pipeline splits the layers evenly; this plan's stages are not"
    return None


def _recompute_refusal(plan: Plan, model: TransformerConfig) -> str | None:
    """Why NxDT cannot recompute what the plan recomputes (one line), or None."""
    run = plan.run
    if plan.recompute == "full" and run is not None and (
            run.recompute_method != "uniform" or run.recompute_num_layers != 1
            or run.recompute_every != 1):
        return ("it checkpoints every layer, not Megatron-LM's --recompute-method / "
                "--recompute-num-layers groups or every k-th block")
    if plan.recompute == "selective" and run is not None:
        column = _family(model) == "mixtral"
        missing = [m for m in run.recompute_modules
                   if RECOMPUTE_MODULES.get(m, (None, None))[column] is None]
        if missing:
            return f"its {_family(model)} model has no module to recompute for {', '.join(missing)}"
    return None


def tensor_degree(plan: Plan) -> int:
    """tensor_model_parallel_size: the plan's tensor degree in NeuronCores."""
    assert plan.parallel is not None
    found = trainium(plan)
    return plan.parallel.tensor * (found[0] if found else 1)


def neuronx_config(plan: Plan, model: TransformerConfig) -> dict[str, Any]:
    """The Hydra config of `plan` (see `neuronx_incompatibility` first)."""
    q, run = plan.parallel, plan.run
    found = trainium(plan)
    assert q is not None and found is not None and plan.global_batch_size
    lnc = found[1]
    family = _family(model)
    tensor = tensor_degree(plan)
    ranks, nodes = neuronx_config_devices(plan)
    trainer: dict[str, Any] = {"devices": ranks, "num_nodes": nodes}
    if lnc is not None:
        trainer["lnc"] = lnc
    if plan.training is not None:
        trainer["max_steps"] = plan.training.steps
    strategy: dict[str, Any] = {
        "tensor_model_parallel_size": tensor,
        "pipeline_model_parallel_size": q.pipeline,
        "virtual_pipeline_model_parallel_size": q.virtual_pipeline,
        "context_parallel_size": q.context,
        "expert_model_parallel_size": q.expert,
        "zero1": q.zero_stage == 1,
        "sequence_parallel": tensor > 1 and (q.sequence_parallel or q.tensor == 1),
        "kv_replicator": max(1, tensor // model.num_kv_heads),
    }
    section: dict[str, Any] = {
        "encoder_seq_length": model.seq_length,
        "max_position_embeddings": model.seq_length,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "rope_theta": float(model.rotary_base),
        **_checkpointing(plan, family == "mixtral"),
    }
    if q.pipeline > 1 and q.virtual_pipeline == 1:
        section["pipeline_cuts"] = [f"model.layers.{stage.layers[0]}"
                                    for stage in plan.stages[1:]]
    if q.context > 1:
        section["fusions"] = {"ring_attention": True}
    if model.is_moe:
        cap = run.moe_expert_capacity_factor if run is not None else None
        section["moe"] = {"num_experts": model.num_experts, "top_k": model.moe_top_k,
                          "capacity_factor": cap, "dropless": cap is None}
    return {
        "defaults": [BASE_CONFIGS[(model.is_moe, lnc is not None)], "_self_"],
        "trainer": trainer,
        "distributed_strategy": strategy,
        "data": {"micro_batch_size": plan.micro_batch_size,
                 "global_batch_size": plan.global_batch_size},
        "model": section,
        "precision": {"type": "fp32" if plan.precision == "fp32" else "mixed_precision"},
    }


def _checkpointing(plan: Plan, mixtral: bool) -> dict[str, Any]:
    """model.activations_checkpoint_granularity and _recompute of the plan's recomputation."""
    if plan.recompute == "none":
        return {"activations_checkpoint_granularity": None,
                "activations_checkpoint_recompute": None}
    if plan.recompute == "full":
        return {"activations_checkpoint_granularity": "full",
                "activations_checkpoint_recompute": None}
    modules = plan.run.recompute_modules if plan.run is not None else ("core_attn",)
    return {"activations_checkpoint_granularity": "selective",
            "activations_checkpoint_recompute": [RECOMPUTE_MODULES[m][mixtral]
                                                 for m in modules]}


def launch_words(plan: Plan) -> list[str]:
    """torchrun starting NxDT's orchestrator on the config, one agent per node (run from
    the examples folder, the config in its conf/)."""
    ranks, nodes = neuronx_config_devices(plan)
    return ["torchrun", "--nproc_per_node", str(ranks), "--nnodes", str(nodes),
            "--node_rank", "$NODE_RANK", "--master_addr", "$MASTER_ADDR", "--master_port",
            str(MASTER_PORT), "training_orchestrator.py", "--config-path=conf",
            f"--config-name={CONFIG_NAME}", '"model.model_config=$MODEL_CONFIG"']


def neuronx_config_devices(plan: Plan) -> tuple[int, int]:
    """(ranks per node, nodes) of the plan on Trainium: a node is a host (an instance)."""
    found = trainium(plan)
    assert found is not None
    per_host = min(plan.devices_per_host or plan.devices_per_node, plan.num_gpus)
    return per_host * found[0], plan.num_gpus // per_host


def neuronx_files(plan: Plan, model: TransformerConfig | None) -> dict[str, str]:
    """{'neuronx.yaml': ..., 'neuronx.sh': ...}; ValueError (one line) when NeuronX
    Distributed Training cannot run `plan`."""
    why = neuronx_incompatibility(plan, model)
    if why:
        raise ValueError(f"NeuronX Distributed cannot run this plan: {why}")
    shape = plan_model(plan, model)
    assert shape is not None
    ranks, nodes = neuronx_config_devices(plan)
    header = (f"# NeuronX Distributed Training config ({SOURCE}, keys of docs/general/"
              f"config_overview.rst): {plan.model} on {plan.num_gpus} chips ({plan.cluster}) "
              f"= {ranks * nodes} NeuronCore ranks, as Tessel planned it.\n"
              "# Put it in examples/conf/ beside the config its defaults name.\n")
    text = header + yaml.safe_dump(neuronx_config(plan, shape), sort_keys=False)
    script = "\n".join([
        "#!/bin/bash",
        f"# NeuronX Distributed Training: {plan.model} as Tessel planned it. Run from "
        f"neuronx-distributed-training's examples/ on each of the {nodes} node(s),",
        f"# with {CONFIG_FILE} in examples/conf/ and MODEL_CONFIG the model's Hugging Face "
        "config.json.",
        "set -euo pipefail",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the first node\'s address}"',
        ': "${NODE_RANK:?set NODE_RANK to this node\'s index, 0 first}"',
        ': "${MODEL_CONFIG:?set MODEL_CONFIG to the model\'s config.json}"',
        " ".join(w if "$" in w else shlex.quote(w) for w in launch_words(plan)),
        "",
    ])
    return {CONFIG_FILE: text, LAUNCH_FILE: script}


def _unmapped(plan: Plan) -> str | None:
    """The one line for a knob set away from its default that NxD has no key for."""
    knob = unmapped_knob(plan, HANDLED | NOT_WRITTEN)
    return None if knob is None else f"it has no {knob}"
