"""What a Megatron-LM launch line runs, in Tessel's vocabulary: `megatron_run`.

Flags Tessel cannot price are refused (`unpriced`), the model shape (`model_shape`) and
the parallel configuration (`parallel_config`) are read with Megatron-LM's defaults and
rules, and the flags given that change neither time nor memory are listed as ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.megatron.model_shape import model_config
from planner.megatron.parallel_config import parallel_config
from planner.megatron.unpriced import refuse_unpriced

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs
    from planner.models.config import TransformerConfig
    from planner.vocabulary.parallel import ParallelConfig

# Flags `model_shape` and `parallel_config` read (the rest are accepted and ignored:
# `MegatronRun.ignored`).
_READ = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels",
    "seq_length", "max_position_embeddings", "vocab_size", "padded_vocab_size",
    "make_vocab_size_divisible_by", "pad_vocab_size", "group_query_attention",
    "num_query_groups", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "swiglu",
    "normalization", "position_embedding_type", "use_rotary_position_embeddings",
    "add_position_embedding", "rotary_base", "untie_embeddings_and_output_weights",
    "add_bias_linear", "hidden_dropout", "attention_dropout", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "recompute_modules", "grad_reduce_in_bf16",
    "use_precision_aware_optimizer", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
    "fp8_param_gather",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "sequence_parallel", "micro_batch_size", "global_batch_size", "recompute_granularity",
    "recompute_activations", "recompute_method", "recompute_num_layers",
    "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
    "tp_comm_overlap", "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "overlap_p2p_comm", "bf16", "fp16", "fp8",
    "fp8_recipe", "attention_backend", "use_flash_attn", "transformer_impl",
    "moe_token_dispatcher_type", "enable_cuda_graph", "external_cuda_graph",
    "cuda_graph_impl", "quick_geglu", "qk_layernorm", "softmax_type",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "window_size", "window_attn_skip_freq",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_router_score_function",
    "moe_router_num_groups", "moe_router_group_topk", "mtp_num_layers",
    "moe_router_force_load_balancing", "moe_expert_capacity_factor",
    "overlap_moe_expert_parallel_comm", "moe_enable_deepep",
    "moe_pad_expert_input_to_capacity", "cuda_graph_scope_deprecated",
})


@dataclass(frozen=True)
class MegatronRun:
    """What a launch line runs, in Tessel's vocabulary."""

    model: TransformerConfig
    parallel: ParallelConfig
    """The configuration, resolved for the world size (data filled in)."""
    layers_per_stage: list[int] | None
    """Layers of each pipeline stage when --decoder-first/last-pipeline-num-layers or the
    embedding and loss counted as layers make them uneven; None: Megatron-LM's even
    split."""
    chunk_layers: list[int] | None
    """Layers of each model chunk in model order (chunk c on pipeline rank c % pipeline)
    where the embedding or the loss take a layer's place; None: chunks of equal size."""
    notes: list[str]
    """Defaults worth saying out loud (fp32 without --bf16, a padded vocabulary, ...)."""
    ignored: list[str]
    """The flags given that change neither time nor memory, as typed."""


def megatron_run(args: MegatronArgs, world_size: int) -> MegatronRun:
    """The model and parallel configuration Megatron-LM runs for `args` on `world_size`
    GPUs: its defaults for everything absent, its `validate_args` rules checked.
    LaunchLineError, naming the flag as typed, for anything it would refuse or that Tessel
    cannot price."""
    refuse_unpriced(args)
    notes: list[str] = []
    model = model_config(args, notes)
    parallel, layers, chunks = parallel_config(args, model, world_size, notes)
    ignored = [flag for dest, flag in args.typed.items() if dest not in _READ]
    return MegatronRun(model, parallel, layers, chunks, notes, ignored)
