"""Candidate sharding strategies of every node of a traced training step on a logical mesh.

A strategy says, for one node, which placement each tensor input must arrive in and which
placement each output leaves in, what the node then costs in compute time on one device,
and how many bytes it keeps resident. The choices come from DTensor's registered op rules
(`passes.dtensor_rules`); an op without a rule gets one strategy, everything replicated,
and is reported as a fallback. Ops that create tensors from nothing (arange, full) produce
replicated values.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._ops import _pointwise_ops

from cost_models.compute import dtype_key, op_flops, op_time, tensor_bytes
from cost_models.memory import state_element_bytes
from passes.deadline import Deadline
from passes.dtensor_rules import Placements, TensorMeta, has_rule, op_choices, tensor_meta
from passes.program import TracedProgram
from planner.vocabulary.cluster import DeviceSpec

if TYPE_CHECKING:
    from cost_models.profiled_costs import ProfileDatabase

# Parameter, gradient and AdamW's two moments, all in the parameter's dtype.
TRAINING_STATE_COPIES = 4


def training_state_bytes(value: torch.Tensor) -> int:
    """All the training state of a parameter as the graph runtime trains it
    (`cost_models.memory.state_element_bytes`): in fp32 the parameter, its gradient and
    AdamW's two moments; in half precision (mixed) the half parameter, an fp32 gradient
    accumulator, fp32 master weights and moments (18 bytes per element); in any other
    dtype, four copies in it."""
    key = dtype_key(value.dtype)
    if key not in ("fp32", "bf16", "fp16"):
        return tensor_bytes(value) * TRAINING_STATE_COPIES
    element = state_element_bytes(key)
    return value.numel() * (element.params + element.grads + element.optimizer)

# Graph nodes that carry no computation to shard: shape assertions from export.
_SKIPPED_OPS = {torch.ops.aten._assert_tensor_metadata.default}

_aten = torch.ops.aten
# Ops that read only the shape and dtype of their tensor inputs. Planned as factories
# (replicated output, inputs never moved): the seed of the backward pass, `full_like(loss)`,
# must not force the loss to be reduced first.
SHAPE_ONLY_OPS = {
    _aten.full_like.default,
    _aten.ones_like.default,
    _aten.zeros_like.default,
    _aten.empty_like.default,
}

Source = tuple[str, int]
"""Where a tensor comes from: (node name, output index); index 0 for single-output nodes."""

OpTimer = Callable[[float, float, str], float]
"""Seconds of an op from (FLOPs, bytes moved, dtype key)."""


@dataclass(frozen=True)
class Strategy:
    """One way to run one node."""

    inputs: tuple[Placements, ...]
    """Required placement of each tensor input, aligned with `NodeStrategies.sources`."""
    outputs: tuple[Placements | None, ...]
    """Placement of each tensor output (None where the op returns no tensor there)."""
    compute_s: float
    """Time of the node's local computation on one device, in seconds."""
    memory_bytes: float
    """Bytes the node keeps resident per device: training state for parameters, saved
    activations for forward values the backward reads."""
    produced: Placements | None = None
    """When set, the op itself produces its (single) output in this placement, a partial
    sum, and the node reduces it to `outputs[0]` at once. A value read by several
    consumers is then reduced once, not once per consumer."""


@dataclass
class NodeStrategies:
    """All strategies of one node."""

    name: str
    kind: str
    """'parameter', 'buffer', 'input', 'op', 'factory' (no tensor inputs) or 'fallback'
    (no sharding rule: replicated)."""
    sources: tuple[Source, ...]
    """The producer of each tensor input."""
    strategies: list[Strategy]


def is_skipped(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _SKIPPED_OPS


def source_of(node: fx.Node) -> Source:
    """(producer, output index) of a value; `getitem` nodes are views of their producer."""
    if node.op == "call_function" and node.target is operator.getitem:
        producer, index = node.args
        return producer.name, int(index)
    return node.name, 0


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """Tensor-valued input nodes in flattened argument order (the order DTensor uses);
    none for ops that only read their inputs' shapes."""
    if node.target in SHAPE_ONLY_OPS:
        return []
    leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
    return [a for a in leaves if isinstance(a, fx.Node) and _is_tensor(a)]


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def output_value(program: TracedProgram, source: Source) -> torch.Tensor:
    value = program.nodes[source[0]].meta["val"]
    return value[source[1]] if isinstance(value, (tuple, list)) else value


def enumerate_strategies(
    program: TracedProgram,
    mesh: DeviceMesh,
    device: DeviceSpec,
    profile: ProfileDatabase | None = None,
    deadline: Deadline | None = None,
) -> dict[str, NodeStrategies]:
    """Strategies of every placeholder and op node, in graph order. Ops are timed with
    `profile`'s measurements when given, else with `device`'s roofline. DeadlinePassed
    when `deadline` passes first."""
    timer: OpTimer = (
        profile.op_time if profile is not None
        else lambda flops, nbytes, dtype: op_time(flops, nbytes, device, dtype)
    )
    table: dict[str, NodeStrategies] = {}
    saved = _saved_for_backward(program)
    rules = _RuleCache()  # repeated blocks ask DTensor the same questions
    nodes = list(program.graph.nodes)
    for done, node in enumerate(nodes):
        if deadline is not None:
            deadline.check(f"enumerating strategies on mesh {tuple(mesh.shape)} "
                           f"({done} of {len(nodes)} nodes)")
        if node.op == "placeholder":
            table[node.name] = _placeholder(program, node, mesh)
        elif node.op == "call_function" and node.target is not operator.getitem:
            if is_skipped(node):
                continue
            table[node.name] = _op(node, table, program, mesh, timer, node.name in saved,
                                   rules)
    return table


class _RuleCache:
    """DTensor's answers for an op, keyed by everything the rule reads: the mesh's shape,
    the op, its arguments (tensors as shape, stride and dtype), the candidate input
    placements and the output's metadata, and beside each answer the strategies' placements
    a node makes of it (`_ways`). The blocks of a model repeat, and a graph plan asks again
    for each layer, variant and stage, so the answers are kept for the process (up to
    `LIMIT` of them)."""

    LIMIT = 200_000
    _answers: dict[object, list | None] = {}

    def ways(self, op, args, kwargs, mesh, candidates, out_meta,
             keep: Callable[[list | None], list | None]) -> list | None:
        """`keep(choices)` of DTensor's answers, kept beside them: what a node makes of its
        op's answers reads nothing the key leaves out."""
        key = self._key(op, args, kwargs, mesh, candidates, out_meta)
        ask = lambda: _choices(op, args, kwargs, mesh, candidates, out_meta)  # noqa: E731
        if key is None:
            return keep(ask())
        # What a node makes of the answers (which shards are even) reads the axes' sizes
        # only as the key does: it is kept under the same key.
        return self._remember(("ways", key), lambda: keep(self._remember(key, ask)))

    def _key(self, op, args, kwargs, mesh, candidates, out_meta) -> tuple | None:
        leaves, structure = torch.utils._pytree.tree_flatten(
            (args, kwargs), is_leaf=lambda a: isinstance(a, TensorMeta)
        )
        out_key = out_meta
        mesh_key: tuple = tuple(mesh.shape)
        size = mesh.size()
        outs = [out_meta] if isinstance(out_meta, TensorMeta) else list(out_meta or ())
        tensors = [a for a in (*leaves, *outs) if isinstance(a, TensorMeta)]
        if min(mesh.shape) > 1 and all(d == 1 or _splits(d, size)
                                       for t in tensors for d in t.shape):
            # Every dim splits over any product of the axes (or over none, being 1): a
            # rule reads the axes' sizes only to ask that, so its answer is the same on
            # every mesh of as many axes, whatever their sizes.
            mesh_key = ("axes", mesh.ndim)
        if op in _SHAPE_FREE_RULES:
            leaves = [_shape_class(a, size) if isinstance(a, TensorMeta) else a for a in leaves]
            out_key = (_shape_class(out_meta, size) if isinstance(out_meta, TensorMeta)
                       else out_meta)
        key = (mesh.device_type, mesh_key, op, tuple(leaves), structure,
               tuple(map(tuple, candidates)), out_key)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _remember(self, key: tuple, compute: Callable[[], list | None]) -> list | None:
        if key not in self._answers:
            if len(self._answers) >= self.LIMIT:
                self._answers.clear()
            self._answers[key] = compute()
        return self._answers[key]


# Ops whose DTensor rule reads its tensors' sizes only to ask whether each dim can be
# split over the mesh (and which dims broadcast): matmuls, transposes, reductions over
# given dims and pointwise ops. Their answers are shared by every size that splits over
# the whole mesh, so the layers of a model that differ only in widths ask DTensor once.
_SHAPE_FREE_RULES = frozenset([
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.t.default, _aten.transpose.int, _aten.permute.default, _aten.sum.dim_IntList,
    *_pointwise_ops.pointwise_ops,
    # The pointwise ops with rules of their own (mul, add, relu, ... keep or combine
    # partial sums): torch 2.13 lists them apart from `pointwise_ops`.
    *getattr(_pointwise_ops, "_specially_registered_ops", ()),
])


def _shape_class(meta: TensorMeta, mesh_size: int) -> tuple:
    """What a shape-free rule reads of a tensor: each dim's size, or -1 for every size
    the whole mesh divides (each such dim splits over any mesh axes alike), the order of
    its strides, and its dtype."""
    shape = tuple(-1 if _splits(s, mesh_size) else s for s in meta.shape)
    order = tuple(sorted(range(len(meta.stride)), key=lambda d: (-meta.stride[d], d)))
    return ("tensor", shape, order, meta.dtype)


def _splits(size: int, mesh_size: int) -> bool:
    """Whether a dim of `size` splits evenly over every axis of a mesh of `mesh_size`."""
    return size >= mesh_size and size % mesh_size == 0


def shardable_placements(shape: Sequence[int], mesh: DeviceMesh) -> list[Placements]:
    """Every Replicate/Shard combination that splits `shape` evenly over `mesh`."""
    options = [[Replicate()] + [Shard(d) for d in range(len(shape))]] * mesh.ndim
    return [p for p in itertools.product(*options) if is_even(p, shape, mesh)]


def is_even(placements: Placements | None, shape: Sequence[int], mesh: DeviceMesh) -> bool:
    """True when every sharded dimension divides evenly (so every rank holds equal bytes)."""
    if placements is None:
        return True
    ways = [1] * len(shape)
    for axis, p in enumerate(placements):
        if isinstance(p, Shard):
            if p.dim >= len(shape):
                return False
            ways[p.dim] *= mesh.size(axis)
        elif isinstance(p, Partial):
            if p.reduce_op not in ("sum", "avg"):
                return False  # the reductions gradients and losses need
        elif not isinstance(p, Replicate):
            return False  # strided and other exotic shardings are not planned for
    return all(size % w == 0 for size, w in zip(shape, ways))


def shard_factor(placements: Placements | None, mesh: DeviceMesh) -> int:
    """Into how many pieces a placement splits a tensor's data (Partial counts as split
    work: each rank computed a partial sum)."""
    if placements is None:
        return 1
    return math.prod(mesh.size(a) for a, p in enumerate(placements) if not p.is_replicate())


def _placeholder(program: TracedProgram, node: fx.Node, mesh: DeviceMesh) -> NodeStrategies:
    value = node.meta["val"]
    if node.name in program.parameters:
        kind, nbytes = "parameter", training_state_bytes(value)
    else:
        kind = "buffer" if node.name in program.buffers else "input"
        nbytes = tensor_bytes(value)
    strategies = [
        Strategy((), (p,), 0.0, nbytes / shard_factor(p, mesh))
        for p in shardable_placements(value.shape, mesh)
    ]
    return NodeStrategies(node.name, kind, (), strategies)


def _op(
    node: fx.Node,
    table: dict[str, NodeStrategies],
    program: TracedProgram,
    mesh: DeviceMesh,
    timer: OpTimer,
    saved: bool,
    rules: _RuleCache,
) -> NodeStrategies:
    inputs = tensor_inputs(node)
    sources = tuple(source_of(a) for a in inputs)
    value = node.meta.get("val")
    flops = node_flops(node)
    traffic = tensor_bytes(value) + sum(tensor_bytes(a.meta["val"]) for a in inputs)
    dtype = dtype_key(_first_tensor(value).dtype) if _first_tensor(value) is not None else "fp32"
    out_bytes = tensor_bytes(value) if saved else 0

    costs: dict[int, tuple[float, float]] = {}

    def strategy(ins: tuple[Placements, ...], outs: tuple[Placements | None, ...],
                 produced: Placements | None = None) -> Strategy:
        # The op's own work is split as what it produces (before any reduction after it).
        split = shard_factor(produced or outs[0], mesh)
        if split not in costs:
            costs[split] = (timer(flops / split, traffic / split, dtype), out_bytes / split)
        return Strategy(ins, outs, *costs[split], produced)

    replicated = tuple(Replicate() for _ in range(mesh.ndim))
    n_out = len(value) if isinstance(value, (tuple, list)) else 1
    all_replicated = strategy(
        tuple(replicated for _ in inputs), tuple(replicated for _ in range(n_out))
    )
    if not inputs:
        return NodeStrategies(node.name, "factory", sources, [all_replicated])
    if not has_rule(node.target):
        return NodeStrategies(node.name, "fallback", sources, [all_replicated])

    candidates = [_distinct_outputs(table[name], index) for name, index in sources]
    args, kwargs = _meta_args(node)
    ways = rules.ways(node.target, args, kwargs, mesh, candidates, _output_meta(value),
                      lambda choices: _ways(node, inputs, value, mesh, candidates, choices))
    if ways is None:
        return NodeStrategies(node.name, "fallback", sources, [all_replicated])
    return NodeStrategies(node.name, "op", sources, [strategy(*way) for way in ways])


Way = tuple[tuple, tuple, "Placements | None"]
"""A strategy's placements, (inputs, outputs, produced) as in `Strategy`."""


def _ways(node: fx.Node, inputs: list[fx.Node], value: object, mesh: DeviceMesh,
          candidates: list[list[Placements]], choices: list | None) -> list[Way] | None:
    """The strategies' placements of a node from DTensor's `choices` for its op: even
    shards only, no partial integers, ..., and each partial output also reduced at once;
    None when none is left (the node then runs replicated)."""
    if choices is None:
        return None
    shapes_in = [a.meta["val"].shape for a in inputs]
    shapes_out = [t.shape if isinstance(t, torch.Tensor) else () for t in _as_tuple(value)]
    dtypes = [a.meta["val"].dtype for a in inputs] + [
        t.dtype if isinstance(t, torch.Tensor) else None for t in _as_tuple(value)
    ]
    seen: set = set()
    direct, moved = [], []
    for choice in choices:
        key = (choice.inputs, choice.outputs)
        if key in seen or len(choice.inputs) != len(inputs):
            continue
        if not all(is_even(p, s, mesh) for p, s in zip(choice.inputs, shapes_in)):
            continue
        if not all(is_even(p, s, mesh) for p, s in zip(choice.outputs, shapes_out)):
            continue
        placements = (*choice.inputs, *choice.outputs)
        if any(_partial_of_integers(p, d) for p, d in zip(placements, dtypes)):
            continue
        if node.target in _DIM_MAP_OPS and any(_sharded_twice(p) for p in placements):
            continue
        if any(_averaging(p) for p in choice.inputs):
            # Averaged partials only leave reductions (mean); as inputs they duplicate the
            # summed-partial strategies at twice the ILP size.
            continue
        seen.add(key)
        fed = all(_locally_reachable(p, c) for p, c in zip(choice.inputs, candidates))
        (direct if fed else moved).append(choice)
    # Prefer strategies every producer can feed without communicating: on 2-D meshes the
    # rules propose every combination of placements, most of which only add ILP variables
    # (the producers' own strategies already offer the cheap ways to get there).
    kept = direct or moved
    if not kept:
        return None
    ways: list[Way] = []
    for choice in kept:
        ways.append((choice.inputs, choice.outputs, None))
        # On 2-D meshes, where every partial placement multiplies the ILP, reduce only
        # where the partial sum is made (a matmul or sum over a split dimension), not
        # again at every op it flows through.
        if len(choice.outputs) == 1 and (mesh.ndim == 1 or _creates_partial(choice)):
            ways.extend((choice.inputs, (out,), choice.outputs[0])
                        for out in _reduced(choice.outputs[0], shapes_out[0], mesh))
    return ways


# Ops DTensor runs through its own handler (torch/distributed/tensor/_tp_conv.py), which
# reads each spec's `dim_map` and so refuses a tensor dim sharded over two mesh axes
# (S(0)S(0)), though the registered strategies propose it.
_DIM_MAP_OPS = (torch.ops.aten.convolution.default,
                torch.ops.aten.convolution_backward.default)


def _sharded_twice(placements: Placements | None) -> bool:
    dims = [p.dim for p in placements or () if isinstance(p, Shard)]
    return len(dims) != len(set(dims))


def _partial_of_integers(placements: Placements | None, dtype: torch.dtype | None) -> bool:
    """Partial sums of indices or masks are meaningless (and DTensor would turn a
    replicated int tensor into a partial one by dividing it)."""
    if placements is None or dtype is None or dtype.is_floating_point:
        return False
    return any(p.is_partial() for p in placements)


def _averaging(placements: Placements | None) -> bool:
    return placements is not None and any(
        isinstance(p, Partial) and p.reduce_op == "avg" for p in placements
    )


def _locally_reachable(wanted: Placements, offered: list[Placements]) -> bool:
    """The producer offers `wanted`, or something that becomes it by local work a rule
    would ask for anyway: a replicated value read as a partial one (a bias added to a
    partial sum), or any slice of a producer that is only ever replicated (constants,
    the seed of the backward pass)."""
    if wanted in offered:
        return True
    if all(p.is_replicate() for offer in offered for p in offer):
        return True
    return any(
        all(o == w or (o.is_replicate() and w.is_partial()) for o, w in zip(offer, wanted))
        for offer in offered
    )


# Combinations of input placements tried one by one when a rule rejects some of them.
_MAX_COMBINATIONS = 256


def _choices(op, args, kwargs, mesh, candidates, out_meta) -> list | None:
    """DTensor's strategies for `op`, asking for all candidate inputs at once and, when the
    rule rejects one of them (e.g. a view that cannot unflatten an uneven shard), for each
    combination of candidates separately."""
    try:
        return op_choices(op, args, kwargs, mesh, candidates, out_meta)
    except Exception:  # noqa: BLE001 - rules raise on inputs they cannot handle
        pass
    found: list = []
    for combo in itertools.islice(itertools.product(*candidates), _MAX_COMBINATIONS):
        try:
            result = op_choices(op, args, kwargs, mesh, [[p] for p in combo], out_meta)
        except Exception:  # noqa: BLE001
            continue
        found.extend(c for c in result or [] if c not in found)
    return found or None


def _creates_partial(choice) -> bool:
    """The op contracts a split dimension: its output is partial on a mesh axis along which
    some input is sharded (not merely passed a partial input through)."""
    out = choice.outputs[0]
    if out is None:
        return False
    return any(
        p.is_partial() and any(i is not None and i[axis].is_shard() for i in choice.inputs)
        for axis, p in enumerate(out)
    )


def _reduced(produced: Placements, shape: Sequence[int], mesh: DeviceMesh) -> list[Placements]:
    """Where a partial-sum output can be reduced to at once: replicated (all-reduce) or a
    shard of one dimension (reduce-scatter) on its partial axes."""
    axes = [a for a, p in enumerate(produced) if isinstance(p, Partial)]
    if not axes:
        return []
    targets = [Replicate()] + [Shard(d) for d in range(len(shape))]
    outs = [tuple(target if a in axes else p for a, p in enumerate(produced))
            for target in targets]
    return [out for out in outs if is_even(out, shape, mesh)]


def _distinct_outputs(producer: NodeStrategies, index: int) -> list[Placements]:
    outputs = (s.outputs[index] for s in producer.strategies)
    return list(dict.fromkeys(p for p in outputs if p is not None))


def _as_tuple(value: object) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _first_tensor(value: object) -> torch.Tensor | None:
    return next((t for t in _as_tuple(value) if isinstance(t, torch.Tensor)), None)


def _output_meta(value: object):
    if isinstance(value, (tuple, list)):
        return tuple(tensor_meta(t) if isinstance(t, torch.Tensor) else None for t in value)
    return tensor_meta(value) if isinstance(value, torch.Tensor) else None


def _meta_args(node: fx.Node) -> tuple[tuple, dict]:
    """The node's arguments with `TensorMeta` in place of every tensor input."""

    def convert(a: object) -> object:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            return tensor_meta(v) if isinstance(v, torch.Tensor) else v
        return a

    return (
        torch.utils._pytree.tree_map(convert, node.args),
        torch.utils._pytree.tree_map(convert, node.kwargs),
    )


def node_flops(node: fx.Node) -> float:
    """FLOPs of one traced op, from the values recorded on its inputs and output."""

    def convert(a: object) -> object:
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    args, kwargs = torch.utils._pytree.tree_map(convert, (node.args, node.kwargs))
    return op_flops(node.target, args, kwargs, node.meta.get("val"))


def _saved_for_backward(program: TracedProgram) -> set[str]:
    """Forward values that some backward node reads: the activations training keeps."""
    saved = set()
    for node in program.graph.nodes:
        if node.meta.get("tessel_phase") != "forward" or node.op != "call_function":
            continue
        if is_saved_for_backward(node):
            saved.add(source_of(node)[0])
    return saved


def is_saved_for_backward(node: fx.Node) -> bool:
    """Whether the backward reads this forward value (it is kept until then)."""
    return any(
        u.meta.get("tessel_phase") == "backward" and u.target not in SHAPE_ONLY_OPS
        for u in node.users
    )


def fallback_nodes(table: dict[str, NodeStrategies]) -> list[str]:
    """Nodes whose op has no sharding rule (planned replicated), in graph order."""
    return [name for name, s in table.items() if s.kind == "fallback"]
