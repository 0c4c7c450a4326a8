"""Intra-op planning: one sharding strategy per node of a training step on one logical mesh.

Builds Alpa's ILP from the strategy table (node costs: compute time; edge costs: the
collectives DTensor issues to move a value from its producer's placement to its consumer's)
and two kinds of edges that close the training step: the loss must end replicated (it is
reported), and each gradient must end in its parameter's placement (the optimizer updates
shards in place; for a replicated parameter this is data parallelism's gradient all-reduce).
A value several consumers read is one `solver.SharedRead`, not an edge per consumer: the
runtime moves it once per placement (`passes.lower`), so the ILP prices each move once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate

from passes.deadline import Deadline
from passes.dtensor_rules import Collective, Placements
from passes.strategies import NodeStrategies, Source, Strategy, output_value, source_of
from passes.program import TracedProgram
from planner.search.buckets import Bucket, bucket_transfers
from planner.search.move_prices import IMPOSSIBLE_S, CommModel, interned
from planner.search.replicated import replicated_reason
from planner.vocabulary.cluster import Cluster
from planner.search.elimination import lower_bound, solve_by_elimination
from planner.search.lp_fixing import solve_with_fixing
from planner.search.presolve import contract_followers
from planner.search.symmetry import identical_block_groups
from planner.search.tied_solve import solve_tied
from planner.search.solver import (
    Assignment,
    AssignmentProblem,
    SharedCost,
    SharedRead,
)

if TYPE_CHECKING:
    from cost_models.profiled_costs import ProfileDatabase


# Least time the solver is given when a deadline leaves less: enough to return the greedy
# incumbent it is hinted with.
MIN_SOLVE_S = 1.0


@dataclass(frozen=True)
class Transfer:
    """A value moved between placements on its way from producer to consumer."""

    source: Source
    consumer: str
    """Consuming node name; for the closing edges, 'loss' or the parameter's placeholder."""
    phase: str
    """'forward', 'backward' or 'gradient_sync' (gradient to its parameter's placement)."""
    src: Placements
    dst: Placements
    collectives: tuple[Collective, ...]


@dataclass
class IntraOpSolution:
    choices: dict[str, int]
    """Node name -> index into its strategy list."""
    transfers: list[Transfer]
    """Every redistribution with at least one collective, in graph order."""
    compute_s: float
    communication_s: float
    memory_bytes: float
    assignment: Assignment
    num_variables: int = 0

    buckets: list[Bucket] = field(default_factory=list)
    """Gradient (and loss) all-reduces coalesced into buckets; not in `transfers`."""
    replicated: str = ""
    """Where every rank computes the whole step: why, in the ILP's prices
    (`planner.search.replicated`); '' otherwise."""

    def collectives(self) -> list[tuple[str, str, int]]:
        """(phase, kind, bytes) of every collective of one training step."""
        out = [(t.phase, c.kind, c.nbytes) for t in self.transfers for c in t.collectives]
        out += [
            ("gradient_sync", "all_reduce", b.nbytes) for b in self.buckets for _ in b.mesh_dims
        ]
        return out

    def collectives_by_kind(self, phase: str | None = None) -> dict[str, dict[str, int]]:
        counts: Counter = Counter()
        sizes: Counter = Counter()
        for p, kind, nbytes in self.collectives():
            if phase is None or p == phase:
                counts[kind] += 1
                sizes[kind] += nbytes
        return {k: {"count": counts[k], "bytes": sizes[k]} for k in sorted(counts)}


@dataclass(frozen=True)
class MemoryBudget:
    """A knapsack in place of bytes per device: what each strategy of a node spends, and
    the most all nodes may spend together (nodes not named spend nothing). Lets a caller
    pose another planner's memory rule, e.g. AutoParallel's cap on parameter fractions."""

    amounts: dict[str, np.ndarray]
    limit: float


def plan_intra_op(
    program: TracedProgram,
    table: dict[str, NodeStrategies],
    mesh: DeviceMesh,
    cluster: Cluster,
    time_limit_s: float = 30.0,
    backend: str = "SCIP",
    profile: ProfileDatabase | None = None,
    deadline: Deadline | None = None,
    memory_budget: MemoryBudget | None = None,
    tie_blocks: bool = False,
    shared_moves: bool = True,
) -> IntraOpSolution:
    """Solve the ILP and return the chosen strategy of every node with its collectives;
    collectives `profile` measured are charged its times. With a `deadline`, building the
    ILP stops with DeadlinePassed when it passes, and the solver gets the time left (at
    least `MIN_SOLVE_S`, so that it can return its greedy incumbent). A `memory_budget`
    replaces the per-device memory limit (the solution still reports bytes). With
    `tie_blocks`, identical blocks of the model take the same layout (`symmetry`), as
    AutoParallel's do: often faster under a binding memory limit, but the optimum of a
    narrower problem (up to 0.2% slower on benchmarks/vs_autoparallel.py's family), so
    plans leave it off and stay optimal for the problem posed. With `shared_moves` (the
    default) a value several consumers read at one placement is moved once, as Tessel's
    runtime does; without, each consumer pays its own move, as Megatron-LM's layers do
    (a sequence-parallel input is gathered again for the weight gradient)."""
    comm = CommModel(mesh, cluster, profile)
    names = list(table)
    index = {n: i for i, n in enumerate(names)}
    node_costs = [
        np.array([_node_cost(program, n, s, comm) for s in table[n].strategies]) for n in names
    ]
    node_memory = [np.array([s.memory_bytes for s in table[n].strategies]) for n in names]
    memory_limit = cluster.usable_memory_bytes
    if memory_budget is not None:
        node_memory = [np.asarray(memory_budget.amounts.get(n, np.zeros(len(table[n].strategies))),
                                  dtype=float) for n in names]
        memory_limit = memory_budget.limit
    edges = []
    # Gradient buckets, keyed by the mesh axes they reduce over: each bucket's latency is
    # paid once, by whichever gradients (or the loss) fall into it.
    buckets: dict[tuple, SharedCost] = {}

    def bucket(key: tuple) -> SharedCost:
        if key not in buckets:
            latency = sum(comm.time(Collective("all_reduce", dims, 0)) for dims in key)
            buckets[key] = SharedCost(latency)
        return buckets[key]

    all_edges = _edges(program, table)
    distinct: dict = {}
    followers = _followers(table, index)
    # The consumers of each value, apart from followers (they read it where it is made):
    # the runtime moves it once per placement for all of them (`solver.SharedRead`).
    readers: dict[Source, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for done, edge in enumerate(all_edges):
        if deadline is not None:
            deadline.check(f"building the ILP ({done} of {len(all_edges)} edges)")
        u_name, v_name, matrix, keys = _edge_matrix(edge, program, table, comm, distinct)
        if not np.any(matrix):
            continue
        if edge.position is not None and index[v_name] not in followers:
            readers.setdefault(edge.source, []).append(
                (index[v_name], matrix, _needs(distinct[("in", edge.consumer, edge.position)])))
            continue
        for (i, j), key in keys.items():
            bucket(key).edge_triggers.append((len(edges), i, j))
        edges.append((index[u_name], index[v_name], matrix))
    shared = {source: reads for source, reads in readers.items()
              if shared_moves and len(reads) > 1}
    edges += [(index[source[0]], v, matrix) for source, reads in readers.items()
              if source not in shared for v, matrix, _ in reads]
    loss_name, loss_index = source_of(program.nodes[program.loss])
    replicated = tuple(Replicate() for _ in range(mesh.ndim))
    loss_value = output_value(program, (loss_name, loss_index))
    for i, s in enumerate(table[loss_name].strategies):
        seconds, collectives = comm.transfer(
            loss_value, s.outputs[loss_index], replicated, bucketed=True
        )
        node_costs[index[loss_name]][i] += seconds
        if _all_reduce_only(collectives):
            bucket(_bucket_key(collectives)).node_triggers.append((index[loss_name], i))
    problem = AssignmentProblem(
        node_costs,
        node_memory,
        edges,
        memory_limit=memory_limit,
        shared_costs=list(buckets.values()),
        followers=followers,
        reads=[_shared_read(index[source[0]], reads) for source, reads in shared.items()],
    )
    contracted, contraction = contract_followers(problem)
    groups = identical_block_groups(program, table) if tie_blocks else []
    if deadline is not None:
        time_limit_s = min(time_limit_s, max(MIN_SOLVE_S, deadline.remaining()))
    reduced_assignment, num_variables = solve_tied(
        contracted, _kept_groups(groups, index, contraction.kept), time_limit_s, backend,
        eliminate=solve_by_elimination, ilp=solve_with_fixing)
    assignment = replace(reduced_assignment,
                         choices=contraction.expand(reduced_assignment.choices, len(names)))
    choices = {n: assignment.choices[index[n]] for n in names}
    if assignment.objective >= IMPOSSIBLE_S:
        raise RuntimeError(
            "the solver returned a plan that needs a redistribution DTensor cannot do; "
            f"raise the time limit (now {time_limit_s:g} s)"
        )
    transfers = _transfers(program, table, choices, comm)
    member_of = {t: _bucket_member(program, t) for t in transfers if _bucket_member(program, t)}
    dtype_of = {t: output_value(program, t.source).dtype for t in member_of}
    buckets, transfers = bucket_transfers(transfers, member_of, dtype_of)
    compute = sum(table[n].strategies[choices[n]].compute_s for n in names)
    memory = sum(table[n].strategies[choices[n]].memory_bytes for n in names)
    communication = sum(
        comm.transfer(output_value(program, t.source), t.src, t.dst)[0] for t in transfers
    )
    communication += sum(
        comm.time(Collective("all_reduce", tuple(dims), b.nbytes))
        for b in buckets
        for dims in b.mesh_dims
    )
    return IntraOpSolution(
        choices,
        transfers,
        compute,
        communication,
        memory,
        assignment,
        num_variables=num_variables,
        buckets=buckets,
        replicated=replicated_reason(program, table, choices, compute, communication, comm),
    )


def time_lower_bound(
    program: TracedProgram,
    table: dict[str, NodeStrategies],
    mesh: DeviceMesh,
    cluster: Cluster,
    gradient_weight: Callable[[str], float],
    free: frozenset[str] = frozenset(),
) -> float:
    """A lower bound on the compute and communication time of any choice of strategies,
    with each gradient's move to its parameter's placement charged `gradient_weight(fqn)`
    times its bandwidth term, the loss's reduction not at all, a value read k times
    charged 1/k of each move, and the nodes in `free` and their moves not at all:
    mini-bucket elimination of that network (`elimination.lower_bound`), a fraction of an
    exact solve's time."""
    comm = CommModel(mesh, cluster)
    names = list(table)
    index = {n: i for i, n in enumerate(names)}
    node_costs = [np.array([0.0 if n in free else
                            _node_cost(program, n, s, comm, tie_break=False)
                            for s in table[n].strategies]) for n in names]
    edges = []
    all_edges = _edges(program, table)
    # A value moved to one placement for several consumers is moved once (`_transfers`):
    # of a value's k reads, each is charged 1/k, at most the dearest move it makes.
    reads = Counter(edge.source for edge in all_edges)
    distinct: dict = {}
    for edge in all_edges:
        if free and (edge.source[0] in free or edge.consumer in free):
            continue
        weight = 1.0 / reads[edge.source]
        if edge.phase == "gradient_sync":
            weight *= gradient_weight(program.parameters[edge.consumer])
        if weight > 0:
            u_name, v_name, matrix, _ = _edge_matrix(edge, program, table, comm, distinct,
                                                     with_buckets=False)
            edges.append((index[u_name], index[v_name], weight * matrix))
    memory = [np.zeros(len(c)) for c in node_costs]
    return lower_bound(AssignmentProblem(node_costs, memory, edges))


def _needs(end: tuple) -> np.ndarray:
    """For each choice of a consumer, the placement (an id) it reads one input at: the
    input's distinct placements (`_edge_matrix`), spread."""
    dsts, col_of = end
    return np.array([interned(dst) for dst in dsts])[col_of]


def _shared_read(producer: int, readers: list[tuple[int, np.ndarray, np.ndarray]]
                 ) -> SharedRead:
    """The value's reads as one `SharedRead`: each placement a reader can need is a column,
    its prices the reader's edge column for a choice that needs it."""
    columns: dict[int, np.ndarray] = {}
    for _, matrix, needs in readers:
        for j, placement in enumerate(needs):
            columns.setdefault(int(placement), matrix[:, j])
    column_of = {placement: c for c, placement in enumerate(columns)}
    return SharedRead(producer, np.stack(list(columns.values()), axis=1),
                      tuple((v, np.array([column_of[int(p)] for p in needs]))
                            for v, _, needs in readers))


def _kept_groups(groups: list[list[str]], index: dict[str, int],
                 kept: list[int]) -> list[list[int]]:
    """The groups of nodes to tie, as indices of the contracted problem: members merged
    into a leader by follower contraction are left out (their leaders, tied in turn, take
    them along)."""
    position = {v: i for i, v in enumerate(kept)}
    out = []
    for group in groups:
        members = [position[index[n]] for n in group if index[n] in position]
        if len(members) > 1:
            out.append(members)
    return out


def _bucket_member(program: TracedProgram, transfer: Transfer) -> str | None:
    """The bucket name of a gradient-sync or loss transfer, None for any other."""
    if transfer.consumer == "loss":
        return "loss"
    if transfer.phase == "gradient_sync":
        return program.parameters[transfer.consumer]
    return None


def _followers(
    table: dict[str, NodeStrategies], index: dict[str, int]
) -> dict[int, tuple[int, np.ndarray]]:
    """Single-input ops that run in the placement their input arrives in.

    For each strategy of the producer, the follower takes its strategy that reads exactly
    that placement (not a cheaper re-slicing of it: a follower that splits a replicated
    value would leave its consumers to gather it again). An op lacking such a strategy for
    some producer strategy stays a decision of its own.
    """
    followers = {}
    for name, node in table.items():
        if node.kind != "op" or len(node.sources) != 1:
            continue
        producer, out_index = node.sources[0]
        plain = {}
        for j, s in enumerate(node.strategies):
            if s.produced is None:
                plain.setdefault(s.inputs[0], j)
        mapping = []
        for s in table[producer].strategies:
            j = plain.get(s.outputs[out_index])
            if j is None:
                break
            mapping.append(j)
        else:
            followers[index[name]] = (index[producer], np.array(mapping))
    return followers


# Seconds charged per resident byte: breaks ties between equally fast plans in favour of
# the one holding less per device (a batch read as a shard rather than whole); 1 ms per
# GB, so it never trades more than a sliver of step time for memory.
TIE_BREAK_S_PER_BYTE = 1e-14


def _node_cost(program: TracedProgram, name: str, strategy: Strategy, comm: CommModel,
               tie_break: bool = True) -> float:
    cost = strategy.compute_s
    if tie_break:
        cost += strategy.memory_bytes * TIE_BREAK_S_PER_BYTE
    if strategy.produced is None:
        return cost
    value = output_value(program, (name, 0))
    return cost + comm.transfer(value, strategy.produced, strategy.outputs[0])[0]


@dataclass(frozen=True)
class _Edge:
    source: Source
    consumer: str
    position: int | None
    """Tensor-input position at the consumer; None when the consumer is a parameter (the
    gradient must reach the parameter's own placement)."""
    phase: str


def _edges(program: TracedProgram, table: dict[str, NodeStrategies]) -> list[_Edge]:
    edges = []
    for name, node_strategies in table.items():
        phase = program.nodes[name].meta.get("tessel_phase", "forward")
        for position, source in enumerate(node_strategies.sources):
            edges.append(_Edge(source, name, position, phase))
    param_by_fqn = {fqn: node for node, fqn in program.parameters.items()}
    for grad_name, fqn in program.gradients.items():
        edges.append(
            _Edge(source_of(program.nodes[grad_name]), param_by_fqn[fqn], None, "gradient_sync")
        )
    return edges


def moves_read_by(program: TracedProgram, table: dict[str, NodeStrategies],
                  choices: dict[str, int], nodes: set[str]) -> set[tuple[Source, Placements]]:
    """(value, placement) of every move an op of `nodes` reads its inputs through: those
    a run of only these ops issues (each once, as the runtime reuses a moved value)."""
    return {(edge.source, _required(edge, table, choices[edge.consumer]))
            for edge in _edges(program, table)
            if edge.position is not None and edge.consumer in nodes}


def _required(edge: _Edge, table: dict[str, NodeStrategies], choice: int) -> Placements:
    strategy = table[edge.consumer].strategies[choice]
    return strategy.outputs[0] if edge.position is None else strategy.inputs[edge.position]


def _edge_matrix(
    edge: _Edge, program: TracedProgram, table: dict[str, NodeStrategies], comm: CommModel,
    distinct: dict | None = None, with_buckets: bool = True,
) -> tuple[str, str, np.ndarray, dict[tuple[int, int], tuple]]:
    """Cost of every (producer choice, consumer choice) pair, and for gradient edges the
    bucket each all-reducing pair falls into (none `with_buckets` off). `distinct` keeps
    each end's distinct placements for the other edges of the same `table`."""
    producer, index = edge.source
    value = output_value(program, edge.source)
    # Many strategies share a placement (a producer's strategies differ in their inputs,
    # a consumer's in its other operands): price each distinct pair once, then spread.
    distinct = {} if distinct is None else distinct
    start = ("out", *edge.source)
    if start not in distinct:
        distinct[start] = _distinct([s.outputs[index] for s in table[producer].strategies])
    srcs, row_of = distinct[start]
    end = ("in", edge.consumer, edge.position)
    if end not in distinct:
        distinct[end] = _distinct([_required(edge, table, j)
                                   for j in range(len(table[edge.consumer].strategies))])
    dsts, col_of = distinct[end]
    bucketed = edge.phase == "gradient_sync"
    key = ("edge", tuple(value.shape), value.dtype, tuple(srcs), tuple(dsts), bucketed)
    if key not in comm._cache:
        comm._cache[key] = _pair_prices(value, srcs, dsts, bucketed, comm)
    small, small_keys = comm._cache[key]
    keys = {}
    if small_keys and with_buckets:  # gradient edges only: spread each over its choices
        rows = [np.flatnonzero(row_of == a) for a in range(len(srcs))]
        cols = [np.flatnonzero(col_of == b) for b in range(len(dsts))]
        keys = {(int(i), int(j)): bucket for (a, b), bucket in small_keys.items()
                for i in rows[a] for j in cols[b]}
    return producer, edge.consumer, small[np.ix_(row_of, col_of)], keys


def _pair_prices(value: torch.Tensor, srcs: list[Placements], dsts: list[Placements],
                 bucketed: bool, comm: CommModel) -> tuple[np.ndarray, dict]:
    """Seconds of moving `value` from each of `srcs` to each of `dsts`, and the bucket
    each all-reducing pair falls into."""
    small = np.zeros((len(srcs), len(dsts)))
    small_keys = {}
    tensor_key = (tuple(value.shape), value.dtype)
    dst_ids = [interned(dst) for dst in dsts]
    for a, src in enumerate(srcs):
        src_id = interned(src)
        for b, dst in enumerate(dsts):
            small[a, b], collectives = comm._transfer(tensor_key, value, src_id, src,
                                                      dst_ids[b], dst, bucketed)
            if bucketed and _all_reduce_only(collectives):
                small_keys[(a, b)] = _bucket_key(collectives)
    return small, small_keys


def _distinct(placements: list[Placements]) -> tuple[list[Placements], np.ndarray]:
    """The distinct placements, and for each entry the index of its own among them."""
    first: dict[Placements, int] = {}
    of = [first.setdefault(p, len(first)) for p in placements]
    return list(first), np.array(of, dtype=int)


def _all_reduce_only(collectives: tuple[Collective, ...]) -> bool:
    return bool(collectives) and all(c.kind == "all_reduce" for c in collectives)


def _bucket_key(collectives: tuple[Collective, ...]) -> tuple:
    return tuple(c.mesh_dims for c in collectives)


def _transfers(
    program: TracedProgram,
    table: dict[str, NodeStrategies],
    choices: dict[str, int],
    comm: CommModel,
) -> list[Transfer]:
    """The redistributions of the chosen plan, each (value, target placement) once: the
    runtime reuses a value already moved to a placement for every consumer that needs it."""
    out = []
    for name, node_strategies in table.items():
        strategy = node_strategies.strategies[choices[name]]
        if strategy.produced is not None:
            value = output_value(program, (name, 0))
            _, collectives = comm.transfer(value, strategy.produced, strategy.outputs[0])
            phase = program.nodes[name].meta.get("tessel_phase", "forward")
            out.append(
                Transfer(
                    (name, 0), name, phase, strategy.produced, strategy.outputs[0], collectives
                )
            )
    seen = set()
    for edge in _edges(program, table):
        producer, index = edge.source
        src = table[producer].strategies[choices[producer]].outputs[index]
        dst = _required(edge, table, choices[edge.consumer])
        _, collectives = comm.transfer(output_value(program, edge.source), src, dst)
        if collectives and (edge.source, dst) not in seen:
            seen.add((edge.source, dst))
            out.append(Transfer(edge.source, edge.consumer, edge.phase, src, dst, collectives))
    loss_source = source_of(program.nodes[program.loss])
    src = table[loss_source[0]].strategies[choices[loss_source[0]]].outputs[loss_source[1]]
    dst = tuple(Replicate() for _ in range(comm.mesh.ndim))
    _, collectives = comm.transfer(output_value(program, loss_source), src, dst)
    if collectives and (loss_source, dst) not in seen:
        out.append(Transfer(loss_source, "loss", "forward", src, dst, collectives))
    return out
