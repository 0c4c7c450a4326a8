"""Search every parallel knob for the fastest configuration that fits.

Two spaces:

- `megatron`: what Megatron-LM can run. One (data x tensor x context) layout for every
  pipeline stage; the first and last stages may hold fewer layers. Each layout is tried
  with the least recomputation that fits: the cost model charges recomputation only time,
  so when no recomputation fits, selective or full can only be slower, and are skipped
  (`enumerate_megatron` lists the whole space, for tests that check this pruning).
- `auto`: Alpa's. Stages may differ in size and mesh; `planner/search/inter_op.py` picks the
  stage boundaries and submeshes by dynamic programming for each choice of the knobs all
  stages share.

Knobs fixed on the command line are never varied.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Literal, get_args

from cost_models.pipeline_memory import StageLayout, fits_memory
from cost_models.step_time import StepPrediction, predict_step
from planner.search.forked_call import BothEnds, start_forked
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import (
    RECOMPUTE,
    SECTION_OF,
    FixedKnobs,
    ParallelConfig,
    Recompute,
)
from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.schedules import V_SHAPED, runs_on, schedule_info
from planner.torchtitan.rules import part_layers, rank_of_part, zero_stages

if TYPE_CHECKING:
    from cost_models.layer_collectives import LayerCollectives

# Largest micro-batch tried: beyond it, matmuls are already large and memory is what grows.
MAX_MICRO_BATCH = 16
# Uneven Megatron-LM splits tried per pipeline degree (middle stages 1..this many layers
# above even, the end stages sharing the rest).
MAX_UNEVEN_SPLITS = 8
# Virtual stages tried for the interleaved schedule.
VIRTUAL_STAGES = (2, 4)
# Context parallelism is tried from this sequence length on (shorter sequences leave each
# rank too little attention work to hide the key/value exchange).
CONTEXT_PARALLEL_MIN_SEQ = 8192

# Largest cluster a training plan is searched for: the stage DP keeps one state per GPU
# count, so its time grows with the GPUs; the bound keeps a search at the largest size
# interactive (timings: docs/cli.md, "Errors, exit codes and bounds"). Past today's
# largest clusters (~100K GPUs).
MAX_GPUS = 1 << 20

Progress = Callable[[int, int], None]
SearchSpace = Literal["auto", "megatron"]
"""The two spaces (this module's docstring)."""
SEARCH_SPACES: tuple[str, ...] = get_args(SearchSpace)


@dataclass(frozen=True)
class Candidate:
    """A configuration and its stages' layer counts."""

    parallel: ParallelConfig
    layers_per_stage: tuple[int, ...]
    stages: tuple[StageLayout, ...] | None = None
    """Each stage's mesh, when stages differ (Alpa's space); None: all stages share
    `parallel`'s data x tensor mesh."""
    chunk_layers: tuple[int, ...] | None = None
    """Layers of each model chunk in model order, where the chunks differ (TorchTitan's
    split of a depth its chunks do not divide); None: equal chunks."""


@dataclass
class SearchResult:
    """The best configurations found, best first, and how the search went."""

    ranked: list[tuple[Candidate, StepPrediction]]
    """Configurations that fit, in `rank_key` order."""
    evaluated: int = 0
    """Configurations whose step time was predicted."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent per phase."""


def rank_key(prediction: StepPrediction) -> tuple[bool, float]:
    """How fitting configurations rank: those whose reserved memory fits the device too
    first (one that fits only what it allocates may run out of memory through the caching
    allocator's fragmentation), fastest first within each."""
    return (not prediction.reserved_fits, prediction.step_time_s)


def _powers_of_two_dividing(n: int, limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit and n % 2**i == 0]


def tensor_degrees(model: TransformerConfig, cluster: Cluster) -> list[int]:
    """Tensor-parallel degrees the search uses: powers of two that fit in one node (one
    NVLink domain) and in the cluster, and divide the attention and key/value heads; on
    more than one domain, only those that divide the domain. Those keep every tensor group
    (consecutive ranks) inside one domain: a layout's degrees divide the GPUs too, so they
    divide a part-filled last domain's share as well (256 GB200s: 3 x 72 + 40), while a
    power of two a domain holds no whole number of (16 of a 72-GPU rack) would straddle
    racks, as `planner.search.knobs` refuses for a fixed degree."""
    per_node, n = cluster.devices_per_node, cluster.num_devices
    limit = min(per_node, n, model.num_kv_heads)
    return [t for t in _powers_of_two_dividing(model.num_kv_heads, limit)
            if model.num_attention_heads % t == 0 and (n <= per_node or per_node % t == 0)]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def megatron_stage_splits(num_layers: int, stages: int) -> list[tuple[int, ...]]:
    """How Megatron-LM can split layers over stages: evenly, or (when they do not divide)
    with a smaller first and last stage and the rest even."""
    if num_layers % stages == 0:
        return [(num_layers // stages,) * stages]
    if stages < 3:
        return []
    splits = []
    # The middle stages from one layer above even upwards; the most uneven splits only
    # starve the end stages, and a prime depth would otherwise give thousands of them.
    most = num_layers // stages + MAX_UNEVEN_SPLITS
    for middle in range(num_layers // stages + 1, min(num_layers // (stages - 2), most) + 1):
        ends = num_layers - middle * (stages - 2)
        first, last = ends // 2, ends - ends // 2
        if 1 <= first <= middle and 1 <= last <= middle:
            splits.append((first,) + (middle,) * (stages - 2) + (last,))
    return splits


def _layouts(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs
) -> Iterator[tuple[int, int, int, int, int]]:
    """(tensor, context, pipeline, data, expert) degrees that multiply to the GPUs and
    whose data-parallel replicas split the global batch."""
    for layout in _degree_layouts(model, cluster, fixed):
        if gbs % layout[3] == 0:
            yield layout


def data_degrees(model: TransformerConfig, cluster: Cluster, fixed: FixedKnobs) -> list[int]:
    """The data-parallel degrees of every layout the fixed knobs allow, batch aside."""
    return sorted({layout[3] for layout in _degree_layouts(model, cluster, fixed)})


def _degree_layouts(
    model: TransformerConfig, cluster: Cluster, fixed: FixedKnobs
) -> Iterator[tuple[int, int, int, int, int]]:
    n = cluster.num_devices
    tensors = [fixed["tensor"]] if "tensor" in fixed else [
        t for t in tensor_degrees(model, cluster) if n % t == 0
    ]
    contexts = [fixed["context"]] if "context" in fixed else (
        _powers_of_two_dividing(n, 8) if model.seq_length >= CONTEXT_PARALLEL_MIN_SEQ else [1]
    )
    for t, c in itertools.product(tensors, contexts):
        if n % (t * c) or cluster.crosses_wan(t, c):
            continue  # (a context ring across data centres: never, as a tensor group)
        pipelines = [fixed["pipeline"]] if "pipeline" in fixed else _divisors(
            n // (t * c), model.num_layers
        )
        for p in pipelines:
            if n % (t * c * p):
                continue
            d = n // (t * c * p)
            # Experts are laid out over a stage's tensor x context x data ranks, apart
            # from attention's degrees (Megatron-Core's parallel folding): an expert degree
            # may exceed the data degree when each expert is not split over the tensor ranks.
            stage = t * c * d
            experts = [fixed["expert"]] if "expert" in fixed else (
                [e for e in _divisors(stage, model.num_experts) if model.num_experts % e == 0]
                if model.num_experts else [1]
            )
            for e in experts:
                if stage % e == 0 and not cluster.crosses_wan(t, e):
                    yield t, c, p, d, e


def run_settings(base: ParallelConfig, fixed: FixedKnobs, cluster: Cluster,
                 data: int = 2, tensor: int | None = None) -> ParallelConfig:
    """`base` (its degrees, sequence parallelism, ZeRO stage and gradient overlap chosen)
    with every other fixed knob as given, and the knobs that only make a run faster or
    leaner where they apply, unless fixed, at their best: the weights' gather overlapped
    with the forward where the optimizer is distributed, tensor-parallel communication
    overlapped with the matmuls where the device runs Transformer Engine's userbuffers;
    the rest at their defaults (Megatron-LM's, and attention as the device runs it; CUDA
    graphs stay off unless asked for: they need static shapes and hold their own memory).
    Under TorchTitan, async tensor parallelism is a compile pass (`maybe_enable_async_tp`),
    fp8 is scaled per tensor, and FSDP2 gathers fp8 weights only over `data` ranks above
    one (any, where stages differ: Alpa's space). `tensor`: the tensor degree the overlaps
    are decided for, where stages choose their own (default `base`'s)."""
    titan = fixed.get("engine") == "torchtitan"
    compiled = fixed.get("compile", False)
    zero_stage = base.sharding.zero_stage
    tensor = base.dims.tensor if tensor is None else tensor
    overlap_tp = (tensor > 1 and base.sharding.sequence_parallel
                  and cluster.device.tp_comm_overlap)
    # Degrees and batch sizes are the layout's (a stage's, in Alpa's space), not as fixed.
    given = {name: value for name, value in fixed.items()
             if SECTION_OF[name] not in ("dims", "batch")}
    return base.but(**{
        **given,
        "overlap_param_gather": fixed.get(
            "overlap_param_gather", zero_stage >= 1 and base.overlap.overlap_grad_reduce),
        "tp_comm_overlap": fixed.get("tp_comm_overlap",
                                     overlap_tp and (compiled or not titan)),
        "fp8_recipe": fixed.get("fp8_recipe", "tensorwise" if titan else "delayed"),
        "fp8_param_gather": fixed.get("fp8_param_gather", False) and (
            not titan or (zero_stage == 3 and data > 1)),
    })


def _dispatchers(fixed: FixedKnobs, expert: int, cluster: Cluster) -> list[str]:
    """The token dispatchers tried: as fixed; without expert parallelism the all-gather
    (nothing to send); under Tessel's runtime the all-gather too, unless routing is forced
    even: an all-to-all moves what the router decides at run time, so its bytes are an
    expectation a plan cannot promise (`plan check` compares them exactly). Megatron-LM and
    TorchTitan: all-to-all, and DeepEP's flex dispatcher where it runs (Hopper and newer,
    like Transformer Engine's userbuffers)."""
    if "moe_token_dispatcher" in fixed:
        return [fixed["moe_token_dispatcher"]]
    if expert == 1:
        return ["allgather"]
    if fixed.get("engine") == "tessel":
        return ["alltoall"] if fixed.get("moe_router_force_load_balancing") else ["allgather"]
    # DeepEP differs from an all-to-all only where the expert group spans domains.
    spans = cluster.spans_domains(1, expert)
    return ["alltoall", "flex"] if cluster.device.tp_comm_overlap and spans else ["alltoall"]


def _expert_tensor_degrees(fixed: FixedKnobs, t: int, c: int, d: int, e: int
                           ) -> list[int | None]:
    """Expert tensor degrees tried: as fixed; the attention's (None) and, where experts are
    split and tensors too, 1: each expert whole on one rank (parallel folding), which
    Megatron-Bridge's MoE recipes run (not under Tessel's runtime, which does not)."""
    options: list[int | None] = [None]
    if "expert_tensor" in fixed:
        options = [fixed["expert_tensor"]]
    elif e > 1 and t > 1 and fixed.get("engine") != "tessel":
        # Tessel's runtime splits each expert over the tensor ranks only (`runtime/spec.py`):
        # a plan it is to run keeps that.
        options.append(1)
    return [x for x in options if (t * c * d) % (e * (x or t)) == 0]


def _knob_choices(
    layout: tuple[int, int, int, int, int], model: TransformerConfig, gbs: int,
    fixed: FixedKnobs, space: SearchSpace, cluster: Cluster,
) -> Iterator[ParallelConfig]:
    """Every setting of the knobs other than degrees and recomputation, for one layout."""
    t, c, p, d, e = layout
    per_replica = gbs // d
    micro = _divisors(per_replica, MAX_MICRO_BATCH)
    if "micro_batch_size" in fixed:
        micro = [fixed["micro_batch_size"]] if per_replica % fixed["micro_batch_size"] == 0 else []
    if fixed.get("optimizer_in_backward"):
        # A step in backward leaves no gradient to accumulate: one micro-batch, one stage.
        micro = [mb for mb in micro if mb == per_replica] if p == 1 else []
    # Megatron-LM requires sequence parallelism when experts and tensors are split, and
    # TorchTitan always runs it with tensor parallelism; fixed on, it needs a
    # tensor-parallel group to shard over.
    titan = fixed.get("engine") == "torchtitan"
    parallel_seq = [True] if t > 1 and (e > 1 or titan) else [False, True] if t > 1 else [False]
    if "sequence_parallel" in fixed:
        parallel_seq = [v for v in parallel_seq if v == fixed["sequence_parallel"]]
    zero = [fixed["zero_stage"]] if "zero_stage" in fixed else (
        list(zero_stages(t, c, p, d)) if titan
        else [0, 1] if space == "megatron" else [0, 1, 2, 3]
    )
    overlap = [fixed.get("overlap_grad_reduce", True)]
    dispatchers = _dispatchers(fixed, e, cluster)
    for mb, sp, z, ov, dispatcher, etp in itertools.product(
            micro, parallel_seq, zero, overlap, dispatchers,
            _expert_tensor_degrees(fixed, t, c, d, e)):
        schedules = _schedules(model.num_layers, p, per_replica // mb, fixed, space)
        dims = ParallelDims(tensor=t, context=c, pipeline=p, data=d, expert=e,
                            expert_tensor=etp)
        base = run_settings(ParallelConfig.of(
            dims=dims, micro_batch_size=mb, global_batch_size=gbs, sequence_parallel=sp,
            zero_stage=z, overlap_grad_reduce=ov, precision=fixed.get("precision", "bf16"),
            moe_token_dispatcher=dispatcher), fixed, cluster, d)
        for schedule, v in schedules:
            yield base.but(schedule=schedule, virtual_pipeline=v,
                           overlap_moe_expert_parallel_comm=fixed.get(
                               "overlap_moe_expert_parallel_comm",
                               a2a_overlap_allowed(e, dispatcher, p, v, fixed)))


def a2a_overlap_allowed(expert: int, dispatcher: str, pipeline: int, virtual: int,
                        fixed: FixedKnobs) -> bool:
    """Whether Megatron-LM runs --overlap-moe-expert-parallel-comm here (its
    validate_args: expert parallelism, the alltoall or flex dispatcher, no full
    recomputation, and with pipelining the interleaved schedule), under its engine."""
    return (fixed.get("engine", "megatron") == "megatron" and expert > 1
            and dispatcher in ("alltoall", "flex") and fixed.get("recompute") != "full"
            and (pipeline == 1 or virtual > 1))


def _schedules(
    num_layers: int, p: int, m: int, fixed: FixedKnobs, space: SearchSpace
) -> list[tuple[str, int]]:
    """(schedule, virtual stages) for `p` stages and `m` micro-batches, fixed ones kept.
    Interleaving needs the micro-batches to be a multiple of the stages and the stage's
    layers to split into the chunks (Megatron-LM's rules); GPipe is Alpa's, not Megatron's.
    DualPipeV (two equal chunks per stage, m >= 2 p: torch's ScheduleDualPipeV) is
    TorchTitan's ("DualPipeV" among its pipeline_parallel_schedule names) and Tessel's
    runtime's; Megatron-LM has no DualPipe schedule, so it is offered under those engines
    only."""
    if p == 1:
        schedule = fixed.get("schedule", "1f1b")
        return [] if schedule_info(schedule).chunks != 1 else [(schedule, 1)]
    if m < p:
        # Fewer micro-batches than stages never fill the pipeline, and torch's schedules
        # (what the runtime runs) refuse them.
        return []
    chunks = [fixed["virtual_pipeline"]] if "virtual_pipeline" in fixed else VIRTUAL_STAGES
    # TorchTitan splits any depth over its model parts (`_splits`); Megatron-LM's chunks
    # must divide a stage's layers.
    titan = fixed.get("engine") == "torchtitan"
    options = [("interleaved", v) for v in chunks
               if m % p == 0 and (titan or (num_layers // p) % v == 0)]
    if runs_on("dualpipev", fixed.get("engine")) and 2 in chunks and m >= 2 * p \
            and (titan or (num_layers // p) % 2 == 0):
        options.append(("dualpipev", 2))
    if "virtual_pipeline" not in fixed:
        options = [("1f1b", 1), *options] + ([("gpipe", 1)] if space == "auto" else [])
    return [o for o in options if o[0] == fixed.get("schedule", o[0])]


def enumerate_megatron(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs
) -> Iterator[Candidate]:
    """Every configuration of the Megatron space, recomputation modes included."""
    recomputes = [fixed["recompute"]] if "recompute" in fixed else list(RECOMPUTE)
    for layout in _layouts(model, cluster, gbs, fixed):
        for config in _knob_choices(layout, model, gbs, fixed, "megatron", cluster):
            for split, chunk_layers in _splits(model, config):
                for recompute in recomputes:
                    yield Candidate(configure(config, recompute), split,
                                    chunk_layers=chunk_layers)


def configure(config: ParallelConfig, recompute: Recompute) -> ParallelConfig:
    """`config` with `recompute`; the MoE all-to-all overlap off under full recomputation,
    which Megatron-LM does not run together."""
    if recompute == "full":
        return config.but(recompute=recompute, overlap_moe_expert_parallel_comm=False)
    return config.but(recompute=recompute)


def _splits(model: TransformerConfig, config: ParallelConfig
            ) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """(layers of each stage, of each model chunk where chunks differ): Megatron-LM's
    splits (equal chunks under interleaving); under TorchTitan, model chunks that do not
    divide the layers split as TorchTitan splits them (`part_layers`: DeepSeek-V3's 61
    layers under DualPipeV), each stage the sum of the chunks it runs."""
    p, v = config.dims.pipeline, config.pipelining.virtual_pipeline
    if config.execution.engine == "torchtitan" and v > 1 and model.num_layers % (p * v):
        chunks = part_layers(model.num_layers, p * v)
        if chunks is None or 0 in chunks:
            return []
        v_shaped = config.pipelining.schedule in V_SHAPED
        stages = [0] * p
        for part, count in enumerate(chunks):
            stages[rank_of_part(part, p, v_shaped)] += count
        return [(tuple(stages), tuple(chunks))]
    splits = megatron_stage_splits(model.num_layers, p)
    if v > 1:
        splits = [s for s in splits if len(set(s)) == 1]
    return [(split, None) for split in splits]


def search_megatron(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    flash_attention: bool = True, progress: Progress | None = None,
    collectives: LayerCollectives | None = None, both_cores: bool = False,
) -> SearchResult:
    """The Megatron space, each layout with the least recomputation that fits (and, where
    that one's reserved memory does not, also the least whose reserved memory fits).
    `both_cores`: a forked child searches layouts from the back of the list while this
    process takes them from the front (`forked_call.BothEnds`); the ranking is the same."""
    start = time.perf_counter()
    layouts = list(_layouts(model, cluster, gbs, fixed))
    search = _LayoutSearch(model, cluster, gbs, fixed, flash_attention, collectives)
    if both_cores and len(layouts) > 1:
        queue = BothEnds(len(layouts))
        other = start_forked(search.run, layouts, queue.back)
        found = search.run(layouts, queue.front, progress, queue.taken)
        more = other()
    else:
        counter = itertools.count()
        found = search.run(layouts, lambda: next(counter), progress)
        more = ([], 0)
    # Layout by layout and in each the order tried, as one process would have found them,
    # so that ties rank the same however the layouts were shared out.
    entries = sorted(found[0] + more[0], key=lambda e: (rank_key(e[2]), e[0]))
    ranked = [(candidate, prediction) for _, candidate, prediction in entries]
    return SearchResult(ranked, found[1] + more[1], {"search_s": time.perf_counter() - start})


@dataclass
class _LayoutSearch:
    """`search_megatron`'s work on one layout of degrees at a time."""

    model: TransformerConfig
    cluster: Cluster
    gbs: int
    fixed: FixedKnobs
    flash_attention: bool
    collectives: LayerCollectives | None

    def run(
        self, layouts: list[tuple[int, int, int, int, int]], take: Callable[[], int | None],
        progress: Progress | None = None, done: Callable[[], int] | None = None,
    ) -> tuple[list[tuple[tuple[int, int], Candidate, StepPrediction]], int]:
        """((layout index, order), candidate, prediction) of the layouts `take` hands out
        (None: no more), and how many configurations were tried."""
        model, cluster, gbs, fixed = self.model, self.cluster, self.gbs, self.fixed
        recomputes = [fixed["recompute"]] if "recompute" in fixed else list(RECOMPUTE)
        found: list[tuple[tuple[int, int], Candidate, StepPrediction]] = []
        evaluated = 0
        # Memory does not depend on how tokens reach their experts: one check per layout
        # of the other knobs serves every dispatcher.
        fitted: dict[tuple, bool] = {}
        # The smallest micro-batch that fitted under no recomputation, per layout of the
        # other knobs: micro-batches come smallest first, and a larger one keeps at least
        # as many activations (`micro_batch x min(micro-batches, stages)` in flight), so it
        # cannot fit.
        too_large: dict[tuple, int] = {}
        while (index := take()) is not None and index < len(layouts):
            order = itertools.count()
            for config in _knob_choices(layouts[index], model, gbs, fixed, "megatron",
                                        cluster):
                memory_knobs = config.but(moe_token_dispatcher="allgather",
                                          overlap_moe_expert_parallel_comm=False)
                others = memory_knobs.but(micro_batch_size=1)
                for split, chunk_layers in _splits(model, config):
                    if config.batch.micro_batch_size >= too_large.get((others, split),
                                                                      gbs + 1):
                        continue
                    fitting = False
                    for recompute in recomputes:
                        candidate = Candidate(configure(config, recompute), split,
                                              chunk_layers=chunk_layers)
                        evaluated += 1
                        key = (memory_knobs, split, recompute)
                        if key not in fitted:
                            fitted[key] = fits_memory(model, cluster, candidate.parallel,
                                                      self.flash_attention, list(split))
                        fitting = fitted[key]
                        if fitting:
                            prediction = predict_step(
                                model, cluster, candidate.parallel, self.flash_attention,
                                list(split), self.collectives)
                            found.append(((index, next(order)), candidate, prediction))
                            if prediction.reserved_fits:
                                break  # more recomputation would only be slower
                            # More recomputation may keep the caching allocator's
                            # reserve within the device too (`rank_key` ranks that plan
                            # first).
                    if not fitting:
                        too_large[others, split] = config.batch.micro_batch_size
            if progress:
                progress(done() if done else index + 1, len(layouts))
        return found, evaluated


def best_exhaustive(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    flash_attention: bool = True,
) -> tuple[Candidate, StepPrediction] | None:
    """The first fitting configuration of the whole Megatron space in `rank_key` order, by
    brute force."""
    best = None
    for candidate in enumerate_megatron(model, cluster, gbs, fixed):
        prediction = predict_step(model, cluster, candidate.parallel, flash_attention,
                                  list(candidate.layers_per_stage))
        if prediction.fits and (best is None or rank_key(prediction) < rank_key(best[1])):
            best = (candidate, prediction)
    return best


def devices_needed(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    limit: int = MAX_GPUS,
) -> int | None:
    """The fewest GPUs of this kind (doubling from the cluster's count) on which some
    Megatron configuration fits, or None up to `limit`. Tensor and pipeline degrees are
    freed and memory relief maxed (full recomputation, micro-batch 1, distributed
    optimizer), so the answer is the least the model needs, not the best size to train."""
    relieved = fixed.but(pipeline=None, tensor=None, recompute="full", micro_batch_size=1,
                         zero_stage=1)
    n = cluster.num_devices * 2
    while n <= limit:
        # Past one host a size must fill whole hosts (7 GPUs of a DGX double to 16, not 14).
        if n > cluster.devices_per_host:
            n = -(-n // cluster.devices_per_host) * cluster.devices_per_host
        if search_megatron(model, cluster.with_devices(n), gbs, relieved).ranked:
            return n
        n *= 2
    return None
