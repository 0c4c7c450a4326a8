"""The IR every pass after tracing reads: a model's (or a stage's) training step as one aten
graph, forward and backward, with its placeholders and outputs named by what they are."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx


@dataclass
class TracedProgram:
    """The training step of one model as an aten graph, with its inputs and outputs named."""

    graph_module: fx.GraphModule
    """Joint forward + backward graph; placeholders are parameters, buffers, then inputs."""
    parameters: dict[str, str]
    """Placeholder node name -> parameter fully qualified name."""
    buffers: dict[str, str]
    """Placeholder node name -> buffer fully qualified name."""
    user_inputs: list[str]
    """Placeholder node names of the example inputs, in call order."""
    loss: str
    """Node name of the scalar loss."""
    gradients: dict[str, str]
    """Output node name -> fully qualified name of the parameter it is the gradient of."""
    method: str = "torch.export"
    """How the graph was captured: 'aot_autograd' (`passes.module_joint`), 'torch.export',
    'symbolic_trace', or 'make_fx' (a stage already in aten ops, `passes.aten_joint`)."""
    nodes: dict[str, fx.Node] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in self.graph_module.graph.nodes}

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph


def decomposition_table(keep_attention: bool) -> dict:
    """Core ATen decompositions; with `keep_attention`, scaled-dot-product attention stays
    one fused op (its head and batch shardings are known; its math form loses them when
    batch and heads are flattened together)."""
    from torch._decomp import core_aten_decompositions

    table = core_aten_decompositions()
    if keep_attention:
        for op in list(table):
            if "scaled_dot_product" in str(op):
                del table[op]
    return table
