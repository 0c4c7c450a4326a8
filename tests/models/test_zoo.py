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
from planner.models.transformer import (
    apply_rotary,
    build_model,
    example_inputs,
    lm_loss,
    rotary_tables,
)


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


# The 2025 MoE shapes, tiny: DeepSeek-V3's (multi-latent attention, a dense first layer,
# a shared expert, 8 fine-grained experts of their own width, sigmoid routing limited to 2
# of 4 groups, one MTP layer), Qwen3-MoE's (head width apart from hidden / heads, QK
# RMSNorm, grouped keys) and GPT-OSS's (biases, attention sinks, a window on alternate
# layers).
_MOE_FORM = dict(norm="rmsnorm", activation="swiglu", position_embedding="rope",
                 tie_embeddings=False, bias=False)
TINY_MOE = {
    "deepseek-v3": TransformerConfig(
        **TINY, **_MOE_FORM, ffn_hidden_size=96, multi_latent_attention=True,
        q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4,
        v_head_dim=8, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=16,
        moe_shared_expert_intermediate_size=16, moe_layer_freq=[0, 1],
        moe_router_score_function="sigmoid", moe_router_num_groups=4,
        moe_router_group_topk=2, mtp_num_layers=1),
    "deepseek-v2-lite": TransformerConfig(  # queries straight from the hidden state
        **TINY, **_MOE_FORM, multi_latent_attention=True, kv_lora_rank=16, qk_head_dim=8,
        qk_pos_emb_head_dim=4, v_head_dim=8, num_experts=4, moe_top_k=2,
        moe_router_score_function="sigmoid", mtp_num_layers=2),
    "qwen3-moe": TransformerConfig(
        **TINY, **_MOE_FORM, num_query_groups=2, kv_channels=24, qk_layernorm=True,
        ffn_hidden_size=96, moe_ffn_hidden_size=32, num_experts=8, moe_top_k=2),
    "gpt-oss": TransformerConfig(
        **{**TINY, "seq_length": 12}, **{**_MOE_FORM, "bias": True}, num_query_groups=2,
        kv_channels=8, ffn_hidden_size=64, num_experts=4, moe_top_k=2,
        softmax_type="learnable", window_size=3, window_attn_skip_freq=2),
}


@pytest.mark.parametrize("name", list(TINY_MOE))
def test_tiny_moe_shapes_count_run_backward_and_are_causal(name: str) -> None:
    torch.manual_seed(0)
    config = TINY_MOE[name]
    model = build_model(config, device="cpu")
    with torch.no_grad():
        for p in model.parameters():  # zero-initialised sinks would hide their effect
            p.add_(torch.randn_like(p) * 0.02)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()
    ids = example_inputs(config, batch_size=2, device="cpu")
    targets = example_inputs(config, batch_size=2, device="cpu")
    logits = model(ids)
    assert logits.shape == (2, config.seq_length, config.vocab_size)
    output = model(ids, mtp_targets=targets)
    torch.testing.assert_close(output[0] if config.mtp_num_layers else output, logits)
    lm_loss(output, targets).backward()
    # Every parameter trains (each expert is picked by some token; MTP layers too).
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % config.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :-1], model(changed)[:, :-1])


def test_tiny_moe_layer_kinds_are_built_per_layer() -> None:
    from planner.models.transformer import MLAttention, MoEMLP, MTPLayer

    model = build_model(TINY_MOE["deepseek-v3"], device="meta")
    assert [isinstance(b.mlp, MoEMLP) for b in model.layers] == [False, True]
    assert all(isinstance(b.attn, MLAttention) for b in model.layers)
    assert isinstance(model.mtp[0], MTPLayer) and isinstance(model.mtp[0].block.mlp, MoEMLP)
    assert model.layers[1].mlp.experts[0].gate_proj.weight.shape == (16, 64)
    assert model.layers[1].mlp.shared_experts.gate_proj.weight.shape == (16, 64)
    assert model.layers[0].mlp.gate_proj.weight.shape == (96, 64)
    oss = build_model(TINY_MOE["gpt-oss"], device="meta")
    assert [b.attn.window for b in oss.layers] == [3, None]  # every 2nd layer full
    assert oss.layers[0].attn.q_proj.weight.shape == (32, 64)  # 4 heads of kv_channels 8


def test_a_sliding_window_sees_exactly_its_window() -> None:
    # Layer 0 of the tiny GPT-OSS: a query sees itself and 3 earlier tokens, no more.
    config = TINY_MOE["gpt-oss"].model_copy(update={"num_layers": 1,
                                                    "window_attn_skip_freq": None})
    torch.manual_seed(0)
    model = build_model(config, device="cpu")
    ids = example_inputs(config, batch_size=1, device="cpu")
    changed = ids.clone()
    changed[0, 4] = (ids[0, 4] + 1) % config.vocab_size
    with torch.no_grad():
        moved = (model(ids) - model(changed)).abs().amax(-1)[0]
    assert (moved[:4] == 0).all() and (moved[4:8] > 0).all() and (moved[8:] == 0).all()


def test_attention_sinks_join_the_softmax_denominator() -> None:
    from planner.models.transformer import attention_core, attention_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0])
    mask = attention_mask(torch.arange(5), 5, None)
    got = attention_core(q, k, v, mask, sinks)
    scores = (q @ k.transpose(-1, -2) / 2).masked_fill(~mask, float("-inf"))
    weights = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sinks.exp()[:, None, None])
    torch.testing.assert_close(got, weights @ v)
    torch.testing.assert_close(attention_core(q, k, v, mask), attention_core(q, k, v))


def test_group_limited_sigmoid_routing_is_deepseek_v3s() -> None:
    """The tiny DeepSeek-V3's routing equals transformers' DeepseekV3TopkRouter (no score
    correction bias, no scaling) on the same router weight."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = TINY_MOE["deepseek-v3"]
    torch.manual_seed(0)
    moe = build_model(config, device="cpu").layers[1].mlp
    hf = DeepseekV3TopkRouter(DeepseekV3Config(
        hidden_size=64, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=1.0))
    with torch.no_grad():
        hf.weight.copy_(moe.router.weight)
    x = torch.randn(3, 7, 64)
    _, hf_weights, hf_index = hf(x)
    top, index = moe.route(x)
    order, hf_order = index.reshape(-1, 2).sort(-1), hf_index.sort(-1)
    assert torch.equal(order.values, hf_order.values)
    torch.testing.assert_close(top.reshape(-1, 2).gather(1, order.indices),
                               hf_weights.gather(1, hf_order.indices))
    weights = moe.routing_weights(x)
    assert ((weights > 0).sum(-1) == 2).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 7))


def test_forced_balance_gives_every_expert_the_same_tokens() -> None:
    from planner.models.transformer import forced_experts

    index = forced_experts(batch=2, seq=16, top_k=2, num_experts=8)
    assert torch.bincount(index.reshape(-1), minlength=8).tolist() == [8] * 8
    config = TINY_MOE["deepseek-v3"]
    moe = build_model(config, device="cpu").layers[1].mlp
    moe.force_balance = True
    top, chosen = moe.route(torch.randn(2, 16, 64))
    assert torch.equal(chosen, index)
    torch.testing.assert_close(top.sum(-1), torch.ones(2, 16))


def test_mtp_loss_is_added_scaled_as_megatron_does() -> None:
    from planner.models.transformer import MTP_LOSS_SCALING_FACTOR, mtp_depth_inputs

    config = TINY_MOE["deepseek-v2-lite"]  # two MTP depths
    torch.manual_seed(0)
    model = build_model(config, device="cpu")
    ids, targets = (example_inputs(config, batch_size=2, device="cpu") for _ in range(2))
    logits, mtp = model(ids, mtp_targets=targets)
    main = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), targets.reshape(-1))
    torch.testing.assert_close(lm_loss((logits, mtp), targets),
                               main + MTP_LOSS_SCALING_FACTOR * mtp)
    embedded, labels = mtp_depth_inputs(targets, 2)
    assert torch.equal(embedded[:, :14], targets[:, 1:15])
    assert torch.equal(labels[:, :14], targets[:, 2:])


@pytest.mark.parametrize("name", [*TINY_MOE, "mixtral", "gpt"])
def test_the_plans_parameter_listing_is_the_zoo_models(name: str) -> None:
    """`cost_models.stage_parameters.chunk_parameters` (what a Plan's placements and held
    bytes come from) names every parameter the zoo builds, with its shape."""
    from cost_models.stage_parameters import chunk_parameters

    config = {**TINY_MOE, **TINY_FAMILIES}[name]
    listed = {p.name: p.shape for p in chunk_parameters(config, (0, config.num_layers),
                                                         True, True)}
    built = {n: tuple(p.shape) for n, p in build_model(config).named_parameters()}
    assert listed == built
