"""One rank's pipeline stages of the zoo transformer, built on the meta device and
materialized shard by shard with the same values a single-process build gets.

A stage (`StageModule`) holds the layers of one pipeline chunk under their full-model
names (``layers.3.attn.q_proj.weight`` stays that), the embeddings on the first chunk and
the final norm and LM head on the last, so parameter names, initial values and the
optimizer's view of them are those of `planner.models.transformer.Transformer`.

Initial values come from `init_parameter`: every parameter's value is a function of its
name, its shape and a seed alone (a generator seeded from both), so a rank computes one
full parameter, keeps the slice its shard covers and drops the rest; at most one full
parameter is in memory at a time, and the single-process reference (`build_reference`)
gets bit-identical values.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils.checkpoint import checkpoint

from planner.models.config import TransformerConfig
from runtime.adapters import initial_adapter
from planner.models.transformer import (
    Attention,
    Block,
    MLAttention,
    MTPLayer,
    RMSNorm,
    Transformer,
    apply_rotary,
    attention_core,
    attention_mask,
    mtp_cross_entropy,
    mtp_depth_inputs,
    rotary_tables,
)

INIT_STD = 0.02
CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def init_parameter(name: str, shape: torch.Size | tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of parameter `name` (a full-model name): biases zero, norm scales
    one, every matrix and embedding N(0, 0.02) (GPT-2's init) from a generator keyed by the
    seed and the name; LoRA's adapter factors as LoRA initializes them."""
    name = clean_name(name)
    adapter = initial_adapter(name, shape, seed)  # LoRA's A and B (runtime.adapters)
    if adapter is not None:
        return adapter
    leaf = name.rsplit(".", 1)[-1]
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if leaf == "bias":
        return torch.zeros(shape)
    if module.endswith("norm"):
        return torch.ones(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)


def clean_name(name: str) -> str:
    """A parameter's full-model name, without the wrappers recomputation adds."""
    return name.replace(CHECKPOINT_PREFIX, "")


class StageAttention(Attention):
    """The zoo's attention, runnable on a tensor-parallel shard of its heads.

    Same parameters and results as `Attention`; it reads the head counts from attributes
    that tensor parallelism divides (`local_heads`), reshapes with the local width, computes
    rotary tables itself from its input's sequence length (the full one, also under
    sequence parallelism) and can recompute the attention core in backward (selective
    recomputation).
    """

    def __init__(self, config: TransformerConfig, window: int | None = None) -> None:
        super().__init__(config, window)
        self.rope = config.position_embedding == "rope"
        self.rotary_base = config.rotary_base
        self.recompute_core = False
        self.context: ContextShard | None = None

    def local_heads(self, tensor_parallel: int) -> None:
        if self.num_heads % tensor_parallel or self.num_kv_heads % tensor_parallel:
            raise ValueError(
                f"tensor parallelism {tensor_parallel} must divide the {self.num_heads} heads "
                f"and {self.num_kv_heads} key/value heads"
            )
        self.num_heads //= tensor_parallel
        self.num_kv_heads //= tensor_parallel

    def forward(self, x: torch.Tensor, rotary=None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._project_heads(x)
        context = self.context
        first = context.offset(s) if context is not None else 0
        if self.rope:
            rotary = rotary_tables(first + s, self.head_dim, self.rotary_base, q)
            rotary = (rotary[0][first:], rotary[1][first:])
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        if context is not None:
            # Context parallelism: every rank's keys and values gathered over the context
            # group (backward: reduce-scattered), queries stay local; the causal mask is
            # offset by the rank's first position.
            k = funcol.all_gather_tensor_autograd(k, 2, context.group)
            v = funcol.all_gather_tensor_autograd(v, 2, context.group)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        y = self._core(q, k, v, first, context is not None)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))

    def _core(self, q, k, v, first: int, offset: bool) -> torch.Tensor:
        """The attention core, with an explicit mask where a context shard, a window or
        sinks need one; recomputed in backward under selective recomputation."""
        mask = None
        sinks = getattr(self, "sinks", None)
        if offset or self.window is not None or sinks is not None:
            positions = torch.arange(first, first + q.shape[2], device=q.device)
            mask = attention_mask(positions, k.shape[2], self.window)
        if isinstance(sinks, DTensor):  # tensor parallelism: this rank's heads' sinks
            sinks = sinks.to_local()
        extra = () if sinks is None else (sinks,)
        if self.recompute_core and needs_grad(q, k, v):
            return checkpoint(_attention_core, q, k, v, mask, *extra, use_reentrant=False)
        return _attention_core(q, k, v, mask, *extra)


class StageMLAttention(MLAttention):
    """The zoo's multi-latent attention, runnable on a tensor-parallel shard of its heads
    (Megatron-Core's layout: the down projections to the latents replicated, the up
    projections column-parallel by heads, the output projection row-parallel), with the
    rotary tables, context shards and selective recomputation of `StageAttention`.

    Under tensor parallelism the rotary key part, which every head reads, is held whole on
    every rank; its gradient sums over the ranks' heads (`sum_gradient_over`: one all-reduce
    in backward). The latents' gradients are reduced by the up projections'
    ColwiseParallel, so the block input's gradient is complete on every rank and needs no
    reduction of its own."""

    def __init__(self, config: TransformerConfig, window: int | None = None) -> None:
        super().__init__(config, window)
        self.rotary_base = config.rotary_base
        self.recompute_core = False
        self.context: ContextShard | None = None
        self.k_pos_gradient_mesh: DeviceMesh | None = None
        """Set by tensor parallelism: the tensor mesh the rotary key's gradient sums over."""

    def local_heads(self, tensor_parallel: int) -> None:
        if self.num_heads % tensor_parallel:
            raise ValueError(
                f"tensor parallelism {tensor_parallel} must divide the {self.num_heads} heads")
        self.num_heads //= tensor_parallel

    def forward(self, x: torch.Tensor, rotary=None) -> torch.Tensor:
        b, s, _ = x.shape
        mesh = self.k_pos_gradient_mesh
        hook = None if mesh is None else sum_gradient_over(mesh)
        q_nope, q_pos, k_nope, k_pos, v = self.project(x, hook)
        context = self.context
        first = context.offset(s) if context is not None else 0
        rotary = rotary_tables(first + s, self.pos_dim, self.rotary_base, q_nope)
        q, k = self.join(q_nope, q_pos, k_nope, k_pos, (rotary[0][first:], rotary[1][first:]))
        if context is not None:
            k = funcol.all_gather_tensor_autograd(k, 2, context.group)
            v = funcol.all_gather_tensor_autograd(v, 2, context.group)
        mask = None
        if context is not None or self.window is not None:
            positions = torch.arange(first, first + s, device=q.device)
            mask = attention_mask(positions, k.shape[2], self.window)
        if self.recompute_core and needs_grad(q, k, v):
            y = checkpoint(_attention_core, q, k, v, mask, use_reentrant=False)
        else:
            y = _attention_core(q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


def sum_gradient_over(mesh: DeviceMesh):
    """Identity forward; backward, the gradient summed over `mesh` (one all-reduce): for a
    tensor every rank holds whole whose consumers are split over the ranks."""

    def hook(t: torch.Tensor) -> torch.Tensor:
        whole = DTensor.from_local(t, mesh, [Replicate()], run_check=False)
        return whole.to_local(grad_placements=[Partial()])

    return hook


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether backward reaches any of `tensors`: where none needs a gradient (the first
    block of a LoRA stage without adapters on q, k and v, its embedding frozen), selective
    recomputation has nothing to replay, and a checkpoint would only pack and free them."""
    return any(t.requires_grad for t in tensors)


def _attention_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    return attention_core(q, k, v, mask, sinks)


def stage_block(config: TransformerConfig, kind) -> Block:
    """A zoo block of `kind` whose attention is the stage's (`StageAttention` or
    `StageMLAttention`)."""
    block = Block(config, kind)
    cls = StageMLAttention if config.multi_latent_attention else StageAttention
    block.attn = cls(config, kind.window)
    return block


@dataclass(frozen=True)
class ContextShard:
    """This rank's contiguous slice of the sequence under context parallelism.

    Keys and values are all-gathered over the context group (Llama 3's context
    parallelism, and what the cost model predicts: one all-gather of K and V per layer),
    not passed around a ring as Megatron's ring attention does. Slices are contiguous, so
    with a causal mask the last rank does the most attention work; Megatron's 2 x cp
    load-balancing chunks are not done.
    """

    group: dist.ProcessGroup
    rank: int
    size: int

    def offset(self, local_length: int) -> int:
        """The first sequence position of this rank's slice."""
        return self.rank * local_length


class StageModule(nn.Module):
    """Layers [first, last) of the model, plus the embeddings if `first_stage` and the
    final norm and LM head if `last_stage`. Input: token ids (first stage) or hidden
    states; output: hidden states or logits (last stage).

    With tied embeddings the LM head is the token embedding's weight. A last stage that is
    not also the first holds its own copy under the same name (``embed.weight``), as
    Megatron-LM's last stage does; the trainer sums the two copies' gradients over the
    embedding group (first and last pipeline rank) so they stay equal.
    """

    def __init__(
        self, config: TransformerConfig, layers: tuple[int, int], first_stage: bool,
        last_stage: bool,
    ) -> None:
        super().__init__()
        self.config = config
        self.layer_range = layers
        self.first_stage, self.last_stage = first_stage, last_stage
        h = config.hidden_size
        # The last stage holds the token embedding too for a tied head, and for the
        # multi-token-prediction layers, which embed the next tokens (Megatron-LM keeps
        # it there for both and keeps the copies' gradients equal).
        mtp = last_stage and config.mtp_num_layers > 0
        tied_head = last_stage and config.tie_embeddings
        self.embed = (nn.Embedding(config.vocab_size, h)
                      if first_stage or tied_head or mtp else None)
        self.pos_embed = None
        if first_stage and config.position_embedding == "learned":
            self.pos_embed = nn.Embedding(config.max_position_embeddings, h)
        self.layers = nn.ModuleDict()
        kinds = config.layer_kinds()
        for index in range(*layers):
            self.layers[str(index)] = stage_block(config, kinds[index])
        self.final_norm = _norm_like(config) if last_stage else None
        # Multi-token prediction on the last stage, as Megatron-LM places it.
        self.mtp = None
        if mtp:
            self.mtp = nn.ModuleList()
            for _ in range(config.mtp_num_layers):
                layer = MTPLayer(config)
                layer.block = stage_block(config, config.mtp_kind())
                self.mtp.append(layer)
        # An nn.Linear (not the zoo's LMHead) so ColwiseParallel can shard it; same weight
        # name and value (LMHead of an untied model is F.linear without bias).
        self.lm_head = None
        if last_stage and not config.tie_embeddings:
            self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        # Set by tensor parallelism with sequence parallelism: embeddings -> sequence shard.
        self.scatter_sequence = None
        # Set by tensor parallelism: the layout of the tied head's input (Replicate(), or
        # Shard(1) under sequence parallelism).
        self.head_input_layout = None
        # Set by context parallelism (`set_context`).
        self.context: ContextShard | None = None

    def set_context(self, context: ContextShard) -> None:
        """Run on this rank's slice of the sequence: positions offset, attention over
        every rank's keys and values."""
        self.context = context
        for block in self.blocks():
            block.attn.context = context

    def blocks(self) -> list[nn.Module]:
        """Every transformer block of the stage: its layers', then its MTP layers'."""
        return list(self.layers.values()) + [layer.block for layer in self.mtp or ()]

    def forward(self, x: torch.Tensor, mtp_targets: torch.Tensor | None = None):
        if self.first_stage:
            ids = x
            x = self.embed(ids)
            if self.pos_embed is not None:
                s = ids.shape[1]
                first = self.context.offset(s) if self.context is not None else 0
                x = x + self.pos_embed(torch.arange(first, first + s, device=ids.device))
            if self.scatter_sequence is not None:
                x = self.scatter_sequence(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.last_stage:
            x = self.final_norm(x)
            logits = self._head(x)
            if self.mtp is None or mtp_targets is None:
                return logits
            # The MTP layers' mean loss rides with the logits to the loss function
            # (planner.models.transformer.lm_loss), as in the zoo's Transformer.
            losses = []
            for depth, layer in enumerate(self.mtp, start=1):
                ids, labels = mtp_depth_inputs(mtp_targets, depth)
                x = layer(x, self.embed(ids))
                losses.append(mtp_cross_entropy(self._head(x), labels, depth))
            return logits, torch.stack(losses).mean()
        return x

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:  # tied: the head is the token embedding
            return tied_head(x, self.embed.weight, self.head_input_layout)
        return self.lm_head(x)


def force_load_balancing(stage: nn.Module) -> None:
    """Route every MoE MLP of the stage by forced load balancing
    (`planner.models.transformer.forced_experts`)."""
    for module in stage.modules():
        if hasattr(module, "force_balance"):
            module.force_balance = True


def tied_head(x: torch.Tensor, weight: torch.Tensor, input_layout=None) -> torch.Tensor:
    """Logits of a head tied to the token embedding `weight`. A vocabulary-parallel weight
    (a DTensor, with `input_layout` the layout of `x` on its mesh: Replicate(), or Shard(1)
    under sequence parallelism) gives logits column-parallel over the vocabulary, then
    gathered for the loss (what ColwiseParallel does for the untied head)."""
    if input_layout is None or not isinstance(weight, DTensor):
        return F.linear(x, weight)
    mesh = weight.device_mesh
    if not isinstance(x, DTensor):  # SequenceParallel's norm output already is one
        x = DTensor.from_local(x, mesh, [input_layout], run_check=False)
    logits = F.linear(x.redistribute(mesh, [Replicate()]), weight)
    return logits.redistribute(mesh, [Replicate()]).to_local()


def _norm_like(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.hidden_size)
    return nn.LayerNorm(config.hidden_size)


def build_stage(
    config: TransformerConfig, layers: tuple[int, int], first_stage: bool, last_stage: bool,
) -> StageModule:
    """The stage on the meta device: no parameter memory."""
    with torch.device("meta"):
        return StageModule(config, layers, first_stage, last_stage)


def materialize(module: nn.Module, seed: int, device: str | torch.device = "cpu") -> None:
    """Give every meta parameter of `module` its initial value, shard by shard.

    Plain tensors get the whole value; DTensors (tensor-parallel or FSDP-sharded) only the
    slice their local shard covers, computed from their placements: each rank computes one
    full parameter at a time, copies its slice and drops the rest.
    """
    module.to_empty(device=device)
    with torch.no_grad():
        for name, param in module.named_parameters():
            full = init_parameter(name, param.shape, seed)
            if isinstance(param, DTensor) and any(
                    isinstance(p, _StridedShard) for p in param.placements):
                # Strided (a fused gate/up split alike): no one offset, so split locally.
                param.to_local().copy_(distribute_tensor(
                    full, param.device_mesh, param.placements, src_data_rank=None).to_local())
            elif isinstance(param, DTensor):
                local = param.to_local()
                shape, offset = compute_local_shape_and_global_offset(
                    param.shape, param.device_mesh, param.placements
                )
                index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
                local.copy_(full[index].reshape(local.shape))
            else:
                param.copy_(full)
            del full


def build_reference(
    config: TransformerConfig, seed: int, force_balance: bool = False,
) -> Transformer:
    """The whole model in one process with the values the stages get."""
    with torch.device("meta"):
        model = Transformer(config)
    if force_balance:
        force_load_balancing(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(init_parameter(name, param.shape, seed))
    return model
