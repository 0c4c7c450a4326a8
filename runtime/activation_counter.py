"""Bytes each pipeline stage saves for backward, per micro-batch, as autograd holds them:
what `plan check` compares with the Plan's `Stage.saved_activation_bytes`.

`torch.autograd.graph.saved_tensors_hooks` is entered around each stage module's forward
(a forward pre-hook, before any other, and a forward hook that always runs) and around
the loss the schedule computes on the last stage's output. Its pack hook sees every tensor
an autograd op saves, at the level autograd records it: a DTensor (counted by its local
tensor), an async collective's result (by the tensor it wraps), or a view. The count is
per storage (its data pointer), over the bytes the saved views of it span: views of one
tensor (q as SDPA and the rotation save it, a linear's flattened input) count once, and
a micro-batch that is a slice of the local batch counts its own rows, not the batch.
Parameters and views of them (a linear's transposed weight, the tied head) are not
activations and are left out.

Recomputation needs nothing of its own: torch's non-reentrant checkpoint saves its inputs
(`_NoopSaveInputs`) before it enters its hooks, so they are seen here, and what the
checkpointed region would save is hidden behind the checkpoint's own hooks, as it is not
kept.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor

Spans = dict[int, tuple[int, int]]
"""Storage data pointer -> [first, last) byte of it that saved tensors span."""


class ActivationCounter:
    """Counts, per stage index, the bytes each forward (one micro-batch) saves for
    backward. `watch` each stage module, wrap the loss with `counting_loss`, call
    `start_step` before a step and read `per_micro_batch` after it."""

    def __init__(self) -> None:
        self._spans: dict[int, list[Spans]] = {}
        self._active: list[Any] = []

    def watch(self, index: int, module: nn.Module) -> None:
        """Count what `module` (pipeline stage `index`) saves in each of its forwards."""

        def enter(module: nn.Module, args: Any) -> None:
            spans: Spans = {}
            self._spans.setdefault(index, []).append(spans)
            self._enter(spans, module)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            self._leave()

        # First among the pre-hooks and always closed, so that the hooks wrap everything
        # the module's call runs (the pipeline's gathers and scatters included).
        module.register_forward_pre_hook(enter, prepend=True)
        module.register_forward_hook(leave, always_call=True)

    def counting_loss(
        self, index: int, loss_fn: Callable[..., torch.Tensor]
    ) -> Callable[..., torch.Tensor]:
        """`loss_fn`, its saved tensors counted with stage `index`'s latest micro-batch
        (the schedule computes the loss right after that stage's forward)."""

        def loss(*args: Any, **kwargs: Any) -> torch.Tensor:
            runs = self._spans.get(index)
            if not runs:
                return loss_fn(*args, **kwargs)
            self._enter(runs[-1], None)
            try:
                return loss_fn(*args, **kwargs)
            finally:
                self._leave()

        return loss

    def start_step(self) -> None:
        """Forget the previous step's counts."""
        self._spans = {}

    def per_micro_batch(self) -> dict[int, list[int]]:
        """Stage index -> bytes saved by each micro-batch's forward, in the order they ran
        since `start_step`."""
        return {
            index: [sum(end - start for start, end in spans.values()) for spans in runs]
            for index, runs in sorted(self._spans.items())
        }

    def _enter(self, spans: Spans, module: nn.Module | None) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: _pack(t, spans, module), lambda t: t)
        hooks.__enter__()
        self._active.append(hooks)

    def _leave(self) -> None:
        self._active.pop().__exit__(None, None, None)


def _pack(saved: torch.Tensor, spans: Spans, module: nn.Module | None) -> torch.Tensor:
    t = _local(saved)
    if t.numel() == 0 or t.device.type == "meta":
        return saved
    pointer = t.untyped_storage().data_ptr()
    # The module's parameters as they are now: FSDP2 swaps gathered ones in during forward.
    if module is not None and pointer in _parameter_storages(module):
        return saved
    start, end = _span(t)
    if pointer in spans:
        first, last = spans[pointer]
        start, end = min(start, first), max(end, last)
    spans[pointer] = (start, end)
    return saved


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding `t`'s bytes on this rank."""
    while True:
        if isinstance(t, DTensor):
            t = t._local_tensor
        elif isinstance(t, AsyncCollectiveTensor):
            t = t.elem
        else:
            return t


def _parameter_storages(module: nn.Module) -> set[int]:
    return {_local(p).untyped_storage().data_ptr() for p in module.parameters()}


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte of its storage that a (possibly strided) view reads."""
    size = t.element_size()
    last = t.storage_offset() + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
    return t.storage_offset() * size, (last + 1) * size
