"""Mixed clusters: pipelines whose stages run on pools of different machines.

A pooled cluster (`planner.vocabulary.pools`) is searched two ways, and the fastest plan
that fits wins, so a mixed plan is never worse than the best single pool:

- each pool alone, with the whole search (`planner.search.search`) on its machines;
- pipelines across pools (Metis, Um et al., USENIX ATC 2024, plans stages over device
  types this way): the pools in some order, each pool's devices cut into stages of one
  (tensor x data) mesh of its own, every device used; the layers are then balanced over
  the stages by each stage's speed and memory (`balance_layers`), so a faster pool's stages
  hold more layers and a stage never holds more than its memory takes.

For every setting of the knobs all stages share (micro-batch, recomputation, ZeRO stage:
`alpa_space.shared_knob_groups`, least memory relief first), each placement of stages is
priced by the stage costs the stage DP uses (`step_time.stage_mesh_costs`: time and memory
linear in a stage's layers), the best few are predicted whole (`predict_stages`, each stage
on its pool's machines, the transfer between pools over the link between them) and the
best of those refined by moving one layer across a boundary while that helps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from cost_models import pipeline_schedule
from cost_models.engine_memory import NON_ALLOCATOR_BYTES
from cost_models.pipeline_memory import StageLayout, stage_memories
from cost_models.pipeline_timing import paced_micro_batches
from cost_models.step_time import StageCosts, StepPrediction, predict_stages, stage_mesh_costs
from planner.models.config import TransformerConfig
from cost_models.offload import offloads
from planner.search import offload_candidates, search
from planner.search.alpa_space import MAX_STAGES, shared_knob_groups, stage_meshes
from planner.search.megatron_space import (
    Candidate,
    SearchSpace,
    rank_key,
    tensor_degrees,
)
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import FixedKnobs, ParallelConfig
from planner.vocabulary.pools import PooledCluster

CONTEXT_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees the pipelines across pools try (each splits a sequence over
that many ranks of every stage; past 8 its ring's transfers outgrow the attention)."""
PREDICTED_PER_SETTING = 4
"""Placements per knob setting predicted whole, the best by their stage costs."""


def balance_layers(
    slopes: Sequence[float], offsets: Sequence[float], caps: Sequence[int], num_layers: int,
    paced: int,
) -> tuple[int, ...] | None:
    """Layers per stage, each at least 1 and at most its cap, summing to `num_layers`,
    that minimise Alpa's pipeline objective sum_k t_k + paced * max_k t_k with stage k
    taking t_k = slopes[k] * n_k + offsets[k]; None when the caps do not hold the layers.

    Exact: the optimum's slowest stage takes some t* = slopes[k] n + offsets[k]; at that
    bound every stage may hold up to min(cap, (t* - offset) / slope) layers, and filling
    the least steep stages first gives the least sum (each layer costs its stage's slope).
    So the best over every candidate bound is the optimum."""
    p = len(slopes)
    if p == 0 or num_layers < p or min(caps) < 1 \
            or sum(min(c, num_layers) for c in caps) < num_layers:
        return None
    slope, offset = np.asarray(slopes, float), np.asarray(offsets, float)
    cap = np.minimum(np.asarray(caps), num_layers - p + 1)
    n = np.arange(1, num_layers - p + 2)
    bounds = np.unique((slope[:, None] * n[None, :] + offset[:, None])[n[None, :] <= cap[:, None]])
    # Per bound (rows), the most layers each stage may hold (columns).
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(slope > 0, np.floor((bounds[:, None] - offset) / slope + 1e-9),
                        num_layers)
    most = np.minimum(room, cap).astype(int)
    feasible = (most.min(axis=1) >= 1) & (most.sum(axis=1) >= num_layers)
    if not feasible.any():
        return None
    most = most[feasible]
    # One layer each, then the rest to the least steep stages first, up to their most.
    order = np.argsort(slope, kind="stable")
    spare = most[:, order] - 1
    before = np.cumsum(spare, axis=1) - spare
    extra = np.clip(num_layers - p - before, 0, spare)
    layers = np.empty_like(most)
    layers[:, order] = 1 + extra
    times = slope * layers + offset
    totals = times.sum(axis=1) + paced * times.max(axis=1)
    return tuple(int(x) for x in layers[int(np.argmin(totals))])


@dataclass(frozen=True)
class PoolPlan:
    """A plan found on a pooled cluster: on one pool alone (`pool` its index, the
    candidate as that pool's search gives it) or across pools (`pool` None, every stage
    naming its pool)."""

    pool: int | None
    candidate: Candidate
    prediction: StepPrediction


def search_pools(
    model: TransformerConfig, pooled: PooledCluster, gbs: int, fixed: FixedKnobs,
    space: SearchSpace = "auto",
) -> tuple[list[PoolPlan], int]:
    """The plans of `model` on `pooled` at `gbs` sequences a step, fastest first (those that
    fit; `rank_key`'s order), and how many were predicted: each pool's best alone and the
    pipelines across pools."""
    found: list[PoolPlan] = []
    evaluated = 0
    for index in range(len(pooled.pools)):
        result = search(model, pooled.pool(index), gbs, fixed, space)
        evaluated += result.evaluated
        found += [PoolPlan(index, c, p) for c, p in result.ranked[:1]]
    if len(pooled.pools) > 1:
        # Where a pool alone needs offload, the pipelines across pools may use it too: the
        # memory it frees may buy them less recomputation.
        settings = [fixed]
        if any(offloads(plan.candidate.parallel) for plan in found):
            settings += [fixed.but(**offload)
                         for offload in offload_candidates(_least_able(pooled), fixed)]
        for setting in settings:
            across, priced = _across_pools(model, pooled, gbs, setting)
            found += across
            evaluated += priced
    return sorted(found, key=lambda plan: rank_key(plan.prediction)), evaluated


def _least_able(pooled: PooledCluster) -> Cluster:
    """The pool whose machines set the knobs every stage shares: tensor-parallel overlap
    only where every pool's devices run it, offload only where every pool's hosts hold it."""
    return min((pooled.pool(i) for i in range(len(pooled.pools))),
               key=lambda c: (c.device.tp_comm_overlap, c.host is not None,
                              c.device.peak_tflops["fp32"]))


def _across_pools(
    model: TransformerConfig, pooled: PooledCluster, gbs: int, fixed: FixedKnobs,
) -> tuple[list[PoolPlan], int]:
    """Per micro-batch size, the fastest pipeline across all pools of the first knob
    setting (least memory relief first) under which one fits; and how many were predicted."""
    base = _least_able(pooled)
    fixed = FixedKnobs({"precision": base.device.default_precision, **fixed})
    found, evaluated = [], 0
    # Context parallelism splits every stage's sequences (and activations) alike.
    contexts = [fixed["context"]] if "context" in fixed else [
        c for c in CONTEXT_DEGREES if model.seq_length % (2 * c) == 0
        and all(pooled.pool(i).num_devices % c == 0 for i in range(len(pooled.pools)))]
    for context in contexts:
        for group in shared_knob_groups(model, base, gbs, fixed.but(context=context)):
            for shared in group:
                plans, priced = _placements(model, pooled, shared, fixed)
                evaluated += priced
                fitting = [plan for plan in plans if plan.prediction.fits]
                if fitting:
                    found.append(min(fitting, key=lambda plan: rank_key(plan.prediction)))
                    break
    return found, evaluated


def _placements(
    model: TransformerConfig, pooled: PooledCluster, shared: ParallelConfig,
    fixed: FixedKnobs,
) -> tuple[list[PoolPlan], int]:
    """Pipelines across every pool under `shared`'s knobs: the best few by stage costs
    predicted whole (each fitted to its pools' memory), the best of those refined; and how
    many predictions that took."""
    b = shared.batch.micro_batch_size
    micro_batches = shared.batch.global_batch_size // b
    most = min(MAX_STAGES, model.num_layers, micro_batches)
    costs: dict[tuple[int, int, int], StageCosts] = {}
    options = [_pool_meshes(model, pooled.pool(i), shared, fixed)
               for i in range(len(pooled.pools))]
    scored: list[tuple[float, _Placement]] = []
    for order in itertools.permutations(range(len(pooled.pools))):
        for meshes in itertools.product(*(options[i] for i in order)):
            count = sum(stages for _, _, stages in meshes)
            if count > most or count != fixed.get("pipeline", count):
                continue
            pools = [i for i, (_, _, stages) in zip(order, meshes) for _ in range(stages)]
            shapes = [(t, d) for t, d, stages in meshes for _ in range(stages)]
            for pool, (t, d) in zip(pools, shapes):
                if (pool, t, d) not in costs:
                    costs[pool, t, d] = stage_mesh_costs(model, pooled.pool(pool), shared, t, d)
            placement = _Placement.of(model, pooled, shared, pools, shapes, costs,
                                      micro_batches)
            layers = placement.balanced()
            if layers is not None:
                scored.append((placement.objective(layers), placement))
    scored.sort(key=lambda item: item[0])
    plans, evaluated = [], 0
    for _, placement in scored[:PREDICTED_PER_SETTING]:
        plan, tries = _fitted(model, pooled, shared, placement)
        evaluated += tries
        if plan is not None:
            plans.append(plan)
    if plans:
        refined, tries = _refine(model, pooled, shared,
                                 min(plans, key=lambda plan: rank_key(plan.prediction)))
        plans.append(refined)
        evaluated += tries
    return plans, evaluated


@dataclass
class _Placement:
    """Stages on pools with linear costs: stage k takes slopes[k] x its layers + offsets[k]
    seconds a micro-batch and holds at most caps[k] layers."""

    pools: list[int]
    shapes: list[tuple[int, int]]
    slopes: list[float]
    offsets: list[float]
    caps: list[int]
    num_layers: int
    paced: int

    @classmethod
    def of(cls, model: TransformerConfig, pooled: PooledCluster, shared: ParallelConfig,
           pools: list[int], shapes: list[tuple[int, int]],
           costs: dict[tuple[int, int, int], StageCosts], micro_batches: int) -> _Placement:
        """Each stage's cost by `costs`, capped by its pool's memory for the micro-batches
        it holds in flight (`pipeline_schedule.in_flight`) besides what a device keeps
        outside the allocator."""
        p = len(pools)
        slopes, offsets, caps = [], [], []
        for k, (pool, (t, d)) in enumerate(zip(pools, shapes)):
            c = costs[pool, t, d]
            first, last = k == 0, k == p - 1
            in_flight = pipeline_schedule.in_flight(shared.pipelining.schedule, p - k, 0,
                                                    micro_batches)
            per_layer = c.state_bytes_per_layer + c.activation_bytes_per_layer * in_flight
            ends = (first + last) * c.state_bytes_embedding + last * c.head_activation_bytes
            room = pooled.pool(pool).usable_memory_bytes - NON_ALLOCATOR_BYTES - ends
            slopes.append(c.layer_s)
            offsets.append(c.p2p_s + last * c.head_s)
            caps.append(int(room // per_layer) if per_layer > 0 else model.num_layers)
        return cls(pools, shapes, slopes, offsets, caps, model.num_layers,
                   paced_micro_batches(micro_batches))

    def balanced(self) -> tuple[int, ...] | None:
        return balance_layers(self.slopes, self.offsets, self.caps, self.num_layers,
                              self.paced)

    def objective(self, layers: Sequence[int]) -> float:
        """Alpa's pipeline objective of `layers` by the linear costs."""
        times = [a * n + f for a, n, f in zip(self.slopes, layers, self.offsets)]
        return sum(times) + self.paced * max(times)

    def stages(self, layers: Sequence[int]) -> list[StageLayout]:
        return [StageLayout(n, t, d, pool)
                for n, (t, d), pool in zip(layers, self.shapes, self.pools)]


def _fitted(model: TransformerConfig, pooled: PooledCluster, shared: ParallelConfig,
            placement: _Placement) -> tuple[PoolPlan | None, int]:
    """The balanced split of `placement` predicted whole; where a stage does not fit its
    pool's memory (the linear costs leave out working buffers), that stage capped below the
    layers it was given and the split balanced again. None when no split fits."""
    tries = 0
    while (layers := placement.balanced()) is not None:
        stages = placement.stages(layers)
        plan = _predicted(model, pooled, shared, stages)
        tries += 1
        if plan.prediction.fits:
            return plan, tries
        held = stage_memories(model, pooled.pool(stages[0].pool), plan.candidate.parallel,
                              stages)
        over = [k for k, stage in enumerate(stages)
                if not held[k].fits(pooled.pool(stage.pool).usable_memory_bytes)]
        if not over:
            return None, tries  # the hosts' memory, which more layers elsewhere cannot free
        for k in over:
            placement.caps[k] = layers[k] - 1
    return None, tries


def _pool_meshes(model: TransformerConfig, cluster: Cluster, shared: ParallelConfig,
                 fixed: FixedKnobs) -> list[tuple[int, int, int]]:
    """(tensor, data, stages) that use every device of `cluster`: stages of one of the
    stage DP's (tensor x data) meshes (`alpa_space.stage_meshes`), as many as fill it."""
    degrees = [fixed["tensor"]] if "tensor" in fixed else tensor_degrees(model, cluster)
    n = cluster.num_devices
    return [(tensor, data, n // devices)
            for devices in range(1, n + 1) if n % devices == 0
            for tensor, data in stage_meshes(degrees, shared, devices, fixed)
            if data == fixed.get("data", data)]


def _predicted(model: TransformerConfig, pooled: PooledCluster, shared: ParallelConfig,
               stages: list[StageLayout]) -> PoolPlan:
    if all(stage.tensor == 1 for stage in stages):  # no tensor axis to apply them on
        shared = shared.but(sequence_parallel=False, tp_comm_overlap=False)
    candidate = Candidate(shared, tuple(s.layers for s in stages), tuple(stages))
    return PoolPlan(None, candidate, predict_stages(model, pooled, shared, stages))


def _refine(model: TransformerConfig, pooled: PooledCluster, shared: ParallelConfig,
            plan: PoolPlan) -> tuple[PoolPlan, int]:
    """`plan` with one layer moved across a stage boundary while a move makes it faster
    (the linear stage costs leave out the ends' collectives, the optimizer's step and the
    gradients' reduction, which the whole prediction has)."""
    tries = 0
    while True:
        stages = list(plan.candidate.stages or ())
        moves = []
        for k in range(len(stages) - 1):
            for give, take in ((k, k + 1), (k + 1, k)):
                if stages[give].layers > 1:
                    moved = list(stages)
                    moved[give] = replace(stages[give], layers=stages[give].layers - 1)
                    moved[take] = replace(stages[take], layers=stages[take].layers + 1)
                    moves.append(_predicted(model, pooled, shared, moved))
        tries += len(moves)
        better = [m for m in moves if m.prediction.fits
                  and rank_key(m.prediction) < rank_key(plan.prediction)]
        if not better:
            return plan, tries
        plan = min(better, key=lambda m: rank_key(m.prediction))
