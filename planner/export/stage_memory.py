"""What one GPU of each pipeline stage holds at its peak, by kind, for drawing a Plan
against the device: weights, gradients, optimizer state, activations, working buffers and
the memory outside the allocator, and what the allocator reserves beside them.

Each stage is priced by the predictor's own function (`cost_models.pipeline_memory.
stage_memory`, the one the plan's peak came from), at the plan's configuration and
stages; nothing is searched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.pipeline_memory import attention_backend, stage_memory, stage_parameters
from cost_models.transformer_ops import SCORE_FREE_ATTENTION
from planner.cluster import Cluster
from planner.export.plan_config import parallel_config, stage_layouts
from planner.models.config import TransformerConfig
from planner.plan import Plan


@dataclass(frozen=True)
class StagePeak:
    """Bytes one GPU of a stage holds at its peak, by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    working: float
    """Gathered weights, unsharded gradients, the loss's logits, a layer's gradients."""
    reserve: float
    """Outside the caching allocator: the CUDA context, communicator buffers."""
    reserved: float
    """What the caching allocator holds at the peak (allocated and its fragmentation)."""

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.working + self.reserve)


def stage_peaks(plan: Plan, model: TransformerConfig, cluster: Cluster) -> list[StagePeak]:
    """The peak of one GPU of each of `plan`'s stages (a training plan of `model` on
    `cluster`)."""
    parallel = parallel_config(plan)
    layouts = stage_layouts(plan)
    sequences = parallel.micro_batch_size * parallel.data
    flash = attention_backend(parallel, cluster.device.flash_attention) in SCORE_FREE_ATTENTION
    params = stage_parameters(model, layouts, parallel.expert)
    peaks = []
    for index, layout in enumerate(layouts):
        here = replace(parallel, tensor=layout.tensor, data=layout.data,
                       micro_batch_size=sequences // layout.data)
        peak = stage_memory(model, here, params[index], layout.layers, index, len(layouts),
                            parallel.num_micro_batches, flash)
        peaks.append(StagePeak(
            weights=peak.weights, gradients=peak.gradients, optimizer=peak.optimizer,
            activations=peak.activations, working=peak.transient, reserve=peak.reserve,
            reserved=peak.reserved,
        ))
    return peaks
