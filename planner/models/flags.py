"""Model-shape flags, named as Megatron-LM names them, and the config fields they set.

`plan gpt --num-layers 96 --hidden-size 12288 --num-attention-heads 96 ...` builds a zoo
model at that shape; the same flags override a preset's fields (`plan gpt3-175b
--seq-length 4096`). The CLI adds them (`planner/cli/model_args.py`); messages anywhere
name a field by its flag (`flag_names`).
"""

from __future__ import annotations

from typing import Any, Iterable


# Megatron-LM flag -> (TransformerConfig field, the largest value accepted). The bounds are
# far past any model trained, and keep every search and trace finite (a prime layer count
# of 10^9 would make the layer grouping loop for minutes).
VALUE_FLAGS: dict[str, tuple[str, int]] = {
    "--num-layers": ("num_layers", 1 << 14),
    "--hidden-size": ("hidden_size", 1 << 20),
    "--num-attention-heads": ("num_attention_heads", 1 << 14),
    "--ffn-hidden-size": ("ffn_hidden_size", 1 << 22),
    "--num-query-groups": ("num_query_groups", 1 << 14),
    "--vocab-size": ("vocab_size", 1 << 24),
    "--seq-length": ("seq_length", 1 << 24),
    "--max-position-embeddings": ("max_position_embeddings", 1 << 24),
    "--rotary-base": ("rotary_base", 1 << 31),
    "--num-experts": ("num_experts", 1 << 14),
    "--moe-router-topk": ("moe_top_k", 1 << 10),
    "--kv-channels": ("kv_channels", 1 << 20),
    "--q-lora-rank": ("q_lora_rank", 1 << 20),
    "--kv-lora-rank": ("kv_lora_rank", 1 << 20),
    "--qk-head-dim": ("qk_head_dim", 1 << 20),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", 1 << 20),
    "--v-head-dim": ("v_head_dim", 1 << 20),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", 1 << 22),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", 1 << 22),
    "--moe-router-num-groups": ("moe_router_num_groups", 1 << 14),
    "--moe-router-group-topk": ("moe_router_group_topk", 1 << 14),
    "--mtp-num-layers": ("mtp_num_layers", 1 << 10),
}
# Megatron-LM's spellings of the choice fields -> ours.
NORMALIZATION = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
POSITION_EMBEDDING = {"learned_absolute": "learned", "rope": "rope"}
# Switches: flag -> (field, value when given).
SWITCHES: dict[str, tuple[str, Any]] = {
    "--swiglu": ("activation", "swiglu"),
    "--untie-embeddings-and-output-weights": ("tie_embeddings", False),
    "--disable-bias-linear": ("bias", False),
    "--multi-latent-attention": ("multi_latent_attention", True),
    "--qk-layernorm": ("qk_layernorm", True),
}
# TransformerConfig field -> the flag that sets it, for messages that name the flag.
_FLAG_OF = {
    **{field: flag for flag, (field, _) in {**VALUE_FLAGS, **SWITCHES}.items()},
    "norm": "--normalization",
    "position_embedding": "--position-embedding-type",
}


def flag_names(fields: Iterable[str]) -> str:
    """The flags that set `fields`, comma-separated: '--moe-router-topk, --swiglu'."""
    return ", ".join(_FLAG_OF.get(field, "--" + field.replace("_", "-")) for field in fields)
