"""planner.search.forked_call: half of the auto search in a forked child gives the answer
the search gives in one process, and a failure in the child reaches the caller."""

from __future__ import annotations

import os

import pytest

from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.search import forked_call, search
from planner.search.forked_call import BothEnds, start_forked


def _fails(message: str) -> None:
    raise ValueError(message)


def test_the_childs_answer_and_its_error_reach_the_caller() -> None:
    pid = start_forked(os.getpid)()
    assert pid != os.getpid()
    wait = start_forked(_fails, "--tensor-model-parallel-size 3 does not divide 16 heads")
    with pytest.raises(ValueError, match="does not divide 16 heads"):
        wait()


def _take_all(take) -> list[int]:
    taken = []
    while (index := take()) is not None:
        taken.append(index)
    return taken


def test_both_ends_hand_out_every_index_once_across_the_fork() -> None:
    queue = BothEnds(200)
    child = start_forked(_take_all, queue.back)
    mine = _take_all(queue.front)
    theirs = child()
    assert sorted(mine + theirs) == list(range(200))
    assert mine == sorted(mine) and theirs == sorted(theirs, reverse=True)
    assert queue.taken() == 200 and queue.front() is None and queue.back() is None


def test_the_auto_search_forked_ranks_as_in_one_process(monkeypatch) -> None:
    model, cluster = get_preset("gpt3-1.3b"), Cluster.load("dgx-a100-80g").with_devices(64)
    forked = search(model, cluster, 512, {}, "auto")
    monkeypatch.setattr(forked_call.os, "cpu_count", lambda: 1)
    alone = search(model, cluster, 512, {}, "auto")
    assert forked.evaluated == alone.evaluated
    assert [(c, p.step_time_s) for c, p in forked.ranked] == [
        (c, p.step_time_s) for c, p in alone.ranked]
