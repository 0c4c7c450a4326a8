"""A model's forward cut into layers, at the model's full depth, as the graph search reads it.

Most models are traced whole: each layer is a run of the traced forward's ops. A model of
many identical blocks that can be rebuilt at another depth (a zoo or Hugging Face
transformer, `planner.models.sources.LoadedModel.build`) is traced with `REDUCED_BLOCKS`
blocks instead and described at full depth: what comes before the blocks (the embedding)
as a layer of its own, the first block, the middle block once per middle block, each
under its own parameters' names (`layers.2.` -> `layers.K.`), the last block, and what
comes after (the head and loss). Every block is then one template, solved once per mesh,
and the ends are small programs. Two middle blocks are traced, so that the template is
confirmed by a second instance rather than assumed. Export time grows with the blocks
traced, so a deep model costs what four of its blocks do; the runtime, which traces the
model it runs, cuts it where the full model's layers begin (`cuts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from passes.layers import block_of, repeated_blocks
from passes.stage_graph import ForwardGraph, block_cuts, layer_cuts, module_path

REDUCED_BLOCKS = 4
"""Blocks a model rebuilt at another depth is traced with: first, two middle, last."""


@dataclass
class ModelLayers:
    """The layers of a model: each a traced layer (`source`), under its own names."""

    forward: ForwardGraph
    """The traced forward (of the model at reduced depth, where `reduced`)."""
    traced_cuts: list[int]
    """Op positions of the traced forward's layers."""
    source: list[int]
    """Per layer of the model, the traced layer it is."""
    renames: list[tuple[str, str] | None] = field(default_factory=list)
    """Per layer of the model, (traced block's FQN prefix, its own), where they differ."""

    @classmethod
    def traced(cls, forward: ForwardGraph, max_layers: int) -> ModelLayers:
        """A model traced whole, cut as `passes.stage_graph.layer_cuts` cuts it."""
        cuts = layer_cuts(forward, max_layers)
        return cls(forward, cuts, list(range(len(cuts) - 1)), [None] * (len(cuts) - 1))

    @classmethod
    def expanded(cls, forward: ForwardGraph, num_blocks: int) -> ModelLayers | None:
        """`forward`, traced with REDUCED_BLOCKS blocks, described at `num_blocks`: a layer
        per block, and what comes before the first and after the last as layers of their
        own (so that every block is one template). None where the two middle blocks
        differ or the blocks cannot be cut apart."""
        cuts = block_cuts(forward, ends=True)
        paths = [module_path(node) for node in forward.ops]
        blocks = repeated_blocks(paths)
        if cuts is None or len(blocks) != REDUCED_BLOCKS:
            return None
        first = int(block_of(paths[0], blocks) is None)  # a layer before the first block
        last = len(cuts) - 1 - first - REDUCED_BLOCKS  # a layer after the last block
        if last not in (0, 1) or (
                op_signature(forward, cuts, first + 1) != op_signature(forward, cuts, first + 2)):
            return None
        traced = [first, first + 1, *[first + 2] * (num_blocks - 3), first + 3]
        source = [0] * first + traced + [first + REDUCED_BLOCKS] * last
        prefix = blocks[0].rsplit(".", 1)[0]
        renames: list[tuple[str, str] | None] = [None] * len(source)
        for block, r in enumerate(traced):
            old, new = f"{blocks[r - first]}.", f"{prefix}.{block}."
            renames[first + block] = None if old == new else (old, new)
        return cls(forward, cuts, source, renames)

    @property
    def loss_scaled(self) -> bool:
        """Whether the model trains in fp16, its loss scaled (`stage_graph.LOSS_SCALE`)."""
        return self.forward.loss_scaled

    @property
    def num_layers(self) -> int:
        return len(self.source)

    @property
    def reduced(self) -> bool:
        """Whether the model was traced with fewer layers than it has: then no stage of
        several layers can be cut from the trace, only run as its layers' programs."""
        return self.source != list(range(len(self.traced_cuts) - 1))

    @cached_property
    def cuts(self) -> list[int]:
        """Op positions in the full model's forward where each layer begins, and its end."""
        sizes = [self.traced_cuts[r + 1] - self.traced_cuts[r] for r in self.source]
        return [0, *np.cumsum(sizes).tolist()]

    def fqn(self, layer: int, traced: str) -> str:
        """The name, in layer `layer`, of the traced parameter `traced` (a parameter outside
        the blocks, a tied embedding, keeps its name)."""
        rename = self.renames[layer]
        if rename is None or not traced.startswith(rename[0]):
            return traced
        return rename[1] + traced.removeprefix(rename[0])

    def cut_bytes(self, boundary: int) -> int:
        """Bytes crossing the cut before layer `boundary` (none before the first, or after
        the last)."""
        if boundary in (0, self.num_layers):
            return 0
        return self.forward.cut_bytes(self.traced_cuts[self.source[boundary]])

    def crossing(self, boundary: int) -> list[torch.Tensor]:
        """The tensors crossing the cut before layer `boundary` (meta values)."""
        return [n.meta["val"] for n in
                self.forward.crossing(self.traced_cuts[self.source[boundary]])]

    def parameter_values(self) -> dict[str, torch.Tensor]:
        """Every parameter of the full model (meta values), by FQN."""
        traced = self.forward.parameter_values()
        return {self.fqn(layer, fqn): traced[fqn] for layer, r in enumerate(self.source)
                for fqn in self._parameters_of[r]}

    def flops(self) -> float:
        """FLOPs of the full model's forward."""
        flops = self.forward.op_flops()
        return float(sum(flops[self.traced_cuts[r]:self.traced_cuts[r + 1]].sum()
                         for r in self.source))

    @cached_property
    def _parameters_of(self) -> list[list[str]]:
        """Per traced layer, the FQNs of the parameters its ops read."""
        out = []
        for r in range(len(self.traced_cuts) - 1):
            ops = self.forward.ops[self.traced_cuts[r]:self.traced_cuts[r + 1]]
            read = {a.name for op in ops for a in op.all_input_nodes}
            out.append([fqn for name, fqn in self.forward.parameters.items() if name in read])
        return out


def op_signature(forward: ForwardGraph, cuts: list[int], layer: int) -> tuple:
    """What layer `layer` computes, op by op: each op and its output's shape."""
    return tuple((str(n.target), tuple(getattr(n.meta.get("val"), "shape", ())))
                 for n in forward.ops[cuts[layer]:cuts[layer + 1]])
