"""The fabric above and inside a scale-up domain, as numbers: which tiers a group of ranks
crosses and what link that leaves it, and how much of a torus it spans.

A cluster file may give its scale-out fabric as tiers, lowest first (`Cluster.tiers`:
leaf or rail group, spine, WAN), each joining `devices` devices at `bandwidth_gbs` per GPU,
`latency_us` and `oversubscription`; and its scale-up domain as a torus (`Cluster.torus`:
a TPU slice's ICI). Mesh groups are aligned blocks of `stride * size` consecutive ranks
(`Cluster.spans_domains`), so the block's extent says which units hold it. These are pure
functions of the cluster's fields; `Cluster` wraps them.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence


class TierLike(Protocol):
    name: str
    devices: int
    bandwidth_gbs: float
    latency_us: float
    oversubscription: float
    wan: bool


def crossed_link(bandwidth_gbs: float, latency_us: float, devices_per_node: int,
                 tiers: Sequence[TierLike], group_stride: int, group_size: int,
                 point_to_point: bool = False) -> tuple[float, float]:
    """(bandwidth per GPU, latency) of the scale-out link a group spanning domains
    crosses, starting from the NICs' (`bandwidth_gbs`, `latency_us`): the narrowest of
    them and of every tier up to the lowest whose unit holds the group's block (past the
    top tier, all of them), at that tier's latency. Across a WAN tier only the ring steps
    between data centres pay its latency, (d - 1) of a ring's (n - 1) when the group spans
    d of them (a hierarchical all-reduce's count): the rest of each step's latency is the
    tier's below; a `point_to_point` message (a pipeline's, across the slowest boundary)
    pays all of it."""
    extent = group_stride * group_size
    below = devices_per_node
    for tier in tiers:
        bandwidth_gbs = min(bandwidth_gbs, tier.bandwidth_gbs / tier.oversubscription)
        if tier.wan and not point_to_point:
            spanned = math.ceil(extent / below)
            latency_us += (tier.latency_us - latency_us) * (spanned - 1) / max(group_size - 1, 1)
        else:
            latency_us = max(latency_us, tier.latency_us)
        if extent <= tier.devices and tier.devices % extent == 0:
            break
        below = tier.devices
    return bandwidth_gbs, latency_us


def crossed_wan(devices_per_node: int, tiers: Sequence[TierLike], group_stride: int,
                group_size: int) -> str | None:
    """The WAN tier a group's block crosses (it is larger than one data centre, the unit
    of the tier below the WAN), or None."""
    below = devices_per_node
    for tier in tiers:
        if tier.wan and group_stride * group_size > below:
            return tier.name
        below = tier.devices
    return None


def torus_share(torus: Sequence[int] | None, group_stride: int, group_size: int) -> float:
    """The share of a torus's dimensions a group inside the domain spans (1 without a
    torus): ranks fill the fastest dimension first, so a group `stride` apart spans the
    dimensions from the one its stride steps in to the one its extent reaches."""
    if not torus:
        return 1.0
    sizes = [1]
    for dimension in torus:
        sizes.append(sizes[-1] * dimension)
    first = max(i for i in range(len(torus)) if sizes[i] <= group_stride)
    extent = group_stride * group_size
    last = next((i for i in range(len(torus)) if sizes[i + 1] >= extent), len(torus) - 1)
    return (last - first + 1) / len(torus)


def fabric_problem(devices_per_node: int, tiers: Sequence[TierLike],
                   torus: Sequence[int] | None) -> str | None:
    """What is wrong with a fabric of `tiers` and a domain's `torus`, in one sentence
    naming the field, or None: each tier joins a multiple of the devices below it, and the
    torus's dimensions multiply to the domain."""
    if torus is not None and (any(d < 1 for d in torus)
                              or math.prod(torus) != devices_per_node):
        return (f"torus {list(torus)} holds {math.prod(torus)} chips, but a scale-up domain "
                f"has devices_per_node {devices_per_node}; give dimensions that multiply "
                "to it")
    below = devices_per_node
    for index, tier in enumerate(tiers):
        if tier.devices <= below or tier.devices % below:
            return (f"tiers.{index}.devices: {tier.name} joins {tier.devices} devices, "
                    f"which is not a multiple above {below} (the domain's or the tier "
                    "below's); give each tier more devices than the one below, a multiple "
                    "of them")
        below = tier.devices
    return None
