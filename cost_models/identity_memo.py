"""A bounded memo keyed by the identity of objects that are slow to hash.

A search prices thousands of layouts of one model on one cluster, and asks the same
questions of them (a layer's kernels, its saved bytes, a chunk's parameters). The model,
cluster and collectives are pydantic models or plain objects that are copied when they
change, never changed in place, and hashing them field by field each time would cost more
than the answers: so they key the memo by `id`, and the memo holds them, so that an id is
never reused by another object while its entry lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["IdentityMemo"]

T = TypeVar("T")


class IdentityMemo(Generic[T]):
    """Answers by (the identities of `objects`, hashable `values`); cleared whole when it
    holds more than `limit` (a search's working set fits; a long session's does not grow)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple, tuple[tuple[object, ...], T]] = {}

    def get(self, objects: tuple[object, ...], values: tuple[Hashable, ...],
            compute: Callable[[], T]) -> T:
        """The answer for `objects` and `values`: remembered, or `compute()`d and kept."""
        key = (tuple(map(id, objects)), values)
        found = self._entries.get(key)
        if found is not None and all(a is b for a, b in zip(found[0], objects)):
            return found[1]
        answer = compute()
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = (objects, answer)
        return answer

    def clear(self) -> None:
        self._entries.clear()
