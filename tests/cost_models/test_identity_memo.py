"""The memo a search's pricing keys by objects' identities."""

from __future__ import annotations

from cost_models.identity_memo import IdentityMemo


def test_an_answer_is_computed_once_per_objects_and_values() -> None:
    memo: IdentityMemo[int] = IdentityMemo(limit=10)
    calls = []
    model, other = object(), object()

    def answer(value: int) -> int:
        calls.append(value)
        return value * 2

    assert memo.get((model,), (1,), lambda: answer(1)) == 2
    assert memo.get((model,), (1,), lambda: answer(1)) == 2
    assert memo.get((model,), (2,), lambda: answer(2)) == 4
    assert memo.get((other,), (1,), lambda: answer(1)) == 2  # another object: asked again
    assert calls == [1, 2, 1]


def test_it_holds_its_objects_and_is_cleared_past_its_limit() -> None:
    memo: IdentityMemo[str] = IdentityMemo(limit=2)
    kept = [object() for _ in range(3)]
    for i, obj in enumerate(kept):
        memo.get((obj,), (), lambda i=i: f"#{i}")
    # The third entry cleared the first two: asked again, the first is computed anew.
    assert memo.get((kept[0],), (), lambda: "again") == "again"
    assert memo.get((kept[2],), (), lambda: "not again") == "#2"
