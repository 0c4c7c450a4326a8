"""The one module that touches DTensor's private sharding API.

Everything Tessel needs from DTensor internals goes through here, so a torch upgrade breaks
one file: the fake process group that builds meshes of any size without processes, the
registered op strategies (the node choices of the intra-op ILP), and the redistribution
planner (the collectives an edge of the ILP costs). Tested on torch 2.13 (pyproject pins it).
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.distributed._functional_collectives as funcol
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops import _math_ops as _dtensor_math_ops
from torch.distributed.tensor._ops import _matrix_ops as _dtensor_matrix_ops
from torch.distributed.tensor._ops import _tensor_ops as _dtensor_tensor_ops
from torch.distributed.tensor._ops import _view_ops as _dtensor_view_ops
from torch.distributed.tensor._ops import utils as _dtensor_op_utils
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.distributed.tensor._redistribute import (
    _gen_transform_infos,
    _optimize_transform_infos,
    redistribute_local_tensor,
)

from planner.vocabulary.placement_text import placement_pieces

Placements = tuple[Placement, ...]

# DTensor warns on every unflattened multi-axis reduction; the planner costs those itself.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

# How DTensor's redistribution planner names the collective a transform needs; Tessel's
# communication vocabulary is the same (cost_models.comm.COLLECTIVE_KINDS).
_COLLECTIVE_OF_TRANSFORM = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def fake_mesh(mesh_shape: Sequence[int]) -> DeviceMesh:
    """A DeviceMesh of any shape with no processes behind it, for planning.

    Uses torch's fake process group: collectives are accepted and do nothing. Replaces a
    fake group left by an earlier call; refuses to replace a real one.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = 1
    for size in mesh_shape:
        world *= size
    if dist.is_initialized() and dist.get_backend() != "fake":
        # Planning on a rank of a real job (`parallelize`): a mesh with no groups of its
        # own, which is all that strategies and costs read.
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh("cpu", torch.arange(world).reshape(tuple(mesh_shape)),
                          _init_backend=False)
    if dist.is_initialized():
        if dist.get_world_size() != world:
            dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return init_device_mesh("cpu", tuple(mesh_shape))


def tensor_meta(value: torch.Tensor) -> TensorMeta:
    return TensorMeta(value.shape, value.stride(), value.dtype)


def spec(mesh: DeviceMesh, placements: Placements, meta: TensorMeta | None) -> DTensorSpec:
    return DTensorSpec(mesh, tuple(placements), tensor_meta=meta)


@dataclass(frozen=True)
class OpChoice:
    """One way DTensor can run an op: the placements it needs and the ones it produces."""

    inputs: tuple[Placements | None, ...]
    """Required placement of each tensor argument, in flattened argument order."""
    outputs: tuple[Placements | None, ...]
    """Placement of each tensor output (one entry for single-output ops)."""


def has_rule(op: torch._ops.OpOverload) -> bool:
    prop = DTensor._op_dispatcher.sharding_propagator
    return op in prop.op_strategy_funcs or op in prop.op_single_dim_strategy_funcs


def op_choices(
    op: torch._ops.OpOverload,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    mesh: DeviceMesh,
    candidate_inputs: Sequence[Sequence[Placements]],
    output_meta: TensorMeta | Sequence[TensorMeta | None] | None,
) -> list[OpChoice] | None:
    """Every strategy DTensor registers for `op`, or None when it has no rule.

    `args`/`kwargs` hold `TensorMeta` in place of each tensor argument (flattened order),
    and `candidate_inputs[i]` the placements the i-th tensor argument may arrive in; rules
    that follow their inputs (pointwise, views) only propose those.
    """
    prop = DTensor._op_dispatcher.sharding_propagator
    single_dim = prop.op_single_dim_strategy_funcs.get(op)
    full = prop.op_strategy_funcs.get(op)
    if single_dim is None and full is None:
        return None

    flat, treedef = torch.utils._pytree.tree_flatten(
        (args, kwargs), is_leaf=lambda a: isinstance(a, TensorMeta)
    )
    tensor_positions = [i for i, a in enumerate(flat) if isinstance(a, TensorMeta)]
    for position, candidates in zip(tensor_positions, candidate_inputs):
        meta = flat[position]
        if single_dim is not None:
            # Single-dim rules read the one current placement of each input only to learn
            # which shard types fill their placeholders, then propose every combination.
            candidates = [_representative(candidates)]
        flat[position] = OpStrategy([OpSpec(spec(mesh, p, meta)) for p in candidates])
    strategy_args, strategy_kwargs = torch.utils._pytree.tree_unflatten(flat, treedef)
    # A list of tensors (cat, stack) is one TupleStrategy argument to DTensor's rules.
    strategy_args = tuple(
        TupleStrategy(list(a))
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, OpStrategy) for x in a)
        else a
        for a in strategy_args
    )
    schema_info = (
        prop.op_to_schema_info_for_single_dim_strategy.get(op)
        if single_dim is not None
        else prop.op_to_schema_info.get(op)
    )
    schema = OpSchema(op, tuple(strategy_args), strategy_kwargs, schema_info=schema_info)
    with _no_redistribute_costs():
        if single_dim is not None:
            expand = _expand_single_dim_strategy_to_mesh(mesh, schema, single_dim, output_meta)
            strategy = expand(op, schema.args_meta, schema.kwargs_meta)
        else:
            strategy = full(schema)
    return [_as_choice(s, len(tensor_positions)) for s in _op_specs(strategy)]


@contextmanager
def _no_redistribute_costs() -> Iterator[None]:
    """DTensor's expansion of a rule to every mesh axis (`expand_to_full_mesh_op_strategy`),
    its view, reduction, matmul and tensor rules price each strategy's move from every
    candidate input with DTensor's cost model, about half the time a rule takes on a 2-D
    mesh; a choice keeps only placements (the ILP prices moves itself), so there they are
    priced at zero. None of these modules reads the costs back; the single-dim expansion,
    which searches by them, keeps its own."""
    saved = [module.generate_redistribute_costs for module in _COST_ATTACHING]
    for module in _COST_ATTACHING:
        module.generate_redistribute_costs = _zero_costs
    try:
        yield
    finally:
        for module, original in zip(_COST_ATTACHING, saved):
            module.generate_redistribute_costs = original


_COST_ATTACHING = (_dtensor_op_utils, _dtensor_view_ops, _dtensor_math_ops,
                   _dtensor_matrix_ops, _dtensor_tensor_ops)


def _zero_costs(src_strategy: OpStrategy, dst_spec: DTensorSpec) -> list[float]:
    return [0.0] * len(src_strategy.strategies)


def _representative(candidates: Sequence[Placements]) -> Placements:
    sharded = [p for p in candidates if any(isinstance(x, Shard) for x in p)]
    return (sharded or list(candidates))[0]


def _op_specs(strategy: OpStrategy | TupleStrategy) -> list[OpSpec]:
    if isinstance(strategy, OpStrategy):
        return list(strategy.strategies)
    raise NotImplementedError(f"tuple strategies are not supported: {strategy}")


def _as_choice(op_spec: OpSpec, num_tensor_args: int) -> OpChoice:
    outputs = op_spec.output_specs
    if isinstance(outputs, DTensorSpec):
        out = (outputs.placements,)
    else:
        out = tuple(o.placements if o is not None else None for o in outputs)
    if op_spec.input_specs is None:
        inputs = (out[0],) * num_tensor_args
    else:
        inputs = tuple(s.placements if s is not None else None for s in op_spec.input_specs)
    return OpChoice(inputs=inputs, outputs=out)


@dataclass(frozen=True)
class Collective:
    """One collective DTensor issues to redistribute a tensor."""

    kind: str
    """'all_reduce', 'all_gather', 'reduce_scatter' or 'all_to_all'."""
    mesh_dims: tuple[int, ...]
    """Mesh axes the collective runs over (several when DTensor flattens them into one)."""
    nbytes: int
    """Bytes of the larger of the collective's local input and output buffers."""


def redistribution(
    mesh: DeviceMesh, meta: TensorMeta, src: Placements, dst: Placements
) -> list[Collective]:
    """The collectives DTensor's `redistribute` issues to move a tensor from `src` to `dst`.

    Asks DTensor's own planner (and its merging of same-kind collectives over several mesh
    axes), so a plan's predicted collectives are the ones the runtime issues.
    """
    src, dst = tuple(src), tuple(dst)
    if src == dst:
        return []
    supported, split = _move(src, dst)
    if not supported:
        raise UnsupportedRedistribution(
            f"DTensor cannot move {placement_str(src)} to {placement_str(dst)}"
        )
    # Where the whole mesh divides every dim either end shards, every shard is even and
    # DTensor's plan is the same whatever the axes' sizes (they only pad uneven shards), and
    # on a mesh without axis names the same whatever its shape (only named axes flatten):
    # planned once per (axes, rank, src, dst) for the process, each collective sized for
    # this mesh.
    shape = tuple(mesh.shape)
    size = math.prod(shape)
    if math.prod(meta.shape) == 0 or any(
            d >= len(meta.shape) or meta.shape[d] % size for d in split):
        return _sized(_plan(mesh, meta, src, dst), meta, mesh)
    axes = len(shape) if mesh.mesh_dim_names is None else (shape, mesh.mesh_dim_names)
    key = (mesh.device_type, axes, len(meta.shape), src, dst)
    if key not in _EVEN_PLANS:
        _EVEN_PLANS[key] = _plan(mesh, meta, src, dst)
    return _sized(_EVEN_PLANS[key], meta, mesh)


_Step = tuple[str, tuple[int, ...], tuple[int, ...]]
"""A collective of a redistribution: its kind, its mesh axes, and the mesh axes that shard
the tensor it starts from (its buffer is a shard over them)."""
_EVEN_PLANS: dict[tuple, list[_Step]] = {}


def _plan(mesh: DeviceMesh, meta: TensorMeta, src: Placements,
          dst: Placements) -> list[_Step]:
    axis = _shard_move_axis(src, dst)
    if mesh.device_type == "cpu" and axis is not None:
        # `redistribute` below: one all-to-all of the local shard.
        return [("all_to_all", (axis,), _sharding_axes(src))]
    src_spec, dst_spec = spec(mesh, src, meta), spec(mesh, dst, meta)
    infos = _gen_transform_infos(src_spec, dst_spec)
    infos = _optimize_transform_infos(infos, mesh, src_spec.placements, dst_spec.placements)
    current = list(src)
    steps = []
    for info in infos:
        kind = info._comm_type_key()
        dims = tuple(getattr(info, "original_mesh_dims", (info.mesh_dim,)))
        before = _sharding_axes(current)
        for d in dims:
            current[d] = info.src_dst_placements[1]
        if kind is None:
            continue
        if kind == "all_to_all" and mesh.device_type == "cpu":
            # A move over several axes: DTensor all-gathers the shard and keeps a chunk.
            kind = "all_gather"
        steps.append((kind, dims, before))
    return steps


def _sharding_axes(placements: Sequence[Placement]) -> tuple[int, ...]:
    return tuple(axis for axis, p in enumerate(placements) if isinstance(p, Shard))


def _sized(steps: list[_Step], meta: TensorMeta, mesh: DeviceMesh) -> list[Collective]:
    """The collectives of `steps` on this mesh: each of the larger of its local input and
    output buffers (a gather's output holds `group` local inputs; the others are at most
    their input). Shapes divide evenly: see strategies.is_even."""
    shape = tuple(mesh.shape)
    numel = math.prod(meta.shape)
    out = []
    for kind, dims, sharded in steps:
        local = numel
        for axis in sharded:
            local //= shape[axis]
        nbytes = local * meta.dtype.itemsize
        if kind == "all_gather":
            nbytes *= math.prod(shape[d] for d in dims)
        out.append(Collective(kind, dims, nbytes))
    return out


class UnsupportedRedistribution(ValueError):
    """DTensor has no way to move between these placements (e.g. a shard to a partial)."""


def is_supported(src: Placements, dst: Placements) -> bool:
    """DTensor makes partial values only from replicated ones (or the same partial)."""
    return _move(tuple(src), tuple(dst))[0]


_MOVES: dict[tuple[Placements, Placements], tuple[bool, frozenset[int]]] = {}


def _move(src: Placements, dst: Placements) -> tuple[bool, frozenset[int]]:
    """(`is_supported`, the dims either end shards) of a move, once per pair for the
    process: a layer's 2-D ILP prices thousands of moves among a few dozen placements, and
    each Placement method runs through pybind."""
    if (src, dst) not in _MOVES:
        supported = not any(d.is_partial() and d != s and not s.is_replicate()
                            for s, d in zip(src, dst))
        split = frozenset(p.dim for p in (*src, *dst) if isinstance(p, Shard))
        _MOVES[(src, dst)] = supported, split
    return _MOVES[(src, dst)]


def redistribute(value: DTensor, placements: Placements) -> DTensor:
    """`value.redistribute(...)` that may also target partial placements, which the
    public API reserves for DTensor's own dispatch (replicated -> partial is local), and
    that moves a shard from one dim to another with an all-to-all on CPU meshes too."""
    moved = _shard_to_shard(value, placements)
    if moved is not None:
        return moved
    if not any(p.is_partial() for p in placements):
        return value.redistribute(value.device_mesh, placements)
    current = value._spec
    target = spec(current.mesh, placements, current.tensor_meta)
    local = redistribute_local_tensor(value._local_tensor, current, target)
    return DTensor(local, target, requires_grad=value.requires_grad)


def _shard_move_axis(src: Placements, dst: Placements) -> int | None:
    """The one mesh axis on which `src` -> `dst` moves a shard from one dim to another,
    when nothing else changes and no other axis splits either dim (then the local pieces
    are plain slices of the two dims), else None."""
    if len(src) != len(dst):
        return None
    changed = [axis for axis, (a, b) in enumerate(zip(src, dst)) if a != b]
    if len(changed) != 1:
        return None
    a, b = src[changed[0]], dst[changed[0]]
    if type(a) is not Shard or type(b) is not Shard:  # strided shards are not plain slices
        return None
    others = [p for axis, p in enumerate(src) if axis != changed[0]]
    if any(p.is_shard() and p.dim in (a.dim, b.dim) for p in others):
        return None
    return changed[0]


def _shard_to_shard(value: DTensor, placements: Placements) -> DTensor | None:
    """S(i) -> S(j) on one mesh axis of a CPU mesh as one all-to-all, or None when the move
    is anything else.

    torch 2.13's DTensor all-gathers and keeps a chunk on CPU meshes ("gloo does not
    support alltoall"), but gloo does run `all_to_all_single`: each rank cuts its shard
    into one piece per peer along dim j, exchanges them, and joins what it receives along
    dim i. Its backward is the reverse all-to-all. Uneven pieces are left to DTensor.
    """
    mesh, src = value.device_mesh, value.placements
    axis = _shard_move_axis(src, placements)
    if mesh.device_type != "cpu" or axis is None:
        return None
    a, b = src[axis], placements[axis]
    local, n = value.to_local(), mesh.size(axis)
    if local.dim() <= max(a.dim, b.dim) or local.shape[b.dim] % n:
        return None
    pieces = torch.stack(local.chunk(n, dim=b.dim))
    received = funcol.all_to_all_single_autograd(pieces, None, None, mesh.get_group(axis))
    joined = torch.cat(list(received.unbind(0)), dim=a.dim)
    return DTensor.from_local(joined, mesh, placements, run_check=False,
                              shape=value.shape, stride=value.stride())


def placement_str(placements: Placements | None) -> str:
    """DTensor's compact form: 'S(0)R', 'P', ... (the form used in plans and logs)."""
    if placements is None:
        return "-"
    return "".join(_one(p) for p in placements)


def _one(p: Placement) -> str:
    if isinstance(p, _StridedShard):  # a Shard subclass: test it first
        return f"_S({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    return str(p)


def parse_placements(text: str) -> Placements:
    """Inverse of `placement_str`: 'S(0)R' -> (Shard(0), Replicate()); '_S(0,2)' is a
    strided shard (dim 0 split again inside a split by 2: FSDP2 over tensor parallelism)."""
    out: list[Placement] = []
    for kind, argument in placement_pieces(text):
        if kind == "_S":
            dim, factor = (int(v) for v in argument.split(","))
            out.append(_StridedShard(dim, split_factor=factor))
        elif kind == "S":
            out.append(Shard(int(argument)))
        elif kind == "R":
            out.append(Replicate())
        else:
            out.append(Partial(argument) if argument else Partial())
    return tuple(out)


# -- Own rules: ops DTensor has no strategy for ----------------------------------------------

_aten = torch.ops.aten


def _register_cpu_flash_attention_rules() -> None:
    """Shardings of CPU scaled-dot-product attention, the CPU counterpart of DTensor's rules
    for the CUDA kernels: replicated, split by batch (dim 0) or split by heads (dim 1),
    with every tensor of the op split alike."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy,
        register_op_strategy,
    )

    forward = _aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = _aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    prop = DTensor._op_dispatcher.sharding_propagator
    if forward in prop.op_strategy_funcs:
        return

    def rules(num_outputs: int, op_schema: OpSchema) -> list[list[Placement]]:
        inputs = [a for a in op_schema.args_schema if isinstance(a, OpStrategy)]
        inputs += [v for v in op_schema.kwargs_schema.values() if isinstance(v, OpStrategy)]
        out = []
        query = inputs[0]
        for placement in (Replicate(), Shard(0), Shard(1)):
            if isinstance(placement, Shard) and query.shape[placement.dim] == 1:
                continue  # nothing to split: a batch of one, or one head
            # A mask broadcast over batch or heads (size 1 there) stays replicated.
            per_input = [
                Replicate() if isinstance(placement, Shard) and t.shape[placement.dim] == 1
                else placement
                for t in inputs
            ]
            out.append([placement] * num_outputs + per_input)
        return out

    @register_op_strategy(forward, schema_info=RuntimeSchemaInfo(3))
    def _forward(op_schema: OpSchema) -> OpStrategy:
        mesh = op_schema.get_mesh_from_args()
        return expand_to_full_mesh_op_strategy(mesh, op_schema, rules(2, op_schema), input_index=2)

    @register_op_strategy(backward, schema_info=RuntimeSchemaInfo(6))
    def _backward(op_schema: OpSchema) -> OpStrategy:
        mesh = op_schema.get_mesh_from_args(validate=False)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, rules(3, op_schema), input_index=3)


_register_cpu_flash_attention_rules()
