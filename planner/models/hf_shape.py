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

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

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
    if not file.is_file():
        raise HFConfigError(
            f"Hugging Face config {str(path)!r} does not exist; give the path of a "
            "config.json file or of the directory that holds it."
        )
    try:
        fields = json.loads(file.read_text())
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
    config = SimpleNamespace(**fields)
    if fields["hidden_size"] % fields["num_attention_heads"] or _stated_rope_theta(config) is None:
        return None
    return config


def hf_num_layers(config: Any) -> int | None:
    """Number of repeated blocks, when every block is built alike (else None)."""
    layers = getattr(config, "num_hidden_layers", None)
    layer_types = getattr(config, "layer_types", None)
    if not isinstance(layers, int) or (layer_types and len(set(layer_types)) > 1):
        return None
    return layers


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


# Decoder families whose config maps onto the zoo's TransformerConfig (Llama's layout).
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "mixtral"}


def to_transformer_config(config: Any, seq_length: int | None = None) -> Any:
    """The zoo shape of a Hugging Face decoder, for training plans (which price layers
    by their shape, not their traced graph)."""
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
    if config.model_type not in _LLAMA_LIKE:
        raise HFConfigError(
            f"training plans know the shapes of {', '.join(sorted(_LLAMA_LIKE | {'gpt2'}))} "
            f"configs, not model_type {config.model_type!r}; describe it with a zoo family "
            "(gpt/llama/mixtral) and its shape flags."
        )
    experts = getattr(config, "num_local_experts", None)
    return TransformerConfig(
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=getattr(config, "num_key_value_heads", None),
        ffn_hidden_size=config.intermediate_size, vocab_size=config.vocab_size,
        seq_length=seq, max_position_embeddings=config.max_position_embeddings,
        norm="rmsnorm", activation="swiglu", position_embedding="rope",
        rotary_base=_rope_theta(config),
        tie_embeddings=bool(config.tie_word_embeddings), bias=False,
        num_experts=experts, moe_top_k=getattr(config, "num_experts_per_tok", 2) or 2,
    )


# The zoo's parameter names -> a Llama-family Hugging Face model's (transformers' own
# module names), so an hf: plan lists the parameters the runtime builds.
_LLAMA_ROOT_NAMES = {"embed.": "model.embed_tokens.", "final_norm.": "model.norm."}
_LLAMA_LAYER_NAMES = {".attn_norm.": ".input_layernorm.",
                      ".mlp_norm.": ".post_attention_layernorm.", ".attn.": ".self_attn."}


def parameter_namer(config: Any) -> Callable[[str], str] | None:
    """Maps the zoo's parameter names to the Hugging Face model's for the Llama family,
    whose modules correspond one to one (``layers.3.attn.q_proj.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None for other model types."""
    if getattr(config, "model_type", None) not in _LLAMA_LIKE:
        return None

    def hf_name(name: str) -> str:
        for zoo, hf in _LLAMA_ROOT_NAMES.items():
            if name.startswith(zoo):
                return hf + name.removeprefix(zoo)
        if not name.startswith("layers."):
            return name  # lm_head.weight
        for zoo, hf in _LLAMA_LAYER_NAMES.items():
            name = name.replace(zoo, hf, 1)
        return "model." + name

    return hf_name
