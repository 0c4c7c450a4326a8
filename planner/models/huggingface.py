"""Hugging Face models from a `config.json` on disk, built on the meta device.

`plan hf:path/to/config.json` plans a model the user did not write: transformers builds
the architecture the config names, with every parameter on the meta device, and the model
is called the way `torch.export` can trace (no KV cache, plain tensor outputs, SDPA
attention). Nothing is downloaded: the config file is all that is read.

A config.json is data, never code: its `auto_map` (the hook transformers uses to import
Python files that ship beside a config) and every other field that points at custom code
are dropped before the config is built, transformers is never allowed to run remote code,
and "architectures" resolves only to model classes defined in transformers itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = [
    "HFConfigError",
    "LogitsOnly",
    "build_hf_model",
    "default_seq_length",
    "hf_num_layers",
    "load_hf_config",
    "masked_token_loss",
    "next_token_loss",
]

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


def _without_code_fields(value: Any) -> Any:
    """`value` (a config's fields, nested sub-configs included) without _CODE_FIELDS."""
    if isinstance(value, dict):
        return {
            key: _without_code_fields(item)
            for key, item in value.items()
            if key not in _CODE_FIELDS
        }
    if isinstance(value, list):
        return [_without_code_fields(item) for item in value]
    return value


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LogitsOnly(nn.Module):
    """Call a Hugging Face model the way `torch.export` can trace it, returning its first
    output (logits for language-model heads, hidden states for a bare encoder)."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf_model = hf_model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf_model(input_ids, use_cache=False, return_dict=False)[0]


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Causal LM cross-entropy: position ``t`` predicts token ``t + 1``."""
    vocab = logits.shape[-1]
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1)
    )


def masked_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Masked-LM cross-entropy over every position (the cost of a masked-LM step does not
    depend on which 15% of the tokens are masked)."""
    vocab = logits.shape[-1]
    return nn.functional.cross_entropy(logits.reshape(-1, vocab), input_ids.reshape(-1))


def load_hf_config(path: str | Path) -> Any:
    """The transformers config in `path` (a config.json, or a directory holding one)."""
    from transformers import AutoConfig

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
    fields = _without_code_fields(fields)
    model_type = fields.pop("model_type")
    if not isinstance(model_type, str):
        raise HFConfigError(
            f"{file}: \"model_type\" must be a string naming the architecture (e.g. "
            f"\"llama\"), not {_one_line(repr(model_type), 60)}."
        )
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as error:
        if model_type not in _known_model_types():
            raise HFConfigError(
                f"{file}: model_type {model_type!r} is not one this transformers version "
                f"knows ({_one_line(str(error).splitlines()[0], 120)}); upgrade "
                "transformers or fix model_type."
            ) from None
        raise _field_error(file, error) from None
    except Exception as error:  # noqa: BLE001 - transformers and huggingface_hub validate
        # in many ways (strict-dataclass errors in transformers 5 are no ValueError).
        raise _field_error(file, error) from None


def _known_model_types() -> set[str]:
    from transformers import CONFIG_MAPPING

    return set(CONFIG_MAPPING.keys())


def _field_error(file: Path, error: Exception) -> HFConfigError:
    """One line naming `file` and, where transformers says which, the field it rejected."""
    text = str(error)
    found = re.search(r"field '([^']+)'", text)
    # huggingface_hub's strict-dataclass errors wrap the validator's own error.
    wrapped = type(error).__module__.startswith("huggingface_hub") and error.__cause__
    cause = error.__cause__ if wrapped else error
    reason = _one_line(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__)
    if found:
        return HFConfigError(
            f"{file}: field {found.group(1)!r} is invalid ({reason}); fix it in the file."
        )
    return HFConfigError(f"{file} has a field transformers cannot use ({reason}); fix the file.")


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


def build_hf_model(
    config: Any, num_layers: int | None = None
) -> tuple[nn.Module, Callable[..., torch.Tensor] | None]:
    """The model `config` describes (optionally with `num_layers` blocks), wrapped for
    tracing, and the loss its head trains with."""
    import transformers

    config = config.__class__.from_dict(_without_code_fields(config.to_dict()))
    config.use_cache = False
    config._attn_implementation = "sdpa"
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:num_layers]
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                 "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    architecture = _architecture(config, transformers)
    with torch.device("meta"):
        # A concrete transformers class: nothing here can import code from outside the
        # package (Auto*.from_config, the one call that can, is never made).
        model = architecture._from_config(config)
    name = type(model).__name__
    loss = next_token_loss if name.endswith("ForCausalLM") or name.endswith("LMHeadModel") else (
        masked_token_loss if name.endswith("ForMaskedLM") else None
    )
    return LogitsOnly(model), loss


def _architecture(config: Any, transformers: Any) -> Any:
    """The model class to build `config` with: one of transformers' own classes, never
    one that a config's auto_map or a name outside transformers points at.

    "architectures" names are used when they name a concrete model class defined in the
    transformers package (not an `Auto*` factory, whose `from_config` is where remote code
    is loaded from) built for this config's class. Other names are ignored rather than
    refused: Hub configs often name a custom class there while their model_type is one
    transformers implements, and that implementation is the model to plan. Without a
    usable name, the masked LM, causal LM or bare model registered for the model_type is
    taken (masked first: encoders such as BERT also register a causal head, which they
    are not trained with). Neither found: HFConfigError.
    """
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if _is_own_model_class(cls, transformers) and isinstance(
            config, getattr(cls, "config_class", None) or ()
        ):
            return cls
    for auto in ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"):
        mapping = getattr(transformers, auto)._model_mapping
        if type(config) not in mapping:
            continue
        registered = mapping[type(config)]
        for cls in registered if isinstance(registered, (list, tuple)) else [registered]:
            if _is_own_model_class(cls, transformers):
                return cls
    raise HFConfigError(
        f"transformers has no model class of its own for model_type {config.model_type!r}; "
        "name one of its classes in the config's \"architectures\" field (Tessel never "
        "runs code that ships with a config)."
    )


def _is_own_model_class(cls: Any, transformers: Any) -> bool:
    """Whether `cls` is a concrete model class defined inside the transformers package."""
    return (
        isinstance(cls, type)
        and issubclass(cls, transformers.PreTrainedModel)
        and not cls.__name__.startswith("Auto")
        and (cls.__module__ == "transformers" or cls.__module__.startswith("transformers."))
    )


def _rope_theta(config: Any) -> int:
    """Rotary base: `rope_theta` (transformers 4) or `rope_parameters["rope_theta"]` (5)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    theta = getattr(config, "rope_theta", None) or parameters.get("rope_theta") or 10000
    return int(theta)


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
