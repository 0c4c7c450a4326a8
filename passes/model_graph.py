"""Trace a model once per layer template and describe it at full depth.

A 96-block model is traced with two blocks: the first and second block must come out as
the same template (same ops, shapes and wiring), and the remaining 94 are that template
again, under their own names. Tracing cost is then independent of depth, which is what
lets `plan` handle GPT-3 175B and the 1T model in seconds on a laptop-class CPU. Models
that cannot be rebuilt at another depth, or whose two traced blocks differ, are traced
whole.

Everything is traced at the batch the model's builder gives (micro-batch 1 for zoo and
Hugging Face models): shapes, not structure, depend on the batch, so per-token figures
taken here scale to any micro-batch size.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from passes.aten_joint import trace_decomposed
from passes.dtensor_rules import has_rule
from passes.layers import Layer, find_layers
from passes.strategies import is_skipped, tensor_inputs
from passes.program import TracedProgram
from passes.trace import LossFn, trace

Builder = Callable[[int | None], tuple[nn.Module, tuple[Any, ...], LossFn | None]]
"""Builds the model, its example inputs and loss; with an int, at that many blocks."""

# Blocks traced for a model that can be rebuilt at another depth: two, so that the
# template is confirmed by a second instance rather than assumed.
TRACED_BLOCKS = 2

_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<index>\d+)$")


@dataclass
class ModelGraph:
    """A traced model and its layers at full depth."""

    program: TracedProgram
    """The traced training step (of the reduced-depth model, when `traced_depth` is set)."""
    layers: list[Layer]
    """Every layer of the full model in forward order; blocks of one template share the
    traced nodes of `Layer.source`."""
    tokens: int
    """Tokens in the traced batch (batch x sequence for token-id inputs, else samples)."""
    traced_depth: int | None
    """Blocks in the traced model when it was traced at reduced depth, else None."""
    trace_s: float
    """Wall time of tracing."""
    layers_s: float
    """Wall time of finding layers and templates."""

    @property
    def templates(self) -> dict[str, list[Layer]]:
        """Template hash -> the layers that use it, in first-use order."""
        grouped: dict[str, list[Layer]] = {}
        for layer in self.layers:
            grouped.setdefault(layer.template, []).append(layer)
        return grouped

    @property
    def num_parameters(self) -> int:
        return sum(layer.num_parameters for layer in self.layers)

    def ops_without_rule(self) -> list[str]:
        """Ops of the traced step that have no sharding rule (planned replicated)."""
        return sorted({str(n.target) for n in self.program.graph.nodes if _lacks_rule(n)})


def trace_model(build: Builder, num_layers: int | None = None,
                decomposed_backward: bool = False) -> ModelGraph:
    """Trace the model `build` makes; with `num_layers`, at TRACED_BLOCKS blocks and
    expanded to `num_layers` when both traced blocks share one template. With
    `decomposed_backward`, the backward is that of the decomposed forward
    (`aten_joint.trace_decomposed`: half the time, for ILPs that read only collectives)."""
    tracer = trace_decomposed if decomposed_backward else trace
    if num_layers is not None and num_layers > TRACED_BLOCKS:
        graph = _trace(build, TRACED_BLOCKS, tracer)
        blocks = [layer for layer in graph.layers if _NUMBERED.match(layer.name)]
        if len(blocks) == TRACED_BLOCKS and len({b.template for b in blocks}) == 1:
            graph.layers = _expand(graph.layers, blocks, num_layers)
            graph.traced_depth = TRACED_BLOCKS
            return graph
    return _trace(build, None, tracer)


def _trace(build: Builder, depth: int | None, tracer: Callable[..., TracedProgram]) -> ModelGraph:
    start = time.perf_counter()
    model, inputs, loss_fn = build(depth)
    program = tracer(model, inputs, loss_fn)
    traced = time.perf_counter()
    layers = find_layers(program)
    return ModelGraph(
        program=program,
        layers=layers,
        tokens=_tokens(inputs),
        traced_depth=None,
        trace_s=traced - start,
        layers_s=time.perf_counter() - traced,
    )


def _expand(layers: list[Layer], blocks: list[Layer], num_layers: int) -> list[Layer]:
    """The layer list with the traced blocks replaced by `num_layers` blocks, each named
    and owning parameters as the full model's block of that index would."""
    prefix = _NUMBERED.match(blocks[0].name)["prefix"]
    first, last = layers.index(blocks[0]), layers.index(blocks[-1])
    expanded = []
    for index in range(num_layers):
        # Block 0 is its own trace (it may differ in wiring to the embedding); the rest
        # follow the last traced block.
        source = blocks[0] if index == 0 else blocks[-1]
        name = f"{prefix}{index}"
        parameters = [name + p.removeprefix(source.name) for p in source.parameters]
        expanded.append(replace(source, name=name, parameters=parameters, source=source.name))
    return layers[:first] + expanded + layers[last + 1 :]


def _tokens(inputs: tuple[Any, ...]) -> int:
    first = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        return 1
    if not first.is_floating_point():
        return first.numel()  # token ids: batch x sequence
    return first.numel() // first.shape[-1]  # features: every position but the last dim


def _lacks_rule(node: fx.Node) -> bool:
    """An op the planner must run replicated. Factories (no tensor inputs: arange, full)
    are made replicated on every rank anyway, and shape-only ops read no tensor, so
    neither counts."""
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and not is_skipped(node)
        and bool(tensor_inputs(node))
        and not has_rule(node.target)
    )
