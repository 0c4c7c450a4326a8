"""Model-shape flags of the CLI, named as Megatron-LM names them.

`plan gpt --num-layers 96 --hidden-size 12288 --num-attention-heads 96 ...` builds a zoo
model at that shape; the same flags override a preset's fields (`plan gpt3-175b
--seq-length 4096`). Each flag's help is the TransformerConfig field's description, so the
two cannot drift apart.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Iterable

from planner.models.config import TransformerConfig

# Megatron-LM flag -> (TransformerConfig field, parse the flag's value into the field's).
_VALUE_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--num-layers": ("num_layers", int),
    "--hidden-size": ("hidden_size", int),
    "--num-attention-heads": ("num_attention_heads", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int),
    "--num-query-groups": ("num_query_groups", int),
    "--vocab-size": ("vocab_size", int),
    "--seq-length": ("seq_length", int),
    "--max-position-embeddings": ("max_position_embeddings", int),
    "--rotary-base": ("rotary_base", int),
    "--num-experts": ("num_experts", int),
    "--moe-router-topk": ("moe_top_k", int),
}
# Megatron-LM's spellings of the choice fields -> ours.
_NORMALIZATION = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
_POSITION_EMBEDDING = {"learned_absolute": "learned", "rope": "rope"}
# Switches: flag -> (field, value when given).
_SWITCHES: dict[str, tuple[str, Any]] = {
    "--swiglu": ("activation", "swiglu"),
    "--untie-embeddings-and-output-weights": ("tie_embeddings", False),
    "--disable-bias-linear": ("bias", False),
}
# TransformerConfig field -> the flag that sets it, for messages that name the flag.
_FLAG_OF = {
    **{field: flag for flag, (field, _) in {**_VALUE_FLAGS, **_SWITCHES}.items()},
    "norm": "--normalization",
    "position_embedding": "--position-embedding-type",
}


def flag_names(fields: Iterable[str]) -> str:
    """The flags that set `fields`, comma-separated: '--moe-router-topk, --swiglu'."""
    return ", ".join(_FLAG_OF.get(field, "--" + field.replace("_", "-")) for field in fields)


def _help(field: str) -> str:
    return TransformerConfig.model_fields[field].description or field


def add_model_shape_flags(parser: argparse.ArgumentParser) -> None:
    """Add the model-shape flags, in a group of their own, all defaulting to 'not given'."""
    group = parser.add_argument_group(
        "model shape (Megatron-LM flags; for gpt/llama/mixtral, or to override a preset)"
    )
    for flag, (field, parse) in _VALUE_FLAGS.items():
        group.add_argument(flag, dest=field, type=parse, default=None, help=_help(field))
    group.add_argument(
        "--normalization", choices=sorted(_NORMALIZATION), default=None, help=_help("norm")
    )
    group.add_argument(
        "--position-embedding-type",
        choices=sorted(_POSITION_EMBEDDING),
        default=None,
        help=_help("position_embedding"),
    )
    for flag, (field, _) in _SWITCHES.items():
        dest = flag.removeprefix("--").replace("-", "_")
        group.add_argument(flag, dest=dest, action="store_true", help=_help(field))


def shape_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TransformerConfig fields the command line gave, and only those."""
    shape = {field: getattr(args, field) for field, _ in _VALUE_FLAGS.values()}
    if args.normalization:
        shape["norm"] = _NORMALIZATION[args.normalization]
    if args.position_embedding_type:
        shape["position_embedding"] = _POSITION_EMBEDDING[args.position_embedding_type]
    for flag, (field, value) in _SWITCHES.items():
        if getattr(args, flag.removeprefix("--").replace("-", "_")):
            shape[field] = value
    return {k: v for k, v in shape.items() if v is not None}
