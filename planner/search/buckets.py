"""Gradient buckets: the gradient all-reduces of a step, coalesced as DDP does.

Reducing each gradient on its own pays one collective latency per parameter; DDP and
Megatron flatten gradients into buckets and reduce each bucket with one collective
(Li et al., "PyTorch Distributed", VLDB 2020). Tessel does the same for every transfer
that only all-reduces (partial sums of gradients, and the loss), grouped by dtype and by
the mesh axes reduced over, in graph order, up to a size cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from passes.dtensor_rules import placement_str

# DDP's default bucket cap (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25).
BUCKET_CAP_BYTES = 25 * 2**20


@dataclass
class Bucket:
    members: list[str]
    """Parameter FQNs whose gradients share the bucket; 'loss' for the loss."""
    mesh_dims: list[list[int]]
    """One all-reduce per entry, over these mesh axes, in order."""
    dtype: str
    nbytes: int
    placements_before: list[str]
    placements_after: list[str]


def bucket_transfers(
    transfers: list, member_of: dict, dtype_of: dict, cap_bytes: int = BUCKET_CAP_BYTES
) -> tuple[list[Bucket], list]:
    """Split transfers into gradient buckets and the ones that stay individual.

    `member_of[transfer] -> name` and `dtype_of[transfer] -> torch.dtype` identify each
    bucketable transfer.
    """
    buckets: list[Bucket] = []
    open_bucket: dict[tuple, Bucket] = {}
    rest = []
    for t in transfers:
        if t not in member_of or not all(c.kind == "all_reduce" for c in t.collectives):
            rest.append(t)
            continue
        dims = [list(c.mesh_dims) for c in t.collectives]
        dtype: torch.dtype = dtype_of[t]
        key = (str(dtype), tuple(tuple(d) for d in dims))
        nbytes = t.collectives[0].nbytes
        bucket = open_bucket.get(key)
        if bucket is None or bucket.nbytes + nbytes > cap_bytes:
            bucket = Bucket([], dims, str(dtype).removeprefix("torch."), 0, [], [])
            open_bucket[key] = bucket
            buckets.append(bucket)
        bucket.members.append(member_of[t])
        bucket.nbytes += nbytes
        bucket.placements_before.append(placement_str(t.src))
        bucket.placements_after.append(placement_str(t.dst))
    return buckets, rest
