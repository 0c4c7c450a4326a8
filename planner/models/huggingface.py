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

import re
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from planner.models.hf_shape import (
    HFConfigError,
    one_line,
    read_config_fields,
    without_code_fields,
)

__all__ = [
    "HFConfigError",
    "LogitsOnly",
    "build_hf_model",
    "load_hf_config",
    "masked_token_loss",
    "next_token_loss",
]


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

    file, fields = read_config_fields(path)
    model_type = fields.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except ValueError as error:
        if model_type not in _known_model_types():
            raise HFConfigError(
                f"{file}: model_type {model_type!r} is not one this transformers version "
                f"knows ({one_line(str(error).splitlines()[0], 120)}); upgrade "
                "transformers or fix model_type."
            ) from None
        raise _field_error(file, error) from None
    except Exception as error:  # noqa: BLE001 - transformers and huggingface_hub validate
        # in many ways (strict-dataclass errors in transformers 5 are no ValueError).
        raise _field_error(file, error) from None
    _refuse_unstated_size(file, model_type, fields, config)
    _refuse_unbounded_size(file, config)
    return config


# Fields that size a model, each a whole number from 1 up to the most its Megatron-LM flag
# takes (`planner.models.flags.VALUE_FLAGS`, by the zoo field it becomes): beyond that no
# plan is meaningful, and a planner handed 10**30 layers would build a list of them.
_BOUNDED_FIELDS = {
    "num_hidden_layers": "--num-layers", "n_layer": "--num-layers",
    "hidden_size": "--hidden-size", "n_embd": "--hidden-size",
    "num_attention_heads": "--num-attention-heads", "n_head": "--num-attention-heads",
    "num_key_value_heads": "--num-query-groups", "intermediate_size": "--ffn-hidden-size",
    "n_inner": "--ffn-hidden-size", "vocab_size": "--vocab-size",
    "max_position_embeddings": "--max-position-embeddings", "n_positions":
    "--max-position-embeddings", "head_dim": "--kv-channels",
    "num_local_experts": "--num-experts", "num_experts": "--num-experts",
    "n_routed_experts": "--num-experts", "num_experts_per_tok": "--moe-router-topk",
    "moe_intermediate_size": "--moe-ffn-hidden-size", "q_lora_rank": "--q-lora-rank",
    "kv_lora_rank": "--kv-lora-rank", "qk_nope_head_dim": "--qk-head-dim",
    "qk_rope_head_dim": "--qk-pos-emb-head-dim", "v_head_dim": "--v-head-dim",
}


def _refuse_unbounded_size(file: Path, config: Any) -> None:
    """HFConfigError, in one line naming the field, for a size field (`_BOUNDED_FIELDS`)
    that is not a whole number from 1 to its flag's most; absent or null fields are the
    family's to default."""
    from planner.models.flags import VALUE_FLAGS

    for name, flag in _BOUNDED_FIELDS.items():
        value = config.__dict__.get(name)
        if value is None:
            continue
        most = VALUE_FLAGS[flag][1]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            shown = one_line(repr(value), 40)
            raise HFConfigError(f"{file}: field {name!r} is {shown}; it must be a whole "
                                f"number from 1 to {most:,} (the most {flag} takes).")


# The fields that size a model: left out, transformers' defaults (a model of its own
# choosing) would be planned without a word.
_SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def _refuse_unstated_size(file: Path, model_type: str, fields: dict[str, Any],
                          config: Any) -> None:
    """HFConfigError, in one line naming them, where `fields` leave a size field of the
    config to transformers' default (under its own name or the one the family's
    attribute_map gives it: GPT-2's n_layer). Configs made of sub-configs (a text_config
    and a vision_config) state their sizes there and are left to transformers."""
    if getattr(config, "sub_configs", None):
        return
    aliases = getattr(type(config), "attribute_map", {}) or {}
    missing = [name for name in _SIZE_FIELDS if hasattr(config, name)
               and name not in fields and aliases.get(name) not in fields]
    if missing:
        raise HFConfigError(
            f"{file} states no {', '.join(missing)} (model_type {model_type!r}), so "
            "transformers would plan a model of its own default size; state them in the "
            "file.")


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
    reason = one_line(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__)
    if found:
        return HFConfigError(
            f"{file}: field {found.group(1)!r} is invalid ({reason}); fix it in the file."
        )
    return HFConfigError(f"{file} has a field transformers cannot use ({reason}); fix the file.")


def build_hf_model(
    config: Any, num_layers: int | None = None, device: str = "meta",
) -> tuple[nn.Module, Callable[..., torch.Tensor] | None]:
    """The model `config` describes (optionally with `num_layers` blocks), wrapped for
    tracing, and the loss its head trains with; built on `device` (meta: nothing
    allocated)."""
    import transformers

    config = config.__class__.from_dict(without_code_fields(config.to_dict()))
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
    if not getattr(architecture, "_supports_sdpa", True):
        # GPT-OSS's attention sinks have no SDPA path in transformers: its eager attention.
        config._attn_implementation = "eager"
    with torch.device(device):
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
