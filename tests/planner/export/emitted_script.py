"""Emitted Python scripts, imported and built as their users' torchrun would: the module
from its text, and rank 0's `build` on a fake process group of the plan's size."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


def imported(text: str, tmp_path: Path, name: str, file: str = "pytorch_train.py") -> Any:
    """The script `text` (checked to parse), written to `tmp_path` and imported as
    ``emitted_<name>``."""
    ast.parse(text)
    path = tmp_path / file
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"emitted_{name}", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def built_on_rank_0(script: Any, world_size: int) -> Any:
    """What the script's ``build("cpu")`` returns on rank 0 of a fake process group of
    `world_size` ranks (skipped where a real group is running in this process)."""
    if dist.is_initialized():
        if dist.get_backend() != "fake":
            pytest.skip("a real process group is running in this test process")
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        return script.build("cpu")
    finally:
        dist.destroy_process_group()
