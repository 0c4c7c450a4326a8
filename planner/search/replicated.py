"""Why the intra-op ILP left a step replicated, in its own prices.

A plan in which every rank computes the whole step (every value replicated, no collective)
is the right answer when splitting the work saves less than the communication it costs: on
a small model each operator's time is mostly its fixed cost, which no sharding divides,
while data parallelism still all-reduces every gradient. `replicated_reason` says so with
the two numbers, from the same strategy table and collective prices the ILP chose by: the
most any sharding could save (each node at its cheapest strategy: a lower bound on the
compute of every plan) and data parallelism's gradient all-reduce over the whole mesh, in
DDP's 25 MiB buckets as `planner.search.buckets` coalesces them.
"""

from __future__ import annotations

import math

from torch.distributed.tensor import Replicate

from passes.dtensor_rules import Collective
from passes.program import TracedProgram
from passes.strategies import NodeStrategies
from planner.search.buckets import BUCKET_CAP_BYTES
from planner.search.move_prices import CommModel

SMALL_SAVING = 0.1
"""A saving below this fraction of the compute is put down to the operators' fixed costs."""


def is_replicated(table: dict[str, NodeStrategies], choices: dict[str, int]) -> bool:
    """Whether every node's chosen strategy keeps every value whole on every rank."""
    return all(
        placements is None or all(isinstance(p, Replicate) for p in placements)
        for node, strategies in table.items()
        for placements in strategies.strategies[choices[node]].outputs
    )


def replicated_reason(
    program: TracedProgram, table: dict[str, NodeStrategies], choices: dict[str, int],
    compute_s: float, communication_s: float, comm: CommModel,
) -> str:
    """One line on why the chosen plan is replicated, with the numbers; '' where it is not
    (or the mesh is one device, where there is nothing to split)."""
    ranks = math.prod(comm.mesh.shape)
    if ranks == 1 or communication_s > 0 or not is_replicated(table, choices):
        return ""
    floor = sum(min(s.compute_s for s in strategies.strategies)
                for strategies in table.values())
    saved = max(compute_s - floor, 0.0)
    gradient_bytes = sum(_nbytes(program, node) for node in program.parameters)
    axes = tuple(range(comm.mesh.ndim))
    buckets = max(1, math.ceil(gradient_bytes / BUCKET_CAP_BYTES))
    sync = sum(comm.time(Collective("all_reduce", axes, size))
               for size in _bucket_sizes(gradient_bytes, buckets))
    why = " (each operator's fixed cost dominates at this size)" \
        if saved < SMALL_SAVING * compute_s else ""
    return (f"replicated: each of the {ranks} ranks computes the whole step, as splitting "
            f"its operators saves at most {saved * 1e3:.3f} of their {compute_s * 1e3:.3f} ms "
            f"per micro-batch{why}, while data parallelism's gradient all-reduce alone costs "
            f"{sync * 1e3:.3f} ms per step ({gradient_bytes:,} B in {buckets} "
            f"bucket{'s' if buckets > 1 else ''})")


def _nbytes(program: TracedProgram, node: str) -> int:
    value = program.nodes[node].meta["val"]
    return value.numel() * value.element_size()


def _bucket_sizes(total: int, buckets: int) -> list[int]:
    """`total` bytes as DDP fills `buckets` buckets: full ones, then the rest."""
    sizes = [BUCKET_CAP_BYTES] * (buckets - 1)
    return sizes + [total - sum(sizes)]
