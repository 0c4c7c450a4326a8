"""Train a training plan (`RunSpec`) on this rank: its pipeline stages of the zoo model or
of a Hugging Face decoder (`runtime.model_parts`), tensor/sequence parallel, FSDP2 data
parallel with ZeRO, recomputation, a torch pipeline schedule and an fp32 optimizer; and
the same training in one process, for comparison.

`PipelineTrainer.step(tokens, targets)` takes the global batch (every rank passes the same
one), keeps this rank's data-parallel slice and runs forward and backward over its
micro-batches with the plan's schedule, then the optimizer step. Its loss is the mean of
the rank's micro-batch losses on last-stage ranks (None elsewhere): the mean over the
data-parallel ranks of the last stage is the loss one process computes on the whole batch.

The optimizers are elementwise (SGD, AdamW), so updating each local shard on its own is
the single-process update of the full parameter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
from runtime.comm_counter import CommCounter
from runtime.elastic import launch
from runtime.experts import (
    EXPERT_MARK,
    expert_mesh,
    expert_parameters,
    reduce_expert_gradients,
)
from runtime.faults import FaultWatch, bound_timeouts
from runtime.mesh import build_mesh
from runtime.model_parts import model_parts
from runtime.parallelize import (
    apply_data_parallel,
    keep_gradients_sharded,
    slice_stage_boundaries,
)
from runtime.resilience import Resilience, restart_count
from runtime.schedule import build_schedule, stage_shapes
from runtime.spec import RunSpec
from runtime.stages import ContextShard, clean_name

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


def _optimizer(params: list[nn.Parameter], name: str) -> torch.optim.Optimizer:
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
        loss_fn = lm_loss
        if self.activations is not None:
            for index, module in self.modules.items():
                self.activations.watch(index, module)
            loss_fn = self.activations.counting_loss(spec.num_stages - 1, lm_loss)
        self.saved_activations: dict[int, list[int]] = {}
        self.schedule = build_schedule(
            self.modules, shapes, spec.num_stages, spec.schedule, spec.virtual_pipeline,
            spec.num_micro_batches, loss_fn, self.mesh["pp"].get_group(), torch.device("cpu"),
        )
        self.embedding_group = self._embedding_group()
        self.parameters = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = _optimizer(self.parameters, optimizer)
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
        if not self._shared_embedding or self.spec.num_stages == 1:
            return
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

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Forward and backward over the micro-batches, then the optimizer step."""
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
        if not self.is_last:
            return None
        return float(torch.stack([loss.detach() for loss in losses]).mean())

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


def batches(config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0):
    """`steps` (tokens, targets) batches of the plan's global batch, the same on every
    rank."""
    generator = torch.Generator().manual_seed(seed + 12345)
    shape = (spec.global_batch_size, config.seq_length)
    return [
        (torch.randint(0, config.vocab_size, shape, generator=generator),
         torch.randint(0, config.vocab_size, shape, generator=generator))
        for _ in range(steps)
    ]


def train_on_rank(
    rank: int, world_size: int, config: TransformerConfig, spec: RunSpec, steps: int,
    seed: int = 0, optimizer: str = "sgd", hf_config: dict[str, Any] | None = None,
    resilience: Resilience | None = None,
) -> dict[str, Any]:
    """K steps of the plan on this rank: its losses, its stages' final parameters (from
    the first rank of each stage's tp x dp group only), collectives counted per kind over
    the steps, and its local bytes. `hf_config`: see `PipelineTrainer`.

    With `resilience`, the run resumes from the newest complete checkpoint in its folder
    (the losses before it come from the checkpoint), checkpoints every K steps and may
    kill a rank (`runtime.resilience`); ``resumed_from`` says the step it resumed at,
    ``steps_run`` how many steps this attempt ran (and counted collectives of)."""
    trainer = PipelineTrainer(config, spec, seed, optimizer, hf_config=hf_config,
                              count_activations=True)
    data = batches(config, spec, steps, seed)
    losses: list[float | None] = []
    resumed = resilience.resume(trainer) if resilience is not None else None
    if resumed is not None:
        losses = list(resumed.notes.get("losses", [None] * resumed.step))
    watch = FaultWatch.gather(resilience.last_checkpoint if resilience is not None else None)
    per_step = []
    everything = CommCounter()
    for index in range(trainer.steps_done, steps):
        if resilience is not None:
            resilience.before_step(rank, index)
        with watch.step(index), everything, CommCounter() as counter:
            losses.append(trainer.step(*data[index]))
        per_step.append(counter.by_kind())
        if resilience is not None:
            with watch.step(index):  # a save's collectives meet a lost peer too
                resilience.after_step(trainer, {"losses": losses})
    with watch.step(steps):
        trainer.wait_for_checkpoint()
    params = trainer.full_parameters()
    # One copy of each parameter: data rank 0 of each stage; experts from their ep ranks.
    if trainer.coords["tp"] != 0 or trainer.coords["cp"] != 0 or (
        trainer.coords["dp"] >= spec.expert
    ):
        params = {}
    elif trainer.coords["dp"] > 0:
        params = {n: p for n, p in params.items() if EXPERT_MARK in f".{n}"}
    return {
        "coords": trainer.coords,
        "losses": losses,
        "parameters": params,
        "collectives": _add_counts(per_step),
        "collectives_per_step": per_step,
        "collectives_by_group": everything.by_group(),
        "local_bytes": trainer.local_bytes(),
        "saved_activations": trainer.saved_activation_bytes(),
        "resumed_from": None if resumed is None else resumed.step,
        "attempt": restart_count(),
        "steps_run": len(per_step),
    }


def _add_counts(steps: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for step in steps:
        for kind, c in step.items():
            entry = total.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += c["count"]
            entry["bytes"] += c["bytes"]
    return dict(sorted(total.items()))


def train_reference(
    config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0, optimizer: str = "sgd",
    hf_config: dict[str, Any] | None = None,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same steps in one process: whole model (the zoo's, or with `hf_config`
    transformers' own causal LM), whole batch. Returns the losses and the final
    parameters."""
    parts = model_parts(config, hf_config)
    model = parts.reference(seed, spec.force_balance)
    opt = _optimizer(list(model.parameters()), optimizer)
    losses = []
    for tokens, targets in batches(config, spec, steps, seed):
        loss = lm_loss(parts.logits(model, tokens, targets), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def merge_results(results: list[dict[str, Any]]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses (mean over the last stage's data-parallel ranks) and every parameter, from
    every rank's `train_on_rank` result."""
    last = [r["losses"] for r in results if r["losses"] and r["losses"][0] is not None]
    losses = [sum(step) / len(step) for step in zip(*last)]
    params: dict[str, torch.Tensor] = {}
    for r in results:
        params.update(r["parameters"])
    return losses, params


def relative_errors(
    losses: list[float], params: dict[str, torch.Tensor], ref_losses: list[float],
    ref_params: dict[str, torch.Tensor],
) -> tuple[float, float]:
    """Largest relative error of the losses, and relative error of the parameters as one
    vector (norm of the difference over the norm of the reference)."""
    if set(params) != set(ref_params):
        raise ValueError(f"parameters differ: {sorted(set(params) ^ set(ref_params))}")
    loss_err = max(abs(a - b) / max(abs(b), 1e-12)
                   for a, b in zip(losses, ref_losses, strict=True))
    names = sorted(ref_params)
    got = torch.cat([params[n].flatten() for n in names])
    want = torch.cat([ref_params[n].flatten() for n in names])
    # The whole parameter vector: Adam turns rounding noise in gradients that are zero in
    # exact arithmetic (a key bias under softmax) into updates of size lr, which no
    # per-tensor measure of a partly-noise tensor can tell from a bug.
    return loss_err, float((got - want).norm() / max(float(want.norm()), 1e-12))


@dataclass
class TrainingCheck:
    """A plan trained on local ranks next to the same steps in one process."""

    world_size: int
    losses: list[float]
    reference_losses: list[float]
    loss_max_abs_error: float
    loss_max_rel_error: float
    parameter_max_abs_error: float
    parameter_rel_error: float
    """Norm of the difference of all parameters over the reference's norm."""
    collectives: list[dict[str, dict[str, int]]]
    """Per rank: kind -> count and bytes, over all steps (point-to-point as send/recv)."""
    collectives_by_group: list[list[dict[str, Any]]]
    """Per rank: count and bytes per kind and process group (global ranks), over all
    steps: which axis each collective ran on."""
    collectives_per_step: list[list[dict[str, dict[str, int]]]]
    """Per rank, per step: the same. The first step of a pipelined plan also carries the
    schedule's one-time agreement on static shapes: one 4-byte int32 send and receive per
    stage boundary each way."""
    local_bytes: list[dict[str, int]]
    """Per rank: bytes of parameters, gradients and optimizer state held locally."""
    saved_activations: list[dict[int, list[int]]]
    """Per rank: stage index -> bytes saved for backward by each micro-batch of the last
    step (`PipelineTrainer.saved_activation_bytes`)."""
    coordinates: list[dict[str, int]]
    """Per rank: its index on each mesh axis."""
    steps_run: int = 0
    """Steps the last attempt ran: the collectives above are over these."""
    attempt: int = 0
    """The attempt that finished (0: the first; above it, the job was restarted)."""
    resumed_from: int | None = None
    """The checkpoint's step that attempt resumed from (None: from the start)."""

    def passed(self, tolerance: float = 1e-4) -> bool:
        return self.loss_max_rel_error < tolerance and self.parameter_rel_error < tolerance

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_training(
    config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0,
    optimizer: str = "sgd", hf_config: dict[str, Any] | None = None,
    resilience: Resilience | None = None, max_restarts: int = 0,
) -> TrainingCheck:
    """Train `spec` for `steps` on `spec.degrees.world_size` local gloo ranks (started by
    torch's elastic launcher) and in one process; compare losses and final parameters.
    With `hf_config` (a Hugging Face config's ``to_dict()``; `config` its
    `planner.models.huggingface.to_transformer_config`) both run that model's own
    transformers modules. `resilience` (checkpoints, an injected kill) and
    `max_restarts` (the elastic agent's): see `train_on_rank`; every step's loss is
    compared, those before a restart's checkpoint included."""
    results = launch(
        train_on_rank, spec.degrees.world_size, config, spec, steps, seed, optimizer,
        hf_config, resilience, max_restarts=max_restarts,
        checkpoint_root=resilience.checkpoint_dir if resilience is not None else None,
    )
    losses, params = merge_results(results)
    ref_losses, ref_params = train_reference(config, spec, steps, seed, optimizer, hf_config)
    loss_rel, param_rel = relative_errors(losses, params, ref_losses, ref_params)
    return TrainingCheck(
        world_size=spec.degrees.world_size,
        losses=losses,
        reference_losses=ref_losses,
        loss_max_abs_error=max(abs(a - b) for a, b in zip(losses, ref_losses)),
        loss_max_rel_error=loss_rel,
        parameter_max_abs_error=max(
            float((params[n] - ref_params[n]).abs().max()) for n in ref_params
        ),
        parameter_rel_error=param_rel,
        collectives=[r["collectives"] for r in results],
        collectives_per_step=[r["collectives_per_step"] for r in results],
        collectives_by_group=[r["collectives_by_group"] for r in results],
        local_bytes=[r["local_bytes"] for r in results],
        saved_activations=[r["saved_activations"] for r in results],
        coordinates=[r["coords"] for r in results],
        steps_run=results[0]["steps_run"],
        attempt=results[0]["attempt"],
        resumed_from=results[0]["resumed_from"],
    )
