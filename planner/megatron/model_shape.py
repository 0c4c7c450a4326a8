"""The model a Megatron-LM launch line builds, as the zoo's `TransformerConfig`.

Megatron-LM's defaults for absent flags (GPT's: LayerNorm, GeLU, learned positions, tied
embeddings, biases; a 4h MLP, 2/3 of it for swiglu), the vocabulary padded as it pads
the tokenizer's, and its rules on positions and shapes, each error naming the flag as
typed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from planner.megatron.errors import LaunchLineError
from planner.models.config import TransformerConfig
from planner.models.presets import validation_message

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs

_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
             "micro_batch_size")


def model_config(args: MegatronArgs, notes: list[str]) -> TransformerConfig:
    """The model shape Megatron-LM builds from `args`: its defaults for what is absent,
    its rules checked; defaults worth saying out loud are added to `notes`."""
    v = args.values
    missing = [args.flag(dest) for dest in _REQUIRED if getattr(v, dest) is None]
    if missing:
        raise LaunchLineError(
            f"the launch line has no {', '.join(missing)}, which Megatron-LM requires; "
            f"add {'it' if len(missing) == 1 else 'them'}"
        )
    h, heads = args.count("hidden_size"), args.count("num_attention_heads")
    assert h is not None and heads is not None
    ffn = args.count("ffn_hidden_size")
    if ffn is None:
        # Megatron-LM's default: 4h, or for swiglu 2/3 of it rounded down to 64.
        ffn = int(4 * h * 2 / 3 / 64) * 64 if v.swiglu else 4 * h
    experts = v.num_experts or None
    if v.num_experts == 0:
        # validate_args: "if args.num_experts == 0: args.num_experts = None".
        notes.append(f"{args.flag('num_experts')} 0: Megatron-LM builds no experts (it reads "
                     "0 as none), a dense model")
    fields: dict[str, Any] = {
        "num_layers": args.count("num_layers"), "hidden_size": h,
        "num_attention_heads": heads, "seq_length": args.count("seq_length"),
        "ffn_hidden_size": ffn,
        "vocab_size": _vocabulary(args, notes),
        "max_position_embeddings": args.count("max_position_embeddings"),
        "norm": {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}[v.normalization],
        "activation": "swiglu" if v.swiglu or v.quick_geglu else "gelu",
        "position_embedding": _positions(args),
        "rotary_base": v.rotary_base,
        "tie_embeddings": not v.untie_embeddings_and_output_weights,
        "bias": v.add_bias_linear,
        "hidden_dropout": v.hidden_dropout, "attention_dropout": v.attention_dropout,
        # Under MLA, --qk-layernorm norms the query and key/value latents, which the zoo's
        # MLA always has (megatron/core/transformer/multi_latent_attention.py).
        "qk_layernorm": v.qk_layernorm and not v.multi_latent_attention,
        # off-by-one adds a constant 1 to the denominator: no parameter, vanilla's cost.
        "softmax_type": "learnable" if v.softmax_type == "learnable" else "vanilla",
        **_heads(args, h, heads), **_window(args),
    }
    # Megatron-LM reads --num-query-groups only under --group-query-attention.
    if v.group_query_attention:
        fields["num_query_groups"] = args.count("num_query_groups")
    if experts:
        fields.update(_experts(args))
        if fields["moe_ffn_hidden_size"] is None:
            # validate_args: "moe_ffn_hidden_size is not set, using ffn_hidden_size for MoE
            # instead."
            notes.append(f"no {args.flag('moe_ffn_hidden_size')}: Megatron-LM makes each "
                         f"expert --ffn-hidden-size {ffn:,} wide")
        if not args.given("ffn_hidden_size") and fields["moe_layer_freq"] in (1, [1] * (
                fields["num_layers"] or 0)) and fields["moe_ffn_hidden_size"]:
            # Every layer is MoE: no dense MLP reads the default width; state the experts'.
            fields["ffn_hidden_size"] = fields["moe_ffn_hidden_size"]
        if fields["moe_ffn_hidden_size"] == fields["ffn_hidden_size"]:
            fields["moe_ffn_hidden_size"] = None  # the zoo's "as wide as the dense MLP"
    else:
        _drop_expert_width(args, notes)
    if v.mtp_num_layers:
        fields["mtp_num_layers"] = args.count("mtp_num_layers")
    _check_positions(args, fields, notes)
    try:
        return TransformerConfig(**fields)
    except ValidationError as error:
        raise LaunchLineError(_shape_message(args, error)) from None


def _heads(args: MegatronArgs, h: int, heads: int) -> dict[str, Any]:
    """Attention head widths: --kv-channels apart from hidden / heads (Megatron-LM sets
    it to hidden / heads when absent), or multi-latent attention's ranks and widths."""
    v = args.values
    if v.multi_latent_attention:
        # Megatron-Core's MLATransformerConfig: the head widths are its own, --kv-channels
        # and --num-query-groups are not read.
        return {"multi_latent_attention": True, "q_lora_rank": args.count("q_lora_rank"),
                **{dest: args.count(dest) for dest in (
                    "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")}}
    kv_channels = args.count("kv_channels")
    if kv_channels is None or (h % heads == 0 and kv_channels == h // heads):
        return {}
    return {"kv_channels": kv_channels}


def _window(args: MegatronArgs) -> dict[str, Any]:
    """--window-size (left, right) and --window-attn-skip-freq: a causal model's window
    looks left only; a left size of -1 is Transformer Engine's "no window"."""
    v = args.values
    if v.window_size is None:
        return {}
    flag = args.flag("window_size")
    if len(v.window_size) != 2:
        raise LaunchLineError(f"{flag} {','.join(map(str, v.window_size))} must give two "
                              "sizes, left and right, such as 128,0")
    left, right = v.window_size
    if right != 0:
        raise LaunchLineError(
            f"{flag} {left},{right} lets each token see {right} later tokens, which a "
            "causal language model does not; give the right size 0")
    if left < 0:
        return {}
    if left == 0:
        raise LaunchLineError(f"{flag} {left},{right}: a window of 0 tokens sees nothing; "
                              "give its left size (e.g. 128,0)")
    return {"window_size": left, "window_attn_skip_freq": v.window_attn_skip_freq}


def _experts(args: MegatronArgs) -> dict[str, Any]:
    """The mixture of experts: routed experts and their width (--moe-ffn-hidden-size;
    Megatron-LM defaults it to --ffn-hidden-size), shared experts, the dense/MoE layer
    pattern and group-limited routing."""
    v = args.values
    return {
        "num_experts": args.count("num_experts"), "moe_top_k": args.count("moe_router_topk"),
        "moe_ffn_hidden_size": args.count("moe_ffn_hidden_size"),
        "moe_shared_expert_intermediate_size": args.count(
            "moe_shared_expert_intermediate_size"),
        "moe_layer_freq": v.moe_layer_freq,
        # sqrtsoftplus scores like sigmoid (an elementwise score and top-k): priced alike.
        "moe_router_score_function": "softmax" if v.moe_router_score_function == "softmax"
        else "sigmoid",
        "moe_router_num_groups": args.count("moe_router_num_groups"),
        "moe_router_group_topk": args.count("moe_router_group_topk"),
    }


def _drop_expert_width(args: MegatronArgs, notes: list[str]) -> None:
    """--moe-ffn-hidden-size on a model without experts, as Megatron-Core's
    TransformerConfig.__post_init__ takes it: ignored with a warning where --moe-layer-freq
    leaves dense layers, refused where it makes every layer MoE."""
    if not args.given("moe_ffn_hidden_size"):
        return
    flag, freq = args.flag("moe_ffn_hidden_size"), args.values.moe_layer_freq
    mixed = (isinstance(freq, list) and 0 in freq) or (isinstance(freq, int) and freq > 1)
    if not mixed:
        raise LaunchLineError(
            f"{flag} sizes experts, and the line has no --num-experts, which Megatron-Core "
            "refuses; add --num-experts or drop it")
    notes.append(f"{flag} is ignored: the line has no --num-experts, so every layer is "
                 "dense, as Megatron-Core reads it")


# Tokenizers whose vocabulary is fixed by what they are, with what fixes it: Megatron-LM's
# GPT2BPETokenizer reads GPT-2's vocab.json and merges (50,257 tokens), its Llama2Tokenizer
# Llama 2's SentencePiece model (32,000; Mixtral's and Mistral 7B's are the same size).
# Other tokenizers' sizes live in the files they load, which Tessel does not read.
TOKENIZER_VOCABULARY = {
    "GPT2BPETokenizer": (50257, "GPT-2's byte-pair vocabulary"),
    "Llama2Tokenizer": (32000, "Llama 2's SentencePiece model, as Mixtral's"),
}


def _vocabulary(args: MegatronArgs, notes: list[str]) -> int:
    """The embedding's rows: --padded-vocab-size, else --vocab-size padded as Megatron-LM
    pads the tokenizer's (to a multiple of --make-vocab-size-divisible-by x tensor size)."""
    v = args.values
    if v.padded_vocab_size is not None:
        return args.count("padded_vocab_size") or 0
    size = args.count("vocab_size")
    # pretrain_gpt.py's args_defaults: GPT2BPETokenizer without --tokenizer-type.
    tokenizer = v.tokenizer_type or "GPT2BPETokenizer"
    if size is None and tokenizer in TOKENIZER_VOCABULARY:
        size, whose = TOKENIZER_VOCABULARY[tokenizer]
        named = (f"{args.flag('tokenizer_type')} {tokenizer}" if v.tokenizer_type
                 else f"pretrain_gpt.py's default tokenizer, {tokenizer}")
        notes.append(f"vocabulary {size:,}: {named}'s ({whose}); give --vocab-size if your "
                     "tokenizer's differs")
    if size is None:
        raise LaunchLineError(
            "the launch line has no --vocab-size: Megatron-LM takes it from the tokenizer, "
            "which Tessel does not load; add --vocab-size N (the tokenizer's, Megatron-LM "
            "pads it) or --padded-vocab-size N"
        )
    if not v.pad_vocab_size:
        return size
    divisor = v.make_vocab_size_divisible_by
    if divisor < 1:
        raise LaunchLineError(f"{args.flag('make_vocab_size_divisible_by')} {divisor} must be "
                              "1 or more; give a positive multiple")
    tensor = v.tensor_model_parallel_size
    if tensor < 1:
        return size  # refused with the other degrees, by name
    multiple = divisor * tensor
    padded = -(-size // multiple) * multiple
    if padded != size:
        notes.append(f"vocabulary padded from {size:,} to {padded:,} (a multiple of "
                     f"{args.flag('make_vocab_size_divisible_by')} {divisor} x tensor "
                     f"{tensor}), as Megatron-LM pads it")
    return padded


def _positions(args: MegatronArgs) -> str:
    v = args.values
    if v.use_rotary_position_embeddings:
        return "rope"
    # yarn and mrope rotate queries and keys as rope does, at rope's cost.
    return "learned" if v.position_embedding_type == "learned_absolute" else "rope"


def _check_positions(args: MegatronArgs, fields: dict[str, Any], notes: list[str]) -> None:
    v = args.values
    if not v.add_position_embedding and fields["position_embedding"] != "rope":
        raise LaunchLineError(
            f"{args.flag('add_position_embedding')} is retired outside rotary embeddings and "
            "Megatron-LM refuses it; use --position-embedding-type rope"
        )
    if fields["max_position_embeddings"] is None:
        # Megatron-LM requires the flag; rope models do not use it, and a learned table
        # as long as the sequence is what a run without it would need.
        fields["max_position_embeddings"] = fields["seq_length"]
        if fields["position_embedding"] == "learned":
            notes.append("no --max-position-embeddings, which Megatron-LM requires: the "
                         "position table is taken as long as --seq-length")
    elif fields["max_position_embeddings"] < fields["seq_length"]:
        raise LaunchLineError(
            f"{args.flag('max_position_embeddings')} {fields['max_position_embeddings']} is "
            f"shorter than --seq-length {fields['seq_length']}, which Megatron-LM refuses; "
            "raise it to at least the sequence length"
        )


# TransformerConfig field -> the dest of the flag that sets it, where the names differ.
_DEST_OF = {"moe_top_k": "moe_router_topk", "norm": "normalization",
            "position_embedding": "position_embedding_type"}


def _shape_message(args: MegatronArgs, error: ValidationError) -> str:
    """The shape's validation error with its fields named as the line's flags."""
    message = validation_message(error)
    for name in sorted(TransformerConfig.model_fields, key=len, reverse=True):
        dest = _DEST_OF.get(name, name)
        if name == "ffn_hidden_size" and args.given("moe_ffn_hidden_size") \
                and not args.given("ffn_hidden_size"):
            dest = "moe_ffn_hidden_size"
        message = re.sub(rf"(?<![\w-]){name}\b", args.flag(dest), message)
    return message
