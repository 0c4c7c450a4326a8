"""How one plan's step answers its fabric's bandwidth, tier by tier, and the bandwidth per
tier at which its communication hides: the inverse question an operator asks ("what must
each tier carry for this model's communication to hide behind compute?").

A tier is one of the cluster's links per GPU: the scale-up domain's (`intra_node`: NVLink,
NVSwitch), the scale-out network's (`inter_node`: InfiniBand, RoCE, the NICs) and, where
the cluster describes its fabric's levels above the domains (`Cluster.tiers`: leaf, spine,
WAN), each of those (`tiers.0`, `tiers.1`, ...). Each sweep keeps
the plan (degrees, stages, micro-batches, knobs) and the other tier as they are, scales the
tier's bandwidth, and prices the step again with the step-time model: every collective is
priced on the links it crosses (`cost_models.comm`), and overlap hides what it hides
(bucketed gradient reduction behind the backward, FSDP's gathers behind the blocks, tensor
parallel overlap where it runs), so exposed communication is the step's own answer, not a
formula of its own.

- Exposed communication at a bandwidth: the step there, less the step with that tier's
  bandwidth unbounded (`UNBOUNDED_GBS`; latencies kept).
- Where it hides: the least bandwidth whose step is within `HIDDEN` of the unbounded one
  (bisection over the bandwidth; the step only falls as a link gets faster). For a pure
  data-parallel plan on one tier this is the data-parallel rule, "the gradients'
  all-reduce takes no longer than the backward": 2 (n - 1) / n x gradient bytes over the
  backward's seconds, divided by the link's achieved share (tests/cost_models/
  test_bandwidth_sweep.py holds it to that). Overlapped communication also slows the
  compute beside it (`Efficiency.overlap_slowdown`), so past that rule the step still
  falls a little as bandwidth grows: the hiding bandwidth includes it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from cost_models.step_time import predict_stages
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.plan import BandwidthPoint, TierSweep

if TYPE_CHECKING:
    from cost_models.pipeline_memory import StageLayout
    from planner.models.config import TransformerConfig
    from planner.vocabulary.parallel import ParallelConfig

TIERS = ("intra_node", "inter_node")
"""The cluster's links, as `Cluster` names them: the scale-up domain's and the scale-out
network's, each per GPU and per direction."""
TIER_NAMES = {"intra_node": "scale-up", "inter_node": "scale-out"}
"""How a report names each tier: within a scale-up domain (a node), and between them."""
FACTORS = (1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0)
"""The multiples of the preset's bandwidth each sweep prices."""
HIDDEN = 0.01
"""Communication hides where the step is within 1% of the step with the tier unbounded."""
UNBOUNDED_GBS = 1e9
"""A link no collective waits on (GB/s per GPU): the reference of exposed communication."""
SEARCH_STEPS = 40
"""Bisection steps over log2 of the bandwidth: 2^-40 of the bracket's span."""


def tier_keys(cluster: Cluster) -> tuple[str, ...]:
    """The tiers of `cluster` a sweep can vary: its two links and each level of `tiers`."""
    return TIERS + tuple(f"tiers.{i}" for i in range(len(cluster.tiers)))


def tier_name(cluster: Cluster, key: str) -> str:
    """How a report names tier `key` of `cluster` ('scale-up', 'spine')."""
    return TIER_NAMES.get(key) or cluster.tiers[int(key.split(".")[1])].name


def _bandwidth(cluster: Cluster, key: str) -> float:
    if key in TIERS:
        return getattr(cluster, key).bandwidth_gbs
    return cluster.tiers[int(key.split(".")[1])].bandwidth_gbs


def _with_bandwidth(cluster: Cluster, key: str, gbs: float) -> Cluster:
    """`cluster` with tier `key` at `gbs` GB/s per GPU (a copy: prices are memoised per
    cluster object)."""
    if key in TIERS:
        link = getattr(cluster, key).model_copy(update={"bandwidth_gbs": gbs})
        return cluster.model_copy(update={key: link})
    index = int(key.split(".")[1])
    tiers = list(cluster.tiers)
    tiers[index] = tiers[index].model_copy(update={"bandwidth_gbs": gbs})
    return cluster.model_copy(update={"tiers": tiers})


def tier_sweep(
    model: TransformerConfig, cluster: Cluster, parallel: ParallelConfig,
    stages: list[StageLayout], tier: str, flash_attention: bool | None = None,
) -> TierSweep:
    """Sweep `tier`'s bandwidth (one of `tier_keys`) for the plan (`parallel` on
    `stages`) on `cluster`, as the Plan keeps it (`Plan.network`)."""
    if tier not in tier_keys(cluster):
        raise ValueError(f"tier must be one of {', '.join(tier_keys(cluster))}, got {tier!r}")
    preset = _bandwidth(cluster, tier)

    def step(bandwidth: float) -> float:
        return predict_stages(model, _with_bandwidth(cluster, tier, bandwidth), parallel,
                              stages, flash_attention).step_time_s

    unbounded = step(UNBOUNDED_GBS)
    points = [BandwidthPoint(bandwidth_gbs=preset * f, factor=f, step_s=s,
                             exposed_s=s - unbounded)
              for f in FACTORS for s in (step(preset * f),)]
    return TierSweep(tier=tier, name=tier_name(cluster, tier), cluster_gbs=preset,
                     unbounded_step_s=unbounded, points=points,
                     hides_at_gbs=hiding_bandwidth(step, unbounded))


def hiding_bandwidth(step: Callable[[float], float], unbounded_s: float) -> float | None:
    """The least bandwidth (GB/s) whose `step` is within `HIDDEN` of `unbounded_s`, by
    bisection over log2 of the bandwidth (`step` falls as the bandwidth rises); None where
    even a link of 1e-6 GB/s is within it (the tier carries nothing the step waits on)."""
    target = unbounded_s * (1 + HIDDEN)
    low, high = math.log2(1e-6), math.log2(UNBOUNDED_GBS)
    if step(2**low) <= target:
        return None
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if step(2**middle) <= target else (middle, high)
    return 2**high
