"""What one GPU of each pipeline stage holds at its peak: weights, gradients, optimizer
state, activations and the framework's reserve, for drawing a Plan against the device.

The model state is the plan's own (`Stage.memory`, counted over the rank's shards). A Plan
does not record activations per stage, so they are predicted again from its configuration
with `cost_models.memory`, as the step-time model does for the plan's peak: the layers'
activations times the micro-batches in flight under the schedule, the output layer's on
the last stage, and under full recomputation one checkpointed group rebuilt at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models import memory
from cost_models.pipeline_memory import attention_backend, stage_activation_bytes
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
    reserve: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.reserve


def stage_peaks(plan: Plan, model: TransformerConfig, cluster: Cluster) -> list[StagePeak]:
    """The peak of one GPU of each of `plan`'s stages (a training plan of `model` on
    `cluster`)."""
    parallel = parallel_config(plan)
    layouts = stage_layouts(plan)
    sequences = parallel.micro_batch_size * parallel.data
    flash = attention_backend(parallel, cluster.device.flash_attention) in SCORE_FREE_ATTENTION
    peaks = []
    for index, (stage, layout) in enumerate(zip(plan.stages, layouts)):
        if stage.memory is None:
            raise ValueError(f"stage {index} of the plan records no memory")
        here = replace(parallel, tensor=layout.tensor, data=layout.data,
                       micro_batch_size=sequences // layout.data)
        peaks.append(StagePeak(
            weights=stage.memory.parameters_bytes, gradients=stage.memory.gradients_bytes,
            optimizer=stage.memory.optimizer_bytes,
            activations=stage_activation_bytes(model, here, layout.layers, index,
                                               len(layouts), parallel.num_micro_batches,
                                               flash),
            reserve=memory.FRAMEWORK_RESERVE_BYTES,
        ))
    return peaks
