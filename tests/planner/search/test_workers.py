"""Forked ILP workers: what they inherit stays out of their garbage collections, and the
caller's collector is left as it was."""

from __future__ import annotations

import gc

import pytest

from planner.search.workers import can_fork, forked_pool


def _frozen_in_worker() -> int:
    return gc.get_freeze_count()


def test_a_worker_leaves_what_it_inherits_out_of_its_collections() -> None:
    if not can_fork():
        pytest.skip("this platform cannot fork")
    inherited = [[i] for i in range(1000)]  # objects a worker's collections would walk
    frozen_before = gc.get_freeze_count()
    with forked_pool(1) as pool:
        frozen_in_worker = pool.apply(_frozen_in_worker)
    assert frozen_in_worker >= len(inherited)
    assert gc.get_freeze_count() == frozen_before
