"""Count the collectives a rank actually issues, by kind, with their payload bytes.

A TorchDispatchMode that sees every `_c10d_functional` collective DTensor (or Tessel's
gradient buckets) dispatch, and every eager `c10d` op: FSDP2's all-gathers and
reduce-scatters, the pipeline schedules' sends and receives (counted as ``send`` and
``recv``), broadcasts and all-to-alls. (`CommDebugMode` misses point-to-point ops and
breaks inside pipeline schedules.) Bytes follow the plan's convention: the larger of the
collective's local input and output buffers, so they compare one to one with
`Plan.communication`; an all-to-all counts what the rank sends (its input; NCCL's
accounting), which is the same where its splits are even and, where the router sets them,
sums over the group to a figure no routing changes. Dispatch modes are thread-local:
collectives issued on another thread are not seen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_c10d = torch.ops._c10d_functional
_eager = torch.ops.c10d

# op -> (kind, how many times the input's bytes the larger buffer holds: a group size)
_KINDS = {
    _c10d.all_reduce.default: "all_reduce",
    _c10d.all_reduce_.default: "all_reduce",
    _c10d.all_gather_into_tensor.default: "all_gather",
    _c10d.reduce_scatter_tensor.default: "reduce_scatter",
    _c10d.all_to_all_single.default: "all_to_all",
}

# Eager c10d ops: their first two arguments are (output, input) buffers, or (tensors,
# process group) for in-place ones; the bytes are the larger of the two totals.
_EAGER_KINDS = {
    _eager.send.default: "send",
    _eager.recv_.default: "recv",
    _eager.recv_any_source_.default: "recv",
    _eager.allreduce_.default: "all_reduce",
    _eager.allreduce_coalesced_.default: "all_reduce",
    _eager._allgather_base_.default: "all_gather",
    _eager.allgather_.default: "all_gather",
    _eager.allgather_into_tensor_coalesced_.default: "all_gather",
    _eager._reduce_scatter_base_.default: "reduce_scatter",
    _eager.reduce_scatter_.default: "reduce_scatter",
    _eager.reduce_scatter_tensor_coalesced_.default: "reduce_scatter",
    _eager.broadcast_.default: "broadcast",
    _eager.alltoall_base_.default: "all_to_all",
    _eager.alltoall_.default: "all_to_all",
    _eager.reduce_.default: "reduce",
    _eager.gather_.default: "gather",
    _eager.scatter_.default: "scatter",
}


class CommCounter(TorchDispatchMode):
    """Use as a context manager around the code to measure; read `by_kind()` after."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()
        # (kind, ranks of the group) -> count / bytes
        self.group_counts: Counter = Counter()
        self.group_bytes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            # Let DTensor decompose the op; its collectives come back here as plain ones.
            return NotImplemented
        out = func(*args, **kwargs)
        kind = collective_kind(func)
        if kind is not None:
            nbytes = _sent(func, args) if kind == "all_to_all" else (
                max(_nbytes(args[0]), _nbytes(out)) if func in _KINDS
                else max(_total(args[0]), _total(args[1])))
            ranks = _group_ranks(func, args)
            self.counts[kind] += 1
            self.bytes[kind] += nbytes
            self.group_counts[kind, ranks] += 1
            self.group_bytes[kind, ranks] += nbytes
        return out

    def by_kind(self) -> dict[str, dict[str, int]]:
        return {k: {"count": self.counts[k], "bytes": self.bytes[k]} for k in sorted(self.counts)}

    def by_group(self) -> list[dict]:
        """Per kind and process group (its global ranks; None where it could not be read):
        count and bytes, sorted by kind then ranks. Tells a tensor-parallel all-reduce from a
        data-parallel one."""
        keys = sorted(self.group_counts, key=lambda k: (k[0], k[1] or ()))
        return [
            {"kind": kind, "ranks": list(ranks) if ranks is not None else None,
             "count": self.group_counts[kind, ranks], "bytes": self.group_bytes[kind, ranks]}
            for kind, ranks in keys
        ]


def add_counts(tables: Iterable[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """`CommCounter.by_kind` tables (one per step, say) summed kind by kind, sorted by kind."""
    total: dict[str, dict[str, int]] = {}
    for table in tables:
        for kind, c in table.items():
            entry = total.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += c["count"]
            entry["bytes"] += c["bytes"]
    return dict(sorted(total.items()))


def collective_kind(func) -> str | None:
    """The kind of collective an op is ("all_reduce", "send", ...), or None."""
    return _KINDS.get(func) or _EAGER_KINDS.get(func)


def process_group(func, args: tuple) -> dist.ProcessGroup | None:
    """The process group a collective op runs on: a functional collective's last
    argument names it, an eager c10d op's first ScriptObject argument is it (boxed);
    None where it cannot be read."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        if func in _KINDS:
            name = args[-1] if args else None
            return _resolve_process_group(name) if isinstance(name, str) else None
        for value in args[1:]:
            if isinstance(value, torch.ScriptObject):
                return dist.ProcessGroup.unbox(value)
    except (RuntimeError, ValueError):
        return None
    return None


def _group_ranks(func, args: tuple) -> tuple[int, ...] | None:
    group = process_group(func, args)
    try:
        return None if group is None else tuple(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError):
        return None


def _sent(func, args: tuple) -> int:
    """Bytes an all-to-all sends: the functional op's input (its first argument), the
    eager ops' input buffers (their second: they take (output, input))."""
    return _nbytes(args[0]) if func in _KINDS else _total(args[1])


def _total(value: object) -> int:
    """Bytes of every tensor in `value` (a tensor or nested lists of them)."""
    if isinstance(value, (list, tuple)):
        return sum(_total(v) for v in value)
    return _nbytes(value)


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0
