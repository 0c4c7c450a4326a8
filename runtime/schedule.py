"""A plan's pipeline schedule as a `torch.distributed.pipelining` schedule over this rank's
hand-built `PipelineStage`s.

gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B, interleaved -> ScheduleInterleaved1F1B over
the rank's virtual stages (stage c on pipeline rank c % pp, torch's and Megatron's order);
and torch's zero-bubble schedules: interleaved_zb -> ScheduleInterleavedZeroBubble (same
order), zbv -> ScheduleZBVZeroBubble (two stages per rank in V order); dualpipev ->
ScheduleDualPipeV (DeepSeek's DualPipeV: the same V, a forward of one chunk run with a
backward of the other; with no OVERLAP_F_B function registered torch runs the pair one
after the other, and its cool-down splits backwards into I and W). Zero-bubble
schedules write weight gradients by hand, which DDP's hooks never see (trap 1); data
parallelism here is FSDP2, whose schedules-aware hooks reduce them.
Every stage is given its input and output shapes (meta tensors; `stage_shapes`), so no
stage infers them by sending metadata at the first step, and the point-to-point traffic
is only activations forward and their gradients back (static shapes need example
tensors with requires_grad=True: trap 7 of the gloo notes).
Gradients are scaled by 1 / micro-batches (`scale_grads=True`), so a step's gradient is
the mean over the whole batch, as one process computes it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.distributed.pipelining import PipelineStage

from planner.vocabulary.schedules import SCHEDULE_TABLE

SCHEDULE_CLASSES = {name: getattr(pipelining, info.torch_class)
                    for name, info in SCHEDULE_TABLE.items()}
"""Each schedule's torch class, as `planner.vocabulary.schedules` names it."""
_MULTI_STAGE = tuple(SCHEDULE_CLASSES[name] for name, info in SCHEDULE_TABLE.items()
                     if info.multi_chunk)


def schedule_class(schedule: str, virtual_pipeline: int) -> type:
    """The torch schedule class a plan's schedule name maps to."""
    if schedule not in SCHEDULE_CLASSES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULE_CLASSES)}")
    cls = SCHEDULE_CLASSES[schedule]
    if (cls in _MULTI_STAGE) != (virtual_pipeline > 1):
        raise ValueError(
            f"schedule {schedule!r} with {virtual_pipeline} virtual stages per rank: the "
            f"interleaved and zero-bubble schedules need more than one, the others one"
        )
    return cls


def stage_shapes(
    index: int, num_stages: int, micro_batch_size: int, seq_length: int, hidden_size: int,
    vocab_size: int, sequence_shards: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta tensors of stage `index`'s input and output for one micro-batch: token ids in
    to the first stage, logits out of the last, hidden states (a 1/sequence_shards slice
    of the sequence under sequence parallelism) between."""
    local = seq_length // sequence_shards
    hidden = torch.empty(
        micro_batch_size, local, hidden_size, device="meta", requires_grad=True
    )
    if index == 0:
        inputs = torch.empty(micro_batch_size, seq_length, dtype=torch.long, device="meta")
    else:
        inputs = hidden
    if index == num_stages - 1:
        outputs = torch.empty(
            micro_batch_size, seq_length, vocab_size, device="meta", requires_grad=True
        )
    else:
        outputs = hidden
    return inputs, outputs


def build_schedule(
    modules: dict[int, nn.Module],
    shapes: dict[int, tuple[torch.Tensor, torch.Tensor]],
    num_stages: int,
    schedule: str,
    virtual_pipeline: int,
    num_micro_batches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    pp_group: dist.ProcessGroup,
    device: torch.device,
):
    """The schedule running this rank's stages (`modules`: stage index -> module, `shapes`:
    stage index -> example input and output, see `stage_shapes`)."""
    cls = schedule_class(schedule, virtual_pipeline)
    stages = [
        PipelineStage(
            module, index, num_stages, device, input_args=shapes[index][0],
            output_args=shapes[index][1], group=pp_group,
        )
        for index, module in sorted(modules.items())
    ]
    if cls in _MULTI_STAGE:
        return cls(stages, num_micro_batches, loss_fn=loss_fn, scale_grads=True)
    (stage,) = stages
    return cls(stage, num_micro_batches, loss_fn=loss_fn, scale_grads=True)
