"""Layers and layer templates of traced models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from passes.layers import find_layers
from passes.trace import trace
from planner.models import demo

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
import hf_tiny  # noqa: E402


MODELS = {
    "demo:gpt": (lambda: demo.gpt(layers=4), "blocks", 16),
    "hf:gpt2": (lambda: hf_tiny.gpt2(layers=4)[:2], "hf_model.transformer.h", 12),
    "hf:llama": (
        lambda: hf_tiny.llama(layers=4, key_value_heads=2)[:2], "hf_model.model.layers", 9
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_decoder_is_embedding_four_identical_blocks_and_head(name: str) -> None:
    factory, prefix, params_per_block = MODELS[name]
    torch.manual_seed(0)
    model, inputs = factory()
    layers = find_layers(trace(model, inputs))
    assert [layer.name for layer in layers] == [
        "embedding", *(f"{prefix}.{i}" for i in range(4)), "head"
    ]
    blocks = layers[1:-1]
    assert len({b.template for b in blocks}) == 1  # one template, four uses
    assert layers[0].template != blocks[0].template != layers[-1].template
    assert all(len(b.parameters) == params_per_block for b in blocks)
    assert all(p.startswith(b.name + ".") for b in blocks for p in b.parameters)
    owned = [p for layer in layers for p in layer.parameters]
    assert sorted(owned) == sorted(n for n, _ in model.named_parameters())  # each exactly once
    assert blocks[0].flops == pytest.approx(blocks[3].flops)


def test_model_without_repeated_blocks_is_cut_by_flops() -> None:
    torch.manual_seed(0)
    model, inputs = demo.mlp(batch=8, in_features=32, hidden=64, out_features=16)
    program = trace(model, inputs)
    layers = find_layers(program, balanced_layers=2)
    assert [layer.name for layer in layers] == ["layer.0", "layer.1"]
    forward = [
        n.name for n in program.graph.nodes
        if n.op == "call_function" and n.meta.get("tessel_phase") == "forward"
        and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    assert [n for layer in layers for n in layer.nodes] == forward  # contiguous, complete
    # fc1 (2*8*32*64 FLOPs) and fc2 (2*8*64*16) land in different layers.
    assert layers[0].parameters == ["fc1.bias", "fc1.weight"]
    assert layers[1].parameters == ["fc2.bias", "fc2.weight"]
