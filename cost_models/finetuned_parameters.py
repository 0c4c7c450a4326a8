"""A pipeline chunk's parameters as a fine-tuning run holds them
(`cost_models.stage_parameters` lists them as pre-training does).

Pre-training and full fine-tuning train every parameter. Under LoRA and QLoRA every
parameter of the chunk is frozen (no gradient, no optimizer state; QLoRA's adapted weights
stored in NF4) and each adapted linear's weight is followed by its two adapter factors,
which are trained; `cost_models.adapters` says which linears, the factors' names and
shapes, and how tensor parallelism splits them. A factor sits in its linear's ZeRO unit
and is sharded by ZeRO as any parameter is. Tessel's runtime builds exactly these
(`runtime.adapters`), and the Plan's placements, held bytes and collectives count them.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.adapters import NF4_BYTES, adapted, adapter_layouts
from cost_models.stage_parameters import ParameterLayout, chunk_parameters
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import Finetuning


def finetuned(params: list[ParameterLayout], finetuning: Finetuning) -> list[ParameterLayout]:
    """`params` as `finetuning` trains them: unchanged, or under LoRA and QLoRA every one
    frozen (QLoRA's adapted weights in NF4) and each adapted weight followed by its
    adapter factors."""
    if not finetuning.adapters:
        return params
    out: list[ParameterLayout] = []
    for p in params:
        hit = adapted(p, tuple(finetuning.lora_targets))
        nf4 = NF4_BYTES if hit and finetuning.finetune == "qlora" else None
        out.append(replace(p, frozen=True, element_bytes=nf4))
        if hit:
            out += adapter_layouts(p, finetuning.lora_rank)
    return out


def finetuned_chunk(
    model: TransformerConfig, layers: tuple[int, int], first: bool, last: bool,
    finetuning: Finetuning,
) -> list[ParameterLayout]:
    """The parameters of the chunk holding `layers` (`chunk_parameters`) as `finetuning`
    trains them."""
    return finetuned(chunk_parameters(model, layers, first, last), finetuning)
