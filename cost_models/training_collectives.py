"""The collectives one rank of a training plan issues in one step, one by one: kind, mesh
axis, phase, count and bytes. `plan check --gpus` compares them with what the ranks
measure, kind by kind, in count and bytes.

They follow the runtime (`runtime/`), which composes torch's pieces the Megatron-LM way:

- Tensor parallelism (`parallelize_module`), per layer and micro-batch: without sequence
  parallelism two all-reduces forward (attention and MLP outputs) and two backward (their
  inputs' gradients, reduced once per block input); with it, an all-gather and a
  reduce-scatter per block input and output, each way, plus one all-reduce per sequence-
  parallel norm parameter's gradient (per micro-batch; once per step when ZeRO's hooks
  accumulate gradients). The embedding's output is all-reduced; the head's input gradient
  reduced and its logits all-gathered for the loss. A mixture-of-experts MLP reduces each
  expert's output and each expert input's gradient on its own.
- Full recomputation reruns each block's forward in backward up to the last tensor the
  backward needs (torch's non-reentrant checkpoint stops early), so the MLP's output
  reduction is not repeated; selective recomputation reruns no collective.
- Context parallelism all-gathers each layer's keys and values (backward: reduce-scatter).
- Pipelining (`torch.distributed.pipelining`): an activation out and its gradient back
  per micro-batch and chunk boundary that crosses ranks, each rank sending its 1/t slice
  of the sequence (without sequence parallelism Megatron's scatter-gather: the receiver
  all-gathers the slices, the sender their gradients); in the first step one 4-byte
  shape agreement each way per boundary.
- ZeRO (FSDP2), per FSDP unit (each block, and each chunk's remaining parameters):
  ZeRO-0 one all-reduce of the gradients per step; ZeRO-1/2 one all-gather and one
  reduce-scatter per step; ZeRO-3 one all-gather per micro-batch's forward and one more
  for the backward (the parameters stay gathered between micro-batches' backwards), and
  one reduce-scatter per step. Buffers hold dim 0 padded to a multiple of the shards.
- A tied embedding's two copies (first and last stage) all-reduce their gradients once.
- Per-head QK norms (Qwen3's), replicated over the tensor ranks while each rank normalizes
  only its heads, all-reduce their gradients over the tensor ranks once per step, all of
  the rank's in one (Megatron-LM's finalize_model_grads).
- Expert parallelism: ``allgather`` dispatch all-gathers tokens and routing weights over the
  expert group and reduce-scatters the outputs (backward: the mirror); ``alltoall`` sends
  counts, tokens and outputs with all-to-alls whose sizes depend on the routing (their
  bytes are the even-routing expectation, exact under forced balance). Expert gradients
  are all-reduced over the expert-data-parallel ranks, one bucket per MoE block.

- LoRA and QLoRA (`runtime.adapters`): the base is frozen, so only the adapters'
  gradients are reduced over the data-parallel ranks (a unit of only frozen parameters
  reduces nothing), and the frozen norms', tied embedding's and QK norms' gradients are
  not reduced at all. The adapter factor whole on every tensor rank (A beside a
  column-parallel linear, B beside a row-parallel one) gets a partial gradient there,
  which DTensor all-reduces over the tensor ranks: once per step where ZeRO's hooks
  accumulate the gradients, else once per micro-batch. No gradient reaches the first
  chunk's embedding output or its first layer's input, so their backward reductions are
  not issued (nor, when only the MLP is adapted, that layer's attention output's).

Bytes follow `runtime.comm_counter`: the larger of a collective's local input and output.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from cost_models.finetuned_parameters import finetuned_chunk
from cost_models.stage_parameters import (
    ParameterLayout,
    local_shape,
    padded_numel,
    sharded_by_zero,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import Finetuning
from planner.vocabulary.parallel_dims import ParallelDims

SHAPE_AGREEMENT_BYTES = 4
"""The int32 torch's pipeline stages exchange once per boundary and direction to agree on
static shapes."""
COUNT_BYTES = 8
"""An int64 count per expert, exchanged before each all-to-all token dispatch."""


@dataclass(frozen=True)
class Collective:
    """`count` collectives of `bytes` each, of one kind, on one mesh axis, in one phase."""

    kind: str
    axis: str
    """tp, cp, dp (data x context under ZeRO), pp, ep, edp or embedding (first and last
    pipeline rank)."""
    phase: str
    """forward, backward, recompute (the forward rerun in backward), gradient_sync, or
    setup (first step only)."""
    count: int
    bytes: int


@dataclass(frozen=True)
class GradientFlow:
    """Which of a layer's activations a gradient reaches in backward: all of them, but
    where only frozen parameters come before (under LoRA, the first chunk's first layer:
    its input is the frozen embedding's output)."""

    attention_input: bool = True
    keys_values: bool = True
    attention_output: bool = True
    mlp_input: bool = True
    mlp_output: bool = True


ALL_GRADIENTS = GradientFlow()


def first_layer_flow(targets: tuple[str, ...]) -> GradientFlow:
    """The gradients of a first layer whose input needs none (LoRA over a frozen
    embedding), with adapters beside the `targets` linears: from the attention's output
    on where attention is adapted, else from the MLP's output."""
    attention = bool({"linear_qkv", "linear_proj"} & set(targets))
    mlp = bool({"linear_fc1", "linear_fc2"} & set(targets))
    return GradientFlow(attention_input=False, keys_values="linear_qkv" in targets,
                        attention_output=attention, mlp_input=attention,
                        mlp_output=attention or mlp)


@dataclass(frozen=True)
class RankLayout:
    """What of a training plan decides one pipeline rank's collectives."""

    chunks: tuple[tuple[int, int], ...]
    """Layers [first, last) of every pipeline chunk, in model order."""
    chunk_ranks: tuple[int, ...]
    """The pipeline rank that runs each chunk."""
    dims: ParallelDims
    """The plan's degrees (the stage's tensor and data ones)."""
    micro_batch_size: int
    num_micro_batches: int
    sequence_parallel: bool
    zero_stage: int
    recompute: str
    expert_dispatcher: str = "allgather"
    element_bytes: int = 4
    """Bytes of an activation or parameter element."""
    gradient_bytes: int = 4
    """Bytes of a gradient element as it is reduced (fp32 main gradients under mixed
    precision, as Megatron-LM reduces them)."""
    finetuning: Finetuning = Finetuning()
    """What is trained: every weight, or (LoRA, QLoRA) adapters over a frozen base."""

    @property
    def adapters(self) -> bool:
        """Whether only adapters are trained, over a frozen base."""
        return self.finetuning.adapters

    @property
    def tensor(self) -> int:
        return self.dims.tensor

    @property
    def data(self) -> int:
        return self.dims.data

    @property
    def context(self) -> int:
        return self.dims.context

    @property
    def expert(self) -> int:
        return self.dims.expert


def rank_collectives(
    model: TransformerConfig, layout: RankLayout, pp_rank: int
) -> list[Collective]:
    """Every collective a rank on pipeline rank `pp_rank` issues in one step."""
    out: list[Collective] = []
    mine = [c for c, r in enumerate(layout.chunk_ranks) if r == pp_rank]
    last = len(layout.chunks) - 1
    m = layout.num_micro_batches
    kinds = model.layer_kinds()
    held: list[ParameterLayout] = []
    for c in mine:
        first_chunk, last_chunk = c == 0, c == last
        layers = layout.chunks[c]
        params = finetuned_chunk(model, layers, first_chunk, last_chunk, layout.finetuning)
        held += params
        num_layers = layers[1] - layers[0]
        for index in range(*layers):  # dense and MoE layers apart
            flow = ALL_GRADIENTS
            if layout.adapters and first_chunk and index == layers[0]:
                flow = first_layer_flow(layout.finetuning.lora_targets)
            out += _scaled(layer_collectives(model.for_layer(kinds[index]), layout, flow), m)
        out += _scaled(end_collectives(model, layout, first_chunk, last_chunk), m)
        if last_chunk:
            out += _scaled(_mtp_collectives(model, layout), m)
        if layout.tensor > 1 and layout.sequence_parallel and not layout.adapters:
            out += _norm_gradients(model, layout, num_layers, last_chunk)
        out += _adapter_gradients(layout, params)
        out += _expert_gradients(model, layout, params)
        out += _pipeline(model, layout, c, pp_rank)
        out += _zero(layout, params)
    out += _tied_embedding(model, layout, pp_rank)
    out += _head_norm_gradients(model, layout, held)
    return [c for c in out if c.count]


def layer_collectives(
    model: TransformerConfig, layout: RankLayout, flow: GradientFlow = ALL_GRADIENTS,
) -> list[Collective]:
    """The tensor-, context- and expert-parallel collectives of one transformer layer for
    one micro-batch: phase forward, backward, or recompute (the forward rerun in
    backward); the backward ones of the activations `flow` says a gradient reaches.
    What the step-time model prices per layer."""
    return [*_layer_tensor_parallel(model, layout, flow),
            *_layer_context_parallel(model, layout, flow),
            *_layer_expert_dispatch(model, layout)]


def end_collectives(
    model: TransformerConfig, layout: RankLayout, first: bool, last: bool
) -> list[Collective]:
    """The tensor-parallel collectives of the embedding (`first` chunk) and of the head and
    loss (`last` chunk) for one micro-batch."""
    if layout.tensor == 1:
        return []
    hidden = _hidden_bytes(model, layout)
    sp = layout.sequence_parallel
    out = []
    if first:
        out.append(Collective("all_reduce", "tp", "forward", 1, hidden))
        if sp and not layout.adapters:
            # The embedding's output cut to sequence shards: backward all-gathers (a
            # frozen embedding's output gets no gradient).
            out.append(Collective("all_gather", "tp", "backward", 1, hidden))
    if last:
        logits = _tokens(model, layout) * model.vocab_size * layout.element_bytes
        out.append(Collective("all_gather", "tp", "forward", 1, logits))
        if sp:
            out += [Collective("all_gather", "tp", "forward", 1, hidden),
                    Collective("reduce_scatter", "tp", "backward", 1, hidden)]
        else:
            out.append(Collective("all_reduce", "tp", "backward", 1, hidden))
    return out


def by_kind(collectives: list[Collective], steps: int = 1) -> dict[str, dict[str, int]]:
    """Count and bytes per kind over `steps` steps (setup collectives once), the shape
    `runtime.comm_counter.CommCounter.by_kind` measures."""
    total: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    for c in collectives:
        times = 1 if c.phase == "setup" else steps
        total[c.kind]["count"] += c.count * times
        total[c.kind]["bytes"] += c.count * c.bytes * times
    return dict(sorted(total.items()))


def _scaled(collectives: list[Collective], times: int) -> list[Collective]:
    return [replace(c, count=c.count * times) for c in collectives]


def _tokens(model: TransformerConfig, layout: RankLayout) -> int:
    """Token positions of one micro-batch on a rank (its context shard)."""
    return layout.micro_batch_size * model.seq_length // layout.context


def _hidden_bytes(model: TransformerConfig, layout: RankLayout) -> int:
    """One micro-batch's hidden states on a rank, whole over the sequence shard."""
    return _tokens(model, layout) * model.hidden_size * layout.element_bytes


def _layer_tensor_parallel(
    model: TransformerConfig, layout: RankLayout, flow: GradientFlow = ALL_GRADIENTS,
) -> list[Collective]:
    if layout.tensor == 1:
        return []
    hidden = _hidden_bytes(model, layout)
    sp, full = layout.sequence_parallel, layout.recompute == "full"
    # The attention, and a dense MLP the same: its input gathered (or its gradient
    # reduced) once, its output reduced. Multi-latent attention reduces its latents'
    # gradients instead of its input's (runtime.stages.StageMLAttention).
    dense = 1 if model.is_moe else 2
    reduced_inputs = (flow.attention_input and not model.multi_latent_attention) + \
        (flow.mlp_input and not model.is_moe)
    # Under sequence parallelism each output's reduce-scatter gathers its gradient back.
    scattered_outputs = flow.attention_output + (flow.mlp_output and not model.is_moe)
    if sp:
        out = [Collective("all_gather", "tp", "forward", dense, hidden),
               Collective("reduce_scatter", "tp", "forward", dense, hidden),
               Collective("reduce_scatter", "tp", "backward", reduced_inputs, hidden),
               Collective("all_gather", "tp", "backward", scattered_outputs, hidden)]
        if full:  # rerun: the block inputs' gathers and the attention output's scatter
            out += [Collective("all_gather", "tp", "recompute", dense, hidden),
                    Collective("reduce_scatter", "tp", "recompute", 1, hidden)]
    else:
        out = [Collective("all_reduce", "tp", "forward", dense, hidden),
               Collective("all_reduce", "tp", "backward", reduced_inputs, hidden)]
        if full:  # rerun up to the attention output's reduction
            out.append(Collective("all_reduce", "tp", "recompute", 1, hidden))
    if model.multi_latent_attention:
        # The query latent's (or, without one, the input's through q_proj), the key/value
        # latent's and the shared rotary key's gradients, summed over the heads' ranks.
        per_token = layout.micro_batch_size * model.seq_length // layout.context \
            * layout.element_bytes
        q_latent = model.q_lora_rank or model.hidden_size
        out += [Collective("all_reduce", "tp", "backward", 1, per_token * width)
                for width in (q_latent, model.kv_lora_rank, model.qk_pos_emb_head_dim)]
    if model.is_moe:
        # Every expert (this rank's, under expert parallelism) reduces its output, and each
        # of its column-parallel inputs' gradients, on its own. Under expert parallelism
        # the experts run on their group's gathered tokens (or, dispatched all-to-all, on
        # the tokens routed to them: data-dependent).
        experts = model.num_experts // layout.expert
        inputs = 2 if model.activation == "swiglu" else 1
        gathered = layout.expert == 1 or layout.expert_dispatcher == "allgather"
        # Dispatched all-to-all, an expert runs on the pairs routed to it: ep k / E of
        # a rank's tokens under even routing (exact under forced balance).
        rows = hidden * layout.expert if gathered else \
            hidden * model.moe_top_k * layout.expert // model.num_experts
        grads = int(flow.mlp_input)  # the experts' inputs' gradients
        out += [Collective("all_reduce", "tp", "forward", experts, rows),
                Collective("all_reduce", "tp", "backward", experts * inputs * grads, rows)]
        shared = 1 if model.moe_shared_expert_intermediate_size else 0
        # The shared expert the same way, on the rank's own tokens.
        out += [Collective("all_reduce", "tp", "forward", shared, hidden),
                Collective("all_reduce", "tp", "backward", shared * inputs * grads, hidden)]
        if sp:  # the MLP input gathered; its output cut to sequence shards (backward: gather)
            out += [Collective("all_gather", "tp", "forward", 1, hidden),
                    Collective("all_gather", "tp", "backward", int(flow.mlp_output), hidden)]
        if full:
            out += [Collective("all_reduce", "tp", "recompute", experts, rows),
                    Collective("all_reduce", "tp", "recompute", shared, hidden)]
            if sp:
                out.append(Collective("all_gather", "tp", "recompute", 1, hidden))
    return out


def _mtp_collectives(model: TransformerConfig, layout: RankLayout) -> list[Collective]:
    """The multi-token-prediction layers' collectives for one micro-batch, on the last
    chunk: per layer, tensor parallelism's embedding of the next tokens (vocabulary-
    parallel), eh_proj (column-parallel, output gathered: its input's gradient reduced)
    and the head, and its block's (never recomputed: it is not checkpointed)."""
    if not model.mtp_num_layers:
        return []
    block = [c for c in layer_collectives(model.for_layer(model.mtp_kind()), layout)
             if c.phase != "recompute"]
    out = list(block)
    if layout.tensor > 1:
        hidden = _hidden_bytes(model, layout)
        out += [*end_collectives(model, layout, True, True),
                Collective("all_gather", "tp", "forward", 1, hidden),
                Collective("all_reduce", "tp", "backward", 1, 2 * hidden)]
    return _scaled(out, model.mtp_num_layers)


def _norm_gradients(
    model: TransformerConfig, layout: RankLayout, num_layers: int, last: bool
) -> list[Collective]:
    """Sequence-parallel norms hold replicated parameters whose gradients are partial sums:
    one all-reduce per parameter, each micro-batch, or once per step where ZeRO's hooks
    accumulate the gradients before they are reduced."""
    per_norm = 1 if model.norm == "rmsnorm" else 2
    norms = (4 if model.sandwich_norms else 2) * num_layers + (1 if last else 0)
    times = 1 if layout.data * layout.context > 1 else layout.num_micro_batches
    nbytes = model.hidden_size * layout.gradient_bytes
    return [Collective("all_reduce", "tp", "backward", norms * per_norm * times, nbytes)]


def _adapter_gradients(layout: RankLayout, params: list[ParameterLayout]) -> list[Collective]:
    """Under tensor parallelism, the trained factors whole on every tensor rank (LoRA's A
    beside a column-parallel linear, B beside a row-parallel one: `cost_models.adapters`)
    get partial gradients, each rank's from its part of the linear: DTensor all-reduces
    each one, once per step where ZeRO's hooks accumulate the gradients before they are
    reduced, else once per micro-batch."""
    if layout.tensor == 1 or not layout.adapters:
        return []
    times = 1 if layout.data * layout.context > 1 else layout.num_micro_batches
    return [Collective("all_reduce", "tp", "gradient_sync", times,
                       math.prod(p.shape) * layout.gradient_bytes)
            for p in params if not p.frozen and p.tensor_dim is None]


def _head_norm_gradients(
    model: TransformerConfig, layout: RankLayout, params: list[ParameterLayout]
) -> list[Collective]:
    """Per-head QK norms (not multi-latent attention's latent norms, whose inputs'
    gradients are reduced before them) are replicated over the tensor ranks, each of which
    normalizes only its heads: one all-reduce per step of all the rank's norms' gradients
    (after ZeRO's reduce-scatter: each rank's shards)."""
    if layout.tensor == 1 or not model.qk_layernorm or model.multi_latent_attention \
            or layout.adapters:  # frozen under LoRA
        return []
    shards = layout.data * layout.context
    numel = sum(math.prod(local_shape(p, layout.tensor, shards, layout.zero_stage))
                for p in params if ".attn.q_norm." in p.name or ".attn.k_norm." in p.name)
    return [Collective("all_reduce", "tp", "gradient_sync", 1 if numel else 0,
                       numel * layout.gradient_bytes)]


def _layer_context_parallel(
    model: TransformerConfig, layout: RankLayout, flow: GradientFlow = ALL_GRADIENTS,
) -> list[Collective]:
    if layout.context == 1:
        return []
    kv_heads = model.num_kv_heads // layout.tensor
    gathered = (layout.micro_batch_size * kv_heads * model.seq_length * model.head_dim
                * layout.element_bytes)
    out = [Collective("all_gather", "cp", "forward", 2, gathered),
           Collective("reduce_scatter", "cp", "backward", 2 * flow.keys_values, gathered)]
    if layout.recompute == "full":
        out.append(Collective("all_gather", "cp", "recompute", 2, gathered))
    return out


def _layer_expert_dispatch(model: TransformerConfig, layout: RankLayout) -> list[Collective]:
    ep = layout.expert
    if not model.is_moe or ep == 1:
        return []
    e = layout.element_bytes
    tokens = _tokens(model, layout)
    full = layout.recompute == "full"
    if layout.expert_dispatcher == "allgather":
        gathered, weights = tokens * model.hidden_size * e * ep, tokens * model.num_experts * e * ep
        out = [Collective("all_gather", "ep", "forward", 1, gathered),
               Collective("all_gather", "ep", "forward", 1, weights),
               Collective("reduce_scatter", "ep", "forward", 1, gathered),
               Collective("all_gather", "ep", "backward", 1, gathered),
               Collective("reduce_scatter", "ep", "backward", 1, gathered),
               Collective("reduce_scatter", "ep", "backward", 1, weights)]
        if full:
            out += [Collective("all_gather", "ep", "recompute", 1, gathered),
                    Collective("all_gather", "ep", "recompute", 1, weights)]
        return out
    counts = model.num_experts * COUNT_BYTES
    pairs = tokens * model.moe_top_k * model.hidden_size * e  # even routing
    out = [Collective("all_to_all", "ep", "forward", 1, counts),
           Collective("all_to_all", "ep", "forward", 2, pairs),
           Collective("all_to_all", "ep", "backward", 2, pairs)]
    if full:
        out += [Collective("all_to_all", "ep", "recompute", 1, counts),
                Collective("all_to_all", "ep", "recompute", 2, pairs)]
    return out


def _expert_gradients(
    model: TransformerConfig, layout: RankLayout, params: list[ParameterLayout]
) -> list[Collective]:
    """Expert gradients summed over the expert-data-parallel ranks: one all-reduce per
    MoE block, of all the rank's experts' gradients in it (a bucket)."""
    ep = layout.expert
    if not model.is_moe or ep == 1 or layout.data // ep == 1:
        return []
    mine = model.num_experts // ep
    buckets: dict[str, int] = defaultdict(int)
    for p in params:
        if p.frozen:
            continue
        if p.expert is not None and p.expert < mine:  # equal shapes on every rank
            buckets[p.group] += math.prod(local_shape(p, layout.tensor, 1, 0))
    return [Collective("all_reduce", "edp", "gradient_sync", 1, n * layout.gradient_bytes)
            for n in buckets.values()]


def _pipeline(
    model: TransformerConfig, layout: RankLayout, chunk: int, pp_rank: int
) -> list[Collective]:
    m = layout.num_micro_batches
    # Each rank sends its 1/t slice of the sequence: sequence parallelism's shard, or
    # without it Megatron's scatter-gather (the receiving stage all-gathers the slices,
    # the sending one all-gathers their gradients).
    activation = (_tokens(model, layout) // layout.tensor * model.hidden_size
                  * layout.element_bytes)
    ranks = layout.chunk_ranks
    gathers = _scaled(boundary_collectives(model, layout, chunk == 0, chunk == len(ranks) - 1),
                      m)
    out = []
    if chunk > 0 and ranks[chunk - 1] != pp_rank:
        out += [Collective("recv", "pp", "forward", m, activation),
                Collective("send", "pp", "backward", m, activation)]
    if chunk < len(ranks) - 1 and ranks[chunk + 1] != pp_rank:
        out += [Collective("send", "pp", "forward", m, activation),
                Collective("recv", "pp", "backward", m, activation)]
    boundaries = len(out) // 2
    out += [Collective("send", "pp", "setup", boundaries, SHAPE_AGREEMENT_BYTES),
            Collective("recv", "pp", "setup", boundaries, SHAPE_AGREEMENT_BYTES)]
    return gathers + out


def boundary_collectives(
    model: TransformerConfig, layout: RankLayout, first: bool, last: bool
) -> list[Collective]:
    """Megatron's scatter-gather at a pipeline chunk's ends, for one micro-batch, without
    sequence parallelism: the chunk all-gathers the sequence slices it receives (unless
    `first`) and, in backward, the gradients of the slices it sent (unless `last`)."""
    if layout.tensor == 1 or layout.sequence_parallel:
        return []
    hidden = _hidden_bytes(model, layout)
    out = []
    if not first:
        out.append(Collective("all_gather", "tp", "forward", 1, hidden))
    if not last:
        out.append(Collective("all_gather", "tp", "backward", 1, hidden))
    return out


def _zero(layout: RankLayout, params: list[ParameterLayout]) -> list[Collective]:
    shards = layout.data * layout.context
    if shards == 1:
        return []
    e, g, m = layout.element_bytes, layout.gradient_bytes, layout.num_micro_batches
    groups: dict[str, list[ParameterLayout]] = defaultdict(list)
    for p in params:
        if not (p.expert is not None and layout.expert > 1):
            groups[p.group].append(p)
    out = []
    for members in groups.values():
        # Only trained parameters' gradients are reduced (none, in a unit of frozen ones).
        trained = [p for p in members if not p.frozen]
        if layout.zero_stage == 0:
            numel = sum(math.prod(local_shape(p, layout.tensor, 1, 0)) for p in trained)
            out.append(Collective("all_reduce", "dp", "gradient_sync", int(bool(trained)),
                                  numel * g))
            continue
        assert all(sharded_by_zero(p, layout.zero_stage, layout.expert) for p in members)
        numel = sum(padded_numel(p, layout.tensor, shards) for p in members)
        reduced = sum(padded_numel(p, layout.tensor, shards) for p in trained)
        gathers = m + 1 if layout.zero_stage == 3 else 1
        out += [Collective("all_gather", "dp", "forward", gathers, numel * e),
                Collective("reduce_scatter", "dp", "gradient_sync", int(bool(trained)),
                           reduced * g)]
    return out


def _tied_embedding(
    model: TransformerConfig, layout: RankLayout, pp_rank: int
) -> list[Collective]:
    ranks = layout.chunk_ranks
    shared = model.tie_embeddings or model.mtp_num_layers > 0  # MTP embeds on the last
    if layout.adapters:  # a frozen embedding has no gradient to share
        return []
    if not shared or ranks[0] == ranks[-1] or pp_rank not in (ranks[0], ranks[-1]):
        return []
    embed = ParameterLayout("embed.weight", (model.vocab_size, model.hidden_size), 0, "root")
    shards = layout.data * layout.context
    numel = math.prod(local_shape(embed, layout.tensor, shards, layout.zero_stage))
    return [Collective("all_reduce", "embedding", "gradient_sync", 1,
                       numel * layout.gradient_bytes)]

