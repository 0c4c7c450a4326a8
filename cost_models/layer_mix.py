"""The kinds of block a model is made of, each as a model of that kind alone.

DeepSeek-V3 puts three dense layers before 58 MoE layers, GPT-OSS alternates windowed and
full attention: a cost per layer is a cost per kind of layer. Each kind is priced on
`TransformerConfig.for_layer(kind)`, a model whose every block is of that kind, so the
per-layer cost models (`transformer_ops`, `saved_activations`, `training_collectives`)
read one uniform layer as before.
"""

from __future__ import annotations

from cost_models.identity_memo import IdentityMemo
from planner.models.config import TransformerConfig

_VARIANTS: IdentityMemo[list[tuple[TransformerConfig, float]]] = IdentityMemo(10_000)
"""`layer_variants` by model."""


def layer_variants(model: TransformerConfig) -> list[tuple[TransformerConfig, float]]:
    """(model of one kind, share of the `num_layers` blocks of that kind) for each kind of
    block `model` has, in order of first appearance; `[(model, 1.0)]` where all blocks
    are alike (the same object, so memos keyed on it keep working)."""
    return _VARIANTS.get((model,), (), lambda: _layer_variants(model))


def _layer_variants(model: TransformerConfig) -> list[tuple[TransformerConfig, float]]:
    """`layer_variants`, made."""
    counts = model.kind_counts()
    if len(counts) == 1:
        return [(model, 1.0)]
    return [(model.for_layer(kind), count / model.num_layers) for kind, count in counts]

