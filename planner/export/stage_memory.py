"""What one GPU of each pipeline stage holds at its peak: weights, gradients, optimizer
state, activations and the framework's reserve, for drawing a Plan against the device.

The model state is the plan's own (`Stage.memory`, counted over the rank's shards). A Plan
does not record activations per stage, so they are predicted again from its configuration
with `cost_models.memory`, as the step-time model does for the plan's peak: the layers'
activations times the micro-batches in flight under the schedule, the output layer's on
the last stage, and under full recomputation one checkpointed group rebuilt at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cost_models import memory
from cost_models.step_time import attention_backend, recomputed_layers
from cost_models.transformer_ops import SCORE_FREE_ATTENTION
from planner.cluster import Cluster
from planner.export.plan_config import parallel_config, stage_layouts
from planner.models.config import TransformerConfig
from planner.parallel import ParallelConfig
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
            activations=_activations(model, parallel, here, layout.layers, index,
                                     len(layouts), flash),
            reserve=memory.FRAMEWORK_RESERVE_BYTES,
        ))
    return peaks


def _activations(model: TransformerConfig, parallel: ParallelConfig, here: ParallelConfig,
                 layers: int, index: int, num_stages: int, flash: bool) -> float:
    """Activations stage `index` keeps at its peak, one GPU of its mesh (`here`)."""
    seq = math.ceil(model.seq_length / here.context)

    def kept(recompute: str) -> float:
        return memory.activation_bytes_per_layer(
            seq, here.micro_batch_size, model.hidden_size, model.num_attention_heads,
            here.tensor, here.sequence_parallel, recompute, flash, here.precision == "fp8",
        )

    per_layer, extra = kept(here.recompute), 0.0
    if here.recompute == "full":
        # Checkpointed layers keep their input, the others (block method) everything;
        # backward rebuilds one checkpointed group at a time.
        replayed = recomputed_layers(parallel, layers)
        group = here.recompute_num_layers if here.recompute_method == "uniform" else 1
        per_layer = (replayed * kept("full") / group + (layers - replayed) * kept("none")) \
            / max(layers, 1)
        extra += min(group, layers) * kept("none")
    in_flight = memory.in_flight_micro_batches(parallel.schedule, num_stages, index,
                                               parallel.num_micro_batches,
                                               parallel.virtual_pipeline)
    if index == num_stages - 1:
        extra += memory.output_layer_activation_bytes(seq, here.micro_batch_size,
                                                      model.hidden_size, model.vocab_size,
                                                      here.tensor)
    return per_layer * layers * in_flight + extra
