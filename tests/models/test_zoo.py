"""The built-in model zoo: published parameter counts, meta-device builds, tiny models that
run, are causal and trace into a training graph."""

from __future__ import annotations

import re

import pydantic
import pytest
import torch

from passes.trace import trace
from planner.models.config import TransformerConfig
from planner.models.presets import PRESETS, describe_presets, get_preset
from planner.models.transformer import apply_rotary, build_model, example_inputs, rotary_tables


def megatron_formula(config: TransformerConfig) -> float:
    """Narayanan et al. 2021: 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    layers, h = config.num_layers, config.hidden_size
    v, s = config.vocab_size, config.seq_length
    return 12 * layers * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("gpt3-175b", 174.6e9),  # Narayanan et al. 2021, Table 1
        ("gpt-1t", 1008.0e9),  # ibid.
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.6e9),
        ("llama3-405b", 405.9e9),
        ("mixtral-8x7b", 46.7e9),
        ("mixtral-8x22b", 141e9),
    ],
)
def test_parameter_count_matches_published(name: str, published: float) -> None:
    assert get_preset(name).num_parameters() == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt-1t"])
def test_parameter_count_matches_megatron_formula(name: str) -> None:
    config = get_preset(name)
    assert config.num_parameters() == pytest.approx(megatron_formula(config), rel=0.01)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_builds_on_meta_with_exact_count(name: str) -> None:
    config = PRESETS[name]
    model = build_model(config)
    params = list(model.parameters())
    assert all(p.device.type == "meta" for p in params)
    assert sum(p.numel() for p in params) == config.num_parameters()


def test_describe_presets_lists_every_preset() -> None:
    described = dict(describe_presets())
    assert list(described) == list(PRESETS)
    assert described["llama3-8b"] == PRESETS["llama3-8b"].num_parameters()


TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=16)
LLAMA_STYLE = dict(
    num_query_groups=2,
    ffn_hidden_size=96,
    norm="rmsnorm",
    activation="swiglu",
    position_embedding="rope",
    tie_embeddings=False,
    bias=False,
)
TINY_FAMILIES = {
    "gpt": TransformerConfig(**TINY),
    "llama": TransformerConfig(**TINY, **LLAMA_STYLE),
    "mixtral": TransformerConfig(**TINY, **LLAMA_STYLE, num_experts=4, moe_top_k=2),
}


@pytest.fixture(params=list(TINY_FAMILIES))
def tiny(request: pytest.FixtureRequest) -> tuple[TransformerConfig, torch.nn.Module]:
    torch.manual_seed(0)
    config = TINY_FAMILIES[request.param]
    return config, build_model(config, device="cpu")


def test_tiny_forward_shape_and_count(tiny: tuple[TransformerConfig, torch.nn.Module]) -> None:
    config, model = tiny
    ids = example_inputs(config, batch_size=2, device="cpu")
    assert model(ids).shape == (2, config.seq_length, config.vocab_size)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()


def test_tiny_is_causal(tiny: tuple[TransformerConfig, torch.nn.Module]) -> None:
    config, model = tiny
    ids = example_inputs(config, batch_size=1, device="cpu")
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % config.vocab_size
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])


# Tracing costs seconds per model, so llama is left out: every module it has (GQA, RoPE,
# RMSNorm, SwiGLU, untied head) is also in the mixtral trace. One block each, for the same
# reason: a second block adds no new op.
@pytest.mark.parametrize("family", ["gpt", "mixtral"])
def test_tiny_traces_with_every_gradient(family: str) -> None:
    config = TINY_FAMILIES[family].model_copy(update={"num_layers": 1})
    model = build_model(config, device="cpu")
    ids = example_inputs(config, batch_size=1, seq_length=4, device="cpu")
    program = trace(model, (ids,))
    assert set(program.gradients.values()) == {n for n, _ in model.named_parameters()}


def test_rotary_scores_depend_only_on_relative_position() -> None:
    q, k = torch.randn(8), torch.randn(8)
    like = torch.empty(0)
    rotary = rotary_tables(6, head_dim=8, base=10000, like=like)
    scores = apply_rotary(q.expand(6, 8), rotary) @ apply_rotary(k.expand(6, 8), rotary).T
    torch.testing.assert_close(scores[:-1, :-1], scores[1:, 1:])


def test_moe_routing_weights_keep_top_k() -> None:
    config = TINY_FAMILIES["mixtral"]
    moe = build_model(config, device="cpu").layers[0].mlp
    weights = moe.routing_weights(torch.randn(2, 5, config.hidden_size))
    assert ((weights > 0).sum(-1) == config.moe_top_k).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))


def test_ffn_and_positions_default_like_megatron() -> None:
    config = TransformerConfig(**TINY)
    assert config.ffn_hidden_size == 4 * config.hidden_size
    assert config.max_position_embeddings == config.seq_length


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (dict(hidden_size=66), "hidden_size (66) must be divisible by num_attention_heads (4)"),
        (dict(num_query_groups=3), "num_attention_heads (4) must be divisible by num_query_groups"),
        (dict(num_experts=2, moe_top_k=3), "moe_top_k (3) cannot exceed num_experts (2)"),
        (dict(max_position_embeddings=8), "seq_length (16) exceeds max_position_embeddings (8)"),
        (dict(hidden_size=12, num_attention_heads=4, position_embedding="rope"), "even head size"),
        (dict(norm="batchnorm"), "norm"),
        (dict(hiden_size=64), "hiden_size"),
    ],
)
def test_validation_names_the_bad_field(changes: dict, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(named)):
        TransformerConfig(**{**TINY, **changes})


def test_unknown_preset_suggests_closest() -> None:
    with pytest.raises(ValueError, match="did you mean 'llama3-70b'"):
        get_preset("llama3-70")


def test_get_preset_returns_a_copy() -> None:
    get_preset("gpt3-125m").num_layers = 1
    assert PRESETS["gpt3-125m"].num_layers == 12


def test_example_inputs_reject_sequences_past_the_position_table() -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        example_inputs(PRESETS["gpt3-125m"], batch_size=1, seq_length=4096)
