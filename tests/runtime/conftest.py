"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


@pytest.fixture
def fake_world():
    """`start(rank, world_size)` joins a fake process group (no processes, collectives do
    nothing) as that rank; it is destroyed after the test."""

    def start(rank: int, world_size: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()
