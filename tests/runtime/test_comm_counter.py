"""runtime.comm_counter: the collectives a rank really issues on a gloo group, counted by
kind with the plan's byte convention (the larger of the local input and output)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from runtime.comm_counter import CommCounter, add_counts
from runtime.local_ranks import run_on_ranks


def _all_reduce_and_all_gather(rank: int, world_size: int):
    group = dist.group.WORLD
    x = torch.full((16,), float(rank + 1))
    with CommCounter() as counter:
        reduced = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
        gathered = funcol.wait_tensor(funcol.all_gather_tensor(x, 0, group))
        local = x * 2  # not a collective: not counted
    after = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))  # outside: not counted
    return counter.by_kind(), reduced, gathered, local, after


def test_all_reduce_and_all_gather_are_counted_with_their_bytes() -> None:
    results = run_on_ranks(_all_reduce_and_all_gather, 2)
    for rank, (counts, reduced, gathered, local, after) in enumerate(results):
        # 16 fp32 = 64 bytes; the gather's output holds both ranks' 16 floats: 128 bytes.
        assert counts == {
            "all_gather": {"count": 1, "bytes": 128},
            "all_reduce": {"count": 1, "bytes": 64},
        }, rank
        # Counting does not change what the collectives compute.
        torch.testing.assert_close(reduced, torch.full((16,), 3.0))
        expected = torch.cat([torch.full((16,), 1.0), torch.full((16,), 2.0)])
        torch.testing.assert_close(gathered, expected)
        torch.testing.assert_close(local, torch.full((16,), 2.0 * (rank + 1)))
        torch.testing.assert_close(after, torch.full((16,), 3.0))


def _reduce_scatter_twice(rank: int, world_size: int):
    group = dist.group.WORLD
    x = torch.arange(32, dtype=torch.float32) * (rank + 1)
    with CommCounter() as counter:
        first = funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "sum", 0, group))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "sum", 0, group))
    return counter.by_kind(), first


def test_repeated_reduce_scatters_add_up_by_their_input_bytes() -> None:
    results = run_on_ranks(_reduce_scatter_twice, 2)
    full = torch.arange(32, dtype=torch.float32) * 3
    for rank, (counts, first) in enumerate(results):
        # Input 32 fp32 = 128 bytes is the larger buffer; two calls.
        assert counts == {"reduce_scatter": {"count": 2, "bytes": 256}}
        torch.testing.assert_close(first, full[rank * 16 : (rank + 1) * 16])


def test_nothing_is_counted_without_collectives() -> None:
    with CommCounter() as counter:
        torch.ones(4) @ torch.ones(4)
    assert counter.by_kind() == {}


def test_tables_of_several_steps_add_up_kind_by_kind() -> None:
    steps = [{"send": {"count": 2, "bytes": 8}, "all_reduce": {"count": 1, "bytes": 64}},
             {"all_reduce": {"count": 3, "bytes": 192}}]
    total = add_counts(steps)
    assert total == {"all_reduce": {"count": 4, "bytes": 256}, "send": {"count": 2, "bytes": 8}}
    assert list(total) == ["all_reduce", "send"]  # sorted by kind
    assert add_counts([]) == {}
