"""Layers that do not divide over the pipeline are planned as Megatron-LM splits them."""

from __future__ import annotations

from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.search.megatron_space import search_megatron


def test_the_search_plans_126_layers_on_16_stages() -> None:
    # Llama 3 405B: 126 layers on 16 stages, the first and last one layer short (the
    # embedding and the loss take their place), as the Llama 3 paper ran it.
    model = get_preset("llama3-405b").model_copy(update={"seq_length": 8192})
    cluster = Cluster.load("dgx-h100").with_devices(16384)
    result = search_megatron(model, cluster, 2048, FixedKnobs(pipeline=16, tensor=8))
    assert result.ranked
    best, prediction = result.ranked[0]
    assert best.layers_per_stage == (7,) + (8,) * 14 + (7,)
    assert prediction.fits
