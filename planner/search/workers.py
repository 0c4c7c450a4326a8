"""Forked worker processes for independent ILPs (Alpa compiles stages in parallel workers).

Workers are forked, so they share the parent's traced programs copy-on-write (fx graphs do
not pickle), and each runs torch single-threaded: a child that starts an OpenMP parallel
region after its parent ran one (a matmul in MKL) waits forever on the parent's thread
team, which did not survive the fork.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
import signal

import torch


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def forked_pool(processes: int) -> multiprocessing.pool.Pool:
    # Python's advice for a fork without exec: what the workers inherit is frozen out of
    # their garbage collections. Otherwise each collection in a worker walks the parent's
    # whole heap (torch, the traced graphs): a third of a layer ILP's time, and every page
    # it touches is copied. The caller's own collections are left as they were.
    gc.freeze()
    try:
        return multiprocessing.get_context("fork").Pool(processes, initializer=_worker_start)
    finally:
        gc.unfreeze()


def _worker_start() -> None:
    torch.set_num_threads(1)
    # A parent that ran torch's elastic agent left its SIGTERM handler installed; under it
    # a worker waiting for tasks survives the pool's terminate(), and the parent then waits
    # on it forever (seen as a hung test suite). Workers end as SIGTERM ends a process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
