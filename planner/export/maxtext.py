"""MaxText: a config override (`maxtext.yml`) and its launch line (`maxtext.sh`) for a Plan.

Written for MaxText as of AI-Hypercomputer/maxtext@e591f30cbbf217ed67ef71263ec0538239f9c3b8:
every key is one of `src/maxtext/configs/base.yml` (types in `src/maxtext/configs/types.py`,
the mesh in `src/maxtext/utils/maxtext_utils.py` `create_device_mesh`). The file names
`base_config: base.yml` (MaxText's `pyconfig` merges it over base.yml, looked up beside the
file or in MaxText's configs folder), and `maxtext.sh` runs
`python3 -m maxtext.trainers.pre_train.train maxtext.yml`.

How the plan maps:

- MaxText's mesh is ICI axes within a slice times DCN axes across slices; Tessel's slice is
  the plan's scale-up domain (`devices_per_node`: a TPU slice, or a GPU node). Each degree
  is split there in Tessel's rank order, fastest first (tensor, context, expert, data,
  pipeline): its ranks inside the slice are `ici_*`, the rest `dcn_*`; the ICI degrees
  multiply to the devices of a slice, the DCN ones to the slices. A degree that straddles
  the slice boundary unevenly is refused.
- data parallelism: ZeRO-3 is `fsdp`; ZeRO-0 is `data` (replicas); ZeRO-1 is `data` with
  `shard_optimizer_over_data` (MaxText's ZeRO-1). ZeRO-2 (gradients sharded apart from the
  weights) has no MaxText form and is refused.
- tensor parallelism with sequence parallelism is `tensor_sequence` (base.yml's logical
  rules shard the norms' sequence dimension, `activation_norm_length`, over it), without it
  `tensor`; context parallelism is `context` (MaxText's default all-gather of keys and values,
  the same bytes per layer as Megatron-LM's ring, which Tessel prices).
- experts: MaxText's `expert` axis shards the batch of the dense layers like data ranks,
  so the plan's expert degree must divide its data degree (experts folded over data ranks),
  and each expert is split over the tensor degree (expert tensor degree = tensor degree).
  MaxText also shards dense weights over its context and expert axes (rule `embed`), as
  FSDP does, whatever the plan's ZeRO stage: the file runs MaxText's layout.
- batch: MaxText's global batch is `per_device_batch_size` x devices x
  `gradient_accumulation_steps`. Without a pipeline one forward is the plan's micro-batch on
  every data rank (`per_device_batch_size` = micro-batch x data / devices, fractional under
  tensor or context parallelism) and the accumulation steps are its micro-batches; with a
  pipeline MaxText splits one batch into `num_pipeline_microbatches` (the plan's
  micro-batches, a multiple of the stages), so `per_device_batch_size` = global batch /
  devices.
- a device: Tessel counts chips (planner/presets/tpu-*.yaml: a preset's peak and memory are
  a chip's); MaxText counts JAX devices: one per chip on v4, v5e, v5p and v6e (v4 and v5p
  run their two TensorCores as one megacore device), two on TPU7x Ironwood, each with half
  the chip's memory. A plan whose cluster name says Ironwood (`tpu-v7`, `tpu7x`, `ironwood`:
  the Plan names its cluster, not its chip) gets twice the devices, the factor where it
  keeps a chip's bytes as priced: on the FSDP axis under ZeRO-3 (as tpu-recipes' Ironwood
  runs shard over all 2 x chips devices), else on the tensor axis (a replica's weights
  split over the chip's two halves). `per_device_batch_size` halves either way.
- pipeline: MaxText's SPMD pipeline runs every micro-batch's forward before the backwards
  (GPipe's order; circular over `num_pipeline_repeats`), so only a `gpipe` plan with equal
  stages is written (`num_layers_per_pipeline_stage` = layers / stages, one repeat); 1F1B,
  interleaved and DualPipeV plans are refused.
- recomputation (`remat_policy`, base.yml's list and decoders.py's `get_remat_policy`):
  full -> `full`; none -> `minimal_with_context` (saves every named matmul output and the
  attention context: "save all"; MaxText always rematerializes each layer's unnamed
  elementwise ops); selective -> the policy that rematerializes what the plan's
  `recompute_modules` name: the attention core -> `minimal`, the MLP ->
  `save_dot_with_context_except_mlp`, both -> `save_dot_except_mlp`; norms and activations
  are rematerialized under every policy.
- precision: bf16 -> `dtype: bfloat16` with `weight_dtype: float32` (fp32 master weights,
  Adam's state in it), fp32 -> both float32; `grad_dtype` is the plan's gradient buffer.
  fp16 (no loss scaling in MaxText) and fp8 (MaxText's fp8 is its quantization library's
  recipe, not the plan's) are refused.
- the model: a shape that is one of MaxText's own model configs is `model_name` (Llama 3
  8B/70B/405B, Mixtral 8x7B, DeepSeek-V3); another Llama-style (RMSNorm, SwiGLU, RoPE, no
  bias) dense or Mixtral-style MoE shape, or a GPT-style one (LayerNorm, GeLU, learned
  positions), is written as base.yml's shape keys with its decoder block (`llama2`,
  `mixtral`, `gpt3`); anything else is refused.

XLA schedules collectives and their overlap itself and picks its kernels, so the plan's
overlap, bucket, CUDA graph, compile, attention-backend and token-dispatcher knobs have no
key here and are not written. Any other knob the plan sets away from its default that MaxText
has no key for (offload, LoRA, 8-bit optimizers, Megatron-LM's recompute groups, forced
expert balance, ...) is refused in one line.
"""

from __future__ import annotations

import shlex
from fractions import Fraction
from typing import Any

import yaml

from planner.export.plan_config import one_layout_problem, plan_model
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import unmapped_knob
from planner.vocabulary.plan import Plan

SOURCE = "AI-Hypercomputer/maxtext@e591f30cbbf217ed67ef71263ec0538239f9c3b8"
CONFIG_FILE = "maxtext.yml"
LAUNCH_FILE = "maxtext.sh"
TRAIN_MODULE = "maxtext.trainers.pre_train.train"
IRONWOOD_NAMES = ("tpu-v7", "tpu7x", "ironwood")
"""Cluster-name fragments of TPU7x Ironwood, whose chip is two JAX devices."""
OTHER_DEVICES = ("trn", "trainium", "gaudi")
"""Cluster-name fragments of devices MaxText (JAX on TPUs and GPUs) does not run on."""
MODELS = {  # (layers, hidden, heads, kv heads, ffn, vocab, experts) -> MaxText model_name
    (32, 4096, 32, 8, 14336, 128256, None): "llama3-8b",
    (80, 8192, 64, 8, 28672, 128256, None): "llama3-70b",
    (126, 16384, 128, 8, 53248, 128256, None): "llama3.1-405b",
    (32, 4096, 32, 8, 14336, 32000, 8): "mixtral-8x7b",
    (61, 7168, 128, 128, 18432, 129280, 256): "deepseek3-671b",
}
"""MaxText's model configs (src/maxtext/configs/models/<name>.yml) by the shape they build."""
SELECTIVE_POLICIES = {  # (attention core recomputed, MLP recomputed) -> remat_policy
    (True, False): "minimal",
    (False, True): "save_dot_with_context_except_mlp",
    (True, True): "save_dot_except_mlp",
    (False, False): "minimal_with_context",
}
# Knobs this module maps or checks itself, and those XLA decides (no MaxText key).
HANDLED = frozenset({
    "tensor", "pipeline", "context", "expert", "expert_tensor", "data", "micro_batch_size",
    "global_batch_size", "zero_stage", "recompute", "recompute_modules", "sequence_parallel",
    "virtual_pipeline", "schedule", "precision", "main_grads_dtype", "loss_chunks",
    "moe_expert_capacity_factor", "engine", "finetune", "exp_avg_dtype"})
NOT_WRITTEN = frozenset({  # XLA schedules and picks these itself
    "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "attention_backend",
    "ddp_bucket_size", "cuda_graphs", "cuda_graph_scope", "compile", "compile_loss",
    "fsdp_reshard_after_forward", "moe_token_dispatcher", "moe_grouped_gemm",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
    # and these only qualify fp8 and adapters, which are refused
    "fp8_recipe", "lora_rank", "lora_alpha", "lora_targets"})


def jax_devices_per_chip(plan: Plan) -> int:
    """MaxText's devices per Tessel device: 2 on an Ironwood cluster (by its name), else 1."""
    name = plan.cluster.lower()
    return 2 if any(fragment in name for fragment in IRONWOOD_NAMES) else 1


def maxtext_incompatibility(plan: Plan, model: TransformerConfig | None) -> str | None:
    """Why MaxText cannot run `plan` of `model` (one line), or None."""
    problem = one_layout_problem(plan)
    if problem:
        return problem
    q, run, shape = plan.parallel, plan.run, plan_model(plan, model)
    assert q is not None
    other = [fragment for fragment in OTHER_DEVICES if fragment in plan.cluster.lower()]
    if other:
        return (f"MaxText runs on TPUs and GPUs, and this plan was priced on {plan.cluster}"
                + (": use --emit neuronx" if other[0] in ("trn", "trainium") else ""))
    if shape is None:
        return "the plan's model shape is unknown (plan a preset or give its shape flags)"
    if model_keys(shape) is None:
        return (f"MaxText builds its own decoders: {plan.model}'s shape is none of its model "
                "configs, nor a Llama-, Mixtral- or GPT-style shape its base keys describe")
    if q.zero_stage == 2:
        return ("MaxText shards over data ranks the optimizer's state (ZeRO-1, "
                "shard_optimizer_over_data) or everything (FSDP, ZeRO-3), not gradients "
                "apart: plan with --zero-stage 1 or 3")
    if q.expert > 1 and (q.data % q.expert or q.dims.expert_tensor_degree != q.tensor):
        return (f"MaxText's expert axis is carved from the data ranks with each expert split "
                f"over the tensor degree; this plan folds {q.expert} expert ranks over "
                f"{q.data} data ranks with expert tensor degree {q.dims.expert_tensor_degree}")
    if plan.precision in ("fp16", "fp8"):
        why = {"fp16": "no loss scaling",
               "fp8": "its fp8 is its quantization library's recipe, not the plan's"}
        return (f"MaxText has no {plan.precision} training as priced "
                f"({why[plan.precision]}): plan with --precision bf16")
    why = _pipeline_refusal(plan, shape)
    if why is not None:
        return why
    if plan.recompute == "full" and run is not None and (
            run.recompute_method != "uniform" or run.recompute_num_layers != 1):
        return ("MaxText rematerializes every layer by one policy, not Megatron-LM's "
                "--recompute-method / --recompute-num-layers groups")
    if run is not None and run.finetune in ("lora", "qlora"):
        return f"{run.finetune} adapters are not written for MaxText: use --emit pytorch"
    if run is not None and run.exp_avg_dtype != "fp32":
        return ("optax keeps Adam's second moment in the weights' dtype (float32): plan "
                "without --exp-avg-dtype bf16")
    why = _unmapped(plan)
    if why is not None:
        return why
    try:
        mesh_keys(plan)
    except ValueError as error:  # a degree straddles the slice unevenly
        return str(error)
    return _batch_refusal(plan, shape)


def _pipeline_refusal(plan: Plan, model: TransformerConfig) -> str | None:
    """Why MaxText's pipeline cannot run the plan's (one line), or None."""
    q = plan.parallel
    assert q is not None
    if q.pipeline == 1:
        return None
    if plan.schedule != "gpipe" or q.virtual_pipeline != 1:
        return (f"MaxText's pipeline runs every micro-batch's forward before the backwards "
                f"(GPipe's order), not {plan.schedule}: plan with --schedule gpipe")
    sizes = {stop - start for stage in plan.stages for start, stop in [stage.layers]}
    if len(sizes) != 1:
        return "MaxText's pipeline stages hold equal layers; this plan's stages do not"
    if model.is_moe and model.moe_layer_freq != 1:
        return ("MaxText pipelines only the MoE layers of a model that has dense ones too, "
                "not the plan's stages")
    if plan.num_micro_batches % q.pipeline:
        return (f"MaxText's pipeline needs micro-batches a multiple of its {q.pipeline} "
                f"stages, not {plan.num_micro_batches}")
    return None


def _batch_refusal(plan: Plan, model: TransformerConfig) -> str | None:
    """Why MaxText's batch keys cannot hold the plan's batch, or None."""
    q, run = plan.parallel, plan.run
    assert q is not None and plan.micro_batch_size is not None
    per_chip = jax_devices_per_chip(plan)
    tensor, _ = _tensor_and_data(plan)
    if per_chip > 1 and q.zero_stage == 3 and plan.micro_batch_size % per_chip:
        return (f"an Ironwood chip's {per_chip} devices split each FSDP rank's micro-batch of "
                f"{plan.micro_batch_size}: plan with an even --micro-batch-size")
    if model.num_attention_heads % tensor:
        return (f"an Ironwood chip's {per_chip} devices make the tensor degree {tensor}, which "
                f"does not divide the {model.num_attention_heads} heads: plan with "
                "--zero-stage 3 (the factor then falls on FSDP)")
    pdb, devices = per_device_batch(plan), plan.num_gpus * per_chip
    if int(devices * float(pdb)) != devices * pdb:  # MaxText: int(devices * pdb)
        return (f"MaxText's per_device_batch_size {float(pdb)!r} does not give the plan's "
                f"{devices * pdb} sequences on {devices} devices in floating point")
    tiles = run.loss_chunks if run is not None else 1
    if (pdb * model.seq_length) % tiles:
        return (f"MaxText tiles the loss over a device's tokens, which {tiles} chunks do not "
                "divide: plan with another --loss-chunks")
    return None


def per_device_batch(plan: Plan) -> Fraction:
    """MaxText's per_device_batch_size: one forward's sequences per JAX device (the whole
    batch under a pipeline, which splits it into micro-batches)."""
    q = plan.parallel
    assert q is not None and plan.micro_batch_size and plan.global_batch_size
    devices = plan.num_gpus * jax_devices_per_chip(plan)
    if q.pipeline > 1:
        return Fraction(plan.global_batch_size, devices)
    return Fraction(plan.micro_batch_size * q.data, devices)


def split_at_slices(degrees: list[tuple[str, int]], per_slice: int) -> dict[str, tuple[int, int]]:
    """{axis: (ici, dcn)} of `degrees` (axis, size), fastest first, cut where a slice of
    `per_slice` devices ends; ValueError (one line) for a degree that straddles it unevenly."""
    left, split = per_slice, {}
    for axis, size in degrees:
        if left % size == 0:
            ici = size
        elif size % left == 0:
            ici = left
        else:
            raise ValueError(f"its {axis} degree {size} straddles the scale-up domain of "
                             f"{per_slice} devices unevenly")
        split[axis] = (ici, size // ici)
        left //= ici
    return split


def _tensor_and_data(plan: Plan) -> tuple[int, int]:
    """MaxText's tensor degree and data (or FSDP) degree, experts apart: the plan's, with
    an Ironwood chip's second device on FSDP under ZeRO-3, else on the tensor axis."""
    q = plan.parallel
    assert q is not None
    per_chip = jax_devices_per_chip(plan)
    on_fsdp = q.zero_stage == 3
    return (q.tensor * (1 if on_fsdp else per_chip),
            q.data // q.expert * (per_chip if on_fsdp else 1))


def mesh_keys(plan: Plan) -> dict[str, int]:
    """Every ici_* and dcn_* degree of the plan (MaxText's devices; 1 where unused)."""
    q = plan.parallel
    assert q is not None
    per_chip = jax_devices_per_chip(plan)
    tensor, data = _tensor_and_data(plan)
    data_axis = "fsdp" if q.zero_stage == 3 else "data"
    tensor_axis = "tensor_sequence" if q.sequence_parallel and q.tensor > 1 else "tensor"
    degrees = [(tensor_axis, tensor), ("context", q.context), ("expert", q.expert),
               (data_axis, data), ("pipeline", q.pipeline)]
    per_slice = min(plan.devices_per_node, plan.num_gpus) * per_chip
    split = split_at_slices(degrees, per_slice)
    axes = ("data", "fsdp", "fsdp_transpose", "context", "tensor", "tensor_sequence", "expert",
            "pipeline")
    keys = {f"ici_{axis}_parallelism": split.get(axis, (1, 1))[0] for axis in axes}
    keys |= {f"dcn_{axis}_parallelism": split.get(axis, (1, 1))[1] for axis in axes}
    return keys


def model_keys(model: TransformerConfig) -> dict[str, Any] | None:
    """base.yml's keys that build `model`: a MaxText model_name, or its shape keys with a
    decoder block; None for a shape MaxText's keys do not describe."""
    llama = (model.norm, model.activation, model.position_embedding, model.bias) == (
        "rmsnorm", "swiglu", "rope", False)
    gpt = (model.norm, model.activation, model.position_embedding) == (
        "layernorm", "gelu", "learned")
    key = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
           model.ffn_size, model.vocab_size, model.num_experts)
    if llama and key in MODELS:
        return {"model_name": MODELS[key]}
    plain = not (model.multi_latent_attention or model.window_size or model.qk_layernorm
                 or model.mtp_num_layers or model.moe_shared_expert_intermediate_size
                 or model.parallel_residual or model.qkv_bias or model.sandwich_norms
                 or model.attention_softcap or model.final_logit_softcap
                 or model.moe_layer_freq != 1 or model.softmax_type != "vanilla")
    if not plain or not (llama or (gpt and not model.is_moe)):
        return None
    keys: dict[str, Any] = {
        "decoder_block": "gpt3" if gpt else ("mixtral" if model.is_moe else "llama2"),
        "base_emb_dim": model.hidden_size, "base_num_query_heads": model.num_attention_heads,
        "base_num_kv_heads": model.num_kv_heads, "base_mlp_dim": model.ffn_size,
        "base_num_decoder_layers": model.num_layers, "head_dim": model.head_dim,
        "mlp_activations": ["gelu"] if gpt else ["silu", "linear"],
        "vocab_size": model.vocab_size, "logits_via_embedding": model.tie_embeddings,
        "enable_dropout": False,
    }
    if gpt:
        keys["trainable_position_size"] = model.max_position_embeddings or model.seq_length
    else:
        keys["rope_max_timescale"] = model.rotary_base
    if model.is_moe:
        keys |= {"num_experts": model.num_experts, "num_experts_per_tok": model.moe_top_k,
                 "base_moe_mlp_dim": model.moe_ffn_hidden_size or model.ffn_size}
    return keys


def remat_policy(plan: Plan) -> str:
    """MaxText's remat_policy nearest the plan's recomputation (see the module's notes)."""
    if plan.recompute == "full":
        return "full"
    if plan.recompute == "none":
        return "minimal_with_context"
    modules = set(plan.run.recompute_modules if plan.run is not None else ("core_attn",))
    return SELECTIVE_POLICIES[("core_attn" in modules, bool(modules & {"mlp", "moe"}))]


def maxtext_config(plan: Plan, model: TransformerConfig) -> dict[str, Any]:
    """The override keys of `plan` over MaxText's base.yml (see `maxtext_incompatibility`)."""
    q, run = plan.parallel, plan.run
    assert q is not None and plan.micro_batch_size and plan.global_batch_size
    tpu = "tpu" in plan.cluster.lower() or jax_devices_per_chip(plan) > 1
    pdb = per_device_batch(plan)
    config: dict[str, Any] = {"base_config": "base.yml", "hardware": "tpu" if tpu else "gpu"}
    config |= model_keys(model) or {}
    config |= mesh_keys(plan)
    config |= {
        "shard_optimizer_over_data": q.zero_stage == 1,
        "per_device_batch_size": int(pdb) if pdb.denominator == 1 else float(pdb),
        "gradient_accumulation_steps": 1 if q.pipeline > 1 else plan.num_micro_batches,
        "max_target_length": model.seq_length,
        "remat_policy": remat_policy(plan),
        "dtype": "float32" if plan.precision == "fp32" else "bfloat16",
        "weight_dtype": "float32",
        "grad_dtype": "bfloat16" if run is not None and run.main_grads_dtype == "bf16"
        else "float32",
    }
    if q.context > 1:
        config["context_parallel_strategy"] = "all_gather"
    if q.pipeline > 1:
        config |= {"num_layers_per_pipeline_stage": model.num_layers // q.pipeline,
                   "num_pipeline_repeats": 1,
                   "num_pipeline_microbatches": plan.num_micro_batches,
                   "scan_layers": False}  # base.yml: scan the pipeline's iterations instead
    if run is not None and run.loss_chunks > 1:
        config["num_vocab_tiling"] = run.loss_chunks
    if run is not None and run.moe_expert_capacity_factor is not None:
        config["capacity_factor"] = run.moe_expert_capacity_factor
    if plan.training is not None:
        config["steps"] = plan.training.steps
    return config


def launch_words() -> list[str]:
    """MaxText's trainer on the config, with the run's name and output folder."""
    return ["python3", "-m", TRAIN_MODULE, CONFIG_FILE, '"run_name=${RUN_NAME:-tessel}"',
            '"base_output_directory=$OUTPUT_PATH"']


def maxtext_files(plan: Plan, model: TransformerConfig | None) -> dict[str, str]:
    """{'maxtext.yml': ..., 'maxtext.sh': ...}; ValueError (one line) when MaxText cannot
    run `plan`."""
    why = maxtext_incompatibility(plan, model)
    if why:
        raise ValueError(f"MaxText cannot run this plan: {why}")
    shape = plan_model(plan, model)
    assert shape is not None
    config = maxtext_config(plan, shape)
    per_chip = jax_devices_per_chip(plan)
    slices = max(1, plan.num_gpus // plan.devices_per_node)
    header = [
        f"# MaxText config ({SOURCE}, src/maxtext/configs/base.yml keys): {plan.model} on "
        f"{plan.num_gpus} devices ({plan.cluster}), as Tessel planned it.",
        f"# {slices} scale-up domain(s) (TPU slices, GPU nodes) of "
        f"{min(plan.devices_per_node, plan.num_gpus)} devices: ici_* within one, dcn_* across.",
    ]
    if per_chip > 1:
        axis = "FSDP" if plan.parallel and plan.parallel.zero_stage == 3 else "tensor"
        header.append(f"# Ironwood: {per_chip} JAX devices per chip, {plan.num_gpus * per_chip} "
                      f"in all; the {axis} axis carries the factor.")
    text = "\n".join(header) + "\n" + yaml.safe_dump(config, sort_keys=False)
    script = "\n".join([
        "#!/bin/bash",
        f"# MaxText: {plan.model} as Tessel planned it. Run on every host of every slice "
        "(TPU: every worker, e.g. xpk",
        f"# --num-slices {slices}; GPU: every node, with JAX's distributed environment set).",
        "set -euo pipefail",
        ': "${OUTPUT_PATH:?set OUTPUT_PATH to the run\'s output folder (gs://... on TPU)}"',
        " ".join(w if "$" in w else shlex.quote(w) for w in launch_words()),
        "",
    ])
    return {CONFIG_FILE: text, LAUNCH_FILE: script}


def _unmapped(plan: Plan) -> str | None:
    """The one line for a knob set away from its default that MaxText has no key for."""
    knob = unmapped_knob(plan, HANDLED | NOT_WRITTEN)
    return None if knob is None else f"MaxText has no {knob}"
