"""Forked worker processes for independent ILPs (Alpa compiles stages in parallel workers).

Workers are forked, so they share the parent's traced programs copy-on-write (fx graphs do
not pickle), and each runs torch single-threaded: a child that starts an OpenMP parallel
region after its parent ran one (a matmul in MKL) waits forever on the parent's thread
team, which did not survive the fork.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool

import torch


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def forked_pool(processes: int) -> multiprocessing.pool.Pool:
    return multiprocessing.get_context("fork").Pool(processes, initializer=_single_threaded)


def _single_threaded() -> None:
    torch.set_num_threads(1)
