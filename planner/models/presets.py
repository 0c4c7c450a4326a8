"""Named shapes of published models, for ``plan`` and for tests of the cost model.

Each preset cites where its numbers come from. Where a paper and the released model
disagree, the released configuration wins and the comment says so.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from planner.models.flags import flag_names
from planner.models.config import TransformerConfig

__all__ = ["FAMILIES", "PRESETS", "describe_presets", "get_preset", "zoo_config"]


_LLAMA_FORM: dict[str, Any] = dict(
    norm="rmsnorm", activation="swiglu", position_embedding="rope", tie_embeddings=False,
    bias=False, hidden_dropout=0.0, attention_dropout=0.0,
)

FAMILIES: dict[str, dict[str, Any]] = {
    "gpt": dict(
        norm="layernorm", activation="gelu", position_embedding="learned",
        tie_embeddings=True, bias=True,
    ),
    "llama": _LLAMA_FORM,
    "mixtral": {**_LLAMA_FORM, "num_experts": 8, "moe_top_k": 2},
}
"""Architectures without a size: `plan gpt --num-layers ... --hidden-size ...` builds one
of these at the shape the flags give."""


def _shaped(family: str, num_layers: int, hidden_size: int, num_attention_heads: int,
            **fields: Any) -> TransformerConfig:
    """`FAMILIES[family]` at a depth, width and head count, with `fields` besides."""
    return TransformerConfig(
        **FAMILIES[family], num_layers=num_layers, hidden_size=hidden_size,
        num_attention_heads=num_attention_heads, **fields,
    )


def _gpt3(num_layers: int, hidden_size: int, num_attention_heads: int) -> TransformerConfig:
    """GPT-3 shape as Megatron-LM trains it (Brown et al. 2020, Sec. 2.1).

    Vocabulary 51200: GPT-2's 50257 BPE tokens padded, as Megatron does, to a multiple of
    128 x tensor-parallel size. Context 2048, learned positions, LayerNorm, GeLU, biases,
    tied input and output embeddings.
    """
    return _shaped("gpt", num_layers, hidden_size, num_attention_heads,
                   vocab_size=51200, seq_length=2048)


def _llama3(
    num_layers: int, hidden_size: int, num_attention_heads: int, ffn_hidden_size: int
) -> TransformerConfig:
    """Llama 3 shape (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3).

    8 key/value heads, vocabulary 128256 (the released config.json; the paper rounds it to
    128K), RMSNorm, SwiGLU, RoPE with base 500000, no biases, untied output layer.
    Pre-training sequences are 8192 tokens; the released models extend to 131072.
    """
    return _shaped("llama", num_layers, hidden_size, num_attention_heads,
                   ffn_hidden_size=ffn_hidden_size, num_query_groups=8, vocab_size=128256,
                   seq_length=8192, max_position_embeddings=131072, rotary_base=500000)


def _mixtral(
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    ffn_hidden_size: int,
    vocab_size: int,
    max_position_embeddings: int,
) -> TransformerConfig:
    """Mixtral shape (Jiang et al. 2024, "Mixtral of Experts", Table 1, and the released
    config.json files): 8 SwiGLU experts, top-2 routing, 8 key/value heads, RMSNorm, RoPE
    with base 1e6, no biases, untied output layer. The training sequence length is not
    published; 4096 is a common fine-tuning length well inside the context window.
    """
    return _shaped("mixtral", num_layers, hidden_size, num_attention_heads,
                   ffn_hidden_size=ffn_hidden_size, num_query_groups=8, vocab_size=vocab_size,
                   seq_length=4096, max_position_embeddings=max_position_embeddings,
                   rotary_base=1_000_000)


def _deepseek_v3() -> TransformerConfig:
    """DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437, Sec. 4.2, and the released
    config.json): 61 layers, the first 3 dense (ffn 18432), then 256 routed experts of
    width 2048 with top-8 sigmoid routing limited to 4 of 8 groups, one shared expert;
    multi-latent attention (128 heads, q rank 1536, kv rank 512, 128 + 64 rotary query
    width, 128 value width); one multi-token-prediction layer; vocabulary 129280;
    pre-trained at 4096 tokens. 671B parameters, 37B active (685B with the MTP layer)."""
    return TransformerConfig(
        **_LLAMA_FORM, num_layers=61, hidden_size=7168, num_attention_heads=128,
        ffn_hidden_size=18432, vocab_size=129280, seq_length=4096,
        max_position_embeddings=163840, multi_latent_attention=True, q_lora_rank=1536,
        kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
        num_experts=256, moe_top_k=8, moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048, moe_layer_freq=[0] * 3 + [1] * 58,
        moe_router_score_function="sigmoid", moe_router_num_groups=8,
        moe_router_group_topk=4, mtp_num_layers=1,
    )


def _qwen3_moe(num_layers: int, hidden_size: int, num_attention_heads: int,
               ffn_hidden_size: int, moe_ffn_hidden_size: int) -> TransformerConfig:
    """Qwen3 MoE (Qwen Team 2025, arXiv 2505.09388, Table 2, and the released
    config.json files): 128 experts, top-8 softmax routing, no shared expert, every layer
    MoE; 4 key/value heads of width 128 apart from hidden / heads; QK RMSNorm; no biases;
    RoPE base 1e6; vocabulary 151936; pre-trained at 4096 tokens (its first two stages)."""
    return TransformerConfig(
        **_LLAMA_FORM, num_layers=num_layers, hidden_size=hidden_size,
        num_attention_heads=num_attention_heads, num_query_groups=4, kv_channels=128,
        qk_layernorm=True, ffn_hidden_size=ffn_hidden_size,
        moe_ffn_hidden_size=moe_ffn_hidden_size, num_experts=128, moe_top_k=8,
        vocab_size=151936, seq_length=4096, max_position_embeddings=40960,
        rotary_base=1_000_000,
    )


def _gpt_oss(num_layers: int, num_experts: int) -> TransformerConfig:
    """GPT-OSS (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1, and the
    released config.json files): width 2880, 64 query and 8 key/value heads of width 64,
    top-4 routing over experts of width 2880, biases on every linear (router included),
    one learned attention sink per head, a 128-token sliding window on alternate layers
    (the first windowed), RoPE base 150000, vocabulary 201088 (o200k_harmony); trained
    at 4096 tokens in Megatron-Bridge's recipes."""
    return TransformerConfig(
        **{**_LLAMA_FORM, "bias": True}, num_layers=num_layers, hidden_size=2880,
        num_attention_heads=64, num_query_groups=8, kv_channels=64,
        ffn_hidden_size=2880, num_experts=num_experts, moe_top_k=4, vocab_size=201088,
        seq_length=4096, max_position_embeddings=131072, rotary_base=150000,
        softmax_type="learnable", window_size=128, window_attn_skip_freq=2,
    )


PRESETS: dict[str, TransformerConfig] = {
    # Brown et al. 2020, Table 2.1 (n_layers, d_model, n_heads).
    "gpt3-125m": _gpt3(12, 768, 12),
    "gpt3-350m": _gpt3(24, 1024, 16),
    "gpt3-760m": _gpt3(24, 1536, 16),
    # The table lists 24 heads of size 128 for d_model 2048, which cannot both hold; 16
    # heads of 128 is what Megatron-LM and DeepSpeed train. Heads do not change the count.
    "gpt3-1.3b": _gpt3(24, 2048, 16),
    "gpt3-2.7b": _gpt3(32, 2560, 32),
    "gpt3-6.7b": _gpt3(32, 4096, 32),
    # The table's d_model 5140 is a typo for 40 heads x 128 = 5120.
    "gpt3-13b": _gpt3(40, 5120, 40),
    "gpt3-175b": _gpt3(96, 12288, 96),
    # Narayanan et al. 2021 (Megatron-LM at scale), Table 1: the 1T (1008B) GPT row.
    "gpt-1t": _gpt3(128, 25600, 160),
    "llama3-8b": _llama3(32, 4096, 32, 14336),
    "llama3-70b": _llama3(80, 8192, 64, 28672),
    "llama3-405b": _llama3(126, 16384, 128, 53248),
    # Mixtral 8x7B: 32k context. 8x22B (Mistral AI, April 2024): 64k context, 32768 vocab.
    "mixtral-8x7b": _mixtral(32, 4096, 32, 14336, 32000, 32768),
    "mixtral-8x22b": _mixtral(56, 6144, 48, 16384, 32768, 65536),
    "deepseek-v3": _deepseek_v3(),
    "qwen3-235b-a22b": _qwen3_moe(94, 4096, 64, 12288, 1536),
    "qwen3-30b-a3b": _qwen3_moe(48, 2048, 32, 6144, 768),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "gpt-oss-20b": _gpt_oss(24, 32),
}


# Shape fields a family model must be given; the rest have defaults.
REQUIRED_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")


def zoo_config(name: str, shape: dict[str, Any] | None = None) -> TransformerConfig:
    """The config of preset or family `name` with the fields in `shape` replaced.

    ValueError, in one sentence per problem, for an unknown name, a family missing a
    required shape field, or a shape that does not hold together (heads not dividing
    the hidden size, ...).
    """
    shape = {k: v for k, v in (shape or {}).items() if v is not None}
    if name in PRESETS:
        fields = {**PRESETS[name].model_dump(), **shape}
    elif name in FAMILIES:
        missing = [field for field in REQUIRED_SHAPE if field not in shape]
        if missing:
            flags = flag_names(missing)
            raise ValueError(
                f"model {name!r} needs its shape: add {flags} (or name a preset; see "
                "`plan models`)."
            )
        fields = {**FAMILIES[name], **shape}
    else:
        raise _unknown_model(name)
    try:
        return TransformerConfig(**fields)
    except ValidationError as error:
        raise ValueError(f"model {name!r}: {validation_message(error)}") from None


def validation_message(error: ValidationError) -> str:
    """A pydantic error as one line: each problem's field and what is wrong with it."""
    parts = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in problem["loc"])
        parts.append(f"{field}: {message}" if field else message)
    return " ".join(parts)


def closest_names(name: str, known: list[str]) -> list[str]:
    """Up to three of `known` that look like `name`, best first."""
    return difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.4)


def get_preset(name: str) -> TransformerConfig:
    """A copy of the preset `name`, safe to modify; ValueError naming the closest presets."""
    if name not in PRESETS:
        raise _unknown_model(name)
    return PRESETS[name].model_copy(deep=True)


def _unknown_model(name: str) -> ValueError:
    """The error for a model name that is neither a preset nor a family, naming the
    closest ones."""
    close = closest_names(name, [*PRESETS, *FAMILIES])
    if close:
        return ValueError(
            f"unknown model {name!r}; did you mean {' or '.join(repr(c) for c in close)}? "
            "(`plan models` lists the presets)"
        )
    return ValueError(f"unknown model {name!r}; `plan models` lists the presets.")


def describe_presets() -> list[tuple[str, int]]:
    """``(name, parameter count)`` of every preset, in definition order."""
    return [(name, config.num_parameters()) for name, config in PRESETS.items()]
