"""Run a function on N local ranks joined by a gloo process group.

Ranks are forked, so they inherit what the parent already built (the traced program, the
plan, the initial state) instead of rebuilding it N times on a small machine. Results
come back through a queue; a rank's exception is re-raised in the parent with its
traceback text.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 600.0,
    backend: str = "gloo",
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank inside an initialized process group
    (gloo, or NCCL with rank r on GPU r: the parent must not have used CUDA before, since
    ranks are forked); returns the results in rank order."""
    if dist.is_initialized():
        # A fake group left by planning must not be inherited by the forked ranks.
        dist.destroy_process_group()
    context = mp.get_context("fork")
    queue = context.SimpleQueue()
    port = free_port()
    procs = [
        context.Process(
            target=_rank_main, args=(fn, rank, world_size, port, queue, args, backend)
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    for _ in procs:
        rank, ok, value = queue.get()
        if ok:
            results[rank] = _tree_map_tensors(value, torch.from_numpy, numpy_leaves=True)
        else:
            errors.append((rank, value))
    for p in procs:
        p.join(timeout=timeout_s)
    if errors:
        rank, text = sorted(errors)[0]
        raise RuntimeError(f"rank {rank} failed:\n{text}")
    return [results[r] for r in range(world_size)]


def _rank_main(fn, rank: int, world_size: int, port: int, queue, args, backend: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
    )
    # Each rank gets a share of this machine's cores; oversubscription makes gloo crawl.
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        try:
            result = fn(rank, world_size, *args)
            # Tensors travel as numpy arrays: torch's shared-memory handles die with the rank.
            queue.put((rank, True, _tree_map_tensors(result, lambda t: t.detach().numpy().copy())))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        queue.put((rank, False, traceback.format_exc()))


def _tree_map_tensors(value: Any, fn: Callable, numpy_leaves: bool = False) -> Any:
    import numpy as np

    leaf_type = np.ndarray if numpy_leaves else torch.Tensor
    return torch.utils._pytree.tree_map(
        lambda x: fn(x) if isinstance(x, leaf_type) else x, value
    )
