"""What training plans read of a Hugging Face config.json: its shape, without torch.

Plans on the analytic path price a model by its shape (`TransformerConfig`), so for the
families whose shape maps onto the zoo's (GPT-2 and the Llama layout) reading the JSON is
all they need. transformers builds the same config only after importing torch (seconds
here). Where the file states every field the shape reads, with the type transformers
gives it, `plain_config` is that config as plain attributes; anything else (a field left
to its default, an alias, another family) is left to transformers (`huggingface`), which
knows its defaults and validates the rest. Either way `to_transformer_config` gives the
zoo shape.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from planner.user_files import UserFileError, parse_nested, read_user_file

# Longest default trace sequence: configs state their maximum context (128k for Llama 3),
# far beyond what pretraining uses; --seq-length overrides it.
MAX_DEFAULT_SEQ_LENGTH = 4096


class HFConfigError(ValueError):
    """A Hugging Face config that cannot be used; the message says what to change."""


# Fields that make transformers import code from outside its own package (auto_map and
# custom_pipelines name Python files beside the config; name_or_path is where it looks for
# them; attention and expert implementations may name a kernel fetched from the Hub) or
# that ask it to trust such code. None describes the architecture being planned.
_CODE_FIELDS = frozenset({
    "auto_map", "custom_pipelines", "trust_remote_code", "name_or_path", "_name_or_path",
    "attn_implementation", "_attn_implementation", "_attn_implementation_internal",
    "experts_implementation", "_experts_implementation", "_experts_implementation_internal",
})


def without_code_fields(value: Any) -> Any:
    """`value` (a config's fields, nested sub-configs included) without _CODE_FIELDS."""
    if isinstance(value, dict):
        return {key: without_code_fields(item) for key, item in value.items()
                if key not in _CODE_FIELDS}
    if isinstance(value, list):
        return [without_code_fields(item) for item in value]
    return value


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_config_fields(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The config.json at `path` (or in that directory) and its fields, code fields
    dropped; `model_type` checked to be there and a string."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "config.json"
    if not file.exists():
        raise HFConfigError(
            f"Hugging Face config {str(path)!r} does not exist; give the path of a "
            "config.json file or of the directory that holds it."
        )
    try:
        # Bounded: a regular file of at most 1 MiB, nesting at most 100 deep.
        fields = parse_nested(json.loads, read_user_file(file, str(file), "a config.json"),
                              str(file))
    except UserFileError as error:
        raise HFConfigError(str(error)) from None
    except json.JSONDecodeError as error:
        raise HFConfigError(
            f"{file} is not valid JSON ({error.msg} at line {error.lineno}, column "
            f"{error.colno}); fix the file or download it again."
        ) from None
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise HFConfigError(
            f"{file} has no \"model_type\" field; a Hugging Face config.json names its "
            "architecture there (e.g. \"llama\")."
        )
    if not isinstance(fields["model_type"], str):
        raise HFConfigError(
            f"{file}: \"model_type\" must be a string naming the architecture (e.g. "
            f"\"llama\"), not {one_line(repr(fields['model_type']), 60)}."
        )
    return file, without_code_fields(fields)


# The fields the zoo shape reads, per family, each as the JSON states it.
_INT, _BOOL = "int", "bool"
_GPT2 = {"n_layer": _INT, "n_embd": _INT, "n_head": _INT, "vocab_size": _INT,
         "n_positions": _INT, "tie_word_embeddings": _BOOL}
_LLAMA = {"num_hidden_layers": _INT, "hidden_size": _INT, "num_attention_heads": _INT,
          "num_key_value_heads": _INT, "intermediate_size": _INT, "vocab_size": _INT,
          "max_position_embeddings": _INT, "tie_word_embeddings": _BOOL}
_PLAIN_FIELDS = {"gpt2": _GPT2, "llama": _LLAMA, "mistral": _LLAMA,
                 "mixtral": {**_LLAMA, "num_local_experts": _INT, "num_experts_per_tok": _INT}}
# Other names transformers accepts for those fields, and per-layer attention types it
# derives: their meaning is transformers' to resolve.
_RESOLVED_BY_TRANSFORMERS = frozenset({
    "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings",
    "n_ctx", "num_experts", "layer_types"})


def plain_config(fields: dict[str, Any]) -> SimpleNamespace | None:
    """The config as plain attributes, when the file states every field the zoo shape of
    its family reads with its type (and a rotary base where it has one); None otherwise."""
    model_type = fields["model_type"]
    wanted = _PLAIN_FIELDS.get(model_type)
    if wanted is None or set(fields) & (_RESOLVED_BY_TRANSFORMERS - set(wanted)):
        return None
    for name, kind in wanted.items():
        value = fields.get(name)
        if kind == _BOOL and not isinstance(value, bool):
            return None
        if kind == _INT and (not isinstance(value, int) or isinstance(value, bool)):
            return None
    if model_type == "gpt2":
        if not isinstance(fields.get("n_inner"), (int, type(None))) or (
                fields["n_embd"] % fields["n_head"]):
            return None
        # With the names transformers' GPT2Config also answers to (its attribute_map).
        return SimpleNamespace(**{"n_inner": None, **fields},
                               num_hidden_layers=fields["n_layer"],
                               hidden_size=fields["n_embd"],
                               num_attention_heads=fields["n_head"],
                               max_position_embeddings=fields["n_positions"])
    # Mistral's window defaults to 4096 in transformers: a file that leaves it out (or
    # states no number) is transformers' to read.
    window = fields.get("sliding_window", "unstated")
    if model_type == "mistral" and (isinstance(window, bool)
                                    or not isinstance(window, (int, type(None)))):
        return None
    config = SimpleNamespace(**fields)
    if fields["hidden_size"] % fields["num_attention_heads"] or _stated_rope_theta(config) is None:
        return None
    return config


def hf_num_layers(config: Any) -> int | None:
    """Number of repeated blocks, when every block is built alike (else None): not when
    `layer_types` mixes attention kinds, nor when dense and MoE layers mix (DeepSeek-V3's
    first_k_dense_replace, Qwen3-MoE's mlp_only_layers and decoder_sparse_step)."""
    layers = getattr(config, "num_hidden_layers", None)
    layer_types = getattr(config, "layer_types", None)
    if not isinstance(layers, int) or (layer_types and len(set(layer_types)) > 1):
        return None
    mixed = getattr(config, "first_k_dense_replace", None) or getattr(
        config, "mlp_only_layers", None) or (getattr(config, "decoder_sparse_step", 1) or 1) > 1
    return None if mixed else layers


def default_seq_length(config: Any) -> int:
    """The config's context length, capped at MAX_DEFAULT_SEQ_LENGTH."""
    longest = getattr(config, "max_position_embeddings", None) or MAX_DEFAULT_SEQ_LENGTH
    return min(int(longest), MAX_DEFAULT_SEQ_LENGTH)


def _stated_rope_theta(config: Any) -> float | None:
    """The rotary base the config states: `rope_theta` (transformers 4) or
    `rope_parameters["rope_theta"]` (5); None where it states no number."""
    theta = getattr(config, "rope_theta", None)
    parameters = getattr(config, "rope_parameters", None)
    if not theta and isinstance(parameters, dict):
        theta = parameters.get("rope_theta")
    return theta if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None


def _rope_theta(config: Any) -> int:
    """Rotary base, 10000 where the config states none."""
    return int(_stated_rope_theta(config) or 10000)


# Decoder families whose config maps onto the zoo's TransformerConfig (Llama's layout, and
# the mixtures of experts built on it).
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "mixtral"}
_MOE_ERA = {"qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3"}


def to_transformer_config(config: Any, seq_length: int | None = None) -> Any:
    """The zoo shape of a Hugging Face decoder, for training plans (which price layers
    by their shape, not their traced graph). HFConfigError, in one line naming the field,
    for a config whose shape the zoo cannot state."""
    from planner.models.config import TransformerConfig

    seq = seq_length or default_seq_length(config)
    if config.model_type == "gpt2":
        return TransformerConfig(
            num_layers=config.n_layer, hidden_size=config.n_embd,
            num_attention_heads=config.n_head, ffn_hidden_size=config.n_inner,
            vocab_size=config.vocab_size, seq_length=seq,
            max_position_embeddings=config.n_positions,
            tie_embeddings=config.tie_word_embeddings,
        )
    if config.model_type == "gpt_neox":
        return _validated(config, _gpt_neox_fields(config, seq))
    known = _LLAMA_LIKE | _MOE_ERA | {"gemma2", "phi3"}
    if config.model_type not in known:
        raise HFConfigError(
            f"training plans know the shapes of "
            f"{', '.join(sorted(known | {'gpt2', 'gpt_neox'}))} "
            f"configs, not model_type {config.model_type!r}; describe it with a zoo family "
            "(gpt/llama/mixtral) and its shape flags."
        )
    fields = {**_llama_fields(config, seq), **_FAMILY_FIELDS[config.model_type](config)}
    return _validated(config, fields)


def as_transformers_builds(config: Any) -> tuple[Any, str]:
    """`config` as transformers' own causal LM builds the model, for a plan that runs on
    its modules (Tessel's runtime: `plan check` of an hf: model), and a note saying what
    that leaves out of the config ('' where nothing): transformers' DeepseekV3ForCausalLM
    builds no multi-token-prediction layer, so the plan counts none (Megatron-LM builds
    the config's num_nextn_predict_layers, and a plan for it counts them)."""
    mtp = getattr(config, "num_mtp_layers", 0) or 0
    if getattr(config, "model_type", None) != "deepseek_v3" or not mtp:
        return config, ""
    built = copy.copy(config)
    built.num_mtp_layers = 0  # DeepseekV3Config's name for num_nextn_predict_layers
    return built, (f"transformers' DeepseekV3ForCausalLM builds no multi-token-prediction "
                   f"layer, so the plan counts none of the config's {mtp} "
                   f"(num_nextn_predict_layers; Megatron-LM builds them, and a plan for it "
                   "counts them)")


def _validated(config: Any, fields: dict[str, Any]) -> Any:
    """The TransformerConfig of `fields`; HFConfigError, in one line, where it is not one."""
    from pydantic import ValidationError

    from planner.models.config import TransformerConfig
    from planner.models.presets import validation_message

    try:
        return TransformerConfig(**fields)
    except ValidationError as error:
        raise HFConfigError(
            f"{config.model_type} config: {validation_message(error)}") from None


def _llama_fields(config: Any, seq: int) -> dict[str, Any]:
    """The fields every Llama-layout decoder states alike: RMSNorm, SwiGLU (transformers'
    gated MLP with `hidden_act`; the activation does not change its three matrices),
    rotary positions, no biases, and head width apart from hidden / heads where the
    config's `head_dim` says so."""
    h, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    own_width = isinstance(head_dim, int) and (h % heads or head_dim != h // heads)
    return dict(
        num_layers=config.num_hidden_layers, hidden_size=h, num_attention_heads=heads,
        num_query_groups=getattr(config, "num_key_value_heads", None),
        kv_channels=head_dim if own_width else None,
        ffn_hidden_size=config.intermediate_size, vocab_size=config.vocab_size,
        seq_length=seq, max_position_embeddings=config.max_position_embeddings,
        norm="rmsnorm", activation="swiglu", position_embedding="rope",
        rotary_base=_rope_theta(config), tie_embeddings=bool(config.tie_word_embeddings),
        bias=False,
    )


def _mistral(config: Any) -> dict[str, Any]:
    """Llama, Mistral, Mixtral: experts (Mixtral's num_local_experts) and Mistral's and
    Mixtral's sliding window, on every layer (transformers' MistralAttention and
    MixtralAttention pass config.sliding_window to each layer)."""
    experts = getattr(config, "num_local_experts", None)
    return dict(num_experts=experts,
                moe_top_k=getattr(config, "num_experts_per_tok", 2) or 2,
                window_size=getattr(config, "sliding_window", None) or None)


def _qwen2(config: Any) -> dict[str, Any]:
    """Qwen2: biases on q, k and v only (Qwen2Attention), and a sliding window on the
    layers `layer_types` names."""
    return dict(qkv_bias=True, **_windows(config))


def _phi3(config: Any) -> dict[str, Any]:
    """Phi-3: the Llama shape with q/k/v fused in qkv_proj and gate/up in gate_up_proj
    (the same parameters), partial rotary embeddings where the config says so, and
    `sliding_window` on every layer (Phi3Attention)."""
    _no_attention_bias(config)
    return dict(rotary_percent=_rotary_fraction(config), attention_dropout=_dropout(config),
                hidden_dropout=0.0, window_size=getattr(config, "sliding_window", None) or None)


def _gemma2(config: Any) -> dict[str, Any]:
    """Gemma 2: RMSNorm scaling by (1 + weight) with a norm before and after each of
    attention and MLP (Gemma2DecoderLayer's four), its attention scores and final logits
    soft-capped, the embedding scaled by sqrt(hidden_size) (Gemma2TextScaledWordEmbedding),
    a gated GELU MLP (gate, up, down: the zoo's swiglu matrices), head_dim apart from the
    hidden size, and a sliding window on the layers `layer_types` names (alternating)."""
    _no_attention_bias(config)
    return dict(apply_layernorm_1p=True, sandwich_norms=True, scale_embeddings=True,
                attention_softcap=getattr(config, "attn_logit_softcapping", None) or None,
                final_logit_softcap=getattr(config, "final_logit_softcapping", None) or None,
                attention_dropout=_dropout(config), hidden_dropout=0.0, **_windows(config))


def _gpt_neox_fields(config: Any, seq: int) -> dict[str, Any]:
    """GPT-NeoX (transformers' GPTNeoXForCausalLM): LayerNorm with bias, a GELU MLP of
    two biased matrices (dense_h_to_4h, dense_4h_to_h), q/k/v fused per head in
    query_key_value, rotary embeddings on `partial_rotary_factor` of each head, attention
    and MLP in parallel on the block input (use_parallel_residual), multi-head attention,
    an untied head unless tie_word_embeddings. Its MLP always has biases, so attention
    without them (attention_bias false) is a mix the zoo's one `bias` cannot state."""
    if not getattr(config, "attention_bias", True):
        raise HFConfigError(
            "gpt_neox config: field 'attention_bias' is false, but GPT-NeoX's MLP keeps its "
            "biases, and the zoo gives biases to every linear layer or none; Tessel cannot "
            "price that mix: set it to true.")
    return dict(
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=config.intermediate_size, vocab_size=config.vocab_size,
        seq_length=seq, max_position_embeddings=config.max_position_embeddings,
        norm="layernorm", activation="gelu", position_embedding="rope",
        rotary_base=_rope_theta(config), rotary_percent=_rotary_fraction(config),
        parallel_residual=bool(config.use_parallel_residual),
        tie_embeddings=bool(config.tie_word_embeddings), bias=True,
        attention_dropout=_dropout(config), hidden_dropout=0.0,
    )


def _rotary_fraction(config: Any) -> float:
    """The fraction of each head rotary embeddings rotate: `partial_rotary_factor`, in
    `rope_parameters` (transformers 5) or on the config (4); 1 where it states none."""
    parameters = getattr(config, "rope_parameters", None) or {}
    value = parameters.get("partial_rotary_factor") if isinstance(parameters, dict) else None
    value = value if value is not None else getattr(config, "partial_rotary_factor", None)
    return float(value) if isinstance(value, (int, float)) and value else 1.0


def _qwen3(config: Any) -> dict[str, Any]:
    """Qwen3 (dense): per-head RMSNorm of queries and keys (q_norm, k_norm), and a
    sliding window on the layers `layer_types` names (transformers' Qwen3Config derives
    them from use_sliding_window and max_window_layers)."""
    _no_attention_bias(config)
    return dict(qk_layernorm=True, attention_dropout=_dropout(config), hidden_dropout=0.0,
                **_windows(config))


def _qwen3_moe(config: Any) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3's attention and, on the layers transformers makes sparse (not in
    mlp_only_layers, and (i + 1) % decoder_sparse_step == 0: Qwen3MoeDecoderLayer),
    num_experts routed experts of moe_intermediate_size; the dense layers keep
    intermediate_size. norm_topk_prob only rescales the top-k weights: nothing priced.
    use_sliding_window puts the window on every layer (Qwen3MoeAttention)."""
    _no_attention_bias(config)
    layers, step = config.num_hidden_layers, config.decoder_sparse_step
    for name, value in (("decoder_sparse_step", step),
                        ("num_experts_per_tok", config.num_experts_per_tok)):
        # transformers divides the layer index by the step, and routes each token to
        # num_experts_per_tok experts: 0 is no model it builds.
        if not isinstance(value, int) or value < 1:
            raise HFConfigError(f"qwen3_moe config: field {name!r} is {value!r}; it must be "
                                "a whole number from 1.")
    dense = set(config.mlp_only_layers or [])
    pattern = [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
    return dict(qk_layernorm=True, attention_dropout=_dropout(config), hidden_dropout=0.0,
                num_experts=config.num_experts, moe_top_k=config.num_experts_per_tok,
                moe_ffn_hidden_size=config.moe_intermediate_size,
                moe_layer_freq=moe_frequency(pattern),
                window_size=getattr(config, "sliding_window", None) or None)


def _gpt_oss(config: Any) -> dict[str, Any]:
    """GPT-OSS: biases on every linear (q/k/v/o with attention_bias; the experts'
    gate_up_proj_bias and down_proj_bias and the router's bias always: transformers'
    GptOssExperts and GptOssTopKRouter), one learned sink logit per head (`sinks`,
    Megatron-LM's --softmax-type learnable), a sliding window of `sliding_window` on the
    layers `layer_types` calls sliding_attention, and num_local_experts experts of
    intermediate_size. swiglu_alpha / swiglu_limit clamp the activation: same matrices."""
    if not config.attention_bias:
        raise HFConfigError(
            "gpt_oss config: field 'attention_bias' is false, but GPT-OSS's experts and "
            "router keep their biases, which the zoo ties to the attention's; Tessel "
            "cannot price that mix: set it to true.")
    return dict(bias=True, softmax_type="learnable", num_experts=config.num_local_experts,
                moe_top_k=config.num_experts_per_tok, attention_dropout=_dropout(config),
                hidden_dropout=0.0, **_windows(config))


def _deepseek_v3(config: Any) -> dict[str, Any]:
    """DeepSeek-V3 as transformers' DeepseekV3Config states it (arXiv 2412.19437,
    Sec. 2.1): multi-latent attention (q_lora_rank may be None: queries straight from the
    hidden state), first_k_dense_replace dense layers of intermediate_size then MoE
    layers of n_routed_experts experts of moe_intermediate_size plus n_shared_experts
    shared ones (one MLP of n_shared_experts x moe_intermediate_size: DeepseekV3MoE),
    sigmoid router scores (DeepseekV3TopkRouter, whatever the file's scoring_func) limited
    to topk_group of n_group groups, and num_mtp_layers multi-token-prediction layers
    (the released config.json's num_nextn_predict_layers: DeepseekV3Config's
    attribute_map). MLA ignores num_key_value_heads (and head_dim, which transformers
    sets to qk_rope_head_dim). The config's moe_layer_freq,
    topk_method and rope_scaling (YaRN) are not read by transformers' model or change no
    shape."""
    _no_attention_bias(config)
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok"):
        if not isinstance(getattr(config, name, None), int):
            raise HFConfigError(f"deepseek_v3 config: field {name!r} must be a whole "
                                "number; state it in the file.")
    layers, dense = config.num_hidden_layers, config.first_k_dense_replace or 0
    shared = config.n_shared_experts or 0
    groups = config.n_group if config.n_group and config.n_group > 1 else None
    return dict(
        num_query_groups=None, kv_channels=None, multi_latent_attention=True,
        q_lora_rank=config.q_lora_rank, kv_lora_rank=config.kv_lora_rank,
        qk_head_dim=config.qk_nope_head_dim,
        qk_pos_emb_head_dim=config.qk_rope_head_dim, v_head_dim=config.v_head_dim,
        num_experts=config.n_routed_experts, moe_top_k=config.num_experts_per_tok,
        moe_ffn_hidden_size=config.moe_intermediate_size,
        moe_shared_expert_intermediate_size=shared * config.moe_intermediate_size or None,
        moe_layer_freq=moe_frequency([int(i >= dense) for i in range(layers)]),
        moe_router_score_function="sigmoid", moe_router_num_groups=groups,
        moe_router_group_topk=config.topk_group if groups else None,
        mtp_num_layers=getattr(config, "num_mtp_layers", 0) or 0,
        attention_dropout=_dropout(config), hidden_dropout=0.0,
    )


_FAMILY_FIELDS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "llama": _mistral, "mistral": _mistral, "mixtral": _mistral, "qwen2": _qwen2,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss,
    "deepseek_v3": _deepseek_v3, "phi3": _phi3, "gemma2": _gemma2,
}


def _no_attention_bias(config: Any) -> None:
    """Refuse q/k/v/o biases on a family whose MLPs have none: the zoo's `bias` is one
    switch for every linear layer."""
    if getattr(config, "attention_bias", False):
        raise HFConfigError(
            f"{config.model_type} config: field 'attention_bias' is true, but the zoo "
            "gives biases to every linear layer or none, and this family's MLPs have "
            "none; Tessel cannot price that mix: set it to false.")


def _dropout(config: Any) -> float:
    value = getattr(config, "attention_dropout", 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def _windows(config: Any) -> dict[str, Any]:
    """window_size and window_attn_skip_freq from `sliding_window` and `layer_types`
    (sliding_attention windowed, full_attention full; Megatron-LM's list form is 1 for a
    windowed layer)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or []
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise HFConfigError(
            f"{config.model_type} config: field 'layer_types' names {', '.join(unknown)}, "
            "which Tessel does not price (it knows sliding_attention and full_attention).")
    windowed = [int(kind == "sliding_attention") for kind in types]
    if not window or not any(windowed):
        return {}
    return {"window_size": window, "window_attn_skip_freq": window_frequency(windowed)}


def moe_frequency(pattern: list[int]) -> int | list[int]:
    """A 0/1 MoE-layer pattern in Megatron-LM's shortest form (--moe-layer-freq): N when
    layers 0, N, 2N, ... are exactly the MoE ones, else the list."""
    for n in range(1, len(pattern) + 1):
        if pattern == [int(i % n == 0) for i in range(len(pattern))]:
            return n
    return pattern


def window_frequency(windowed: list[int]) -> int | list[int] | None:
    """A 0/1 windowed-layer pattern in Megatron-LM's shortest form
    (--window-attn-skip-freq, `is_layer_window_attention`): None when every layer is
    windowed, N when exactly every N-th layer (from 1) is full, else the list."""
    if all(windowed):
        return None
    for n in range(2, len(windowed) + 1):
        if windowed == [int((i + 1) % n != 0) for i in range(len(windowed))]:
            return n
    return windowed


# The zoo's parameter names -> a Hugging Face model's (transformers' own module names),
# for the families whose parameters correspond one to one, so an hf: plan lists the
# parameters the runtime builds. (Phi-3, GPT-NeoX and GPT-2 fuse q/k/v, so their plans
# keep the zoo's names.)
_LLAMA_ROOT_NAMES = {"embed.": "model.embed_tokens.", "final_norm.": "model.norm."}
_LLAMA_LAYER_NAMES = {".attn_norm.": ".input_layernorm.",
                      ".mlp_norm.": ".post_attention_layernorm.", ".attn.": ".self_attn."}
# Gemma 2's four norms: before and after attention, before and after the MLP.
_GEMMA2_LAYER_NAMES = {".attn_norm.": ".input_layernorm.",
                       ".post_attn_norm.": ".post_attention_layernorm.",
                       ".mlp_norm.": ".pre_feedforward_layernorm.",
                       ".post_mlp_norm.": ".post_feedforward_layernorm.", ".attn.": ".self_attn."}
# (Mixtral's experts are fused in transformers, one gate_up_proj for all: not one to one.)
_LAYER_NAMES = {**{family: _LLAMA_LAYER_NAMES for family in ("llama", "mistral", "qwen2",
                                                             "qwen3")},
                "gemma2": _GEMMA2_LAYER_NAMES}


def parameter_namer(config: Any) -> Callable[[str], str] | None:
    """Maps the zoo's parameter names to the Hugging Face model's for the families whose
    modules correspond one to one (``layers.3.attn.q_proj.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None for other model types."""
    layer_names = _LAYER_NAMES.get(getattr(config, "model_type", None))
    if layer_names is None:
        return None

    def hf_name(name: str) -> str:
        for zoo, hf in _LLAMA_ROOT_NAMES.items():
            if name.startswith(zoo):
                return hf + name.removeprefix(zoo)
        if not name.startswith("layers."):
            return name  # lm_head.weight
        for zoo, hf in layer_names.items():
            if zoo in name:
                return "model." + name.replace(zoo, hf, 1)
        return "model." + name

    return hf_name
