"""Hugging Face models from a `config.json` on disk, built on the meta device.

`plan hf:path/to/config.json` plans a model the user did not write: transformers builds
the architecture the config names, with every parameter on the meta device, and the model
is called the way `torch.export` can trace (no KV cache, plain tensor outputs, SDPA
attention). Nothing is downloaded: the config file is all that is read.
"""

from __future__ import annotations

import json
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
    model_type = fields.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as error:
        raise HFConfigError(
            f"{file}: model_type {model_type!r} is not one this transformers version "
            f"knows ({str(error).splitlines()[0][:120]}); upgrade transformers or fix "
            "model_type."
        ) from None
    except (TypeError, AttributeError) as error:
        raise HFConfigError(f"{file} has a field transformers cannot use: {error}.") from None


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

    config = config.__class__.from_dict(config.to_dict())
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
        if architecture.__name__.startswith("Auto"):
            model = architecture.from_config(config)
        else:
            model = architecture._from_config(config)
    name = type(model).__name__
    loss = next_token_loss if name.endswith("ForCausalLM") or name.endswith("LMHeadModel") else (
        masked_token_loss if name.endswith("ForMaskedLM") else None
    )
    return LogitsOnly(model), loss


def _architecture(config: Any, transformers: Any) -> Any:
    """The class the config names in "architectures", else the masked LM, causal LM or
    bare model registered for its model_type (masked first: encoders such as BERT also
    register a causal head, which they are not trained with)."""
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    for auto in ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"):
        auto_cls = getattr(transformers, auto)
        if type(config) in auto_cls._model_mapping:
            return auto_cls
    raise HFConfigError(
        f"transformers has no model class for model_type {config.model_type!r}; "
        "name one in the config's \"architectures\" field."
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
