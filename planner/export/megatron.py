"""Megatron-LM launch flags for a zoo model and a parallel configuration.

Flag names and value types are Megatron-LM's (`pretrain_gpt.py`'s argument parser,
checked against `../shared/reference/megatron_lm_arguments.json` by the tests); the
configuration must also meet `validate_args`, which `megatron_incompatibility` checks. World
size is not a flag: it comes from the launcher. Each knob's flag is the knob registry's
(`planner.vocabulary.knobs`): `spelt_flags` writes those a value or a switch spells; the
rest (precision, recomputation's companions, the virtual stages, CUDA graphs, the experts'
tensor degree) follow Megatron-LM's rules below.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from planner.megatron.pipeline_layout import layout_string
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import KNOBS, engine_value, spelt
from planner.vocabulary.parallel import ParallelConfig


def spelt_flags(parallel: ParallelConfig, *names: str) -> list[str]:
    """Knobs `names` as Megatron-LM's flags spell them (the registry's): a switch given
    where on, a value where it is not the knob's default (always, for the degrees and
    batches)."""
    flags = []
    for name in names:
        knob, value = KNOBS[name], parallel.knob(name)
        spelling = knob.megatron
        assert spelling is not None, f"Megatron-LM has no flag for {name}"
        written = engine_value(spelling, value)
        if spelling.switch:
            flags += [spelling.key] if written else []
        elif written is not None and (spelling.always or value != knob.default):
            flags.append(f"{spelling.key} {_value_text(written)}")
    return flags


# The knobs a plain Megatron-LM flag spells that `megatron_flags` places nowhere else: each
# written after the others (a knob added to the registry is written without a line here).
_PLACED = frozenset({
    "tensor", "pipeline", "context", "expert", "micro_batch_size", "zero_stage",
    "sequence_parallel", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
    "moe_router_force_load_balancing", "overlap_moe_expert_parallel_comm", "moe_grouped_gemm"})
_OTHER_KNOBS = tuple(name for name, spelling in spelt("megatron").items()
                     if not spelling.engine and name not in _PLACED)


def _value_text(value: Any) -> str:
    """A flag's value as Megatron-LM's parser reads it: a list as words, numbers short."""
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag(name: str) -> str:
    spelling = KNOBS[name].megatron
    assert spelling is not None
    return spelling.key


def megatron_incompatibility(
    parallel: ParallelConfig, layers_per_stage: list[int], chunk_layers: list[int] | None = None
) -> str | None:
    """Why Megatron-LM cannot run this layout, or None if it can. `chunk_layers`: each
    model chunk's layers where the embedding or loss take a layer's place."""
    dims, sharding, moe = parallel.dims, parallel.sharding, parallel.moe
    p, schedule = dims.pipeline, parallel.pipelining.schedule
    offload = parallel.offload
    # The knobs the registry gives other engines only, at another value than their default.
    for name, knob in KNOBS.items():
        if "megatron" not in knob.engines and parallel.knob(name) != knob.default:
            flag = knob.cli.key if knob.cli else name
            return f"{flag} ({' and '.join(knob.engines)} only)"
    if parallel.finetuning.adapters:
        # Megatron-LM's arguments have no adapters; Megatron-Bridge's PEFT adds them.
        return (f"{parallel.finetuning.finetune} adapters (Megatron-LM has none; "
                "Megatron-Bridge's PEFT LoRA runs them: use --emit pytorch)")
    if offload.offload_optimizer == "nvme" or offload.offload_params != "none":
        return "offload to NVMe or of parameters (Megatron-LM offloads optimizer state and " \
               "activations to the CPU only)"
    if offload.offload_activation_layers and (
            p > 1 or parallel.recomputation.recompute != "none"):
        # Megatron-Core's TransformerConfig.__post_init__ refuses both with cpu_offloading.
        return "activation offload with pipeline stages or recomputation"
    if sharding.zero_stage > 1:
        return f"ZeRO stage {sharding.zero_stage} (Megatron-LM shards optimizer state only)"
    if schedule == "gpipe" and p > 1:
        return "the GPipe schedule (Megatron-LM runs 1F1B)"
    if schedule == "dualpipev":
        # No DualPipe flag among Megatron-LM's arguments (shared/reference/
        # megatron_lm_arguments.json): its schedules are 1F1B and interleaved 1F1B.
        return "the DualPipeV schedule (Megatron-LM runs 1F1B or interleaved 1F1B)"
    if sharding.sequence_parallel and dims.tensor == 1:
        return "sequence parallelism without tensor parallelism"
    if parallel.numerics.precision == "fp8" and parallel.numerics.fp8_recipe == "rowwise":
        # --fp8-recipe's choices: tensorwise, delayed, mxfp8, blockwise, custom.
        return "row-wise fp8 scaling (Megatron-LM's --fp8-recipe has no rowwise)"
    if dims.expert > 1 and dims.tensor > 1 and not sharding.sequence_parallel:
        return "expert with tensor parallelism but no sequence parallelism"
    recomputation = parallel.recomputation
    if moe.overlap_moe_expert_parallel_comm and (
            dims.expert == 1 or moe.moe_token_dispatcher == "allgather"
            or recomputation.recompute == "full" or "moe" in recomputation.recompute_modules
            or parallel.numerics.precision == "fp32"
            or (p > 1 and parallel.pipelining.virtual_pipeline == 1)):
        # Megatron-Core's TransformerConfig.__post_init__ rules for the A2A overlap.
        return ("the expert all-to-all overlap without expert parallelism, the alltoall or "
                "flex dispatcher, bf16, virtual stages under a pipeline, or with full or MoE "
                "recomputation")
    if chunk_layers is not None:
        return None  # the account-for flags or the layout string say any chunk sizes
    middle = layers_per_stage[1:-1]
    if p > 2 and len(set(middle)) > 1:
        return "middle pipeline stages of different sizes"
    if p > 1 and (layers_per_stage[0] > max(layers_per_stage[1:], default=0)
                  or layers_per_stage[-1] > max(layers_per_stage[:-1])):
        return "a first or last stage larger than the middle ones"
    if parallel.pipelining.virtual_pipeline > 1:
        if p == 1 or len(set(layers_per_stage)) > 1:
            return "virtual stages need pipeline > 1 and equal stages"
        if layers_per_stage[0] % parallel.pipelining.virtual_pipeline:
            return "layers per stage not divisible by the virtual stages"
    return None


def megatron_model_incompatibility(model: TransformerConfig) -> str | None:
    """Why Megatron-LM's GPT model cannot build `model`'s blocks, or None: none of its
    arguments (`shared/reference/megatron_lm_arguments.json`) adds a parallel residual,
    norms after each sublayer, soft-capped attention or logits, or scaled embeddings."""
    beyond = [what for what, used in (
        ("a parallel residual", model.parallel_residual),
        ("norms after each sublayer", model.sandwich_norms),
        ("soft-capped attention scores", model.attention_softcap is not None),
        ("soft-capped logits", model.final_logit_softcap is not None),
        ("embeddings scaled by sqrt(hidden)", model.scale_embeddings),
    ) if used]
    if beyond:
        return f"Megatron-LM's GPT model has no {', '.join(beyond)}"
    return None


def _accounted_ends(chunk_layers: list[int]) -> tuple[bool, bool] | None:
    """(embedding, loss): which ends of `chunk_layers` are one layer short because the
    embedding or the loss takes that slot (Megatron-LM's
    --account-for-embedding/loss-in-pipeline-split); None if the chunks are not so."""
    size = max(chunk_layers)
    embedding, loss = chunk_layers[0] == size - 1, chunk_layers[-1] == size - 1
    if len(chunk_layers) == 1 and embedding and loss:
        return None
    expected = [size] * len(chunk_layers)
    expected[0] -= embedding
    expected[-1] -= loss
    return (embedding, loss) if expected == chunk_layers else None


def _vocabulary_padding(vocab: int, tensor: int) -> list[str]:
    """--make-vocab-size-divisible-by where Megatron-LM's default (128, times the tensor
    size: megatron/training/tokenizer `_vocab_size_with_padding`) would pad the model's
    vocabulary (Qwen3's 151936 over 2 ranks): the largest divisor that keeps it."""
    if vocab % tensor or vocab % (128 * tensor) == 0:
        return []
    return [f"--make-vocab-size-divisible-by {math.gcd(vocab // tensor, 128)}"]


def _attention_flags(model: TransformerConfig) -> list[str]:
    """Head widths apart from hidden / heads, multi-latent attention, QK norm, attention
    sinks and sliding windows (Megatron-LM's flags for them; the window as its
    `tuple_type` (left, right), the layers as its `moe_freq_type`)."""
    flags = []
    if model.multi_latent_attention:
        flags.append("--multi-latent-attention")
        if model.q_lora_rank is not None:
            flags.append(f"--q-lora-rank {model.q_lora_rank}")
        flags += [f"--kv-lora-rank {model.kv_lora_rank}", f"--qk-head-dim {model.qk_head_dim}",
                  f"--qk-pos-emb-head-dim {model.qk_pos_emb_head_dim}",
                  f"--v-head-dim {model.v_head_dim}"]
    elif model.kv_channels is not None:
        flags.append(f"--kv-channels {model.kv_channels}")
    if model.qk_layernorm:
        flags.append("--qk-layernorm")
    if model.softmax_type != "vanilla":
        flags.append(f"--softmax-type {model.softmax_type}")
    if model.window_size is not None:
        flags.append(f"--window-size {model.window_size},0")
        skip = model.window_attn_skip_freq
        if skip is not None:
            flags.append(f"--window-attn-skip-freq {layer_pattern_text(skip)}")
    return flags


def _expert_flags(model: TransformerConfig, parallel: ParallelConfig) -> list[str]:
    """The experts' shape and routing, and how they run (Megatron-LM's MoE flags)."""
    flags = []
    if model.moe_ffn_hidden_size is not None:
        flags.append(f"--moe-ffn-hidden-size {model.moe_ffn_hidden_size}")
    if model.moe_shared_expert_intermediate_size is not None:
        flags.append("--moe-shared-expert-intermediate-size "
                     f"{model.moe_shared_expert_intermediate_size}")
    if model.moe_layer_freq != 1:
        flags.append(f"--moe-layer-freq {layer_pattern_text(model.moe_layer_freq)}")
    if model.moe_router_score_function != "softmax":
        flags.append(f"--moe-router-score-function {model.moe_router_score_function}")
    if model.moe_router_num_groups is not None:
        flags.append(f"--moe-router-num-groups {model.moe_router_num_groups}")
    if model.moe_router_group_topk is not None:
        flags.append(f"--moe-router-group-topk {model.moe_router_group_topk}")
    flags += spelt_flags(parallel, "moe_router_force_load_balancing")
    if parallel.moe.moe_expert_capacity_factor is not None:
        flags += spelt_flags(parallel, "moe_expert_capacity_factor",
                             "moe_pad_expert_input_to_capacity")
    return flags + spelt_flags(parallel, "moe_grouped_gemm", "overlap_moe_expert_parallel_comm")


def layer_pattern_text(pattern: int | list[int]) -> str:
    """A per-layer 0/1 pattern as Megatron-LM's `moe_freq_type` reads it, runs folded and
    quoted for the shell: [0, 0, 0, 1, 1] -> '([0]*3+[1]*2)'; a number as itself."""
    if isinstance(pattern, int):
        return str(pattern)
    runs = [(value, len(list(run))) for value, run in itertools.groupby(pattern)]
    return "'(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")'"


def megatron_flags(
    model: TransformerConfig, parallel: ParallelConfig, layers_per_stage: list[int],
    chunk_layers: list[int] | None = None,
) -> list[str]:
    """The flags of a Megatron-LM launch line, in the order a person would write them."""
    flags = [
        f"--num-layers {model.num_layers}",
        f"--hidden-size {model.hidden_size}",
        f"--num-attention-heads {model.num_attention_heads}",
        f"--ffn-hidden-size {model.ffn_size}",
        f"--seq-length {model.seq_length}",
        f"--max-position-embeddings {model.max_position_embeddings}",
        f"--vocab-size {model.vocab_size}",
    ]
    flags += _vocabulary_padding(model.vocab_size, parallel.dims.tensor)
    if model.num_query_groups is not None and model.num_query_groups != model.num_attention_heads:
        flags += ["--group-query-attention", f"--num-query-groups {model.num_query_groups}"]
    if model.norm == "rmsnorm":
        flags.append("--normalization RMSNorm")
    if model.activation == "swiglu":
        flags.append("--swiglu")
    if model.position_embedding == "rope":
        flags += ["--position-embedding-type rope", f"--rotary-base {model.rotary_base}"]
    if not model.tie_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if not model.bias:
        flags.append("--disable-bias-linear")
        if model.qkv_bias:
            flags.append("--add-qkv-bias")
    if model.rotary_percent < 1:
        flags.append(f"--rotary-percent {model.rotary_percent:g}")
    if model.apply_layernorm_1p:
        flags.append("--apply-layernorm-1p")
    # Megatron-LM's dropouts default to 0.1; a model trained without them says so.
    if model.hidden_dropout != 0.1:
        flags.append(f"--hidden-dropout {model.hidden_dropout:g}")
    if model.attention_dropout != 0.1:
        flags.append(f"--attention-dropout {model.attention_dropout:g}")
    flags += _attention_flags(model)
    if model.num_experts is not None:
        flags += [f"--num-experts {model.num_experts}", f"--moe-router-topk {model.moe_top_k}",
                  f"{_flag('moe_token_dispatcher')} {parallel.moe.moe_token_dispatcher}"]
        flags += _expert_flags(model, parallel)
    if model.mtp_num_layers:
        flags.append(f"--mtp-num-layers {model.mtp_num_layers}")
    flags += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [],
              "fp8": ["--bf16", "--fp8-format hybrid",
                      f"--fp8-recipe {parallel.numerics.fp8_recipe}"]}[parallel.numerics.precision]
    if parallel.numerics.precision == "fp8":
        flags += spelt_flags(parallel, "fp8_param_gather")
    flags += spelt_flags(parallel, "main_grads_dtype")
    if parallel.numerics.exp_avg_dtype == "bf16":
        flags += ["--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                  "--exp-avg-sq-dtype bf16"]
    if parallel.offload.offload_optimizer == "cpu":
        # Megatron-LM's validate_args: the hybrid device optimizer reuses the precision-
        # aware optimizer's code path; the copies overlap the CPU's step.
        flags += [_flag("offload_optimizer"), "--overlap-cpu-optimizer-d2h-h2d"]
        if parallel.numerics.exp_avg_dtype != "bf16":
            flags.append("--use-precision-aware-optimizer")
    if parallel.offload.offload_activation_layers:
        flags.append(f"{_flag('offload_activation_layers')} "
                     f"{parallel.offload.offload_activation_layers}")
    flags += spelt_flags(parallel, "attention_backend", "tensor", "pipeline", "context",
                         "micro_batch_size", "global_batch_size", "expert")
    # Megatron-LM splits experts over the tensor ranks unless told: written where not.
    if model.num_experts is not None and parallel.dims.expert_tensor_degree != parallel.dims.tensor:
        flags.append(f"{_flag('expert_tensor')} {parallel.dims.expert_tensor_degree}")
    flags += spelt_flags(parallel, "sequence_parallel", "recompute")
    if parallel.recomputation.recompute == "full":  # Megatron-LM needs both with full recomputation
        flags += [f"{_flag('recompute_method')} {parallel.recomputation.recompute_method}",
                  f"{_flag('recompute_num_layers')} {parallel.recomputation.recompute_num_layers}"]
    elif parallel.recomputation.recompute == "selective":
        flags += spelt_flags(parallel, "recompute_modules")
    flags += spelt_flags(parallel, "zero_stage", "overlap_grad_reduce", "overlap_param_gather",
                         "tp_comm_overlap")
    if parallel.execution.cuda_graphs:
        flags.append(f"{_flag('cuda_graphs')} local")
    elif parallel.execution.cuda_graph_scope:
        flags.append(f"{_flag('cuda_graphs')} transformer_engine {_flag('cuda_graph_scope')} "
                     + " ".join(parallel.execution.cuda_graph_scope))
    flags += spelt_flags(parallel, *_OTHER_KNOBS)
    # Any uneven split, also where the pipeline divides the layers: without these flags
    # Megatron-LM splits evenly, not as planned.
    accounted = _accounted_ends(chunk_layers) if chunk_layers is not None else None
    if accounted is not None:
        embedding, loss = accounted
        flags += ["--account-for-embedding-in-pipeline-split"] if embedding else []
        flags += ["--account-for-loss-in-pipeline-split"] if loss else []
        if parallel.pipelining.virtual_pipeline > 1:
            flags.append("--num-virtual-stages-per-pipeline-rank "
                         f"{parallel.pipelining.virtual_pipeline}")
        return flags
    if chunk_layers is not None:
        layout = layout_string(chunk_layers, model.mtp_num_layers)
        return [*flags, f"--pipeline-model-parallel-layout '{layout}'"]
    if parallel.dims.pipeline > 1 and len(set(layers_per_stage)) > 1:
        flags += [f"--decoder-first-pipeline-num-layers {layers_per_stage[0]}",
                  f"--decoder-last-pipeline-num-layers {layers_per_stage[-1]}"]
    if parallel.pipelining.virtual_pipeline > 1:
        per_chunk = layers_per_stage[0] // parallel.pipelining.virtual_pipeline
        flags.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    return flags
