"""planner.models.demo: output shapes, structure the planner relies on, and causality."""

from __future__ import annotations

import torch
from torch import nn

from planner.models.demo import DEMOS, GPT, MLP, gpt, mlp


def test_registry() -> None:
    assert DEMOS == {"mlp": mlp, "gpt": gpt}


def test_mlp_shapes_and_names() -> None:
    torch.manual_seed(0)
    model, (x,) = mlp(batch=4, in_features=16, hidden=32, out_features=8)
    assert isinstance(model, MLP)
    assert x.shape == (4, 16)
    assert model(x).shape == (4, 8)
    assert [name for name, _ in model.named_children()] == ["fc1", "fc2"]


def test_mlp_defaults() -> None:
    model, (x,) = mlp()
    assert x.shape == (8, 1024)
    assert model.fc1.out_features == 4096
    assert model(x).shape == (8, 1024)


def test_gpt_shapes() -> None:
    torch.manual_seed(0)
    model, (idx,) = gpt(batch=3, seq_len=8, vocab=50, hidden=32, heads=2, layers=3)
    assert isinstance(model, GPT)
    assert idx.shape == (3, 8) and idx.dtype == torch.long
    assert int(idx.max()) < 50
    assert model(idx).shape == (3, 8, 50)
    assert len(model.blocks) == 3


def test_gpt_has_separate_projections_and_untied_head() -> None:
    model, _ = gpt()
    names = {name for name, _ in model.named_modules()}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"blocks.0.attn.{proj}" in names
    assert {"blocks.1.ln1", "blocks.1.ln2", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"} <= names
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.bias is None
    assert model.lm_head.weight is not model.wte.weight
    assert model.blocks[0].mlp.fc1.out_features == 4 * 64


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model, (idx,) = gpt()
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])


def test_factories_are_deterministic_given_seed() -> None:
    for factory in DEMOS.values():
        torch.manual_seed(0)
        model_a, inputs_a = factory()
        torch.manual_seed(0)
        model_b, inputs_b = factory()
        assert all(torch.equal(a, b) for a, b in zip(inputs_a, inputs_b))
        for a, b in zip(model_a.state_dict().values(), model_b.state_dict().values()):
            assert torch.equal(a, b)
