"""One rank's pipeline stages of a Hugging Face decoder, built from the real transformers
modules on the meta device.

A stage (`HFStageModule`) holds decoder layers [first, last) as transformers' own
``XxxDecoderLayer(config, layer_idx)`` (GPT-NeoX's ``GPTNeoXLayer``) under their full-model
names (``model.layers.3.self_attn.q_proj.weight``, ``gpt_neox.layers.3.attention.
query_key_value.weight``), the token embedding on the first chunk and the final norm and
LM head on the last, so names and values are those of ``XxxForCausalLM``; no rank ever
builds the whole model. Which module is the embedding, the final norm, the rotary table
and the head is read off the causal LM itself (`Anatomy`: a one-layer build on the meta
device), not from a table per family. Values come from `runtime.stages.init_parameter`
(keyed by name), shard by shard, as for the zoo model.

The stage does what the family's ``XxxModel.forward`` does around its layers: rotary
position embeddings of the whole sequence, the attention mask of each layer's type
(``layer_types``: full or sliding-window, as transformers' masking utilities build
them), the final norm and, where the config says so, the final logits' soft-capping
(Gemma 2). Embedding scaling lives in the embedding module (Gemma 2's scaled embedding).

Attention is torch's SDPA through transformers' own ``sdpa_attention_forward``, registered
under `ATTENTION` with the masks SDPA takes (no mask at all where plain causal will do:
``is_causal``); a layer that soft-caps its attention logits (Gemma 2) runs its family's
own eager attention, which does, on the same masks. Selective recomputation checkpoints
just that attention core.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import CONFIG_MAPPING, AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    AttentionMaskInterface,
    create_causal_mask,
    create_sliding_window_causal_mask,
    sdpa_mask,
)

from planner.models.hf_shape import without_code_fields
from runtime.hf.experts import zero_router_biases
from runtime.parallelize import apply_recompute
from runtime.stages import init_parameter, materialize, tied_head

ATTENTION = "tessel_attention"
"""The attention implementation stages run (`_attention`; no "sdpa" in its name, which
transformers would check the model class against: Gemma 2 declares no SDPA support)."""

# Decoder families run here against the single-process model, through their own modules:
# the Llama layout (Llama, Mistral's sliding window, Qwen2's q/k/v biases, Qwen3's QK
# norms), Phi-3 (fused qkv_proj and gate_up_proj), Gemma 2 (sandwich norms, soft-capping,
# alternating windows, scaled embedding, tied head), GPT-NeoX (fused per-head
# query_key_value, parallel residual, partial rotary, LayerNorm with bias, GELU), GPT-2
# (Conv1D layers, learned positions, tied head), and the
# mixtures of experts Mixtral and Qwen3-MoE (fused experts behind a top-k router) and
# DeepSeek-V3 (multi-latent attention, dense layers first, shared and routed experts; no
# MTP in transformers).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt_neox", "gpt2",
             "mixtral", "qwen3_moe", "deepseek_v3")
MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v3")

# Every dropout field these families' configs have, and Mixtral's router jitter (noise
# on the router's input in training): every rank must compute what one process does.
_DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop",
             "attn_pdrop", "router_jitter_noise")


class Probed(Exception):
    """Raised by the attention core to end a probe of the module's q, k and v
    (`runtime.hf.layout.fused_qkv_layout`) once it has them."""


def _attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, or the family's eager attention where the layer
    soft-caps its logits (which SDPA cannot); under selective recomputation (the
    module's ``recompute_core``) only softmax(QK^T)V is checkpointed, as Megatron does.
    A module being probed (``tessel_probe``) hands over its q, k, v and stops there."""
    probe = getattr(module, "tessel_probe", None)
    if probe is not None:
        probe.append((query, key, value))
        raise Probed
    core = sdpa_attention_forward
    if kwargs.get("softcap") is not None:
        core = importlib.import_module(type(module).__module__).eager_attention_forward
        attention_mask = _additive_mask(attention_mask, query, key)
    if getattr(module, "recompute_core", False) and torch.is_grad_enabled():
        return checkpoint(core, module, query, key, value, attention_mask,
                          use_reentrant=False, **kwargs)
    return core(module, query, key, value, attention_mask, **kwargs)


def _additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor):
    """The boolean mask SDPA takes (None: plain causal) as the additive one eager
    attention adds to its scores."""
    q, k = query.shape[-2], key.shape[-2]
    if mask is None:
        mask = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)
    blocked = torch.finfo(query.dtype).min
    return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
        ~mask, blocked)


AttentionInterface.register(ATTENTION, _attention)
# The masks SDPA takes (None where plain causal will do), for every layer type.
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def hf_config_from_dict(fields: dict[str, Any]) -> Any:
    """The transformers config of `fields` (a config's ``to_dict()``), rebuilt with the
    concrete config class of its model_type (never Auto* with remote code), set up for
    training here: no KV cache, `ATTENTION`, dropout off (every rank must compute what
    one process does). ValueError, naming what runs, for a family not run here."""
    # Without the fields that point transformers at code outside its package or pick an
    # attention kernel (the planner's own filter).
    fields = without_code_fields(fields)
    refuse_unsupported(fields.get("model_type"))
    config = CONFIG_MAPPING[fields["model_type"]].from_dict(fields)
    config.use_cache = False
    config._attn_implementation = ATTENTION
    for name in _DROPOUTS:
        if isinstance(getattr(config, name, None), (int, float)):
            setattr(config, name, 0.0)
    return config


def refuse_unsupported(model_type: Any) -> None:
    """ValueError, in one line naming `model_type` and the families that run, unless the
    runtime trains that family."""
    if model_type not in SUPPORTED:
        raise ValueError(
            f"the runtime trains Hugging Face decoders of model_type {', '.join(SUPPORTED)}; "
            f"not {model_type!r}: plan it without training it (plan, not plan check), or "
            "describe it with a zoo family and its shape flags"
        )


def causal_lm_class(config: Any) -> type:
    """The family's causal LM class (``XxxForCausalLM``, GPT-2's ``GPT2LMHeadModel``),
    from transformers' own registry of the config's class."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


@dataclass
class Anatomy:
    """Where a causal LM keeps the parts a stage holds, as its own modules name them, and
    meta templates of the parts outside the layers (copied into each stage)."""

    trunk: str
    """The base model's attribute in the causal LM (``model``, ``gpt_neox``)."""
    embedding: str
    """The token embedding's name in the trunk (``embed_tokens``, ``embed_in``)."""
    layers: str
    """The decoder layers' ModuleList in the trunk (``layers``)."""
    final_norm: str
    """The final norm's name in the trunk (``norm``, ``final_layer_norm``, ``ln_f``)."""
    rotary: str | None
    """The rotary table's name in the trunk (``rotary_emb``), or None."""
    positions: str | None
    """The learned position table's name in the trunk (GPT-2's ``wpe``), or None."""
    head: str
    """The LM head's name in the causal LM (``lm_head``)."""
    layer_class: type
    """The decoder layer's class, built as ``layer_class(config, layer_idx)``."""
    templates: dict[str, nn.Module]
    """embedding, final_norm, head, and rotary or positions: meta modules built with the
    config."""


def anatomy(config: Any) -> Anatomy:
    """The causal LM's parts, read off a one-layer build of it on the meta device: the
    trunk is its base model, the embedding and head what it reports as its input and
    output embeddings, the layers its one ModuleList, the rotary table its child with an
    ``inv_freq``, a learned position table its other embedding, the final norm the one
    other child with parameters. ValueError where positions are neither one rotary table
    nor one learned table, or the trunk holds parameters elsewhere too."""
    shallow = copy.deepcopy(config)
    shallow.num_hidden_layers = 1
    if getattr(shallow, "layer_types", None):
        shallow.layer_types = shallow.layer_types[:1]
    with torch.device("meta"):
        full = causal_lm_class(config)(shallow)
    trunk_name = full.base_model_prefix
    trunk = getattr(full, trunk_name)
    children = dict(trunk.named_children())
    embedding = next(n for n, m in children.items() if m is full.get_input_embeddings())
    layers = next(n for n, m in children.items() if isinstance(m, nn.ModuleList))
    rotary = [n for n, m in children.items() if hasattr(m, "inv_freq")]
    positions = [n for n, m in children.items()
                 if isinstance(m, nn.Embedding) and n != embedding]
    rest = [n for n, m in children.items() if n not in (embedding, layers, *rotary, *positions)
            and any(True for _ in m.parameters())]
    head = next(n for n, m in full.named_children() if m is full.get_output_embeddings())
    if len(rotary) + len(positions) != 1 or len(rest) != 1:
        raise ValueError(
            f"a Hugging Face {config.model_type} model keeps "
            f"{', '.join(rest + rotary + positions) or 'nothing'} beside its embedding and "
            "layers (a stage runs models with one rotary or learned position table and one "
            "final norm)")
    position = (rotary or positions)[0]
    return Anatomy(
        trunk=trunk_name, embedding=embedding, layers=layers, final_norm=rest[0],
        rotary=rotary[0] if rotary else None, positions=positions[0] if positions else None,
        head=head, layer_class=type(getattr(trunk, layers)[0]),
        templates={"embedding": children[embedding], "final_norm": children[rest[0]],
                   "positions": children[position], "head": getattr(full, head)})


def layer_types(config: Any) -> list[str]:
    """Each layer's attention type as the family's model builds its masks: its
    ``layer_types``, else a sliding window on every layer where the config has one
    (Mistral, Phi-3), else full attention."""
    stated = getattr(config, "layer_types", None)
    if stated:
        return list(stated)
    window = getattr(config, "sliding_window", None)
    kind = "sliding_attention" if window else "full_attention"
    return [kind] * config.num_hidden_layers


class _Trunk(nn.Module):
    """The base-model part of a stage (``model.``, ``gpt_neox.``), limited to the stage."""


class HFStageModule(nn.Module):
    """Decoder layers [first, last) of a Hugging Face causal LM, plus the token embedding
    if `first_stage` and the final norm and LM head if `last_stage`. Input: token ids
    (first stage) or hidden states; output: hidden states or logits (last stage).

    Every stage holds its own rotary table (buffers only) and computes the position
    embeddings and masks of the whole sequence from it, as the base model does once.
    With tied word embeddings a last stage that is not also the first holds its own copy
    of the embedding and uses its weight as the head (Megatron's way, as the zoo stages
    do); the trainer keeps the two copies equal.
    """

    def __init__(
        self, config: Any, layers: tuple[int, int], first_stage: bool, last_stage: bool,
    ) -> None:
        super().__init__()
        parts = anatomy(config)
        self.anatomy = parts
        self.hf_config = config
        self.layer_range = layers
        self.first_stage, self.last_stage = first_stage, last_stage
        self.tie_embeddings = bool(config.tie_word_embeddings)
        self.layer_types = layer_types(config)
        trunk = _Trunk()
        setattr(self, parts.trunk, trunk)
        if first_stage or (last_stage and self.tie_embeddings):
            setattr(trunk, parts.embedding, copy.deepcopy(parts.templates["embedding"]))
        # A ModuleDict keyed by the global layer index: full-model names, and per-block
        # FSDP and recomputation find the blocks as they do in the zoo stages.
        setattr(trunk, parts.layers, nn.ModuleDict({
            str(i): parts.layer_class(config, i) for i in range(*layers)}))
        if last_stage:
            setattr(trunk, parts.final_norm, copy.deepcopy(parts.templates["final_norm"]))
            if not self.tie_embeddings:
                setattr(self, parts.head, copy.deepcopy(parts.templates["head"]))
        if parts.rotary is not None:  # every stage computes the rotary tables
            setattr(trunk, parts.rotary, copy.deepcopy(parts.templates["positions"]))
        elif first_stage:  # a learned table is added to the token embedding
            setattr(trunk, parts.positions, copy.deepcopy(parts.templates["positions"]))
        # Set by tensor parallelism with sequence parallelism: the hidden states between
        # blocks are 1/tp of the sequence, and the embeddings are scattered to that.
        self.sequence_shards = 1
        self.scatter_sequence: nn.Module | None = None
        # Set by tensor parallelism: layout of the tied head's input.
        self.head_input_layout = None
        # Set by tensor parallelism: the norms inside the attention, run on the rank's
        # heads, whose gradients sum over the tensor ranks (`runtime.hf.tensor_parallel.
        # reduce_head_norm_gradients`). A plain list: they stay registered where they are.
        self.head_norms: list[nn.Module] = []

    @property
    def trunk(self) -> nn.Module:
        """The base-model part (``model``, ``gpt_neox``)."""
        return getattr(self, self.anatomy.trunk)

    @property
    def layers(self) -> nn.ModuleDict:
        """The stage's decoder layers by global index (``model.layers``)."""
        return getattr(self.trunk, self.anatomy.layers)

    @property
    def embed(self) -> nn.Embedding | None:
        """The token embedding, where this stage holds one (what the trainer's tied-
        embedding gradient sum reads)."""
        return getattr(self.trunk, self.anatomy.embedding, None)

    @property
    def final_norm(self) -> nn.Module | None:
        return getattr(self.trunk, self.anatomy.final_norm, None)

    @property
    def head(self) -> nn.Module | None:
        """The untied LM head, on the last stage."""
        return getattr(self, self.anatomy.head, None)

    @property
    def rotary(self) -> nn.Module | None:
        """The rotary table, for a family with rotary positions."""
        return getattr(self.trunk, self.anatomy.rotary) if self.anatomy.rotary else None

    def reset_buffers(self) -> None:
        """Non-persistent buffers, which `to_empty` leaves uninitialized: `reset_buffers`."""
        reset_buffers(self, self.hf_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1] * (1 if self.first_stage else self.sequence_shards)
        positions = torch.arange(length, device=x.device).unsqueeze(0)
        if self.first_stage:
            x = self.embed(x)
            if self.anatomy.positions is not None:
                x = x + getattr(self.trunk, self.anatomy.positions)(positions)
            if self.scatter_sequence is not None:
                x = self.scatter_sequence(x)
        # Attention runs on the whole sequence (gathered under sequence parallelism).
        extra = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(x, positions)
        masks = self._masks(x, length)
        for index, layer in self.layers.items():
            x = layer(x, attention_mask=masks[self.layer_types[int(index)]], **extra)
        if not self.last_stage:
            return x
        x = self.final_norm(x)
        if self.tie_embeddings:
            logits = tied_head(x, self.embed.weight, self.head_input_layout)
        else:
            logits = self.head(x)
        return soft_capped(logits, self.hf_config)

    def _masks(self, x: torch.Tensor, length: int) -> dict[str, torch.Tensor | None]:
        """Each layer type's attention mask over the whole sequence, as the base model
        builds it (None: plain causal)."""
        shape = torch.empty(x.shape[0], length, 0, dtype=torch.float32, device=x.device)
        arguments = {"config": self.hf_config, "inputs_embeds": shape, "attention_mask": None,
                     "cache": None, "position_ids": None}
        masks: dict[str, torch.Tensor | None] = {}
        for kind in set(self.layer_types):
            build = create_sliding_window_causal_mask if kind == "sliding_attention" \
                else create_causal_mask
            masks[kind] = build(**arguments)
        return masks


def soft_capped(logits: torch.Tensor, config: Any) -> torch.Tensor:
    """The logits soft-capped as the family's causal LM does (Gemma 2's
    ``final_logit_softcapping``: cap x tanh(logits / cap)); unchanged without a cap."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def reset_buffers(module: nn.Module, config: Any) -> None:
    """Recompute what `to_empty` leaves uninitialized: the rotary tables (non-persistent
    buffers) from the config, a scaled embedding's scale (Gemma 2), DeepSeek-V3's router
    biases (zero)."""
    with torch.no_grad():
        for sub in module.modules():
            if hasattr(sub, "inv_freq"):
                fresh = type(sub)(config=config)
                for name, buffer in sub.named_buffers(recurse=False):
                    buffer.copy_(fresh.get_buffer(name))
            if hasattr(sub, "scalar_embed_scale"):
                sub.embed_scale.fill_(sub.scalar_embed_scale)
    zero_router_biases(module)


def build_hf_stage(
    config: Any, layers: tuple[int, int], first_stage: bool, last_stage: bool,
) -> HFStageModule:
    """The stage on the meta device: no parameter memory."""
    with torch.device("meta"):
        return HFStageModule(config, layers, first_stage, last_stage)


def materialize_hf_stage(stage: HFStageModule, seed: int) -> None:
    """`runtime.stages.materialize` (each rank's shards of every parameter), then the
    buffers."""
    materialize(stage, seed)
    stage.reset_buffers()


def attention_modules(block: nn.Module) -> list[nn.Module]:
    """A decoder layer's attention modules: those whose class transformers names
    ``...Attention`` (what calls `ATTENTION`)."""
    return [m for m in block.modules() if type(m).__name__.endswith("Attention")]


def apply_hf_recompute(stage: HFStageModule, recompute: str) -> None:
    """Full: checkpoint every decoder layer; selective: only each attention core."""
    if recompute == "selective":
        for block in stage.layers.values():
            for attention in attention_modules(block):
                attention.recompute_core = True
    else:
        apply_recompute(stage, recompute)


def build_hf_reference(config: Any, seed: int) -> nn.Module:
    """The whole model (transformers' ``XxxForCausalLM``) in one process with the values
    the stages get, under its own parameter names; `hf_logits` calls it."""
    with torch.device("meta"):
        model = causal_lm_class(config)(config)
    model.to_empty(device="cpu")
    if config.tie_word_embeddings:  # after to_empty, which gives each name its own tensor
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(init_parameter(name, param.shape, seed))
    reset_buffers(model, config)
    model.train()
    return model


def hf_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of a transformers causal LM on `tokens` (no cache, no mask: causal)."""
    return model(tokens, use_cache=False).logits
