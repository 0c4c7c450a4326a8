"""The tensor-parallel collectives of one transformer layer, as the intra-op ILP chose them
(`planner/search/stage_ilp.py`): what the step-time model charges a layer instead of
Megatron-LM's layout under `--intra-op ilp`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class LayerCollective:
    """One collective a layer issues in its forward pass on a tensor-parallel group."""

    kind: str
    """all_reduce, all_gather, reduce_scatter or all_to_all."""
    bytes_per_token: float
    """Bytes of the full (unsharded) buffer per token of the micro-batch, in bf16."""


LayerCollectives = dict[int, tuple[LayerCollective, ...]]
"""Tensor-parallel degree -> the forward collectives of one layer on that group."""
