"""Alpa's search space: pipeline stages that may differ in layers and in mesh.

For each setting of the knobs every stage shares (micro-batch, recomputation, sequence
parallelism, ZeRO stage), this driver prices every (layers i..j, submesh, stages after)
choice with the step-time model — picking for each submesh its best logical (data x
tensor) mesh — and hands the cost array to Alpa's stage DP (`planner/search/inter_op.py`).
Submeshes are Alpa's: 1, 2, 4, ... GPUs of one node, and whole nodes. Stage memory is
checked for the micro-batches in flight under its schedule (`pipeline_schedule.in_flight`:
under 1F1B a stage with k stages after it holds k + 1). Layers are grouped into at most
`MAX_LAYER_GROUPS` consecutive runs so that the DP stays small for 100-layer models. The
plans Megatron-LM can run are searched as well (`search_megatron`), so the auto space is
never worse than the Megatron one.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from cost_models import pipeline_schedule
from cost_models.memory import FRAMEWORK_RESERVE_BYTES
from cost_models.pipeline_memory import StageLayout
from cost_models.step_time import predict_stages, predict_step, stage_mesh_costs
from planner.vocabulary.cluster import Cluster
from planner.search.forked_call import BothEnds, start_forked
from planner.search.inter_op import stage_dp
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import RECOMPUTE, FixedKnobs, ParallelConfig
from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.schedules import schedule_info
from planner.search.megatron_space import (
    Candidate,
    Progress,
    SearchResult,
    rank_key,
    run_settings,
    search_megatron,
    tensor_degrees,
)

if TYPE_CHECKING:
    from cost_models.layer_collectives import LayerCollectives

MAX_LAYER_GROUPS = 32
MAX_STAGES = 16


MAX_DEVICE_STATES = 1 << 14
"""The most device counts the stage DP indexes (`inter_op`: its tables have one column per
device count in units of the submeshes' greatest common divisor). On a cluster larger than
this many of its smallest submeshes, the smallest are dropped until it is not: at 2^20 GPUs
no stage runs on fewer than 64 (1/16,384 of the cluster, 8 nodes), and the DP keeps 16,385
columns, not 2^20 + 1. Clusters up to 16,384 GPUs keep every submesh."""


def submeshes(cluster: Cluster) -> list[int]:
    """Alpa's submesh sizes: powers of two within a node, then whole nodes (powers of two
    of them, and all), without those too small for `MAX_DEVICE_STATES`."""
    per_node, nodes = cluster.devices_per_node, cluster.num_nodes
    sizes = [2**i for i in range(per_node.bit_length()) if 2**i <= min(per_node,
                                                                          cluster.num_devices)]
    sizes += [per_node * k for k in range(2, nodes + 1) if k & (k - 1) == 0 or k == nodes]
    sizes = sorted(set(sizes))
    # The first size to keep: the smallest whose states fit; where none but the whole
    # cluster does (a node count with few factors of two), all of them, as they are.
    first = next((i for i in range(len(sizes) - 1)
                  if cluster.num_devices // math.gcd(*sizes[i:]) <= MAX_DEVICE_STATES), 0)
    return sizes[first:]


def layer_group_size(num_layers: int) -> int:
    """The fewest consecutive layers per group that leaves at most MAX_LAYER_GROUPS."""
    return next(g for g in range(1, num_layers + 1)
                if num_layers % g == 0 and num_layers // g <= MAX_LAYER_GROUPS)


def search_auto(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    flash_attention: bool = True, progress: Progress | None = None,
    collectives: LayerCollectives | None = None,
) -> SearchResult:
    # The Megatron space and the stage DPs of each micro-batch size are independent: a
    # forked child runs the first and then takes micro-batch sizes from the largest down,
    # while this process takes them from the smallest up, until the two meet.
    groups = shared_knob_groups(model, cluster, gbs, fixed)
    queue = BothEnds(len(groups))
    other = start_forked(_megatron_and_stages, model, cluster, gbs, fixed, flash_attention,
                         collectives, groups, queue)
    ranked, evaluated, dp_s = _stages_per_group(model, cluster, groups, queue.front, fixed,
                                                flash_attention, collectives, progress,
                                                queue.taken)
    result, megatron_s, (more, more_evaluated, more_s) = other()
    if progress:
        progress(len(groups), len(groups))
    # In the order of the groups, whichever process ran them, so that ties rank the same
    # on every run; the DP may rediscover a configuration the Megatron space already holds.
    stage_plans = [pair for _, pair in sorted(ranked + more, key=lambda item: item[0])]
    unique = {c: (c, p) for c, p in result.ranked + stage_plans}
    result.ranked = sorted(unique.values(), key=lambda item: rank_key(item[1]))
    result.evaluated += evaluated + more_evaluated
    result.timings = {"megatron_space_s": megatron_s, "stage_dp_s": dp_s + more_s}
    return result


def _megatron_and_stages(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    flash_attention: bool, collectives: LayerCollectives | None,
    groups: list[list[ParallelConfig]], queue: BothEnds,
) -> tuple[SearchResult, float, tuple[list, int, float]]:
    start = time.perf_counter()
    result = search_megatron(model, cluster, gbs, fixed, flash_attention,
                             collectives=collectives)
    megatron_s = time.perf_counter() - start
    return result, megatron_s, _stages_per_group(model, cluster, groups, queue.back, fixed,
                                                 flash_attention, collectives)


def _stages_per_group(
    model: TransformerConfig, cluster: Cluster, groups: list[list[ParallelConfig]],
    take: Callable[[], int | None], fixed: FixedKnobs, flash_attention: bool,
    collectives: LayerCollectives | None, progress: Progress | None = None,
    done: Callable[[], int] | None = None,
) -> tuple[list, int, float]:
    """Per group `take` hands out, the stage DP's plan of the first settings whose plan
    fits: (group index, (candidate, prediction)), plans predicted and seconds in the DP. `done`
    counts the groups taken by either process, for `progress`."""
    ranked, evaluated, dp_s = [], 0, 0.0
    while (index := take()) is not None:
        # Settings in order of increasing memory relief (and cost): the first whose stage
        # DP finds a plan that fits is kept, as in the Megatron space.
        for shared in groups[index]:
            dp_start = time.perf_counter()
            found = _best_stages(model, cluster, shared, fixed, flash_attention, collectives)
            dp_s += time.perf_counter() - dp_start
            if found is None:
                continue
            candidate = _candidate(found, shared)
            evaluated += 1
            prediction = (
                predict_stages(model, cluster, candidate.parallel, list(candidate.stages),
                               flash_attention, collectives)
                if candidate.stages else predict_step(
                    model, cluster, candidate.parallel, flash_attention,
                    list(candidate.layers_per_stage), collectives)
            )
            if prediction.fits:
                ranked.append((index, (candidate, prediction)))
                break
        if progress and done:
            progress(done(), len(groups))
    return ranked, evaluated, dp_s


def _candidate(stages: list[StageLayout], shared: ParallelConfig) -> Candidate:
    """The DP's stages as a candidate; stages that share one mesh become a Megatron-style
    configuration (so Megatron-LM flags can be emitted if the split allows)."""
    split = tuple(stage.layers for stage in stages)
    meshes = {(stage.tensor, stage.data) for stage in stages}
    if len(meshes) > 1:
        return Candidate(shared, split, tuple(stages))
    tensor, data = meshes.pop()
    uniform = shared.but(tensor=tensor, data=data, pipeline=len(stages),
                         micro_batch_size=shared.batch.micro_batch_size // data,
                         sequence_parallel=shared.sharding.sequence_parallel and tensor > 1,
                         tp_comm_overlap=shared.overlap.tp_comm_overlap and tensor > 1)
    return Candidate(uniform, split)


def shared_knob_groups(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs
) -> list[list[ParallelConfig]]:
    """Per micro-batch size, the settings all stages share, least memory relief first.
    `micro_batch_size` here is the whole micro-batch (data = 1): each stage splits it over
    its own data-parallel replicas. The stage DP prices 1F1B or GPipe pipelines of one
    chunk per stage, so a fixed interleaved (or dualpipev) schedule leaves this space to
    the Megatron one."""
    if schedule_info(fixed.get("schedule", "1f1b")).chunks != 1 or "virtual_pipeline" in fixed:
        return []
    if fixed.get("recompute_method") == "block" or fixed.get("recompute_num_layers", 1) > 1:
        return []  # a stage's cost is no longer linear in its layers
    # A fixed --micro-batch-size is per data-parallel replica: whole micro-batches of any
    # multiple of it, each stage then replicated (whole / fixed) ways.
    per_replica = fixed.get("micro_batch_size", 1)
    sizes = [2**i for i in range(gbs.bit_length()) if gbs % 2**i == 0 and 2**i % per_replica == 0]
    recomputes = [fixed["recompute"]] if "recompute" in fixed else list(RECOMPUTE)
    zeros = [fixed["zero_stage"]] if "zero_stage" in fixed else [1, 3]
    sp, overlap = fixed.get("sequence_parallel", True), fixed.get("overlap_grad_reduce", True)
    # Each stage applies the tensor-parallel settings where its mesh has a tensor axis.
    tensor = max(2, fixed.get("tensor", 2))
    return [
        [
            run_settings(ParallelConfig.of(
                dims=ParallelDims(data=1, context=fixed.get("context", 1),
                                  expert=fixed.get("expert", 1)),
                micro_batch_size=b, global_batch_size=gbs, recompute=r, zero_stage=z,
                sequence_parallel=sp, schedule=fixed.get("schedule", "1f1b"),
                overlap_grad_reduce=overlap, precision=fixed.get("precision", "bf16"),
                moe_token_dispatcher=fixed.get("moe_token_dispatcher", "allgather"),
            ), fixed, cluster, tensor=tensor)
            for z, r in itertools.product(zeros, recomputes)
        ]
        for b in sizes
    ]


def _best_stages(
    model: TransformerConfig, cluster: Cluster, shared: ParallelConfig, fixed: FixedKnobs,
    flash: bool, collectives: LayerCollectives | None = None,
) -> list[StageLayout] | None:
    """The stage DP's best stages (layers and mesh each) under `shared`'s knobs and the
    fixed degrees, or None when nothing fits."""
    sizes = submeshes(cluster)
    group = layer_group_size(model.num_layers)
    groups = model.num_layers // group
    micro_batches = shared.batch.global_batch_size // shared.batch.micro_batch_size
    pipeline = fixed.get("pipeline")
    # At most one stage per micro-batch: fewer never fill the pipeline (see megatron_space).
    most = pipeline or min(MAX_STAGES, groups, cluster.num_devices, micro_batches)
    if most > min(groups, micro_batches):
        return None  # more stages than layer groups or micro-batches
    costs = np.full((groups, groups + 1, len(sizes), most), np.inf)
    meshes: list[list[tuple[int, int]]] = []
    capacity = cluster.usable_memory_bytes - FRAMEWORK_RESERVE_BYTES
    first, last = np.arange(groups)[:, None], np.arange(groups + 1)[None, :]
    layers = (last - first) * group
    valid = layers > 0
    # A stage with k stages after it runs as the first of k + 1 (`in_flight`).
    in_flight = np.array([pipeline_schedule.in_flight(shared.pipelining.schedule, k + 1, 0,
                                                      micro_batches)
                          for k in range(most)])
    chosen = np.zeros(costs.shape, dtype=int)  # which mesh priced each entry
    degrees = [fixed["tensor"]] if "tensor" in fixed else tensor_degrees(model, cluster)
    if fixed.get("sequence_parallel"):
        degrees = [t for t in degrees if t > 1]
    for s, devices in enumerate(sizes):
        options = stage_meshes(degrees, shared, devices, fixed)
        meshes.append(options)
        best = np.full((groups, groups + 1, most), np.inf)
        for option, (tensor, data) in enumerate(options):
            c = stage_mesh_costs(model, cluster, shared, tensor, data, flash, collectives)
            latency = layers * c.layer_s + (last == groups) * c.head_s + c.p2p_s
            state = (layers * c.state_bytes_per_layer
                     + ((first == 0) + (last == groups)) * c.state_bytes_embedding)
            activations = (layers[..., None] * c.activation_bytes_per_layer * in_flight
                           + (last == groups)[..., None] * c.head_activation_bytes)
            fits = (state[..., None] + activations) <= capacity
            candidate = np.where(fits & valid[..., None], latency[..., None], np.inf)
            chosen[:, :, s, :] = np.where(candidate < best, option, chosen[:, :, s, :])
            best = np.minimum(best, candidate)
        costs[:, :, s, :] = best
    plan = stage_dp(costs, np.array(sizes), cluster.num_devices, micro_batches, most,
                    num_stages=pipeline)
    if plan is None:
        return None
    stages = []
    for index, choice in enumerate(plan.stages):
        after = len(plan.stages) - 1 - index
        option = chosen[choice.first_layer, choice.last_layer, choice.submesh, after]
        tensor, data = meshes[choice.submesh][option]
        count = (choice.last_layer - choice.first_layer) * group
        stages.append(StageLayout(count, tensor, data))
    return stages


def stage_meshes(
    degrees: list[int], shared: ParallelConfig, devices: int, fixed: FixedKnobs
) -> list[tuple[int, int]]:
    """(tensor, data) meshes of `devices` GPUs (with `shared.context` context ranks),
    tensor one of `degrees`, whose data replicas split the micro-batch, into whole
    micro-batches of a fixed size when one is fixed, and into expert groups."""
    options = []
    for tensor in degrees:
        data, rest = divmod(devices, tensor * shared.dims.context)
        if rest or data < 1 or shared.batch.micro_batch_size % data or data % shared.dims.expert:
            continue
        per_replica = shared.batch.micro_batch_size // data
        if per_replica == fixed.get("micro_batch_size", per_replica):
            options.append((tensor, data))
    return options
