"""How TorchTitan runs data parallelism on a layout and splits a model into pipeline parts:
one rule for the search (which prices only what TorchTitan runs), the exporter (which
writes only that) and the job-config reader (which reads it back), so that a plan's config
predicts as the plan did."""

from __future__ import annotations

FSDP = 3
"""FSDP2's fully_shard: parameters, gradients and optimizer state sharded (ZeRO-3)."""
DDP = 0
"""torch's replicate (DDP): nothing sharded (ZeRO-0)."""


def zero_stages(tensor: int, context: int, pipeline: int, data: int) -> tuple[int, ...]:
    """The ZeRO stages TorchTitan can run a (tensor, context, pipeline, data) layout with
    (`parallelize_llama`): FSDP2 over the data x context ranks wherever they are more than
    one (`ParallelDims.fsdp_enabled`); DDP as well where data parallelism is all there is
    (its DDP composes with nothing else); neither on one replica without context
    parallelism."""
    if data * context == 1:
        return (DDP,)
    return (DDP, FSDP) if tensor == pipeline == context == 1 else (FSDP,)


def part_layers(num_layers: int, parts: int, first: int = 1, last: int = 1) -> list[int] | None:
    """Transformer blocks of each model part as TorchTitan generates them
    (torchtitan/distributed/pipeline_parallel.py, _generate_llm_fqn_per_model_part): the
    embedding weighs `first` blocks and the norm and output `last` (its defaults,
    pipeline_parallel_first/last_stage_less_layers), the weighted blocks split evenly with
    the first parts one more where they do not divide, blocks handed out in order. None
    where TorchTitan refuses the split (a part below its weights); a part may come out
    empty where blocks run out."""
    if parts == 1:
        return [num_layers]
    each, extra = divmod(num_layers + first + last, parts)
    if each == 0 or first > each or last > each:
        return None
    counts, left = [], num_layers
    for part in range(parts):
        size = each + (part < extra) - (first if part == 0 else last if part == parts - 1
                                        else 0)
        counts.append(min(size, left))
        left -= counts[-1]
    return counts


def rank_of_part(part: int, pipeline: int, v_shaped: bool) -> int:
    """The pipeline rank that runs model part `part`: part % pipeline (pipeline_module_
    split's "loop" style), or in V order under DualPipeV ("v" style: rank r holds parts r
    and 2 pipeline - 1 - r)."""
    return 2 * pipeline - 1 - part if v_shaped and part >= pipeline else part % pipeline
