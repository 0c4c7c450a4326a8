"""tests/models/hf_tiny.py: the tiny HF models load as model specs and trace for training.

The tracing test guards the config choices documented in hf_tiny (untied embeddings,
SDPA attention): if a torch or transformers upgrade changes them, it fails here
rather than deep inside the planner.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from planner.model_spec import load_model  # noqa: E402

HF_TINY = Path(__file__).with_name("hf_tiny.py")


class _Loss(nn.Module):
    """``loss_fn(model(x), x)`` as one module, the shape the planner exports."""

    def __init__(self, model: nn.Module, loss_fn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(x), x)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_loads_and_runs(name: str) -> None:
    loaded = load_model(f"{HF_TINY}:{name}")
    (ids,) = loaded.example_inputs
    assert ids.shape == (2, 16)
    logits = loaded.model(ids)
    assert logits.shape == (2, 16, 128)
    assert loaded.loss_fn(logits, ids).dim() == 0


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_exports_forward_and_backward(name: str) -> None:
    from torch.export.experimental import _export_forward_backward

    loaded = load_model(f"{HF_TINY}:{name}")
    torch.export.export(loaded.model, loaded.example_inputs, strict=False)
    exported = torch.export.export(
        _Loss(loaded.model, loaded.loss_fn), loaded.example_inputs, strict=False
    )
    joint = _export_forward_backward(exported)
    kinds = {spec.kind.name for spec in joint.graph_signature.output_specs}
    assert "GRADIENT_TO_PARAMETER" in kinds
