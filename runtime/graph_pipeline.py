"""Run a graph plan: pipeline stages of any model, each sharded on its own submesh.

Each rank rebuilds its stage's program exactly as the planner traced it
(`passes.stage_graph`: the model's forward cut at the plan's layer cuts) and runs it with
the plan's node shardings (`passes.lower.RankProgram`): the ops that do not need the next
stage's gradient when a micro-batch arrives, the rest when its gradient does. Stages run
the plan's schedule (`_order`: 1F1B's or GPipe's forwards and backwards as
`cost_models.pipeline_schedule` orders them) over their own submeshes, which may differ
in size, as Alpa's do. A stage may run its layers as programs of their own in turn
(`Stage.layer_operators`), each layer's outputs moved to replicated and handed to the
next as they would be to the next stage. A stage the plan recomputes keeps of each
micro-batch in flight only its inputs and runs its first pass again (same random draws,
nothing sent) when the micro-batch's gradient arrives. Tensors cross a stage boundary
whole: each sending rank holds the tensor replicated, and `passes.stage_graph.routes` says
which of them sends which piece to which receiving rank.

Why not `torch.distributed.pipelining`: its stages are autograd modules on one rank of each
pipeline group, so every stage has the same mesh; an Alpa plan's stages have meshes of
their own and run the ILP's explicit forward and backward programs.

Gradients are summed over the micro-batches (a synchronisation that shrinks a gradient
into a shard runs each micro-batch instead), synchronised as the plan says, divided by
the number of micro-batches (the loss is a mean over the batch), and AdamW updates each
rank's shards. Every rank passes the same whole batch to `step`.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from cost_models.pipeline_schedule import Action, eager_last_stage, rank_actions
from passes.dtensor_rules import parse_placements, redistribute
from passes.lower import RankProgram
from passes.stage_graph import (
    BOUNDARY,
    LOSS_SCALE,
    PRECISION_DTYPES,
    StageGraph,
    backward_nodes,
    boundary_parameters,
    floating_in,
    forward_graph,
    gradient_inputs,
    in_precision,
    micro_batch_inputs,
    on_meta_device,
    routes,
    stage_graph,
    stage_outputs,
    stage_program,
    syncs_each_micro_batch,
)
from passes.program import TracedProgram
from planner.vocabulary.plan import Plan, tied_parameters
from runtime.checkpoint import Checkpointing, ShardsState
from runtime.faults import bound_timeouts
from runtime.loss_scale import LossScale
from runtime.trainer import DEFAULT_OPTIMIZER, training_state


def stage_of(plan: Plan, rank: int) -> int:
    """The stage whose devices hold global rank `rank`."""
    for index, stage in enumerate(plan.stages):
        if stage.first_device <= rank < stage.first_device + stage.num_devices:
            return index
    raise ValueError(f"rank {rank} is outside the plan's {plan.num_gpus} devices")


def stage_meshes(plan: Plan, device_type: str = "cpu") -> list[DeviceMesh]:
    """Every stage's mesh (each rank builds all of them: creating a group is collective)."""
    return [
        DeviceMesh(device_type, torch.arange(s.first_device, s.first_device + s.num_devices)
                   .reshape(s.mesh_shape))
        for s in plan.stages
    ]


def build_stage_programs(
    plan: Plan, index: int, model: nn.Module, example_inputs: tuple[Any, ...],
    loss_fn: Callable | None,
) -> list[tuple[StageGraph, TracedProgram]]:
    """Stage `index`'s programs, as the planner built them: the stage's graph and traced
    program, or one of each per layer where the stage runs its layers in turn
    (`Stage.layer_operators`)."""
    if plan.layer_cuts is None or plan.micro_batch_size is None:
        raise ValueError("this plan has no layer cuts: it is not a graph plan")
    on_meta, example_inputs = in_precision(on_meta_device(model), tuple(example_inputs),
                                           plan.precision)
    inputs = micro_batch_inputs(example_inputs, plan.micro_batch_size)
    forward = forward_graph(on_meta, inputs, loss_fn)
    values = {**dict(on_meta.named_parameters()), **dict(on_meta.named_buffers())}
    stage = plan.stages[index]
    first, last = stage.layers
    spans = ([(layer, layer + 1) for layer in range(first, last)] if stage.layer_operators
             else [(first, last)])
    out = []
    for begin, end in spans:
        graph = stage_graph(forward, list(plan.layer_cuts), begin, end, values)
        out.append((graph, stage_program(graph, inputs)))
    return out


class _Part:
    """One program of a stage (the whole stage, or one of its layers): what its ranks run
    of a micro-batch before its gradient arrives and after, and the names it is read by."""

    def __init__(self, graph: StageGraph, program: TracedProgram, plan: Plan, mesh: DeviceMesh,
                 stage: int, layer: int | None) -> None:
        self.graph = graph
        self.program = RankProgram(program, plan, mesh, stage=stage, layer=layer)
        self.gradient_names = gradient_inputs(program, len(graph.user_inputs))
        self.later = backward_nodes(program, self.gradient_names)
        self.output_names = stage_outputs(program, self.gradient_names)
        self.boundaries = boundary_parameters(program)
        self.grad_of = {fqn: name for name, fqn in program.gradients.items()}
        self.parameters = [f for f in program.parameters.values()
                           if not f.startswith(BOUNDARY + ".")]
        self.bucketed = {m for b in self.program.operators.gradient_buckets for m in b.members}

    def outputs(self, env: dict, replicated: tuple) -> list[torch.Tensor]:
        """The part's outgoing tensors moved to replicated, whole on every rank. The move is
        its own, as `planner.search.stage_solve` prices it, even where an op of the
        backward moves the same value there too (a recomputing stage moves it before
        sending, and the backward after its rerun)."""
        return [redistribute(env[n], replicated).to_local() for n in self.output_names]


class StagedTrainer(Checkpointing):
    """This rank's stage of a graph plan: `step(*batch)` trains one step; `save(root)` /
    `load(path)` checkpoint it (`runtime.checkpoint`)."""

    def __init__(
        self, plan: Plan, model: nn.Module, example_inputs: tuple[Any, ...],
        loss_fn: Callable | None = None, state_dict: dict[str, torch.Tensor] | None = None,
        device_type: str = "cpu", optimizer: dict[str, Any] | None = None,
    ) -> None:
        self.plan = plan
        self.device_type = device_type
        self.rank = dist.get_rank()
        meshes = stage_meshes(plan, device_type)
        self.index = stage_of(plan, self.rank)
        self.stage = plan.stages[self.index]
        self.local_rank = self.rank - self.stage.first_device
        self.mesh = meshes[self.index]
        bound_timeouts(self.mesh.get_all_groups())  # subgroups: 30 min otherwise
        built = build_stage_programs(plan, self.index, model, example_inputs, loss_fn)
        layered = bool(self.stage.layer_operators)
        self.parts = [_Part(graph, program, plan, self.mesh, self.index,
                            layer if layered else None)
                      for layer, (graph, program) in enumerate(built)]
        self.replicated = tuple(Replicate() for _ in self.stage.mesh_shape)
        state = state_dict if state_dict is not None else training_state(model)
        self.placements = {fqn: parse_placements(p) for fqn, p in self.stage.parameters.items()}
        # bf16 plans: the programs run in bf16; the trainer keeps fp32 master weights (and
        # AdamW's moments) and accumulates the micro-batches' gradients in fp32. Other
        # plans run the model's own dtypes (None: no cast).
        self.dtype = PRECISION_DTYPES[plan.precision] if plan.precision != "fp32" else None
        master = torch.float32 if self.dtype else None
        shard = self.parts[0].program.shard
        self.params = {fqn: shard(floating_in(state[fqn], master), self.placements[fqn])
                       for part in self.parts for fqn in part.parameters}
        self.buffers = {
            fqn: shard(floating_in(state[fqn], self.dtype), self.replicated)
            for part in self.parts for fqn in part.program.program.buffers.values()
            if fqn != LOSS_SCALE
        }
        self.loss_scale = LossScale() if plan.precision == "fp16" else None
        self.locals = {fqn: p.to_local().detach().clone() for fqn, p in self.params.items()}
        self.optimizer = torch.optim.AdamW(
            list(self.locals.values()), **(optimizer or DEFAULT_OPTIMIZER)
        )
        # Weights tied across stages: a group of the holders' ranks each (creating a group
        # is collective: every rank makes every one, in the same order).
        groups: dict[tuple[int, ...], Any] = {}
        self.ties: dict[str, Any] = {}
        for fqn, ranks in sorted(plan.tie_groups().items()):
            group = groups.get(tuple(ranks)) or dist.new_group(ranks)
            groups[tuple(ranks)] = group
            if fqn in self.params:
                self.ties[fqn] = group
        # A checkpoint holds a tied weight once: the first stage holding it writes it.
        holders = tied_parameters([stage.parameters for stage in plan.stages])
        self._saved_elsewhere = frozenset(fqn for fqn, stages in holders.items()
                                          if stages[0] != self.index and fqn in self.params)

    # -- one step ------------------------------------------------------------------------

    def step(self, *batch: torch.Tensor) -> float | None:
        """One training step on a whole batch (every rank passes the same one). Returns the
        loss on the last stage's ranks, None on the others (as pipelining schedules do)."""
        m = self.plan.num_micro_batches
        micro = [
            tuple(x.tensor_split(m)[i] if isinstance(x, torch.Tensor) else x for x in batch)
            for i in range(m)
        ]
        sends: list[tuple[dist.Work, torch.Tensor]] = []
        # Per part, each parameter's gradient of every micro-batch.
        gradients: list[dict[str, list]] = [{} for _ in self.parts]
        losses: list = []
        order = _order(self.plan.schedule, m, len(self.plan.stages), self.index)
        held: deque = deque()
        if self.loss_scale is not None:
            self.buffers[LOSS_SCALE] = self.parts[0].program.shard(
                torch.tensor(self.loss_scale.scale), self.replicated)
        with torch.no_grad():
            for action in order:
                if action.kind == "F":
                    i = action.micro_batch
                    held.append((i, *self._forward(i, micro[i], sends)))
                else:  # backwards come in micro-batch order: the oldest held is this one's
                    self._backward_oldest(held, gradients, losses, sends)
            loss = self._finish(gradients, losses, m)
        if self.loss_scale is None or not self.loss_scale.overflowed(
                [p.grad for p in self.locals.values() if p.grad is not None]):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        for work, _ in sends:
            work.wait()
        return loss

    def _forward(self, i: int, batch: tuple, sends: list) -> tuple:
        """Micro-batch i's first pass, its outputs sent on: what its backward needs (the
        pass's values, per part, or, on a recomputing stage, what runs the pass again)."""
        received = self._receive(i, self.index - 1, "forward") if self.index > 0 else []
        rng = _rng_state(self.device_type) if self.stage.recompute else None
        passes = self._first_pass(batch, received)
        last = self.parts[-1]
        if last.output_names:
            outputs = last.outputs(passes[-1][0], self.replicated)
            self._send(i, outputs, self.index + 1, "forward", sends)
        if self.stage.recompute:
            return None, (batch, received, rng)
        return passes, None

    def _first_pass(self, batch: tuple,
                    received: list[torch.Tensor]) -> list[tuple[dict, dict]]:
        """Every op that does not read the next stage's gradient, part after part (each
        part's outputs, moved to replicated, are the next one's inputs): per part its
        values and moved values."""
        params = self._dtensors(self.dtype)
        passes = []
        for part in self.parts:
            program, operators = part.program, part.program.operators
            inputs = [
                program.shard(floating_in(batch[position], self.dtype),
                              parse_placements(operators.inputs[name]))
                for position, name in zip(part.graph.user_inputs, program.program.user_inputs)
            ]
            for fqn, full in zip(part.boundaries, received):
                params[fqn] = DTensor.from_local(full, self.mesh, self.replicated,
                                                 run_check=False)
            env, moved = program.bind(params, self.buffers, inputs)
            program.run_nodes(env, moved, skip=part.later)
            passes.append((env, moved))
            if part is not self.parts[-1]:
                received = part.outputs(env, self.replicated)
        return passes

    def _backward_oldest(self, held: deque, gradients: list[dict], losses: list,
                         sends: list) -> None:
        i, passes, kept = held.popleft()
        if kept is not None:  # recompute: the first pass again, its random draws too
            batch, received, rng = kept
            now = _rng_state(self.device_type)
            _set_rng_state(self.device_type, rng)
            passes = self._first_pass(batch, received)
            _set_rng_state(self.device_type, now)
        last = self.index == len(self.plan.stages) - 1
        received = [] if last else self._receive(i, self.index + 1, "backward")
        self._backward(i, passes, received, gradients, losses, sends)

    def _backward(self, i: int, passes: list[tuple[dict, dict]], received: list[torch.Tensor],
                  gradients: list[dict], losses: list, sends: list) -> None:
        """The rest of each part, last part first (each part's incoming tensors' gradients,
        moved to replicated, are the previous one's received gradients)."""
        for k in reversed(range(len(self.parts))):
            part, (env, moved) = self.parts[k], passes[k]
            program = part.program
            for name, full in zip(part.gradient_names, received):
                env[name] = program.shard(full, parse_placements(program.operators.inputs[name]))
            program.run_nodes(env, moved, only=part.later)
            received = [program.move(part.grad_of[f], env, moved, self.replicated).to_local()
                        for f in part.boundaries]
            for fqn in part.parameters:
                name = part.grad_of.get(fqn)
                if name is None:
                    continue
                value = env[name]
                if syncs_each_micro_batch(value.placements, self.placements[fqn]):
                    value = program.move(name, env, moved, self.placements[fqn])
                gradients[k].setdefault(fqn, []).append(value)
            if self.index == len(self.plan.stages) - 1 and k == len(self.parts) - 1:
                loss = env[program.program.loss]
                if "loss" not in part.bucketed:
                    loss = program.move(program.program.loss, env, moved, self.replicated)
                losses.append(loss)
        if self.parts[0].boundaries:
            self._send(i, received, self.index - 1, "backward", sends)

    def _finish(self, gradients: list[dict], losses: list, m: int) -> float | None:
        """Each part's gradients summed over the micro-batches and synchronised as its
        solve says (its buckets, or moved to the parameter's placement), added up over the
        parts that read one parameter (a weight two layers of the stage share), summed
        with the other stages holding it, and divided by m; the loss, on the last stage."""
        totals: dict[str, DTensor] = {}
        loss = None
        for k, part in enumerate(self.parts):
            values = {fqn: _summed(parts) for fqn, parts in gradients[k].items()}
            if losses and k == len(self.parts) - 1:
                values["loss"] = _summed(losses)
            for bucket in part.program.operators.gradient_buckets:
                values.update(part.program.reduce_bucket(bucket, values))
            for fqn, value in values.items():
                if fqn == "loss":
                    loss = value if fqn in part.bucketed else redistribute(value,
                                                                           self.replicated)
                    continue
                if fqn not in part.bucketed:
                    value = redistribute(value, self.placements[fqn])
                totals[fqn] = _summed([totals[fqn], value]) if fqn in totals else value
        # An fp16 plan's gradients and loss are the loss scale's multiple.
        scale = m * (self.loss_scale.scale if self.loss_scale else 1.0)
        for fqn, value in totals.items():
            if fqn in self.ties:
                value = self._summed_over_stages(fqn, value)
            self.locals[fqn].grad = value.to_local().detach().to(self.locals[fqn].dtype) / scale
        return None if loss is None else float(loss.to_local()) / scale

    def _summed_over_stages(self, fqn: str, value: DTensor) -> DTensor:
        """A tied weight's gradient summed with the other stages' holding it: replicated
        here, one all-reduce over all their ranks (each stage's first rank adds its share,
        the others zeros), resharded locally."""
        full = redistribute(value, self.replicated).to_local().detach().clone()
        if self.local_rank:
            full.zero_()
        dist.all_reduce(full, group=self.ties[fqn])
        return self.parts[0].program.shard(full, value.placements)

    # -- stage to stage ------------------------------------------------------------------

    def _peers(self, other: int, direction: str) -> tuple[list, list]:
        """(what this rank receives, what it sends) with stage `other`: lists of (global
        rank, piece, pieces). Forward tensors flow to later stages, gradients to earlier."""
        here, there = self.stage, self.plan.stages[other]
        sending_to_later = direction == "forward"
        i_send = (other > self.index) == sending_to_later
        if i_send:
            plan = routes(here.num_devices, there.num_devices)
            out = [(there.first_device + j, piece, pieces)
                   for j, route in enumerate(plan) for sender, piece, pieces in route
                   if sender == self.local_rank]
            return [], out
        plan = routes(there.num_devices, here.num_devices)
        return [(there.first_device + s, piece, pieces)
                for s, piece, pieces in plan[self.local_rank]], []

    def _send(self, i: int, tensors: list[torch.Tensor], other: int, direction: str,
              sends: list) -> None:
        _, out = self._peers(other, direction)
        for k, tensor in enumerate(tensors):
            flat = tensor.contiguous().reshape(-1)
            for peer, piece, pieces in out:
                chunk = flat.tensor_split(pieces)[piece].clone()
                # The buffer is kept with its request until the send completes.
                sends.append((dist.isend(chunk, peer, tag=_tag(i, k, piece)), chunk))

    def _receive(self, i: int, other: int, direction: str) -> list[torch.Tensor]:
        incoming, _ = self._peers(other, direction)
        values = (self.parts[0].graph.inputs if direction == "forward"
                  else self.parts[-1].graph.outputs)
        out = []
        for k, value in enumerate(values):
            flat = torch.empty(value.numel(), dtype=value.dtype)
            pieces = []
            for peer, piece, count in incoming:
                chunk = flat.tensor_split(count)[piece]
                buffer = torch.empty_like(chunk)
                dist.recv(buffer, peer, tag=_tag(i, k, piece))
                pieces.append((piece, buffer))
            if len(pieces) == 1 and pieces[0][1].numel() == value.numel():
                flat = pieces[0][1]
            else:
                flat = torch.cat([b for _, b in sorted(pieces, key=lambda p: p[0])])
            out.append(flat.view(value.shape))
        return out

    # -- state ---------------------------------------------------------------------------

    def _dtensors(self, dtype: torch.dtype | None = None) -> dict[str, DTensor]:
        """The parameters in `dtype` (None: as the trainer keeps them), as DTensors of the
        plan's layouts."""
        return {
            fqn: DTensor.from_local(floating_in(self.locals[fqn], dtype),
                                    p.device_mesh, p.placements, run_check=False,
                                    shape=p.shape, stride=p.stride())
            for fqn, p in self.params.items()
        }

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """This stage's parameters (the fp32 master weights of a bf16 plan) gathered in
        full (a collective over the stage's ranks)."""
        return {fqn: p.full_tensor() for fqn, p in self._dtensors().items()}

    def checkpoint_state(self) -> ShardsState:
        """This rank's shards and AdamW state as DTensors of the plan's layouts, for `save`
        / `load` (`runtime.checkpoint`: a checkpoint loads onto another plan too)."""
        return ShardsState(self.params, self.locals, self.optimizer, self._saved_elsewhere,
                           self.loss_scale)


def _order(schedule: str | None, m: int, stages: int, index: int) -> list[Action]:
    """The forwards and backwards stage `index` of `stages` runs, in order: the schedule's
    (`pipeline_schedule.rank_actions`; a plan without one has one stage), the last stage
    running each backward as soon as its forward is done (`eager_last_stage`)."""
    actions = rank_actions(schedule or "1f1b", stages, index, m)
    return eager_last_stage(actions, stages)


def _rng_state(device_type: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state() if device_type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(device_type: str, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.random.set_rng_state(state[0])
    if device_type == "cuda":
        torch.cuda.set_rng_state(state[1])


def _summed(parts: list[DTensor]) -> DTensor:
    """The micro-batches' values added locally (partial sums stay partial: no collective),
    in fp32 and then in their own dtype (a bf16 gradient is synchronised in bf16)."""
    first = parts[0]
    total = first.to_local().to(torch.promote_types(first.dtype, torch.float32), copy=True)
    for part in parts[1:]:
        total += part.to_local()
    return DTensor.from_local(total.to(first.dtype), first.device_mesh, first.placements,
                              run_check=False, shape=first.shape, stride=first.stride())


def _tag(micro_batch: int, tensor: int, piece: int) -> int:
    return (micro_batch * 64 + tensor) * 64 + piece
