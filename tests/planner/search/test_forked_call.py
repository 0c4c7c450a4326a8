"""planner.search.forked_call: half of the auto search in a forked child gives the answer
the search gives in one process, and a failure in the child reaches the caller."""

from __future__ import annotations

import os

import pytest

from planner.cluster import Cluster
from planner.models.presets import get_preset
from planner.search import forked_call, search
from planner.search.forked_call import start_forked


def _fails(message: str) -> None:
    raise ValueError(message)


def test_the_childs_answer_and_its_error_reach_the_caller() -> None:
    pid = start_forked(os.getpid)()
    assert pid != os.getpid()
    wait = start_forked(_fails, "--tensor-model-parallel-size 3 does not divide 16 heads")
    with pytest.raises(ValueError, match="does not divide 16 heads"):
        wait()


def test_the_auto_search_forked_ranks_as_in_one_process(monkeypatch) -> None:
    model, cluster = get_preset("gpt3-1.3b"), Cluster.load("dgx-a100-80g").with_devices(64)
    forked = search(model, cluster, 512, {}, "auto")
    monkeypatch.setattr(forked_call.os, "cpu_count", lambda: 1)
    alone = search(model, cluster, 512, {}, "auto")
    assert forked.evaluated == alone.evaluated
    assert [(c, p.step_time_s) for c, p in forked.ranked] == [
        (c, p.step_time_s) for c, p in alone.ranked]
