"""The flight record of collectives, read without processes: which rank a hang waits for."""

from __future__ import annotations

import time

import torch

from runtime.flight_recorder import diagnose


def _enter(group: str, seq: int, ranks: list[int], kind: str = "all_reduce", step: int = 2):
    return {"group": group, "ranks": ranks, "seq": seq, "kind": kind, "step": step}


def test_the_rank_that_never_entered_the_collective_is_named() -> None:
    tp = [0, 1, 2, 3]
    records = {r: [_enter("1", 1, tp, step=1), _enter("1", 2, tp)] for r in (0, 1, 3)}
    records[2] = [_enter("1", 1, tp, step=1)]  # stalled before its second
    line, blamed = diagnose(records)
    assert blamed == [2]
    assert line == ("rank 2 never entered all_reduce #2 on ranks 0-3 (step 2), in which "
                    "ranks 0, 1, 3 waited")


def test_a_rank_stuck_outside_collectives_is_named_though_its_peers_wait_in_receives(
) -> None:
    """pp2 x dp2 (pipeline pairs 0-2 and 1-3, data pairs 0-1 and 2-3), rank 2 stalled as
    step 1 began: rank 3 entered its data pair's all-gathers (FSDP's, asynchronous) and
    waits in a receive from rank 1, which waits on rank 3; rank 0 waits in a receive from
    rank 2. The receives' sequence numbers say nothing; rank 2, in no collective, is the
    one that never entered what a peer did."""
    records = {
        0: [_enter("13", 1, [0, 2], step=0), *(_enter("3", s, [0, 1], "all_gather", 1)
                                              for s in (7, 8, 9)),
            *(_enter("1", s, [0, 2], k, 1) for s, k in ((19, "send"), (20, "recv")))],
        1: [_enter("14", 1, [1, 3], step=0), *(_enter("3", s, [0, 1], "all_gather", 1)
                                              for s in (7, 8, 9)),
            *(_enter("2", s, [1, 3], k, 1) for s, k in ((19, "send"), (20, "recv")))],
        2: [_enter("1", 18, [0, 2], "send", 0), _enter("4", 6, [2, 3], "reduce_scatter", 0),
            _enter("13", 1, [0, 2], step=0)],
        3: [_enter("4", 6, [2, 3], "reduce_scatter", 0), _enter("14", 1, [1, 3], step=0),
            *(_enter("4", s, [2, 3], "all_gather", 1) for s in (7, 8, 9)),
            _enter("2", 19, [1, 3], "recv", 1)],
    }
    assert diagnose(records) == (
        "rank 2 never entered all_gather #7 on ranks 2, 3 (step 1), in which rank 3 waited",
        [2])


def test_of_the_collectives_a_stuck_rank_never_entered_the_first_a_peer_entered_is_named(
) -> None:
    """tp2 x dp2 (tensor pairs 0-1 and 2-3, data pairs 0-2 and 1-3), rank 2 stalled: rank
    0 waits in their data pair's all-gather, rank 3 later in their tensor pair's
    all-reduce; the first is the one rank 2 failed to join."""
    records = {0: [_enter("dp0", 21, [0, 2], "all_gather") | {"time": 10.0}],
               1: [_enter("dp1", 21, [1, 3], "all_gather") | {"time": 10.0},
                   {"group": "dp1", "seq": 21, "left": True}],
               2: [_enter("tp1", 38, [2, 3]) | {"step": 1, "time": 9.0}],
               3: [_enter("dp1", 21, [1, 3], "all_gather") | {"time": 10.0},
                   {"group": "dp1", "seq": 21, "left": True},
                   _enter("tp1", 39, [2, 3]) | {"time": 10.5}]}
    assert diagnose(records) == (
        "rank 2 never entered all_gather #21 on ranks 0, 2 (step 2), in which rank 0 waited",
        [2])


def test_a_collective_every_member_entered_and_none_left_is_said_so() -> None:
    records = {r: [_enter("7", 4, [0, 1], kind="all_gather")] for r in (0, 1)}
    assert diagnose(records) == (
        "every rank of all_gather #4 on ranks 0, 1 (step 2) entered it and none left it", [])


def test_a_functional_collective_that_was_waited_on_is_left() -> None:
    records = {0: [_enter("1", 1, [0, 1]), {"group": "1", "seq": 1, "left": True}],
               1: [_enter("1", 1, [0, 1]), {"group": "1", "seq": 1, "left": True}]}
    assert diagnose(records) is None
    assert diagnose({}) is None


def test_the_recorder_sees_a_functional_collective_enter_and_leave(tmp_path, fake_world) -> None:
    import torch.distributed as dist

    from runtime.flight_recorder import FlightRecorder, read_records

    fake_world(0, 2)
    with FlightRecorder(dist.get_rank(), tmp_path) as recorder:
        recorder.step = 5
        out = torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum",
                                                    dist.group.WORLD.group_name)
        torch.ops._c10d_functional.wait_tensor(out)
    recorder.close()
    entries = read_records(tmp_path)[dist.get_rank()]
    assert abs(entries[0]["time"] - time.time()) < 60
    assert entries[0] | {"ranks": None, "time": None} == {
        "group": dist.group.WORLD.group_name, "ranks": None, "seq": 1, "kind": "all_reduce",
        "step": 5, "time": None}
    assert entries[1] == {"group": dist.group.WORLD.group_name, "seq": 1, "left": True}
