"""One rank's part of a training plan (`RunSpec`): its pipeline stages of the zoo model or
of a Hugging Face decoder (`runtime.model_parts`), tensor/sequence parallel, FSDP2 data
parallel with ZeRO, recomputation, a torch pipeline schedule and an fp32 optimizer.

`PipelineTrainer.step(tokens, targets)` takes the global batch (every rank passes the same
one), keeps this rank's data-parallel slice and runs forward and backward over its
micro-batches with the plan's schedule, then the optimizer step. Its loss is the mean of
the rank's micro-batch losses on last-stage ranks (None elsewhere): the mean over the
data-parallel ranks of the last stage is the loss one process computes on the whole batch.

The optimizers are elementwise (SGD, AdamW), so updating each local shard on its own is
the single-process update of the full parameter.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard

from planner.models.config import TransformerConfig
from planner.models.transformer import lm_loss as zoo_lm_loss
from runtime import checkpoint
from runtime.activation_counter import ActivationCounter
from runtime.experts import expert_mesh, expert_parameters, reduce_expert_gradients
from runtime.faults import bound_timeouts
from runtime.mesh import build_mesh
from runtime.model_parts import model_parts
from runtime.parallelize import (
    apply_data_parallel,
    keep_gradients_sharded,
    slice_stage_boundaries,
)
from runtime.schedule import build_schedule, stage_shapes
from runtime.spec import RunSpec
from runtime.stages import ContextShard, clean_name

# FSDP2 warns when a wrapped module returns a view, since an in-place op on it would skip
# the pre-backward all-gather. A stage's outputs are views where tensor parallelism hands
# back `DTensor.to_local()` (a `view_as` of the local shard: the head's logits); torch's
# pipeline schedule only sends them, or hands them to the loss, which reads them: nothing
# writes into them, so the warning says nothing a user can act on.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                        category=UserWarning)

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "adamw": (
        torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    ),
}


def lm_loss(output, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the batch, plus the scaled
    multi-token-prediction loss when the last stage returns one with its logits
    (`planner.models.transformer.lm_loss`, the zoo's own training loss)."""
    return zoo_lm_loss(output, targets)


def make_optimizer(params: list[nn.Parameter], name: str) -> torch.optim.Optimizer:
    cls, kwargs = OPTIMIZERS[name]
    # foreach=False: the parameters can live on different meshes (tp, dp, both).
    return cls(params, foreach=False, **kwargs)


class PipelineTrainer(checkpoint.Checkpointing):
    """One rank's part of a training plan. Needs an initialized process group of
    `spec.degrees.world_size` ranks. `save(root)` / `load(path)` checkpoint it
    (`runtime.checkpoint`: sharded, reshardable onto another plan).

    `config` is the model's shape; with `hf_config` (a Hugging Face config's
    ``to_dict()``, `config` its `to_transformer_config`) the stages are that model's own
    transformers modules, else the zoo transformer's. With `count_activations`, each step
    counts the bytes every stage saves for backward per micro-batch
    (`saved_activation_bytes`; off by default: its hooks cost time on every saved tensor)."""

    def __init__(
        self, config: TransformerConfig, spec: RunSpec, seed: int = 0, optimizer: str = "sgd",
        mesh: DeviceMesh | None = None, hf_config: dict[str, Any] | None = None,
        count_activations: bool = False,
    ) -> None:
        self.config, self.spec, self.hf_config = config, spec, hf_config
        parts = model_parts(config, hf_config)
        parts.check(spec)
        self.parts = parts
        self.mesh = mesh if mesh is not None else build_mesh(spec.degrees)
        coordinate = self.mesh.get_coordinate()
        assert coordinate is not None
        self.coords = dict(zip(self.mesh.mesh_dim_names, coordinate))
        self.expert_mesh = expert_mesh(self.mesh, spec.expert) if spec.expert > 1 else None
        cp = spec.degrees.cp
        if config.seq_length % (cp * spec.degrees.tp):
            raise ValueError(
                f"seq_length {config.seq_length} must split over context x tensor parallelism "
                "(sequence shards, and the slices pipeline stages send)"
            )
        self.context = None
        # Gradients are averaged over data x context ranks (both see different tokens), as
        # Megatron's data-parallel group with context parallelism is.
        self.dp_mesh = self.mesh["dp"]
        if cp > 1:
            self.context = ContextShard(self.mesh["cp"].get_group(), self.coords["cp"], cp)
            self.dp_mesh = self.mesh["dp", "cp"]._flatten("dp_cp")
        self.modules: dict[int, nn.Module] = {}
        for index in spec.stage_indices(self.coords["pp"]):
            stage = parts.build_stage(
                spec.chunks[index], first=index == 0, last=index == spec.num_stages - 1,
            )
            if self.context is not None:
                stage.set_context(self.context)
            if spec.force_balance:
                parts.force_balance(stage)
            if self.expert_mesh is not None:
                parts.expert_parallel(stage, self.expert_mesh, spec.expert_dispatcher)
            parts.tensor_parallel(stage, self.mesh["tp"], spec.sequence_parallel)
            # LoRA: the base frozen, adapters beside its linears (before FSDP2 wraps them).
            parts.fine_tune(stage, spec, spec.chunks[index], first=index == 0,
                            last=index == spec.num_stages - 1, tp_mesh=self.mesh["tp"])
            if not spec.sequence_parallel:
                slice_stage_boundaries(stage, self.mesh["tp"], first=index == 0,
                                       last=index == spec.num_stages - 1)
            parts.recompute(stage, spec.recompute)
            ignored = set(expert_parameters(stage)) if self.expert_mesh is not None else None
            apply_data_parallel(stage, self.dp_mesh, spec.zero_stage, ignored)
            parts.materialize(stage, seed)
            keep_gradients_sharded(stage)
            self.modules[index] = stage
        self.is_last = spec.num_stages - 1 in self.modules
        self.is_first = 0 in self.modules
        # Hidden states cross stage boundaries as 1/t slices of the sequence: sequence
        # parallelism's, or Megatron's scatter-gather without it.
        shards = spec.degrees.tp
        shapes = {
            index: stage_shapes(
                index, spec.num_stages, spec.micro_batch_size, config.seq_length // cp,
                config.hidden_size, config.vocab_size, shards,
            )
            for index in self.modules
        }
        last = spec.num_stages - 1
        if last in shapes and hf_config is None and config.mtp_num_layers:
            # The last stage returns (logits, MTP loss): one output each.
            inputs, logits = shapes[last]
            shapes[last] = (inputs, (logits, torch.empty((), device="meta",
                                                         requires_grad=True)))
        self.activations = ActivationCounter() if count_activations else None
        self.poisoned = False
        """Set before a step to make its loss NaN (the injected fault `--nan-at-step`)."""
        self.diverged: str | None = None
        """Why the last step was not applied (`step`'s `judge`), or None."""

        def loss_of(output, targets: torch.Tensor) -> torch.Tensor:
            loss = lm_loss(output, targets)
            return loss * float("nan") if self.poisoned else loss

        loss_fn = loss_of
        if self.activations is not None:
            for index, module in self.modules.items():
                self.activations.watch(index, module)
            loss_fn = self.activations.counting_loss(spec.num_stages - 1, loss_of)
        self.saved_activations: dict[int, list[int]] = {}
        self.schedule = build_schedule(
            self.modules, shapes, spec.num_stages, spec.schedule, spec.virtual_pipeline,
            spec.num_micro_batches, loss_fn, self.mesh["pp"].get_group(), torch.device("cpu"),
        )
        self.embedding_group = self._embedding_group()
        self.parameters = [p for m in self.modules.values() for p in m.parameters()]
        # Trained parameters only: a frozen base (LoRA) has no optimizer state.
        self.optimizer = make_optimizer([p for p in self.parameters if p.requires_grad],
                                        optimizer)
        self.held: dict[str, int] = {}
        self.steps_done = 0
        # A hang in any of this rank's groups fails within the default group's timeout.
        meshes = [self.mesh, self.dp_mesh] + ([self.expert_mesh] if self.expert_mesh else [])
        bound_timeouts([g for m in meshes for g in m.get_all_groups()]
                       + [self.embedding_group])

    @property
    def _shared_embedding(self) -> bool:
        """Whether the last stage holds a copy of the token embedding: for a tied head, or
        for multi-token-prediction layers (zoo models only)."""
        mtp = self.hf_config is None and self.config.mtp_num_layers > 0
        return self.config.tie_embeddings or mtp

    def _embedding_group(self) -> dist.ProcessGroup | None:
        """Megatron's embedding group: the pipeline ranks of the first and the last stage,
        which both hold the tied token embedding, one group per pipeline. Every rank
        creates every group (new_group is collective) and keeps the one it is in. None when
        one rank runs both stages (no pipeline, or ZBV's V order)."""
        spec = self.spec
        first, last = spec.stage_rank(0), spec.stage_rank(spec.num_stages - 1)
        if not self._shared_embedding or first == last:
            return None
        ranks = self.mesh.mesh.reshape(spec.degrees.pp, -1)
        mine = None
        for column in range(ranks.shape[1]):
            pair = [int(ranks[first, column]), int(ranks[last, column])]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = group
        return mine

    def _sum_tied_embedding_gradients(self) -> None:
        """Both copies of a tied embedding get the sum of their gradients, so both take the
        same step: added locally when one rank holds both, else one all-reduce over the
        embedding group per shard."""
        if not self._shared_embedding or self.spec.num_stages == 1 or self.spec.finetuning.adapters:
            return  # (a frozen embedding has no gradient)
        grads = []
        for module in self.modules.values():
            if module.embed is not None:
                grad = module.embed.weight.grad
                grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        if len(grads) == 2:
            grads[0].add_(grads[1])
            grads[1].copy_(grads[0])
        elif grads and self.embedding_group is not None:
            dist.all_reduce(grads[0], group=self.embedding_group)

    def _local_batch(self, t: torch.Tensor) -> torch.Tensor:
        dp, index = self.spec.degrees.dp, self.coords["dp"]
        if t.shape[0] != self.spec.global_batch_size:
            raise ValueError(
                f"a batch of {t.shape[0]} sequences for a plan of global batch "
                f"{self.spec.global_batch_size}"
            )
        rows = t.chunk(dp)[index]
        return rows.chunk(self.spec.degrees.cp, dim=1)[self.coords["cp"]].contiguous()

    def step(
        self, tokens: torch.Tensor, targets: torch.Tensor,
        judge: Callable[[float | None, list[torch.Tensor]], str | None] | None = None,
    ) -> float | None:
        """Forward and backward over the micro-batches, then the optimizer step. With
        `judge` (`runtime.divergence.DivergenceGuard.judge`), the step's loss and local
        gradients are judged first, and a step it names a reason for is not applied
        (`diverged` holds the reason)."""
        self.diverged = None
        for module in self.modules.values():
            module.train()
        losses: list[torch.Tensor] = []
        args = (self._local_batch(tokens),) if self.is_first else ()
        kwargs: dict[str, Any] = {}
        if self.is_last:
            kwargs = {"target": self._local_batch(targets), "losses": losses}
        if self.hf_config is None and self.config.mtp_num_layers:
            # Every stage's forward takes them (torch hands step's keyword arguments to
            # all stages, split into micro-batches); the last stage's MTP layers read them.
            kwargs["mtp_targets"] = self._local_batch(targets)
        if self.activations is not None:
            self.activations.start_step()
        # The last stage's outputs are not merged: an MTP model's are (logits, loss).
        self.schedule.step(*args, return_outputs=False, **kwargs)
        if self.activations is not None:
            self.saved_activations = self.activations.per_micro_batch()
        self._sum_tied_embedding_gradients()
        # Replicated parameters each tensor rank sees part of (a Hugging Face model's QK
        # norms, on the rank's heads): one all-reduce of their gradients, Megatron's
        # finalize_model_grads.
        self.parts.reduce_replicated_gradients(list(self.modules.values()), self.mesh["tp"])
        if self.expert_mesh is not None:
            for module in self.modules.values():
                reduce_expert_gradients(module, self.expert_mesh, self.spec.degrees.dp)
        self.held = {
            "parameters": _bytes(self.parameters),
            "parameters_gathered": _gathered_bytes(self.parameters, self.dp_mesh),
            "gradients": _bytes([p.grad for p in self.parameters if p.grad is not None]),
        }
        experts = {id(p) for m in self.modules.values() for p in expert_parameters(m)}
        self.held["expert_parameters"] = _bytes([p for p in self.parameters
                                                 if id(p) in experts])
        self.held["expert_gradients"] = _bytes([p.grad for p in self.parameters
                                                if id(p) in experts and p.grad is not None])
        loss = float(torch.stack([x.detach() for x in losses]).mean()) if self.is_last \
            else None
        if judge is not None:
            grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                     for p in self.parameters if p.grad is not None]
            self.diverged = judge(loss, grads)
        if self.diverged is None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        self.held["optimizer"] = _bytes([
            v for state in self.optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ])
        self.held["expert_optimizer"] = _bytes([
            v for p, state in self.optimizer.state.items() if id(p) in experts
            for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0
        ])
        return loss

    def saved_activation_bytes(self) -> dict[int, list[int]]:
        """Stage index -> bytes this rank saved for backward in each micro-batch of the
        last step, in the order the schedule ran them (`runtime.activation_counter`);
        empty unless built with `count_activations`."""
        return dict(self.saved_activations)

    def checkpoint_state(self) -> checkpoint.ModulesState:
        """The stages' parameters and the optimizer, for `save` / `load`."""
        return checkpoint.ModulesState(self.modules, self.optimizer)

    def local_bytes(self) -> dict[str, int]:
        """This rank's bytes of parameters and gradients (after the last backward) and of
        optimizer state (after the last step), counted over its local shards.

        Parameters are counted at rest (``parameters``) and gathered over the data-parallel
        axis (``parameters_gathered``); ``expert_parameters``, ``expert_gradients`` and
        ``expert_optimizer`` are the experts' part (never ZeRO-sharded here). FSDP2 keeps
        them sharded at rest for every ZeRO stage it runs (1, 2 and 3); ZeRO-1/2 hold the
        gathered ones from the forward to the last backward of a step (what a ZeRO-1/2
        plan predicts), ZeRO-3 one layer's at a time. A tied embedding's copy on the last
        pipeline stage is counted there (as Megatron holds it)."""
        return dict(self.held)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's stages' parameters gathered in full, by full-model name (collective
        over each parameter's mesh: call it on every rank)."""
        out = {}
        for module in self.modules.values():
            for name, p in module.named_parameters():
                value = p.full_tensor() if isinstance(p, DTensor) else p
                out[clean_name(name)] = value.detach().clone()
        return out


def _gathered_bytes(params, dp_mesh: DeviceMesh) -> int:
    """Bytes of the parameters with their data-parallel (FSDP) sharding undone: what a rank
    holds while FSDP2 has them gathered (ZeRO-1/2: from forward to the last backward)."""
    dp_names = set(dp_mesh.mesh_dim_names or ()) | {"dp", "cp", "dp_cp"}
    total = 0
    for p in params:
        if not isinstance(p, DTensor):
            total += p.numel() * p.element_size()
            continue
        mesh, numel = p.device_mesh, p.numel()
        for dim, placement in enumerate(p.placements):
            split = placement.is_shard() or isinstance(placement, _StridedShard)
            if split and mesh.mesh_dim_names[dim] not in dp_names:
                numel //= mesh.size(dim)  # a tensor-parallel split stays
        total += numel * p.element_size()
    return total


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total
