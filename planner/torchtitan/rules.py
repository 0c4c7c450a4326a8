"""How TorchTitan 0.2 runs data parallelism on a layout: one rule for the search (which
prices only what TorchTitan runs), the exporter (which writes only that) and the job-config
reader (which reads it back), so that a plan's TOML predicts as the plan did."""

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
