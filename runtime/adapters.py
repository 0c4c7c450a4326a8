"""LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) on a stage
of the zoo transformer, or on the whole model: every base parameter frozen, and beside each
targeted linear W an adapter y += (alpha / r) B A x, whose factors alone are trained.

Which linears get adapters, the factors' names and shapes, and how tensor parallelism
splits them are `cost_models.adapters`' rules, read here through the Plan's own list of a
chunk's parameters (`cost_models.finetuned_parameters.finetuned_chunk`), so a rank holds
exactly the parameters its Plan lists: beside a column-parallel linear A (r x in) whole
and B (out x r) split by rows, beside a row-parallel one A split by columns and B whole
(Megatron-Bridge's layout). Each factor is a DTensor on the tensor mesh with those
placements, an ``nn.Linear`` named ``lora_a`` / ``lora_b`` under the linear
(``layers.0.attn.q_proj.lora_a.weight``).

The adapter runs in a forward hook of the linear placed before tensor parallelism's output
hook, on the linear's input and output as DTensor holds them inside the module: its output
joins the linear's as a shard of the output columns (column-parallel) or as a partial sum
(row-parallel) that the linear's own all-reduce (or reduce-scatter) then reduces. So the
adapters add no forward collective. In backward the factor that is whole on every tensor
rank (A beside a column-parallel linear, B beside a row-parallel one) gets a partial
gradient, each rank's from its part of the linear, which DTensor all-reduces over the
tensor ranks (FSDP2 does it once per step, before its reduce-scatter); the input gradients
the adapters add join the linear's before its own reduction.

Initial values as LoRA's (and PEFT's): A kaiming-uniform (a = sqrt(5), nn.Linear's own
init), B zero, so the first step's loss is the base model's; from a generator keyed by the
seed and the factor's name, so that every rank and the one-process reference hold the
same adapters (`runtime.stages.init_parameter` asks `initial_adapter`).

QLoRA is not run here: its base is NF4 weights dequantized to bf16 for each matmul, which
this CPU runtime, training in fp32 to compare with one process, does not hold
(`runtime.model_parts` refuses it).
"""

from __future__ import annotations

import math
import zlib
from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from cost_models.stage_parameters import ParameterLayout
from planner.vocabulary.parallel import Finetuning

FACTORS = ("lora_a", "lora_b")
"""The modules an adapted linear gains, LoRA's (and PEFT's) names of A and B."""


def initial_adapter(name: str, shape: torch.Size | tuple[int, ...], seed: int
                    ) -> torch.Tensor | None:
    """The initial value of adapter factor `name` (a full-model name ending in
    ``lora_a.weight`` or ``lora_b.weight``): A kaiming-uniform, B zero; None for a name
    that is no adapter factor."""
    if not is_factor(name):
        return None
    if name.endswith(".lora_b.weight"):
        return torch.zeros(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)


def is_factor(name: str) -> bool:
    """Whether parameter `name` is an adapter factor (``...lora_a.weight``)."""
    return any(name.endswith(f".{factor}.weight") for factor in FACTORS)


def add_adapters(
    module: nn.Module, params: list[ParameterLayout], finetuning: Finetuning,
    tp_mesh: DeviceMesh | None = None, seed: int = 0,
) -> None:
    """Freeze every parameter of `module` (a stage, or the whole model, already tensor-
    parallel where `tp_mesh` spans ranks) and give each linear whose factors `params`
    lists (its chunk's parameters, `finetuned_chunk` under `finetuning`) its adapter.
    On the meta device the factors stay empty for `runtime.stages.materialize`; on a
    real one they get their initial values (`initial_adapter`, keyed by `seed`)."""
    for param in module.parameters():
        param.requires_grad_(False)
    scale = finetuning.lora_alpha / finetuning.lora_rank
    adapted: set[str] = set()
    for factor in (p for p in params if is_factor(p.name)):
        path, name = factor.name.removesuffix(".weight").rsplit(".", 1)
        linear = module.get_submodule(path)
        linear.register_module(name, _factor(factor, linear.weight.device, tp_mesh, seed))
        adapted.add(path)
    for path in sorted(adapted):
        module.get_submodule(path).register_forward_hook(partial(_adapter, scale=scale),
                                                         prepend=True)


def _factor(layout: ParameterLayout, device: torch.device, tp_mesh: DeviceMesh | None,
            seed: int) -> nn.Linear:
    """One factor as a bias-free linear: a DTensor on `tp_mesh` split as `layout` says
    when that spans ranks, else a plain tensor."""
    rows, cols = layout.shape
    if device.type == "meta":
        value = torch.empty(layout.shape, device=device)
    else:
        value = initial_adapter(layout.name, layout.shape, seed)
        assert value is not None
        value = value.to(device)
    if tp_mesh is not None and tp_mesh.size() > 1:
        split = Replicate() if layout.tensor_dim is None else Shard(layout.tensor_dim)
        # Every rank holds the same full value (or none yet): keep the local piece.
        value = distribute_tensor(value, tp_mesh, [split], src_data_rank=None)
    linear = nn.Linear(cols, rows, bias=False, device="meta")
    linear.weight = nn.Parameter(value)
    return linear


def _adapter(linear: nn.Module, args: tuple, output: torch.Tensor, scale: float) -> torch.Tensor:
    """The linear's output plus its adapter's, (alpha / r) B A x, on the linear's input:
    both as DTensor holds them inside a tensor-parallel linear."""
    return output + scale * linear.lora_b(linear.lora_a(args[0]))
