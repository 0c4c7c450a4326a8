"""Count the collectives a rank actually issues, by kind, with their payload bytes.

A TorchDispatchMode that sees every `_c10d_functional` collective DTensor (or Tessel's
gradient buckets) dispatch. Bytes follow the plan's convention: the larger of the
collective's local input and output buffers, so they compare one to one with
`Plan.communication`.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_c10d = torch.ops._c10d_functional

# op -> (kind, how many times the input's bytes the larger buffer holds: a group size)
_KINDS = {
    _c10d.all_reduce.default: "all_reduce",
    _c10d.all_reduce_.default: "all_reduce",
    _c10d.all_gather_into_tensor.default: "all_gather",
    _c10d.reduce_scatter_tensor.default: "reduce_scatter",
    _c10d.all_to_all_single.default: "all_to_all",
}


class CommCounter(TorchDispatchMode):
    """Use as a context manager around the code to measure; read `by_kind()` after."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = _KINDS.get(func)
        if kind is not None:
            nbytes = max(_nbytes(args[0]), _nbytes(out))
            self.counts[kind] += 1
            self.bytes[kind] += nbytes
        return out

    def by_kind(self) -> dict[str, dict[str, int]]:
        return {k: {"count": self.counts[k], "bytes": self.bytes[k]} for k in sorted(self.counts)}


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0
