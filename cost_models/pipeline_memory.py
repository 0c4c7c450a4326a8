"""Memory per GPU of each pipeline stage: weights, gradients and optimizer state of the
parameters it holds, and the activations its layers keep for the micro-batches the
schedule has in flight (Korthikanti et al. 2022 per layer, `cost_models/memory.py`).

A search asks `fits_memory` before it prices a layout's time (`step_time`): most of the
layouts it tries do not fit, and their time is never needed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from cost_models import (
    eight_bit_adam,
    engine_memory,
    graph_pool,
    memory,
    offload,
    pipeline_schedule,
)
from cost_models.adapters import trained_parameters
from cost_models.saved_activations import (
    checkpoint_bytes,
    saved_per_layer,
    tessel_counted,
    tessel_stage,
)
from cost_models.transformer_ops import SCORE_FREE_ATTENTION
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig


@dataclass(frozen=True)
class StageLayout:
    """One pipeline stage: its layers and the logical (data x tensor) mesh it runs on."""

    layers: int
    """Transformer layers the stage holds."""
    tensor: int
    """Tensor-parallel degree inside the stage."""
    data: int
    """Data-parallel degree inside the stage: replicas that split each micro-batch."""
    pool: int = 0
    """The pool of a mixed cluster the stage runs on (`planner.vocabulary.pools`); 0 on
    a cluster of one kind."""

    @property
    def devices(self) -> int:
        return self.tensor * self.data


def recomputed_layers(parallel: ParallelConfig, layers: int) -> int:
    """Layers of a stage of `layers` whose forward (or, selective, attention core) is
    replayed in backward: all of them, or under full recomputation by the block method the
    first recompute_num_layers of each of the stage's virtual chunks."""
    recomputation = parallel.recomputation
    if recomputation.recompute == "none":
        return 0
    if recomputation.recompute == "full" and recomputation.recompute_every > 1:
        # TorchTitan's layer-level checkpointing wraps blocks k, 2k, ... of the model.
        return layers // recomputation.recompute_every
    if recomputation.recompute == "full" and recomputation.recompute_method == "block":
        v = parallel.pipelining.virtual_pipeline
        return min(layers, recomputation.recompute_num_layers * v)
    return layers


def even_split(num_layers: int, stages: int) -> list[int]:
    """Layers per stage as even as they go, the earlier stages taking the remainder."""
    base, extra = divmod(num_layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def attention_backend(parallel: ParallelConfig, flash: bool) -> str:
    """The attention backend `parallel` runs: its own, or for 'auto' flash where the
    device runs fused attention (`flash`), else Megatron-LM's local one."""
    if parallel.execution.attention_backend != "auto":
        return parallel.execution.attention_backend
    return "flash" if flash else "local"


def layer_parameters(model: TransformerConfig, parallel: ParallelConfig,
                     tensor: int | None = None) -> tuple[float, float]:
    """(other, expert): parameters of one (mean) layer on one GPU of a stage `tensor`
    wide (default `parallel.tensor`): all but the routed experts split over the tensor
    ranks; the experts over the expert ranks and each over the expert-tensor ranks
    (Megatron-Core's parallel folding; the expert-tensor degree defaults to the stage's
    tensor degree)."""
    t = tensor or parallel.dims.tensor
    experts = model.expert_parameters_per_layer()
    etp = parallel.dims.expert_tensor if parallel.dims.expert_tensor is not None else t
    return (model.parameters_per_layer() - experts) / t, experts / (parallel.dims.expert * etp)


def stage_parameter_split(
    model: TransformerConfig, stages: list[StageLayout], parallel: ParallelConfig
) -> list[tuple[float, float]]:
    """(other, expert) parameters one GPU of each stage holds."""
    embedding = model.vocab_size * model.hidden_size
    positions = model.hidden_size * (model.max_position_embeddings or 0) * (
        model.position_embedding == "learned"
    )
    mtp = _mtp_parameters(model)
    out = []
    for index, stage in enumerate(stages):
        other, expert = layer_parameters(model, parallel, stage.tensor)
        other, expert = stage.layers * other, stage.layers * expert
        ends = 0.0
        if index == 0:
            ends += embedding + positions
        if index == len(stages) - 1:
            if not model.tie_embeddings or len(stages) > 1:
                ends += embedding  # untied head, or the tied copy Megatron keeps last
            # Multi-token-prediction layers sit on the last stage beside the head.
            ends += mtp[0]
            etp = parallel.dims.expert_tensor or stage.tensor
            expert += mtp[1] / (parallel.dims.expert * etp)
        out.append((other + ends / stage.tensor, expert))
    return out


@lru_cache(maxsize=4096)
def _unrecomputed(parallel: ParallelConfig) -> ParallelConfig:
    """`parallel` without recomputation: what a replayed layer holds while it runs."""
    return parallel.but(recompute="none")


def _mtp_parameters(model: TransformerConfig) -> tuple[float, float]:
    """(other, expert) parameters of the model's multi-token-prediction layers."""
    if not model.mtp_num_layers:
        return 0.0, 0.0
    kind = model.mtp_kind()
    expert = model.layer_expert_parameters(kind)
    other = model.layer_parameters(kind) - expert + model.mtp_extra_parameters()
    return model.mtp_num_layers * other, model.mtp_num_layers * expert


def stage_parameters(
    model: TransformerConfig, stages: list[StageLayout], parallel: ParallelConfig
) -> list[float]:
    """Parameters one GPU of each stage holds (its tensor and expert shards)."""
    return [other + expert for other, expert in stage_parameter_split(model, stages, parallel)]


def fits_memory(
    model: TransformerConfig,
    cluster: Cluster,
    parallel: ParallelConfig,
    flash_attention: bool | None = None,
    layers_per_stage: list[int] | None = None,
) -> bool:
    """Whether `predict_step` would find every stage within the device's memory, without
    pricing its time: a search's first question, as most layouts it tries do not fit."""
    parallel = parallel.resolve(cluster.num_devices)
    stages = uniform_stages(model, parallel, layers_per_stage)
    peak = stages_peak_memory(model, cluster, parallel, stages, flash_attention)
    return peak.fits(cluster.usable_memory_bytes) and offload.host_fits(
        peak.host, peak.nvme, cluster)


def uniform_stages(
    model: TransformerConfig, parallel: ParallelConfig, layers_per_stage: list[int] | None
) -> list[StageLayout]:
    """Stages as Megatron-LM lays them out: all on `parallel`'s mesh, the layers as given
    or split evenly."""
    layers = layers_per_stage or even_split(model.num_layers, parallel.dims.pipeline)
    return [StageLayout(count, parallel.dims.tensor, parallel.dims.data) for count in layers]


def stages_peak_memory(
    model: TransformerConfig,
    cluster: Cluster,
    parallel: ParallelConfig,
    stages: list[StageLayout],
    flash_attention: bool | None = None,
) -> memory.MemoryBreakdown:
    """The memory of the stage that needs the most per GPU. Micro-batches in flight fall
    with the stage index (`pipeline_schedule.in_flight`), so of stages alike in all else the
    first holds the most; the last adds the output layer's activations."""
    params = stage_parameters(model, stages, parallel)
    firsts: dict[tuple, int] = {}
    for i in range(len(stages) - 1):
        firsts.setdefault((params[i], stages[i].tensor, stages[i].data, stages[i].layers), i)
    return max(stage_memories(model, cluster, parallel, stages, flash_attention,
                              [*firsts.values(), len(stages) - 1]),
               key=lambda breakdown: breakdown.total)


def stage_memories(
    model: TransformerConfig,
    cluster: Cluster,
    parallel: ParallelConfig,
    stages: list[StageLayout],
    flash_attention: bool | None = None,
    indices: list[int] | None = None,
) -> list[memory.MemoryBreakdown]:
    """The memory of one GPU of each stage (of those at `indices`, default all), each on its
    own mesh with the sequences of one micro-batch split over its replicas."""
    if flash_attention is None:
        flash_attention = cluster.device.flash_attention
    p = len(stages)
    sequences = parallel.batch.micro_batch_size * parallel.dims.data
    m = parallel.batch.global_batch_size // sequences
    split = stage_parameter_split(model, stages, parallel)
    score_free = attention_backend(parallel, flash_attention) in SCORE_FREE_ATTENTION
    meshes: dict[tuple[int, int], ParallelConfig] = {}
    for stage in stages:
        if (stage.tensor, stage.data) not in meshes:
            meshes[stage.tensor, stage.data] = parallel.but(
                tensor=stage.tensor, data=stage.data,
                micro_batch_size=sequences // stage.data)
    return [stage_memory(model, meshes[stages[i].tensor, stages[i].data], split[i][0],
                         stages[i].layers, i, p, m, score_free, split[i][1])
            for i in (range(p) if indices is None else indices)]


def stage_memory(
    model: TransformerConfig,
    parallel: ParallelConfig,
    params: float,
    layers: int,
    index: int,
    num_stages: int,
    num_micro_batches: int,
    flash: bool,
    expert_params: float = 0.0,
) -> memory.MemoryBreakdown:
    """Memory of one GPU of pipeline stage `index` (`parallel` as the stage runs it),
    holding `params` parameters besides `expert_params` of routed experts and `layers`
    layers' activations, by the rules of the engine that runs it
    (`cost_models.engine_memory`, `cost_models.saved_activations`)."""
    other, expert = layer_parameters(model, parallel)
    if parallel.finetuning.adapters:
        state, gathered = engine_memory.adapter_state(model, params, layers, parallel,
                                                      expert_params)
    else:
        ends = max(params - layers * other, 0)
        # The larger end, the embedding or the head (one tensor where they are tied).
        end_unit = min(ends, model.vocab_size * model.hidden_size / parallel.dims.tensor)
        state, gathered = engine_memory.model_state(
            params, other + expert, ends, parallel, expert_params, end_unit)
        if parallel.execution.optimizer_in_backward:
            state = replace(state, gradients=_one_gradient(model, parallel, end_unit))
    kinds, working = stage_activations(model, parallel, layers, index, num_stages,
                                       num_micro_batches, flash)
    host = nvme = 0.0
    moved_bytes = None
    if offload.offloads(parallel):
        in_flight = pipeline_schedule.in_flight(
            parallel.pipelining.schedule, num_stages, index, num_micro_batches,
            parallel.pipelining.virtual_pipeline)
        state, gathered, kinds, moved = _offloaded(
            model, parallel, state, gathered, kinds, layers, params + expert_params,
            in_flight)
        host, nvme = moved.host_bytes, moved.nvme_bytes
        moved_bytes = moved
    activations = sum(kinds.values())
    pool = 0.0
    if graph_pool.graphed(parallel):
        in_flight = pipeline_schedule.in_flight(
            parallel.pipelining.schedule, num_stages, index, num_micro_batches,
            parallel.pipelining.virtual_pipeline)
        pool = graph_pool.pool_bytes(model, parallel, kinds, layers, in_flight, flash)
    transient = gathered + working
    allocated = state.total + activations + transient
    return memory.MemoryBreakdown(
        weights=state.weights, gradients=state.gradients, optimizer=state.optimizer,
        activations=activations, reserve=engine_memory.NON_ALLOCATOR_BYTES,
        transient=transient,
        fragmentation=engine_memory.reserved_bytes(allocated, parallel) - allocated,
        graph_pool=pool,
        activation_kinds=tuple(kinds.items()),
        expert_state=state.experts,
        frozen=state.frozen,
        host=host,
        nvme=nvme,
        offloaded=moved_bytes,
    )


def _one_gradient(model: TransformerConfig, parallel: ParallelConfig, end_unit: float) -> float:
    """The gradient bytes alive at once when each parameter is stepped and freed as its
    gradient is made (`optimizer_in_backward`): the largest parameter's, the head's or the
    embedding's (`end_unit`) or an MLP projection's, sharded under ZeRO 2-3."""
    element = memory.gradient_element_bytes(parallel.numerics.main_grads_dtype)
    projection = model.hidden_size * (model.ffn_hidden_size or 4 * model.hidden_size) \
        / parallel.dims.tensor
    shards = parallel.dims.data * parallel.dims.context \
        if parallel.sharding.zero_stage >= 2 else 1
    return element * max(end_unit, projection) / shards


OUTSIDE_LAYERS = ("loss", "head", "embedding")
"""Kinds of kept activations that belong to no layer (the ends' embedding, head and loss):
activation offload moves the layers' only."""


def _offloaded(
    model: TransformerConfig, parallel: ParallelConfig, state: memory.ModelStateBytes,
    gathered: float, kinds: dict[str, float], layers: int, params: float, in_flight: int,
) -> tuple[memory.ModelStateBytes, float, dict[str, float], offload.OffloadBytes]:
    """One GPU's state, working buffers and kept activations with what `parallel` offloads
    taken off it (`cost_models.offload`), and what goes to the host and NVMe."""
    shards = parallel.dims.data * parallel.dims.context
    trained = trained_parameters(model, parallel, params, layers)
    owned = trained / shards if parallel.sharding.zero_stage >= 1 else trained
    in_layers = {kind: bytes_ for kind, bytes_ in kinds.items() if kind not in OUTSIDE_LAYERS}
    per_layer = sum(in_layers.values()) / max(layers * in_flight, 1)
    stage = offload.StageState(
        optimizer_parameters=owned, optimizer_bytes=state.optimizer,
        gradient_bytes=state.gradients, weight_shard_bytes=state.weights,
        activation_bytes_per_layer=per_layer, layers=layers)
    moved = offload.offload_bytes(stage, parallel, in_flight)
    config = parallel.offload
    f = offload.optimizer_off_gpu(parallel)
    keep_grads = 1 - f if parallel.sharding.zero_stage >= 2 else 1.0
    # Paged state lives outside torch's allocator, which is what the peak counts.
    kept_optimizer = 0.0 if eight_bit_adam.paged(parallel) else 1 - f
    weights = state.weights
    if config.offload_params != "none":
        # Only the layer computing and the one prefetched are on the GPU, gathered (the
        # torchtitan engine's FSDP2 rules count its gathered blocks already).
        weights = 0.0
        if parallel.execution.engine != "torchtitan":
            gathered += 2 * state.weights * shards / max(layers, 1)
    offloaded = offload.offloaded_layers(parallel, layers)
    if offloaded:
        # The offloaded layers' activations leave but for one layer's staging buffer.
        share = 1 - (offloaded - 1) / layers if offloaded < layers else 1 / layers
        kinds = {kind: bytes_ * (share if kind in in_layers else 1.0)
                 for kind, bytes_ in kinds.items()}
    return memory.ModelStateBytes(
        weights=weights, gradients=state.gradients * keep_grads,
        optimizer=state.optimizer * kept_optimizer, experts=state.experts,
        frozen=state.frozen if weights else 0.0), gathered, kinds, moved


def stage_activations(
    model: TransformerConfig, parallel: ParallelConfig, layers: int, index: int,
    num_stages: int, num_micro_batches: int, flash: bool,
) -> tuple[dict[str, float], float]:
    """(kept, working): the activations stage `index` keeps at its peak, by kind, over the
    schedule's micro-batches in flight, and the working buffers of backward beside them
    (one replayed layer, the loss's logits, a layer's gradients)."""
    layer = saved_per_layer(model, parallel, flash)
    whole = sum(layer.values())
    kinds = dict(layer)
    replay = 0.0  # what backward rebuilds of the layers it replays, held once
    if parallel.recomputation.recompute == "full":
        # Checkpointed layers keep their input; the others all they made. Backward rebuilds
        # one checkpointed group at a time: its working set, held once.
        none = saved_per_layer(model, _unrecomputed(parallel), flash)
        whole_none = sum(none.values())
        replayed = recomputed_layers(parallel, layers)
        recomputation = parallel.recomputation
        group = recomputation.recompute_num_layers \
            if recomputation.recompute_method == "uniform" else 1
        share = (layers - replayed) / max(layers, 1)
        kinds = {kind: bytes_ * share for kind, bytes_ in none.items()}
        kinds["checkpointed inputs"] = replayed * checkpoint_bytes(model, parallel) / group \
            / max(layers, 1)
        replay = min(group, layers) * whole_none
    elif parallel.recomputation.recompute == "selective" and layers:
        # The replayed part of one layer lives again during its backward.
        none = saved_per_layer(model, _unrecomputed(parallel), flash)
        replay = max(sum(none.values()) - whole, 0.0)
    in_flight = pipeline_schedule.in_flight(
        parallel.pipelining.schedule, num_stages, index, num_micro_batches,
        parallel.pipelining.virtual_pipeline,
    )
    kept = {kind: bytes_ * layers * in_flight for kind, bytes_ in kinds.items()}
    tessel = parallel.execution.engine == "tessel" and tessel_counted(model)
    if tessel:
        # Tessel's runtime, counted per micro-batch as `plan check` measures it: the blocks
        # and the end stages' embedding, head and loss, each kept per micro-batch in flight.
        kept = {kind: bytes_ * in_flight for kind, bytes_ in tessel_stage(
            model, parallel, layers, index == 0, index == num_stages - 1).items()}
    layer_working = replay + engine_memory.layer_working_bytes(model, parallel)
    if index != num_stages - 1:
        return kept, layer_working
    saved, loss_working = engine_memory.loss_bytes(model, parallel)
    if tessel:
        return kept, max(loss_working, layer_working)
    kept["loss"] = saved
    # The loss's buffers live before backward starts; a layer's replay and gradients
    # during it, after the loss's backward has freed what it saved. The peak is the larger.
    return kept, max(loss_working, layer_working - saved)
