"""The kinds of block a model is made of, each as a model of that kind alone.

DeepSeek-V3 puts three dense layers before 58 MoE layers, GPT-OSS alternates windowed and
full attention: a cost per layer is a cost per kind of layer. Each kind is priced on
`TransformerConfig.for_layer(kind)`, a model whose every block is of that kind, so the
per-layer cost models (`transformer_ops`, `saved_activations`, `training_collectives`)
read one uniform layer as before.
"""

from __future__ import annotations

from planner.models.config import TransformerConfig

_VARIANTS: dict[int, tuple[TransformerConfig, list[tuple[TransformerConfig, float]]]] = {}
"""`layer_variants` by model id (the model held, so its id stays its own); models are
copied when they change, never changed in place. Bounded like step_time's memo."""
MAX_MEMO = 10_000


def layer_variants(model: TransformerConfig) -> list[tuple[TransformerConfig, float]]:
    """(model of one kind, share of the `num_layers` blocks of that kind) for each kind of
    block `model` has, in order of first appearance; `[(model, 1.0)]` where all blocks
    are alike (the same object, so memos keyed on it keep working)."""
    found = _VARIANTS.get(id(model))
    if found is not None and found[0] is model:
        return found[1]
    counts = model.kind_counts()
    if len(counts) == 1:
        variants = [(model, 1.0)]
    else:
        variants = [(model.for_layer(kind), count / model.num_layers)
                    for kind, count in counts]
    if len(_VARIANTS) > MAX_MEMO:
        _VARIANTS.clear()
    _VARIANTS[id(model)] = (model, variants)
    return variants

