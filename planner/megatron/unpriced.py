"""The Megatron-LM flags Tessel refuses: retired ones, and those it cannot price yet.

`UNPRICED` lists the flags that change time or memory in ways the cost model has no term
for; `refuse_unpriced` refuses a launch line that gives one at a value that changes the
run, rather than silently predicting a different run. Every other flag Tessel does not
read changes neither time nor memory and is ignored (`planner.megatron.run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.megatron.errors import LaunchLineError
from planner.vocabulary.parallel import FP8_RECIPES, RECOMPUTE_MODULES

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs

# Flags that change time or memory in ways Tessel does not price yet: dest -> (what it
# does, values that change nothing besides Megatron-LM's default). Refused when given any
# other value, rather than silently predicting a different run.
UNPRICED: dict[str, tuple[str, tuple[Any, ...]]] = {
    # Layouts and shardings the cost model has no term for.
    "tensor_parallel_num_weight_shards": ("tensor-parallel weight sharding (GTP)", (1,)),
    "expert_tensor_parallel_num_weight_shards": ("expert weight sharding (GTP)", (1,)),
    "hierarchical_context_parallel_sizes": ("hierarchical context parallelism", ()),
    "hybrid_context_parallel": ("hybrid context parallelism", ()),
    "cp_comm_type": ("context-parallel exchange other than the p2p ring", (["p2p"],)),
    "microbatch_group_size_per_vp_stage": (
        "micro-batch groups other than the pipeline size", ()),
    "num_distributed_optimizer_instances": ("several distributed-optimizer instances", ()),
    "use_megatron_fsdp": ("Megatron FSDP (parameters and gradients sharded)", ()),
    "use_torch_fsdp2": ("torch FSDP2 (parameters and gradients sharded)", ()),
    "overlap_param_gather_with_optimizer_step": (
        "the parameter all-gather overlapped with the optimizer step", ()),
    "delay_wgrad_compute": ("delayed weight-gradient computation", ()),
    "mlp_chunks_for_training": ("the MLP computed in chunks", (1,)),
    # Precision and optimizer state other than mixed-precision Adam with fp32 main grads.
    "fp4": ("fp4 matmuls", ()),
    "fp4_param_gather": ("fp4 parameter all-gathers", ()),
    "first_last_layers_bf16": ("bf16 first and last layers in an fp8 run", ()),
    "fp8_wgrad": ("weight gradients outside fp8", ()),
    "fp8_output_proj": ("an fp8 output projection", ()),
    "main_grads_dtype": ("main gradients other than fp32 or bf16", ("bf16",)),
    "main_params_dtype": ("main parameters other than fp32", ()),
    "exp_avg_dtype": ("Adam moments other than fp32 or bf16", ("bf16",)),
    "exp_avg_sq_dtype": ("Adam moments other than fp32 or bf16", ("bf16",)),
    "optimizer": ("an optimizer other than Adam (its state differs)", ()),
    "optimizer_cpu_offload": ("optimizer state offloaded to the CPU", ()),
    # Activations kept elsewhere, or recomputed beyond Tessel's three modes.
    "cpu_offloading_num_layers": ("activations offloaded to the CPU", ()),
    "fine_grained_activation_offloading": ("activations offloaded to the CPU", ()),
    "offload_modules": ("activations offloaded to the CPU", ()),
    "moe_paged_stash": ("MoE activations stashed in pages", ()),
    "distribute_saved_activations": ("recomputed activations split over tensor ranks", ()),
    "moe_layer_recompute": ("recomputation of MoE layers", ()),
    # Architectures the zoo's decoder does not describe.
    "experimental_attention_variant": ("an experimental attention variant", ()),
    "attention_output_gate": ("a gated attention output", ()),
    "linear_attention_freq": ("linear-attention layers", ()),
    "no_rope_freq": ("layers without rotary embeddings", ()),
    "hybrid_layer_pattern": ("a hybrid (Mamba) model", ()),
    "hybrid_override_pattern": ("a hybrid (Mamba) model", ()),
    "is_hybrid_model": ("a hybrid (Mamba) model", ()),
    "heterogeneous_layers_config_path": ("layers that differ in shape", ()),
    "heterogeneous_layers_config_encoded_json": ("layers that differ in shape", ()),
    "spec": ("a custom layer spec", ()),
    "yaml_cfg": ("a YAML config that replaces the flags", ()),
    "enable_mhc_connections": ("multi-stream residual connections", ()),
    "fp32_residual_connection": ("fp32 residual activations", ()),
    "moe_latent_size": ("MoE latent projections", ()),
    "encoder_num_layers": ("an encoder; give --num-layers for a decoder-only model", ()),
    "decoder_num_layers": ("an encoder-decoder split; give --num-layers", ()),
    "encoder_seq_length": ("an encoder's sequence; give --seq-length", ()),
    "decoder_seq_length": ("a decoder sequence of its own; give --seq-length", ()),
    "vision_pretraining": ("a vision model", ()),
    "perform_rl_step": ("reinforcement-learning steps (generation included)", ()),
}
# Options that act only on fp8 matmuls, or only on experts: without those, Megatron-LM
# ignores them, and so does Tessel.
_FP8_ONLY = ("first_last_layers_bf16", "fp8_wgrad", "fp8_output_proj")
# Not in UNPRICED, on purpose: kernel choices that do the same work (fusions, TE's
# communication-overlap variants, --deterministic-mode, grouped GEMMs, bucket sizes,
# --moe-grouped-gemm, --moe-permute-fusion, --moe-router-fusion, --moe-router-dtype, the
# flex dispatcher's backend), which calibrated efficiencies absorb; training-signal
# settings that move no bytes and no FLOPs (--moe-aux-loss-coeff, --moe-router-load-
# balancing-type, --moe-router-enable-expert-bias and its update rate, --moe-router-topk-
# scaling-factor, --moe-router-pre-softmax, --mtp-loss-scaling-factor, the YaRN scaling
# flags --rotary-scaling-factor, --mscale, --mscale-all-dim); --moe-shared-expert-overlap
# (a stream choice); and shape details a few parameters wide (--qk-layernorm,
# --add-qkv-bias, --rotary-percent, --squared-relu and --openai-gelu, which keep GeLU's
# two matrices, dropout rates). Read, not refused (`model_shape`, `parallel_config`):
# multi-latent attention, --kv-channels, sliding windows, --quick-geglu (swiglu's three
# matrices: megatron/training/argument_utils.py sets gated_linear_unit), shared experts,
# --moe-layer-freq, MTP layers, --expert-tensor-parallel-size, expert capacity, forced
# balance and the expert all-to-all overlap, which cost_models prices.

# Flags Megatron-LM itself refuses, with the one to use instead.
_RETIRED = {
    "batch_size": "--micro-batch-size",
    "warmup": "--lr-warmup-fraction",
    "model_parallel_size": "--tensor-model-parallel-size",
    "checkpoint_activations": "--recompute-activations",
}



def refuse_unpriced(args: MegatronArgs) -> None:
    """LaunchLineError, naming the flag as typed, for a retired flag or one that changes
    time or memory in a way Tessel does not price (at a value other than a neutral one)."""
    v = args.values
    for dest, replacement in _RETIRED.items():
        if args.given(dest) and getattr(v, dest) not in (None, False):
            raise LaunchLineError(
                f"{args.flag(dest)} is retired and Megatron-LM refuses it; use {replacement}"
            )
    for dest, (what, neutral) in UNPRICED.items():
        inert = (dest in _FP8_ONLY and v.fp8 is None) or (
            dest.startswith("moe_") and not v.num_experts) or (
            dest == "cp_comm_type" and (v.context_parallel_size or 1) == 1)
        if args.given(dest) and not inert:
            value = getattr(v, dest)
            if value != args.defaults.get(dest) and value not in neutral:
                raise _unpriced(args, dest, what)
    special = (
        ("position_embedding_type", v.position_embedding_type in ("relative", "none"),
         f"{v.position_embedding_type} position embeddings"),
        ("transformer_impl", v.transformer_impl == "inference_optimized",
         "inference-optimized layers"),
        ("fp8_recipe", v.fp8 is not None and v.fp8_recipe not in FP8_RECIPES,
         f"the {v.fp8_recipe} fp8 recipe"),
        ("recompute_modules", bool(set(v.recompute_modules or ()) - set(RECOMPUTE_MODULES)),
         "selective recomputation of modules other than "
         + ", ".join(RECOMPUTE_MODULES)),
    )
    for dest, refused, what in special:
        if refused:
            raise _unpriced(args, dest, what)


def _unpriced(args: MegatronArgs, dest: str, what: str) -> LaunchLineError:
    return LaunchLineError(
        f"{args.flag(dest)} changes time or memory ({what}) in a way Tessel does not price "
        "yet; drop it to predict the run without it"
    )
