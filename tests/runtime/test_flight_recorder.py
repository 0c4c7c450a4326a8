"""The flight record of collectives, read without processes: which rank a hang waits for."""

from __future__ import annotations

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
    assert entries[0] | {"ranks": None} == {"group": dist.group.WORLD.group_name,
                                            "ranks": None, "seq": 1,
                                            "kind": "all_reduce", "step": 5}
    assert entries[1] == {"group": dist.group.WORLD.group_name, "seq": 1, "left": True}
