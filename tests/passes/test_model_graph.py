"""Tracing zoo models on the meta device, once per template, with exact per-layer figures."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from passes.model_graph import TRACED_BLOCKS, trace_model
from passes.trace import trace
from planner.models.sources import load_model

H, HEADS, SEQ, VOCAB = 512, 8, 64, 128
GPT = dict(num_layers=6, hidden_size=H, num_attention_heads=HEADS, seq_length=SEQ, vocab_size=VOCAB)


def layer_figures(graph) -> list[tuple]:
    return [
        (layer.name, layer.template, layer.parameters, layer.num_parameters, layer.flops,
         layer.saved_bytes)
        for layer in graph.layers
    ]


@pytest.fixture(scope="module")
def gpt():
    loaded = load_model("gpt", GPT)
    return loaded, trace_model(loaded.build, loaded.num_layers)


def test_six_blocks_traced_as_two_equal_a_full_trace(gpt) -> None:
    loaded, reduced = gpt
    full = trace_model(loaded.build, None)
    assert reduced.traced_depth == TRACED_BLOCKS and full.traced_depth is None
    assert [layer.name for layer in reduced.layers] == [
        "embedding", *(f"layers.{i}" for i in range(6)), "head"
    ]
    assert layer_figures(reduced) == layer_figures(full)
    assert reduced.num_parameters == loaded.config.num_parameters()


def test_nothing_is_allocated_and_attention_stays_fused(gpt) -> None:
    loaded, graph = gpt
    assert loaded.on_meta
    targets = {str(n.target) for n in graph.program.graph.nodes}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in targets
    assert "aten.bmm.default" not in targets  # not the unfused math form


def test_block_activations_are_korthikantis_without_dropout(gpt) -> None:
    """Saved per token per block: Korthikanti et al.'s 34h bytes (fp16) less the two
    dropout masks (2h), so 32h half-precision values = 64h bytes in fp32; flash attention
    keeps a logsumexp per head (4a bytes) instead of the 5as score bytes, and each of the
    two LayerNorms keeps a mean and a reciprocal std (16 bytes)."""
    _, graph = gpt
    block = graph.layers[1]
    assert block.saved_bytes / graph.tokens == 64 * H + 4 * HEADS + 16


def test_block_flops_are_megatrons_forward_count(gpt) -> None:
    """Forward FLOPs per token: 24h^2 for the four h x h projections and the 4h MLP, plus
    4sh for the full attention matrix (as Megatron-LM counts it); elementwise ops (one
    FLOP per element: GeLU, LayerNorm, residual adds, ~130h in all) add about 1% more."""
    _, graph = gpt
    expected = 24 * H * H + 4 * SEQ * H
    assert graph.layers[1].flops / graph.tokens == pytest.approx(expected, rel=0.02)


def test_tied_embedding_is_one_parameter_with_one_gradient(gpt) -> None:
    _, graph = gpt
    program = graph.program
    assert "lm_head.weight" not in program.parameters.values()
    assert list(program.gradients.values()).count("embed.weight") == 1
    owners = [layer.name for layer in graph.layers if "embed.weight" in layer.parameters]
    assert owners == ["embedding"]


class _WithUnusedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_a_parameter_forward_never_reads_is_traced_without_a_gradient() -> None:
    model = _WithUnusedLayer()
    program = trace(model, (torch.randn(2, 4),))
    assert sorted(program.parameters.values()) == [
        "unused.bias", "unused.weight", "used.bias", "used.weight"
    ]
    assert sorted(program.gradients.values()) == ["used.bias", "used.weight"]
    assert all(p.requires_grad for p in model.parameters())  # unfrozen afterwards


def test_a_model_that_cannot_be_rebuilt_is_traced_whole() -> None:
    loaded = load_model("demo:gpt")
    graph = trace_model(loaded.build, loaded.num_layers)
    assert loaded.num_layers is None and graph.traced_depth is None
