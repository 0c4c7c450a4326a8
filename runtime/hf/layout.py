"""Megatron's tensor-parallel layout of a Hugging Face decoder layer, derived from the
layer itself by one rule rather than a table per family.

`block_layout` runs the layer once on the meta device and watches every linear layer in
each of its sublayers (the children that hold linears: attention and MLP):

- a linear that reads the sublayer's input (the block's normalized hidden states) is
  column-parallel: q/k/v, gate/up, fc1 and their fused forms;
- the sublayer's last linear, whose output is the sublayer's (through parameter-free
  steps such as dropout: what is added back into the residual), is row-parallel:
  o_proj, dense, down_proj, c_proj;
- any other linear (an inner projection, as multi-latent attention has) is not split by
  this rule, and the layer is refused.

GPT-2's ``Conv1D`` (a linear with its weight transposed) counts as a linear; its split
dims are the transposed ones (`ColumnParallel`, `RowParallel`).

A fused column-parallel linear is split so that each rank holds its own heads' rows
(its own rows of each part): `fused_qkv_layout` finds, by running the attention with the
projection's output replaced by its row numbers, which head of q, k or v each row feeds,
and keeps the placement (`Shard(0)`, or `_StridedShard(0, k)` for k equal parts, as
Phi-3's [q; k; v]) whose every shard is exactly one rank's heads: GPT-NeoX's per-head
interleaved query_key_value is already per-head contiguous (Shard(0)). A fused gate/up
(output twice the row-parallel linear's input) is two halves split alike
(`_StridedShard(0, 2)`). Attention modules then read local head counts: a copy of the
config with the heads divided (Phi-3 slices its fused output by them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import _StridedShard
from transformers.pytorch_utils import Conv1D

from runtime.hf import stages as hf_stages

_HEAD_COUNTS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads",
                "split_size")
"""Attributes attention modules (and their configs) count heads in, or (GPT-2's
split_size) the width of all heads' queries."""


@dataclass
class SublayerLayout:
    """One sublayer (attention or MLP) of a decoder layer, as tensor parallelism splits it."""

    name: str
    """Its name in the layer (``self_attn``, ``mlp``, ``attention``)."""
    input_keyword: str | None
    """The keyword its input is passed by, or None: the first positional argument."""
    column: dict[str, int] = field(default_factory=dict)
    """Column-parallel linears (names in the layer) -> parts of a fused one split alike
    (1: not fused, or per-head contiguous)."""
    row: list[str] = field(default_factory=list)
    """Row-parallel linears (names in the layer)."""
    attention: str | None = None
    """The attention module's name in the layer, for an attention sublayer."""


@dataclass
class BlockLayout:
    """A decoder layer's tensor-parallel layout (`block_layout`)."""

    sublayers: list[SublayerLayout]
    norms: list[str]
    """The layer's own norms (outside its sublayers): sequence-parallel under SP."""


def is_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` or transformers' ``Conv1D`` (GPT-2's transposed linear)."""
    return isinstance(module, (nn.Linear, Conv1D))


def out_features(module: nn.Module) -> int:
    return module.nf if isinstance(module, Conv1D) else module.out_features


def in_features(module: nn.Module) -> int:
    return module.nx if isinstance(module, Conv1D) else module.in_features


def block_layout(block: nn.Module, config: Any, rotary: nn.Module | None) -> BlockLayout:
    """The layout of `block` (a decoder layer on the meta device) by the module rule;
    ValueError for a layer the rule does not split. `rotary`: the stage's rotary table,
    None for a family with learned positions."""
    hidden = config.hidden_size
    seen: dict[str, dict[str, Any]] = {}
    handles = []
    children = dict(block.named_children())
    for name, child in children.items():
        if not any(is_linear(m) for m in child.modules()):
            continue

        def pre(module, args, kwargs, name=name):
            keyword = None if args else (
                "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs)))
            seen[name] = {"input": args[0] if args else kwargs[keyword], "keyword": keyword}

        def post(module, args, kwargs, output, name=name):
            seen[name]["output"] = output[0] if isinstance(output, tuple) else output

        handles.append(child.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(child.register_forward_hook(post, with_kwargs=True))
    linears: dict[str, Any] = {}  # name -> its input, in call order
    for name, module in block.named_modules():
        if is_linear(module):
            handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: linears.__setitem__(name, args[0])))
    x = torch.empty(1, 4, hidden, device="meta")
    positions = torch.arange(4, device="meta").unsqueeze(0)
    extra = {} if rotary is None else {"position_embeddings": rotary(x, positions)}
    try:
        block(x, attention_mask=None, **extra)
    finally:
        for handle in handles:
            handle.remove()
    attention_names = {n for n, m in block.named_modules()
                       if m in hf_stages.attention_modules(block)}
    sublayers = []
    for name, record in seen.items():
        layout = SublayerLayout(name, record["keyword"])
        inside = [(n, read) for n, read in linears.items() if n.startswith(name + ".")]
        for index, (linear, read) in enumerate(inside):
            if read is record["input"]:
                layout.column[linear] = 1
            elif index == len(inside) - 1:
                layout.row.append(linear)
            else:
                raise ValueError(
                    f"{type(block).__name__}'s {linear} neither reads its sublayer's input "
                    "nor writes its output; tensor parallelism splits only such linears")
        if len(layout.row) != 1 or not layout.column:
            raise ValueError(f"{type(block).__name__}'s {name} has no column- then row-"
                             "parallel pair of linears; it is not split by tensor parallelism")
        found = sorted(n for n in attention_names if n == name or n.startswith(name + "."))
        layout.attention = found[0] if found else None
        _fused_parts(block, layout, config)
        sublayers.append(layout)
    norms = [n for n, m in children.items() if n not in seen
             and any(True for _ in m.parameters(recurse=False))]
    return BlockLayout(sublayers, norms)


def _fused_parts(block: nn.Module, layout: SublayerLayout, config: Any) -> None:
    """How a sublayer's single column-parallel linear splits: an attention's fused q/k/v
    by `fused_qkv_layout`; an MLP's fused gate/up (twice the width the row-parallel
    linear reads) as two halves split alike."""
    if len(layout.column) != 1:
        return
    (name,) = layout.column
    linear = block.get_submodule(name)
    inner = in_features(block.get_submodule(layout.row[0]))
    if layout.attention is not None:
        if out_features(linear) != inner:  # q/k/v in one linear
            layout.column[name] = fused_qkv_layout(
                block.get_submodule(layout.attention), name.removeprefix(layout.attention + "."),
                config)
    elif out_features(linear) == 2 * inner:
        layout.column[name] = 2


def fused_qkv_layout(attention: nn.Module, name: str, config: Any) -> int:
    """The parts a fused q/k/v projection (`attention`'s linear `name`) splits alike so
    that each rank holds exactly its heads' rows: 1 (Shard(0): per-head contiguous) or
    3 (three equal blocks). Found by running `attention` with the projection's output
    replaced by its row numbers and reading which row each head's q, k and v come from.
    ValueError where neither holds (grouped-query heads in one blocked projection)."""
    heads, kv_heads = config.num_attention_heads, getattr(
        config, "num_key_value_heads", None) or config.num_attention_heads
    linear = getattr(attention, name)
    rows = out_features(linear)
    numbered = torch.arange(1, rows + 1, dtype=torch.float32).reshape(1, 1, rows)
    captured: list[tuple[torch.Tensor, ...]] = []

    class RowNumbers(nn.Module):
        def forward(self, x):  # noqa: ARG002 - the numbers, whatever the input
            return numbered

    head_dim = rows // (heads + 2 * kv_heads)
    unrotated = (torch.ones(1, 1, head_dim), torch.zeros(1, 1, head_dim))  # cos 1, sin 0
    setattr(attention, name, RowNumbers())
    attention.tessel_probe = captured
    try:
        attention(hidden_states=torch.zeros(1, 1, 1), attention_mask=None,
                  position_embeddings=unrotated)
    except hf_stages.Probed:
        pass
    finally:
        setattr(attention, name, linear)
        del attention.tessel_probe
    if not captured:
        raise ValueError(f"{type(attention).__name__} does not reach its attention core")
    owner: dict[int, tuple[str, int]] = {}
    for part, tensor in zip("qkv", captured[0]):
        for head in range(tensor.shape[1]):
            for row in tensor[0, head, 0].tolist():
                owner[int(row) - 1] = (part, head)
    return _parts_splitting_by_heads(owner, rows, heads, kv_heads)


def _parts_splitting_by_heads(
    owner: dict[int, tuple[str, int]], rows: int, heads: int, kv_heads: int,
) -> int:
    """1 or 3: the parts whose alike split gives every rank exactly its heads' rows, for
    every tensor degree dividing the key/value heads."""
    for parts in (1, 3):
        if rows % parts:
            continue
        block = rows // parts
        good = True
        for tp in (d for d in range(2, kv_heads + 1) if kv_heads % d == 0):
            if block % tp:
                good = False
                break
            for rank in range(tp):
                piece = block // tp
                mine = {p * block + rank * piece + i for p in range(parts) for i in range(piece)}
                for row in range(rows):
                    part, head = owner[row]
                    count = heads if part == "q" else kv_heads
                    ours = head // (count // tp) == rank
                    if ours != (row in mine):
                        good = False
        if good:
            return parts
    raise ValueError(
        "a fused q/k/v projection whose rows of a rank's heads are neither one block nor "
        "three equal blocks (grouped-query attention in one projection) is not split by "
        "tensor parallelism yet; run it with --tensor-model-parallel-size 1")


class ColumnParallel(ColwiseParallel):
    """ColwiseParallel of an ``nn.Linear`` or a ``Conv1D`` (its weight transposed: split
    on dim 1) whose output fuses `parts` projections, each split alike over the ranks
    (`_StridedShard(dim, parts)`: a rank holds its rows of every part, in order; one part:
    a plain `Shard`). The rank's output columns are its own [q_r; k_r; v_r] (or
    [gate_r; up_r]), what the module's reshape on local heads reads: used as they are,
    never redistributed."""

    def __init__(self, parts: int = 1) -> None:
        super().__init__()
        self.parts = parts

    def _partition_linear_fn(self, name, module, device_mesh):
        for param_name, param in module.named_parameters():
            dim = 1 if isinstance(module, Conv1D) and param_name == "weight" else 0
            placement: Placement = Shard(dim) if self.parts == 1 else _StridedShard(
                dim, split_factor=self.parts)
            module.register_parameter(param_name, nn.Parameter(
                distribute_tensor(param, device_mesh, [placement], src_data_rank=None),
                requires_grad=param.requires_grad))

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs.to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class RowParallel(RowwiseParallel):
    """RowwiseParallel of an ``nn.Linear`` or a ``Conv1D`` (its weight transposed: split
    on dim 0), the bias replicated."""

    def _partition_linear_fn(self, name, module, device_mesh):
        dim = 0 if isinstance(module, Conv1D) else 1
        module.register_parameter("weight", nn.Parameter(distribute_tensor(
            module.weight, device_mesh, [Shard(dim)], src_data_rank=None)))
        if getattr(module, "bias", None) is not None:
            module.register_parameter("bias", nn.Parameter(distribute_tensor(
                module.bias, device_mesh, [Replicate()], src_data_rank=None)))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def sublayer_plan(layout: SublayerLayout, seq: Placement) -> dict[str, Any]:
    """The torch styles of one sublayer: its input gathered to one replicated DTensor that
    every column-parallel linear reads (their input gradients reduced once, as Megatron's
    fused QKV and FC1), column- then row-parallel linears, the output reduced to `seq`."""
    plan: dict[str, Any] = {name: ColumnParallel(parts)
                            for name, parts in layout.column.items()}
    plan[layout.row[0]] = RowParallel(output_layouts=seq)
    if layout.input_keyword is None:
        plan[layout.name] = PrepareModuleInput(input_layouts=(seq,),
                                               desired_input_layouts=(Replicate(),))
    else:
        plan[layout.name] = PrepareModuleInput(
            input_kwarg_layouts={layout.input_keyword: seq},
            desired_input_kwarg_layouts={layout.input_keyword: Replicate()})
    return plan


def block_plan(layout: BlockLayout, sequence_parallel: bool) -> dict[str, Any]:
    """Every style of a decoder layer: its sublayers', and under sequence parallelism its
    norms on sequence shards (their outputs local: Gemma 2's post-norms feed the
    residual sum)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    for sublayer in layout.sublayers:
        plan.update(sublayer_plan(sublayer, seq))
    if sequence_parallel:
        plan.update({name: SequenceParallel(use_local_output=True) for name in layout.norms})
    return plan


def local_heads(block: nn.Module, layout: BlockLayout, tp: int) -> None:
    """The attention modules count their local heads: a copy of their config and their
    own head counts divided by `tp` (those that reshape with -1 heads are unaffected)."""
    for sublayer in layout.sublayers:
        if sublayer.attention is None:
            continue
        attention = block.get_submodule(sublayer.attention)
        if hasattr(attention, "config"):
            attention.config = copy.copy(attention.config)
            _divide_heads(attention.config, tp)
        _divide_heads(attention, tp)


def _divide_heads(target: Any, tp: int) -> None:
    for name in _HEAD_COUNTS:
        value = getattr(target, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            if value % tp:
                raise ValueError(f"tensor parallelism {tp} must divide the {value} heads "
                                 f"({name})")
            setattr(target, name, value // tp)


def per_head_fusions(config: Any) -> list[str]:
    """The fused linears of `config`'s decoder layer that tensor parallelism splits per
    head or per half (`_StridedShard`), from a one-layer stage on the meta device."""
    stage = hf_stages.build_hf_stage(config, (0, 1), True, False)
    layout = block_layout(stage.layers["0"], config, stage.rotary)
    return [name for sublayer in layout.sublayers
            for name, parts in sublayer.column.items() if parts > 1]
