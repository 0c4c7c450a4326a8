"""Every parameter of a training plan's pipeline chunk: its full-model name, shape, how
tensor parallelism splits it, and so its placement and its bytes on one rank.

The zoo transformer (`planner.models.transformer`) in Megatron-LM's tensor-parallel layout,
as the runtime (`runtime/parallelize.py`) places it: q, k, v, fc1 (gate, up) and the LM
head column-parallel (dim 0 split, biases too), o_proj and fc2 (down) row-parallel (dim 1
split, bias replicated), the token embedding split over the vocabulary (dim 0), norms,
router and learned positions replicated. Multi-latent attention as Megatron-Core splits it:
the down projections to the query and key/value latents (and the latents' norms)
replicated, the up projections column-parallel by heads, the output projection row-
parallel; attention sinks split by heads; a shared expert as a dense MLP. Multi-token-
prediction layers sit on the last chunk (``mtp.K.``: norms replicated, eh_proj column-
parallel, a block as above), each its own ZeRO unit. Data parallelism with ZeRO 1-3 (FSDP2) then
shards dim 0 of each rank's tensor-parallel piece over the data-parallel ranks (and the
context-parallel ones, which see other tokens), padding dim 0 to a multiple of them; a
dim already split by tensor parallelism is split again, which DTensor writes as a strided
shard (`_S(0,t)`). ZeRO-0 keeps parameters whole on every data-parallel rank. Experts
under expert parallelism are left out of ZeRO: each lives on one rank of its expert group.

A frozen parameter (the base under LoRA and QLoRA, `cost_models.finetuned_parameters`)
holds no gradient and no optimizer state, and may be stored in fewer bytes (QLoRA's NF4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.identity_memo import IdentityMemo
from cost_models.memory import StateElementBytes
from planner.models.config import LayerKind, TransformerConfig


@dataclass(frozen=True)
class ParameterLayout:
    """One parameter of a pipeline chunk."""

    name: str
    """Full-model name, e.g. ``layers.3.attn.q_proj.weight``."""
    shape: tuple[int, ...]
    tensor_dim: int | None
    """The dim tensor parallelism splits, or None (replicated over the tensor group)."""
    group: str
    """The ZeRO group (FSDP2 unit) it belongs to: ``layers.N`` or ``root`` (embeddings,
    final norm, head)."""
    expert: int | None = None
    """The expert index, for an expert's parameter."""
    frozen: bool = False
    """Not trained (the base under LoRA): no gradient, no optimizer state."""
    element_bytes: float | None = None
    """Bytes an element is stored in where not the training precision's (QLoRA's NF4
    base, `cost_models.adapters.NF4_BYTES`)."""


_CHUNKS: IdentityMemo[list[ParameterLayout]] = IdentityMemo(1024)
"""`chunk_parameters` by model, layers and ends: a search's top plans list the same chunks
(DeepSeek-V3's hold 45,000 parameters)."""


def chunk_parameters(
    model: TransformerConfig, layers: tuple[int, int], first: bool, last: bool
) -> list[ParameterLayout]:
    """`_chunk_parameters`, listed once per chunk of a model."""
    return list(_CHUNKS.get((model,), (tuple(layers), first, last),
                            lambda: _chunk_parameters(model, layers, first, last)))


def _chunk_parameters(
    model: TransformerConfig, layers: tuple[int, int], first: bool, last: bool
) -> list[ParameterLayout]:
    """The parameters of the chunk holding `layers`, with the embeddings if it is the
    `first` chunk and the final norm, head and multi-token-prediction layers if it is the
    `last` (a copy of the token embedding when the chunk is last but not first and a tied
    head or the MTP layers read it, as Megatron keeps)."""
    h, v = model.hidden_size, model.vocab_size
    out: list[ParameterLayout] = []
    if first or (last and (model.tie_embeddings or model.mtp_num_layers)):
        out.append(ParameterLayout("embed.weight", (v, h), 0, "root"))
    if first and model.position_embedding == "learned":
        out.append(ParameterLayout("pos_embed.weight", (model.max_position_embeddings, h),
                                   None, "root"))
    kinds = model.layer_kinds()
    for index in range(*layers):
        out += _layer(model, f"layers.{index}", kinds[index])
    if last:
        out += _norm(model, "final_norm", "root")
        if not model.tie_embeddings:
            out.append(ParameterLayout("lm_head.weight", (v, h), 0, "root"))
        for k in range(model.mtp_num_layers):
            group = f"mtp.{k}"
            out += _norm(model, group + ".enorm", group) + _norm(model, group + ".hnorm", group)
            out.append(ParameterLayout(group + ".eh_proj.weight", (h, 2 * h), 0, group))
            out += _layer(model, group + ".block", model.mtp_kind(), group)
            out += _norm(model, group + ".final_norm", group)
    return out


def layer_parameter_layouts(model: TransformerConfig, kind: LayerKind) -> list[ParameterLayout]:
    """The parameters of one layer of `kind` (named ``layers.0.``)."""
    return _layer(model, "layers.0", kind)


def layer_gradients(model: TransformerConfig) -> tuple[float, ...]:
    """The first layer's parameter tensors, in elements, in the order backward makes
    their gradients: the forward's, reversed."""
    params = layer_parameter_layouts(model, model.layer_kinds()[0])
    return tuple(float(math.prod(p.shape)) for p in reversed(params))


def _layer(
    model: TransformerConfig, prefix: str, kind: LayerKind, group: str | None = None,
) -> list[ParameterLayout]:
    group = prefix if group is None else group
    prefix += "."
    out = _norm(model, prefix + "attn_norm", group)
    out += _attention(model, prefix + "attn.", group)
    out += _norm(model, prefix + "mlp_norm", group)
    if model.sandwich_norms:  # Gemma 2's norms of the attention's and MLP's outputs
        out += _norm(model, prefix + "post_attn_norm", group)
        out += _norm(model, prefix + "post_mlp_norm", group)
    if kind.moe:
        assert model.num_experts is not None
        out += _linear(model, prefix + "mlp.router", model.num_experts, model.hidden_size,
                       None, group)
        for e in range(model.num_experts):
            out += [
                ParameterLayout(p.name, p.shape, p.tensor_dim, group, expert=e)
                for p in _mlp(model, f"{prefix}mlp.experts.{e}.", group, model.expert_ffn_size)
            ]
        shared = model.moe_shared_expert_intermediate_size
        if shared:
            out += _mlp(model, prefix + "mlp.shared_experts.", group, shared)
    else:
        out += _mlp(model, prefix + "mlp.", group, model.ffn_size)
    return out


def _attention(model: TransformerConfig, prefix: str, group: str) -> list[ParameterLayout]:
    h, heads = model.hidden_size, model.num_attention_heads
    out: list[ParameterLayout] = []
    if model.multi_latent_attention:
        q_width = heads * (model.qk_head_dim + model.qk_pos_emb_head_dim)
        kv_rows = heads * (model.qk_head_dim + model.v_head_dim)
        latent = model.kv_lora_rank
        if model.q_lora_rank is None:
            out.append(ParameterLayout(prefix + "q_proj.weight", (q_width, h), 0, group))
        else:
            q_rank = model.q_lora_rank
            out.append(ParameterLayout(prefix + "q_down_proj.weight", (q_rank, h), None, group))
            out += _norm(model, prefix + "q_norm", group, q_rank)
            out.append(ParameterLayout(prefix + "q_up_proj.weight", (q_width, q_rank), 0, group))
        out.append(ParameterLayout(prefix + "kv_down_proj.weight",
                                   (latent + model.qk_pos_emb_head_dim, h), None, group))
        out += _norm(model, prefix + "kv_norm", group, latent)
        out.append(ParameterLayout(prefix + "kv_up_proj.weight", (kv_rows, latent), 0, group))
        out.append(ParameterLayout(prefix + "o_proj.weight", (h, model.value_width), 1, group))
        return out
    kv = model.num_kv_heads * model.head_dim
    qkv_bias = model.bias or model.qkv_bias  # Qwen2's q/k/v biases without others
    for name, rows, cols, dim in (("q_proj", model.query_width, h, 0), ("k_proj", kv, h, 0),
                                  ("v_proj", kv, h, 0), ("o_proj", h, model.value_width, 1)):
        out += _linear(model, prefix + name, rows, cols, dim, group,
                       qkv_bias if name != "o_proj" else model.bias)
    if model.qk_layernorm:
        out += _norm(model, prefix + "q_norm", group, model.head_dim)
        out += _norm(model, prefix + "k_norm", group, model.head_dim)
    if model.softmax_type == "learnable":
        out.append(ParameterLayout(prefix + "sinks", (heads,), 0, group))
    return out


def _mlp(model: TransformerConfig, prefix: str, group: str, f: int) -> list[ParameterLayout]:
    h = model.hidden_size
    if model.activation == "swiglu":
        names = (("gate_proj", f, h, 0), ("up_proj", f, h, 0), ("down_proj", h, f, 1))
    else:
        names = (("fc1", f, h, 0), ("fc2", h, f, 1))
    out: list[ParameterLayout] = []
    for name, rows, cols, dim in names:
        out += _linear(model, prefix + name, rows, cols, dim, group)
    return out


def _linear(
    model: TransformerConfig, name: str, rows: int, cols: int, dim: int | None, group: str,
    bias: bool | None = None,
) -> list[ParameterLayout]:
    """nn.Linear(cols, rows): weight [rows, cols]; a bias (where `bias`, by default the
    model's) split like the output rows (column-parallel), else replicated."""
    out = [ParameterLayout(name + ".weight", (rows, cols), dim, group)]
    if model.bias if bias is None else bias:
        out.append(ParameterLayout(name + ".bias", (rows,), 0 if dim == 0 else None, group))
    return out


def _norm(
    model: TransformerConfig, name: str, group: str, width: int | None = None,
) -> list[ParameterLayout]:
    width = model.hidden_size if width is None else width
    out = [ParameterLayout(name + ".weight", (width,), None, group)]
    if model.norm != "rmsnorm":
        out.append(ParameterLayout(name + ".bias", (width,), None, group))
    return out


def sharded_by_zero(param: ParameterLayout, zero_stage: int, expert_parallel: int) -> bool:
    """Whether ZeRO (FSDP2) shards the parameter over the data-parallel ranks."""
    return zero_stage >= 1 and not (param.expert is not None and expert_parallel > 1)


def local_shape(
    param: ParameterLayout, tensor: int, data_shards: int, zero_stage: int,
    expert_parallel: int = 1,
) -> tuple[int, ...]:
    """The shape of the first rank's local piece: tensor-parallel split, then (ZeRO >= 1)
    dim 0 cut into `data_shards` chunks, the first of them ceil(rows / shards) long."""
    shape = list(param.shape)
    if param.tensor_dim is not None and tensor > 1:
        shape[param.tensor_dim] //= tensor
    if data_shards > 1 and sharded_by_zero(param, zero_stage, expert_parallel):
        shape[0] = -(-shape[0] // data_shards)
    return tuple(shape)


def padded_numel(param: ParameterLayout, tensor: int, data_shards: int) -> int:
    """Elements of the rank's tensor-parallel piece with dim 0 padded to a multiple of
    `data_shards`: what FSDP2's all-gather returns and its reduce-scatter takes."""
    shape = list(local_shape(param, tensor, 1, 0))
    shape[0] = -(-shape[0] // data_shards) * data_shards
    return math.prod(shape)


def placement(
    param: ParameterLayout, axes: list[str], tensor: int, zero_stage: int,
    expert_parallel: int = 1,
) -> str:
    """DTensor's short form over the stage mesh's `axes` (``dp``, optionally ``cp``,
    ``tp``): e.g. ``_S(0,2)S(0)`` for a column-parallel weight under ZeRO-3 on data x
    tensor 2. An expert's parameter reads R on the data axis: it is held whole by one rank
    of each expert group."""
    tp = f"S({param.tensor_dim})" if param.tensor_dim is not None and tensor > 1 else "R"
    if not sharded_by_zero(param, zero_stage, expert_parallel):
        data = "R"
    elif param.tensor_dim == 0 and tensor > 1:
        data = f"_S(0,{tensor})"
    else:
        data = "S(0)"
    return "".join(tp if axis == "tp" else data for axis in axes)


def rank_state_bytes(
    params: list[ParameterLayout], tensor: int, data_shards: int, zero_stage: int,
    expert_parallel: int, num_experts: int | None, element: StateElementBytes,
) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes the first rank of a stage holds
    during a step: parameters gathered over the data axis but under ZeRO-3, gradients
    sharded from ZeRO-2, optimizer state from ZeRO-1; of the experts, one rank's share;
    a frozen parameter only its own bytes (in NF4 where it is stored so)."""
    mine = (num_experts or 0) // expert_parallel
    totals = [0, 0, 0]
    packed = 0.0  # weights stored in a fraction of a byte per element (NF4)
    for p in params:
        if p.expert is not None and p.expert >= mine:
            continue  # another expert-parallel rank's expert (equal shapes: same bytes)
        whole = math.prod(local_shape(p, tensor, 1, 0, expert_parallel))
        shard = math.prod(local_shape(p, tensor, data_shards, zero_stage, expert_parallel))
        stored = shard if zero_stage >= 3 else whole
        if p.element_bytes is None:
            totals[0] += stored * element.params
        else:
            packed += stored * p.element_bytes
        if p.frozen:
            continue
        totals[1] += (shard if zero_stage >= 2 else whole) * element.grads
        totals[2] += (shard if zero_stage >= 1 else whole) * element.optimizer
    return totals[0] + math.ceil(packed), totals[1], totals[2]
