"""What a Megatron-LM launch line runs, in Tessel's vocabulary: `megatron_run`.

Flags Tessel cannot price are refused (`unpriced`), the model shape (`model_shape`) and
the parallel configuration (`parallel_config`) are read with Megatron-LM's defaults and
rules, and the flags given that change neither time nor memory are listed as ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from planner.megatron.errors import LaunchLineError
from planner.megatron.model_shape import model_config
from planner.megatron.parallel_config import parallel_config
from planner.megatron.unpriced import refuse_unpriced
from planner.vocabulary.knobs import spelt

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs
    from planner.models.config import TransformerConfig
    from planner.vocabulary.parallel import ParallelConfig

# Flags `model_shape` reads, and the pipeline split's (the Plan's stages, not a knob).
_SHAPE = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels",
    "seq_length", "max_position_embeddings", "vocab_size", "padded_vocab_size",
    "make_vocab_size_divisible_by", "pad_vocab_size", "group_query_attention",
    "num_query_groups", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "swiglu",
    "normalization", "position_embedding_type", "use_rotary_position_embeddings",
    "add_position_embedding", "rotary_base", "untie_embeddings_and_output_weights",
    "add_bias_linear", "hidden_dropout", "attention_dropout", "quick_geglu", "qk_layernorm",
    "softmax_type", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "window_size", "window_attn_skip_freq",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_router_score_function",
    "moe_router_num_groups", "moe_router_group_topk", "mtp_num_layers",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
})
# Flags `model_shape` and `parallel_config` read: the shape's, and every knob's flag with
# the flags its reading consults (the knob registry's Megatron-LM spellings). The rest are
# accepted and ignored (`MegatronRun.ignored`).
_READ = _SHAPE | frozenset(
    name for spelling in spelt("megatron").values() for name in (spelling.name, *spelling.reads))


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


def megatron_run(args: MegatronArgs, world_size: int,
                 environment: Mapping[str, str] | None = None) -> MegatronRun:
    """The model and parallel configuration Megatron-LM runs for `args` on `world_size`
    GPUs, its processes started with `environment` (what the launch sets: `--env`, a
    command's `NAME=value` prefix): its defaults for everything absent, its `validate_args`
    rules checked. LaunchLineError, naming the flag as typed, for anything it would refuse
    or that Tessel cannot price."""
    refuse_unpriced(args)
    notes: list[str] = []
    _check_valueless(args, notes)
    model = model_config(args, notes)
    parallel, layers, chunks = parallel_config(args, model, world_size, notes)
    parallel = _as_environment_runs(parallel, environment or {}, notes)
    ignored = [flag for dest, flag in args.typed.items() if dest not in _READ]
    return MegatronRun(model, parallel, layers, chunks, notes, ignored)


def _as_environment_runs(parallel: ParallelConfig, environment: Mapping[str, str],
                         notes: list[str]) -> ParallelConfig:
    """`parallel` as the processes' environment lets it run. CUDA_DEVICE_MAX_CONNECTIONS=1
    (which Megatron-LM asks for to order tensor-parallel communication before compute, and
    Megatron-Bridge's recipes set on GPUs before Blackwell: src/megatron/bridge/recipes/
    run_plugins.py @fa0315ae2) gives every CUDA stream one hardware queue, so kernels run in
    launch order: the combined 1F1B schedule's all-to-alls cannot run beside the other
    micro-batch's compute (Megatron-LM's arguments.py warns against the EP overlap there).
    It is priced as run without the overlap, whose delayed weight gradients then change no
    time."""
    if environment.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1" \
            or not parallel.moe.overlap_moe_expert_parallel_comm:
        return parallel
    notes.append("CUDA_DEVICE_MAX_CONNECTIONS=1 runs every stream's kernels in launch order: "
                 "--overlap-moe-expert-parallel-comm hides no all-to-all (priced without it)")
    return parallel.but(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)


def _check_valueless(args: MegatronArgs, notes: list[str]) -> None:
    """Flags given without their value (a script's `--save $1` with $1 not given): read
    as absent, with a note, where they change neither time nor memory; refused where
    Tessel reads them."""
    read = [flag for dest, flag in args.valueless.items() if dest in _READ]
    if read:
        raise LaunchLineError(
            f"{read[0]} is given no value (the word after it is another flag, or none: a "
            "variable of the script left empty?); give its value, e.g. with --env NAME=VALUE")
    if args.valueless:
        flags = ", ".join(args.valueless.values())
        notes.append(f"{flags} given no value (the script leaves them empty, e.g. an unset "
                     "$1); they change neither time nor memory, so they are read as absent")
