"""A transformer traced at reduced depth and described at full depth is the transformer
traced whole: the same layer cuts, parameters, FLOPs and bytes crossing every cut."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from passes.model_layers import REDUCED_BLOCKS, ModelLayers
from passes.stage_graph import block_cuts, forward_graph, micro_batch_inputs, on_meta_device
from planner.models.sources import load_model

SHAPE = {"num_layers": 7, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
         "vocab_size": 128}


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_reduced_trace_describes_the_full_model(family) -> None:
    loaded = load_model(family, SHAPE)
    full, reduced = loaded.build(None), loaded.build(REDUCED_BLOCKS)
    inputs = micro_batch_inputs(full.example_inputs, 2)
    forward = forward_graph(on_meta_device(full.model), inputs)
    cuts = block_cuts(forward, ends=True)
    whole = ModelLayers(forward, cuts, list(range(len(cuts) - 1)), [None] * (len(cuts) - 1))
    expanded = ModelLayers.expanded(
        forward_graph(on_meta_device(reduced.model), inputs), SHAPE["num_layers"])
    assert expanded is not None and expanded.reduced and not whole.reduced
    # The embedding, every block, the head and loss: a layer each.
    assert expanded.num_layers == whole.num_layers == SHAPE["num_layers"] + 2
    assert expanded.cuts == whole.cuts
    assert list(expanded.parameter_values()) == list(whole.parameter_values())
    assert set(expanded.parameter_values()) == {n for n, _ in full.model.named_parameters()}
    assert expanded.flops() == pytest.approx(whole.flops())
    assert ([expanded.cut_bytes(b) for b in range(10)]
            == [whole.cut_bytes(b) for b in range(10)])
    # Layer 6 is block 5, traced as block 2; layer 7, block 6, traced as the last, 3.
    assert expanded.fqn(6, "layers.2.mlp.fc1.weight") == "layers.5.mlp.fc1.weight"
    assert expanded.fqn(7, "layers.3.mlp.fc1.weight") == "layers.6.mlp.fc1.weight"
    assert expanded.fqn(8, "embed.weight") == "embed.weight"


class _Widening(nn.Module):
    """Blocks of growing width: no two alike."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8 * (i + 1), 8 * (i + 2)) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.sum()


def test_blocks_that_differ_are_not_expanded() -> None:
    forward = forward_graph(_Widening().to("meta"), (torch.empty(2, 8, device="meta"),))
    assert ModelLayers.expanded(forward, 12) is None
