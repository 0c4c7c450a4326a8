"""A plan's pipeline schedule as a `torch.distributed.pipelining` schedule over this rank's
hand-built `PipelineStage`s.

gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B, interleaved -> ScheduleInterleaved1F1B over
the rank's virtual stages (stage c on pipeline rank c % pp, torch's and Megatron's order).
Shapes between stages are inferred at the first step (no example tensors), which also
covers sequence-parallel activations whose local sequence length is s / tp.
Gradients are scaled by 1 / micro-batches (`scale_grads=True`), so a step's gradient is
the mean over the whole batch, as one process computes it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
}


def schedule_class(schedule: str, virtual_pipeline: int) -> type:
    """The torch schedule class a plan's schedule name maps to."""
    if schedule not in SCHEDULE_CLASSES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULE_CLASSES)}")
    if (schedule == "interleaved") != (virtual_pipeline > 1):
        raise ValueError(
            f"schedule {schedule!r} with {virtual_pipeline} virtual stages per rank: the "
            f"interleaved schedule needs more than one, the others exactly one"
        )
    return SCHEDULE_CLASSES[schedule]


def build_schedule(
    modules: dict[int, nn.Module],
    num_stages: int,
    schedule: str,
    virtual_pipeline: int,
    num_micro_batches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    pp_group: dist.ProcessGroup,
    device: torch.device,
):
    """The schedule running this rank's stages (`modules`: stage index -> module)."""
    cls = schedule_class(schedule, virtual_pipeline)
    stages = [
        PipelineStage(module, index, num_stages, device, group=pp_group)
        for index, module in sorted(modules.items())
    ]
    if cls is ScheduleInterleaved1F1B:
        return cls(stages, num_micro_batches, loss_fn=loss_fn, scale_grads=True)
    (stage,) = stages
    return cls(stage, num_micro_batches, loss_fn=loss_fn, scale_grads=True)
