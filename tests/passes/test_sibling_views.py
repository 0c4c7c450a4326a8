"""passes.sibling_views: the q, k and v projections of one block read one view of the
norm's output (so a move of it is made once), two blocks keep a view each, and the
graph still computes the model's loss and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from passes.aten_joint import trace_decomposed
from passes.trace import trace
from tests.passes.test_trace import assert_runs_like_autograd

aten = torch.ops.aten


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.q(h) * self.k(h) + self.v(h)


@pytest.mark.parametrize("tracer", [trace, trace_decomposed])
def test_projections_of_one_block_read_one_view(tracer) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Block(16), _Block(16))
    inputs = (torch.randn(4, 8, 16),)
    program = tracer(model, inputs)
    read = {}  # block -> the nodes its forward projections read their input through
    for node in program.graph.nodes:
        if node.target == aten.addmm.default and node.meta["tessel_phase"] == "forward":
            block = node.meta["tessel_module"].split(".")[0]
            read.setdefault(block, set()).add(node.args[1])
    assert sorted(read) == ["0", "1"]
    assert [len(nodes) for nodes in read.values()] == [1, 1]
    assert read["0"] != read["1"]
    assert_runs_like_autograd(program, model, inputs)
