"""runtime.launch.run_on_ranks: a function on N forked gloo ranks, results in rank order,
failures re-raised in the parent with the rank and the original error."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from passes.dtensor_rules import fake_mesh
from runtime.launch import run_on_ranks


def _describe(rank: int, world_size: int, scale: float):
    value = torch.full((3,), float(rank))
    dist.all_reduce(value)  # a real collective over the group the rank was started in
    return {
        "rank": rank,
        "world": (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
        "tensors": [torch.arange(4) * rank, value * scale],
        "threads": torch.get_num_threads(),
    }


def test_results_come_back_in_rank_order_with_tensors_intact() -> None:
    results = run_on_ranks(_describe, 3, 2.0)
    assert [r["rank"] for r in results] == [0, 1, 2]
    for rank, result in enumerate(results):
        assert result["world"] == (rank, 3, "gloo")
        ids, summed = result["tensors"]
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
        torch.testing.assert_close(ids, torch.arange(4) * rank)
        torch.testing.assert_close(summed, torch.full((3,), (0.0 + 1.0 + 2.0) * 2.0))
        assert result["threads"] == 1


def _fail_on_rank_1(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("shape mismatch in stage 3")
    return rank


def test_an_exception_in_one_rank_is_raised_in_the_parent() -> None:
    with pytest.raises(RuntimeError) as info:
        run_on_ranks(_fail_on_rank_1, 2)
    message = str(info.value)
    assert "rank 1 failed" in message
    assert "ValueError: shape mismatch in stage 3" in message
    assert "_fail_on_rank_1" in message  # the rank's traceback comes along


def _fail_everywhere(rank: int, world_size: int):
    raise KeyError(f"missing on {rank}")


def test_when_every_rank_fails_the_lowest_rank_is_reported() -> None:
    with pytest.raises(RuntimeError, match=r"rank 0 failed(.|\n)*missing on 0"):
        run_on_ranks(_fail_everywhere, 2)


def _world(rank: int, world_size: int):
    return dist.get_backend(), dist.get_world_size()


def test_a_fake_planning_group_in_the_parent_does_not_leak_into_the_ranks() -> None:
    fake_mesh((4,))
    try:
        assert run_on_ranks(_world, 2) == [("gloo", 2), ("gloo", 2)]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
