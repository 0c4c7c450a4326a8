"""Which nodes of identical blocks are tied: every op of an inner block, forward and
backward, has its partner in the other blocks, and a node offered other strategies in one
block is tied with the blocks that match it."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from passes.dtensor_rules import fake_mesh
from passes.strategies import enumerate_strategies
from passes.trace import trace
from planner.search.symmetry import identical_block_groups
from planner.vocabulary.cluster import Cluster
from tests.planner.search.test_presolve import BlockStack


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return x + self.down(torch.relu(self.up(x)))


def _traced():
    program = trace(BlockStack(_Block, depth=3, width=16, outputs=4), (torch.randn(4, 8, 16),))
    return program, enumerate_strategies(program, fake_mesh((2, 2)), Cluster.load("cpu").device)


def _block_nodes(program, table, block: str) -> list[str]:
    return [n for n in table if (program.parameters.get(n) or program.nodes[n].meta.get(
        "tessel_module") or "").startswith(block + ".")]


def test_every_op_of_an_inner_block_forward_and_backward_is_tied() -> None:
    """The backward is attributed by the forward op autograd made it for, so an inner
    block's backward ops pair up with the other blocks' as its forward ops do. (The outer
    blocks differ a little: the last one's backward starts from the head's gradient,
    which offers other placements.)"""
    program, table = _traced()
    groups = identical_block_groups(program, table)
    tied = {name for group in groups for name in group}
    nodes = _block_nodes(program, table, "blocks.1")
    assert {program.nodes[n].meta["tessel_phase"] for n in nodes} == {"forward", "backward"}
    assert set(nodes) <= tied
    # Each group: one member per block, in block order.
    for group in groups:
        blocks = [program.nodes[n].meta.get("tessel_module") or program.parameters[n]
                  for n in group]
        assert [b.split(".")[1] for b in blocks] == sorted({b.split(".")[1] for b in blocks})


def test_a_node_with_other_strategies_in_one_block_is_tied_in_the_others() -> None:
    program, table = _traced()
    before = identical_block_groups(program, table)
    *partners, odd = next(g for g in before if len(g) == 3)  # its member in blocks.2
    table[odd] = replace(table[odd], strategies=table[odd].strategies[:-1])
    after = identical_block_groups(program, table)
    assert partners in after and not any(odd in g for g in after)
    assert len(after) == len(before)
