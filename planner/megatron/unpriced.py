"""The Megatron-LM flags Tessel refuses: retired ones, and those it cannot price yet.

`UNPRICED` lists the flags that change time or memory in ways the cost model has no term
for (the knob registry's unpriced entries, `planner.vocabulary.knobs.UNPRICED_FLAGS`);
`refuse_unpriced` refuses a launch line that gives one at a value that changes the run,
rather than silently predicting a different run. Every other flag Tessel does not read
changes neither time nor memory and is ignored (`planner.megatron.run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.megatron.errors import LaunchLineError
from planner.vocabulary.knobs import UNPRICED_FLAGS
from planner.vocabulary.parallel import FP8_RECIPES, RECOMPUTE_MODULES

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs

# Flags that change time or memory in ways Tessel does not price yet: dest -> (what it
# does, values that change nothing besides Megatron-LM's default), from the knob registry's
# unpriced entries. Refused when given any other value, rather than silently predicting a
# different run.
UNPRICED: dict[str, tuple[str, tuple[Any, ...]]] = {
    knob.megatron.name: (knob.rule, knob.neutral)
    for knob in UNPRICED_FLAGS.values() if knob.megatron is not None}
# What a flag acts on, without which Megatron-LM ignores it, and so does Tessel (fp8
# options without fp8 matmuls, expert options without experts, the context-parallel
# exchange without context parallelism).
_NEEDS = {knob.megatron.name: knob.needs
          for knob in UNPRICED_FLAGS.values() if knob.megatron is not None and knob.needs}
# Not in UNPRICED, on purpose: kernel choices that do the same work (fusions, TE's
# communication-overlap variants, --deterministic-mode, grouped GEMMs, bucket sizes other
# than --ddp-bucket-size (a knob), --moe-permute-fusion, --moe-router-fusion,
# --moe-router-dtype, the flex dispatcher's backend), which calibrated efficiencies absorb;
# training-signal settings that move no bytes and no FLOPs (--moe-aux-loss-coeff,
# --moe-router-load-balancing-type, --moe-router-enable-expert-bias and its update rate,
# --moe-router-topk-scaling-factor, --moe-router-pre-softmax, --mtp-loss-scaling-factor, the YaRN
# scaling flags --rotary-scaling-factor, --mscale, --mscale-all-dim); --moe-shared-expert-overlap (a
# stream choice); and shape details a few parameters wide (--qk-layernorm, --add-qkv-bias,
# --rotary-percent, --squared-relu and --openai-gelu, which keep GeLU's two matrices, dropout
# rates). Read, not refused (`model_shape`, `parallel_config`): multi-latent attention,
# --kv-channels, sliding windows, --quick-geglu (swiglu's three matrices:
# megatron/training/argument_utils.py sets gated_linear_unit), shared experts, --moe-layer-freq, MTP
# layers, --expert-tensor-parallel-size, expert capacity, forced balance and the expert all-to-all
# overlap, which cost_models prices, with --delay-wgrad-compute (the overlap's schedule),
# --moe-grouped-gemm (its absence: one GEMM and activation kernel per expert in turn),
# --moe-paged-stash and its --moe-paged-stash-buffer-size-factor-cuda (expert activations kept)
# and --fp8-output-proj (the head's saved input): knobs of the registry.
# The 2026 recipes' other flags (tests/planner/megatron/recipes), on purpose too: kernel and
# stream choices that do the same work (--moe-hybridep-num-sms, --moe-hybridep-num-sms-
# preprocessing, --high-priority-a2a-comm-stream, --use-transformer-engine-op-fuser,
# --moe-mlp-glu-interleave-size (the fused GLU's weight layout), --te-rng-tracker,
# --moe-router-padding-for-quantization (each expert's rows padded to the fp8 GEMMs' alignment)),
# --moe-paged-stash-page-size (the stash's granularity) and --moe-paged-stash-buffer-size-
# factor-cpu (pinned host memory for a stash that overflows; no device memory);
# --moe-pad-experts-for-cuda-graph-inference (the router drops and pads at decode time only:
# TransformerConfig's docstring); --reuse-grad-buf-for-mxfp8-param-ag (the mxfp8 weights'
# all-gather lands in the gradient buffer instead of the persistent parameter buffer that
# otherwise backs the same weights, megatron/core/distributed/param_and_grad_buffer.py: the
# bytes held are the same). --moe-expert-rank-capacity-factor (HybridEP's static rank budget)
# is a knob: it sizes the experts' kept activations.

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
    acting = {"fp8": v.fp8 is not None, "experts": bool(v.num_experts),
              "context parallelism": (v.context_parallel_size or 1) > 1}
    for dest, (what, neutral) in UNPRICED.items():
        inert = dest in _NEEDS and not acting[_NEEDS[dest]]
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
