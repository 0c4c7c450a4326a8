"""One pipeline stage on one logical mesh: the intra-op ILP's choice for the stage's
program, priced the way the staged runtime (`runtime/graph_pipeline.py`) runs it.

Per micro-batch a rank runs the stage's forward and backward (the ILP's transfers of
those phases), moves each outgoing tensor to replicated before sending it, and moves the
gradient of each incoming tensor to replicated before sending it back. Per step it
synchronises the parameter gradients: all-reduces (DDP's buckets) once, after the
micro-batches' gradients are summed; a synchronisation that shrinks the gradient (a
reduce-scatter into a sharded parameter, as ZeRO and FSDP do) each micro-batch, so that no
rank holds a whole gradient it does not own. A stage that is not the last does not reduce
its surrogate loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch.distributed.tensor import Replicate

from passes.dtensor_rules import (
    Collective,
    Placements,
    fake_mesh,
    parse_placements,
    redistribution,
    tensor_meta,
)
from passes.stage_graph import (
    BOUNDARY,
    backward_nodes,
    gradient_inputs,
    stage_outputs,
    surrogate_nodes,
    syncs_each_micro_batch,
)
from passes.strategies import NodeStrategies, enumerate_strategies, output_value, source_of
from passes.program import TracedProgram
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.plan import GradientBucket, OperatorShardings
from planner.search.intra_op import (
    IntraOpSolution,
    moves_read_by,
    plan_intra_op,
    time_lower_bound,
)
from planner.search.move_prices import CommModel
from planner.search.shardings import operator_shardings


@dataclass
class StageSolve:
    """A stage program's sharding on one logical mesh, with its per-rank costs."""

    program: TracedProgram
    table: dict[str, NodeStrategies]
    solution: IntraOpSolution
    mesh_shape: tuple[int, ...]
    is_last: bool
    compute_s: float
    """Kernel time of one micro-batch's forward and backward."""
    per_micro_batch: list[Collective] = field(default_factory=list)
    """Collectives of every micro-batch."""
    per_step: list[Collective] = field(default_factory=list)
    """Collectives once per step (the summed gradients' all-reduces)."""
    micro_batch_comm_s: float = 0.0
    incoming_s: float = 0.0
    """Of micro_batch_comm_s: moving the incoming tensors' gradients to replicated (what a
    stage of several layers pays only for its first layer)."""
    outgoing_s: float = 0.0
    """Of micro_batch_comm_s: moving the outgoing tensors to replicated (paid only for a
    stage's last layer)."""
    step_comm_s: float = 0.0
    state_bytes: float = 0.0
    """Parameters, gradients and Adam's moments (local shards)."""
    activation_bytes: float = 0.0
    """What one micro-batch keeps from forward to backward, the incoming tensors too."""
    buckets: list[GradientBucket] = field(default_factory=list)
    """The gradient buckets the runtime all-reduces once per step."""
    per_micro_batch_gradients: list[str] = field(default_factory=list)
    """Parameters whose gradient is synchronised every micro-batch."""
    rerun: list[Collective] = field(default_factory=list)
    """Collectives of a micro-batch's first pass (what runs before its gradient arrives),
    which a recomputing stage runs again before the backward."""
    rerun_s: float = 0.0
    """That first pass's kernels and collectives: what recomputation adds per micro-batch."""
    checkpoint_bytes: float = 0.0
    """What a recomputing stage keeps of a micro-batch in flight: its incoming tensors."""
    outgoing: list[Collective] = field(default_factory=list)
    """Of per_micro_batch: moving the outgoing tensors to replicated."""

    @property
    def micro_batch_s(self) -> float:
        return self.compute_s + self.micro_batch_comm_s

    def cost(self) -> StageCost:
        return StageCost(self.micro_batch_s, self.incoming_s, self.outgoing_s,
                         self.step_comm_s, self.state_bytes, self.activation_bytes,
                         rerun_s=self.rerun_s, checkpoint_bytes=self.checkpoint_bytes)

    def result(self) -> StageResult:
        parameters, operators = operator_shardings(self.program, self.table, self.solution,
                                                   buckets=self.buckets)
        return StageResult(self.cost(), self.compute_s, tuple(self.per_micro_batch),
                           tuple(self.per_step), parameters, operators, tuple(self.rerun),
                           tuple(self.outgoing))


@dataclass(frozen=True)
class StageCost:
    """What the stage DP reads of a solve (plain numbers: it crosses process boundaries)."""

    micro_batch_s: float
    """A micro-batch's forward and backward with its transfers."""
    incoming_s: float
    outgoing_s: float
    step_comm_s: float
    state_bytes: float
    activation_bytes: float
    exact: bool = True
    """False for a bound (`bound_stage`): no solve of the stage costs the stage DP less."""
    rerun_s: float = 0.0
    """Recomputation's extra time per micro-batch (`StageSolve.rerun_s`)."""
    checkpoint_bytes: float = 0.0
    """What a recomputing stage keeps per micro-batch in flight (its incoming tensors)."""


@dataclass(frozen=True)
class StageResult:
    """What a plan keeps of a stage's solve, in plain values (stages are solved in worker
    processes): its costs, the collectives one rank issues, and its shardings as the Plan
    records them."""

    cost: StageCost
    compute_s: float
    """Kernel time of one micro-batch's forward and backward."""
    per_micro_batch: tuple[Collective, ...]
    per_step: tuple[Collective, ...]
    parameters: dict[str, str]
    """Parameter FQN -> placement (DTensor's short form)."""
    operators: OperatorShardings | None
    rerun: tuple[Collective, ...] = ()
    """Collectives a recomputing stage issues again per micro-batch."""
    outgoing: tuple[Collective, ...] = ()
    """Of per_micro_batch: moving the outgoing tensors to replicated."""
    layer_operators: tuple[OperatorShardings, ...] = ()
    """Each layer's shardings where the stage runs its layers as programs of their own
    (`planner.search.layered_stage`; `operators` is then None)."""


def solve_stage(
    program: TracedProgram, mesh_shape: tuple[int, ...], cluster: Cluster,
    num_model_inputs: int, is_last: bool, lean: bool = False, time_limit_s: float = 30.0,
    replicate_parameters: bool = False, shard_inputs_on: int | None = None,
    strategies: dict[str, NodeStrategies] | None = None,
) -> StageSolve:
    """Solve the stage's ILP on a fake mesh of `mesh_shape` and price it.

    `lean` keeps for each parameter only its least-memory placements (sharded over every
    axis it can be: ZeRO-3's memory, chosen where memory is short). The baselines use
    `replicate_parameters` (data parallelism's replicated weights) and `shard_inputs_on`
    (the batch split over that mesh axis). `strategies`, the program's strategy table on
    this mesh, saves enumerating it again (it is not modified)."""
    mesh = fake_mesh(mesh_shape)
    if strategies is None:
        strategies = enumerate_strategies(program, mesh, cluster.device)
    table = {name: replace(node, strategies=list(node.strategies))
             for name, node in strategies.items()}
    replicated = tuple(Replicate() for _ in mesh_shape)
    for node, fqn in program.parameters.items():
        keep = table[node].strategies
        if fqn.startswith(BOUNDARY + ".") or replicate_parameters:
            keep = [s for s in keep if tuple(s.outputs[0]) == replicated]
        elif lean:
            least = min(s.memory_bytes for s in keep)
            keep = [s for s in keep if s.memory_bytes <= least]
        table[node].strategies = keep
    if shard_inputs_on is not None:
        for node in program.user_inputs[:num_model_inputs]:
            keep = [s for s in table[node].strategies
                    if _is_batch_split(s.outputs[0], shard_inputs_on)]
            table[node].strategies = keep or table[node].strategies
    # Memory is the stage DP's to check (with the micro-batches in flight, which the ILP
    # does not see); the ILP minimises time, within `lean`'s placements when asked.
    solution = plan_intra_op(program, table, mesh, cluster.with_unbounded_memory(),
                             time_limit_s=time_limit_s)
    solve = StageSolve(program, table, solution, tuple(mesh_shape), is_last,
                       compute_s=solution.compute_s)
    _price(solve, CommModel(mesh, cluster), num_model_inputs)
    return solve


def bound_stage(
    program: TracedProgram, mesh_shape: tuple[int, ...], cluster: Cluster, micro_batches: int,
    num_model_inputs: int, strategies: dict[str, NodeStrategies] | None = None,
) -> StageCost:
    """Less than the stage DP reads of any solve of the stage on this mesh, fast or lean:
    as its interior time, a lower bound on compute and per-micro-batch communication plus
    the gradient synchronisation spread over the micro-batches (which every solve's
    interior and once-per-step share add up to at least; moving the incoming and outgoing
    tensors to replicated only adds); as memory, each node at its least.

    The surrogate loss is left out, so the time is also less than this layer's share of
    any solve of a longer stage that holds it (`graph_space` prunes whole stages by the
    sum of their layers' bounds)."""
    mesh = fake_mesh(mesh_shape)
    if strategies is None:
        strategies = enumerate_strategies(program, mesh, cluster.device)

    def weight(fqn: str) -> float:
        return 0.0 if fqn.startswith(BOUNDARY + ".") else 1.0 / micro_batches

    free = surrogate_nodes(program, gradient_inputs(program, num_model_inputs))
    seconds = time_lower_bound(program, strategies, mesh, cluster, weight, free)
    state, activations = _resident(
        program, {node: min(s.memory_bytes for s in choices.strategies)
                  for node, choices in strategies.items()})
    return StageCost(seconds, 0.0, 0.0, 0.0, state, activations, exact=False)


def _is_batch_split(placements: Placements, axis: int) -> bool:
    return all(
        (p.is_shard(0) if a == axis else p.is_replicate()) for a, p in enumerate(placements)
    )


def _price(solve: StageSolve, comm: CommModel, num_model_inputs: int) -> None:
    program, table, solution = solve.program, solve.table, solve.solution
    mesh = comm.mesh
    replicated = tuple(Replicate() for _ in solve.mesh_shape)
    boundary: list[Collective] = []  # incoming gradients to replicated
    per_mb: list[Collective] = []
    per_step: list[Collective] = []
    grad_of = {fqn: name for name, fqn in program.gradients.items()}
    for transfer in solution.transfers:
        if transfer.consumer == "loss" and not solve.is_last:
            continue  # the surrogate loss is never reduced
        if transfer.phase != "gradient_sync":
            per_mb += transfer.collectives
            continue
        fqn = program.parameters[transfer.consumer]
        if fqn.startswith(BOUNDARY + "."):
            boundary += transfer.collectives
        elif syncs_each_micro_batch(transfer.src, transfer.dst):
            per_mb += transfer.collectives
            solve.per_micro_batch_gradients.append(fqn)
        else:
            per_step += transfer.collectives
    for bucket in solution.buckets:
        kept = GradientBucket(members=[], mesh_dims=bucket.mesh_dims, dtype=bucket.dtype,
                              nbytes=0, placements_before=[], placements_after=[])
        for member, before, after in zip(bucket.members, bucket.placements_before,
                                         bucket.placements_after):
            if member == "loss":
                if not solve.is_last:
                    continue
                value = program.nodes[program.loss].meta["val"]
            else:
                value = program.nodes[grad_of[member]].meta["val"]
            moves = redistribution(mesh, tensor_meta(value), parse_placements(before),
                                   parse_placements(after))
            if member.startswith(BOUNDARY + "."):
                boundary += moves
                continue
            kept.members.append(member)
            kept.placements_before.append(before)
            kept.placements_after.append(after)
            kept.nbytes += moves[0].nbytes if moves else 0
        if kept.members:
            solve.buckets.append(kept)
            per_step += [Collective("all_reduce", tuple(dims), kept.nbytes)
                         for dims in kept.mesh_dims]
    outgoing: list[Collective] = []
    gradients = gradient_inputs(program, num_model_inputs)
    for name in stage_outputs(program, gradients):
        producer, index = source_of(program.nodes[name])
        src = table[producer].strategies[solution.choices[producer]].outputs[index]
        value = output_value(program, (producer, index))
        outgoing += redistribution(mesh, tensor_meta(value), src, replicated)
    solve.outgoing = outgoing
    solve.per_micro_batch = per_mb + boundary + outgoing
    solve.per_step = per_step
    solve.incoming_s = sum(comm.time(c) for c in boundary)
    solve.outgoing_s = sum(comm.time(c) for c in outgoing)
    solve.micro_batch_comm_s = (sum(comm.time(c) for c in per_mb) + solve.incoming_s
                                + solve.outgoing_s)
    solve.step_comm_s = sum(comm.time(c) for c in per_step)
    solve.state_bytes, solve.activation_bytes = _resident(
        program, {node: strategies.strategies[solution.choices[node]].memory_bytes
                  for node, strategies in table.items()})
    _price_rerun(solve, comm, gradients)


def _price_rerun(solve: StageSolve, comm: CommModel, gradients: list[str]) -> None:
    """What recomputation costs: the runtime (`runtime.graph_pipeline`) keeps a micro-batch's
    incoming tensors, drops the rest of its first pass (every op that does not read the
    gradient from the next stage) and runs that pass again, without sending, before the
    micro-batch's backward: the same kernels and the same moves of inputs."""
    program, table, solution = solve.program, solve.table, solve.solution
    later = backward_nodes(program, gradients)
    first_pass = {name for name in table if name not in later}
    reads = moves_read_by(program, table, solution.choices, first_pass)
    solve.rerun = [
        c for t in solution.transfers if t.phase != "gradient_sync" and (
            (t.source, t.dst) in reads or (t.consumer == t.source[0] and t.consumer in first_pass))
        for c in t.collectives]
    compute = sum(table[n].strategies[solution.choices[n]].compute_s for n in first_pass)
    solve.rerun_s = compute + sum(comm.time(c) for c in solve.rerun)
    solve.checkpoint_bytes = sum(_bytes(program.nodes[node].meta["val"])
                                 for node, fqn in program.parameters.items()
                                 if fqn.startswith(BOUNDARY + "."))


def _resident(program: TracedProgram, memory: dict[str, float]) -> tuple[float, float]:
    """(training state, activations) of nodes holding `memory` bytes each: parameters hold
    state; an incoming tensor (a boundary parameter) is kept whole as an activation."""
    state = activations = 0.0
    for node, nbytes in memory.items():
        fqn = program.parameters.get(node)
        if fqn is None:
            activations += nbytes
        elif fqn.startswith(BOUNDARY + "."):
            activations += _bytes(program.nodes[node].meta["val"])
        else:
            state += nbytes
    return state, activations


def _bytes(value: torch.Tensor) -> float:
    return float(value.numel() * value.element_size())
