"""tests/models/hf_tiny.py: the tiny HF models load as model specs and trace for training.

The tracing test guards the config choices documented in hf_tiny (untied embeddings,
SDPA attention): if a torch or transformers upgrade changes them, it fails here
rather than deep inside the planner.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from planner.models.sources import load_model  # noqa: E402

HF_TINY = Path(__file__).with_name("hf_tiny.py")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_loads_and_runs(name: str) -> None:
    loaded = load_model(f"{HF_TINY}:{name}")
    (ids,) = loaded.example_inputs
    assert ids.shape == (2, 16)
    logits = loaded.model(ids)
    assert logits.shape == (2, 16, 128)
    assert loaded.loss_fn(logits, ids).dim() == 0


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_traces_for_training(name: str) -> None:
    from passes.trace import trace

    loaded = load_model(f"{HF_TINY}:{name}")
    program = trace(loaded.model, loaded.example_inputs, loaded.loss_fn)
    assert program.method == "aot_autograd"
    names = {n for n, _ in loaded.model.named_parameters()}
    assert set(program.parameters.values()) == names
    assert set(program.gradients.values()) == names
    fused = [
        n for n in program.graph.nodes
        if n.target is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    ]
    assert len(fused) == 2  # attention stays one op per layer, so its heads can be split
