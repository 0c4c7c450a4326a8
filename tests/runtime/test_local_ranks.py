"""runtime.local_ranks.run_on_ranks: a function on N forked gloo ranks, results in rank order,
failures re-raised in the parent as one line naming the rank and the original error (the
traceback kept beside it), a rank that dies or hangs reported within seconds instead of
waited on forever, and nothing the ranks open listening beyond loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from passes.dtensor_rules import fake_mesh
from runtime.local_ranks import RankError, run_on_ranks


@contextlib.contextmanager
def within(seconds: int):
    """Fail (rather than block) if the body takes longer than `seconds`; an alarm set by
    an outer timeout (pytest-timeout's signal method) is re-armed afterwards."""

    def expire(signum, frame):
        raise TimeoutError(f"run_on_ranks still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    outer = signal.alarm(seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.alarm(max(1, outer - int(time.monotonic() - start)))


def _describe(rank: int, world_size: int, scale: float):
    value = torch.full((3,), float(rank))
    dist.all_reduce(value)  # a real collective over the group the rank was started in
    return {
        "rank": rank,
        "world": (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
        "tensors": [torch.arange(4) * rank, value * scale],
        "threads": torch.get_num_threads(),
    }


def test_results_come_back_in_rank_order_with_tensors_intact() -> None:
    results = run_on_ranks(_describe, 3, 2.0)
    assert [r["rank"] for r in results] == [0, 1, 2]
    for rank, result in enumerate(results):
        assert result["world"] == (rank, 3, "gloo")
        ids, summed = result["tensors"]
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
        torch.testing.assert_close(ids, torch.arange(4) * rank)
        torch.testing.assert_close(summed, torch.full((3,), (0.0 + 1.0 + 2.0) * 2.0))
        assert result["threads"] == 1


def _fail_on_rank_1(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("shape mismatch in stage 3")
    return rank


def test_an_exception_in_one_rank_is_raised_in_the_parent() -> None:
    with pytest.raises(RuntimeError) as info:
        run_on_ranks(_fail_on_rank_1, 2)
    message = str(info.value)
    assert "rank 1 failed" in message
    assert "ValueError: shape mismatch in stage 3" in message
    assert "\n" not in message
    assert "_fail_on_rank_1" in info.value.rank_traceback  # the rank's traceback comes along


def _fail_everywhere(rank: int, world_size: int):
    raise KeyError(f"missing on {rank}")


def test_when_every_rank_fails_the_lowest_rank_is_reported() -> None:
    with pytest.raises(RuntimeError, match=r"rank 0 failed(.|\n)*missing on 0"):
        run_on_ranks(_fail_everywhere, 2)


def _world(rank: int, world_size: int):
    return dist.get_backend(), dist.get_world_size()


def test_a_fake_planning_group_in_the_parent_does_not_leak_into_the_ranks() -> None:
    fake_mesh((4,))
    try:
        assert run_on_ranks(_world, 2) == [("gloo", 2), ("gloo", 2)]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _divide_by_zero_on_rank_1(rank: int, world_size: int):
    return 1 / (rank - 1)


def test_a_rank_error_is_one_line_with_the_traceback_kept_aside() -> None:
    with pytest.raises(RankError) as info:
        run_on_ranks(_divide_by_zero_on_rank_1, 2)
    assert str(info.value) == "rank 1 failed: ZeroDivisionError: division by zero"
    assert info.value.rank == 1
    assert "Traceback" in info.value.rank_traceback
    assert "_divide_by_zero_on_rank_1" in info.value.rank_traceback


def _exit_silently_on_rank_1(rank: int, world_size: int):
    if rank == 1:
        os._exit(3)
    dist.barrier()  # waits on the rank that is gone
    return rank


def _kill_rank_1_while_rank_0_hangs(rank: int, world_size: int):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # alive, never reports: must be stopped, not waited on


@pytest.mark.parametrize(
    ("fn", "expected", "exitcode"),
    [
        (_exit_silently_on_rank_1, "rank 1 exited with code 3 before reporting a result", 3),
        (_kill_rank_1_while_rank_0_hangs,
         "rank 1 was killed by signal SIGKILL before reporting a result", -signal.SIGKILL),
    ],
    ids=["os-exit", "sigkill"],
)
def test_a_rank_that_dies_without_reporting_is_named_within_seconds(
    fn, expected: str, exitcode: int
) -> None:
    start = time.monotonic()
    with within(60), pytest.raises(RankError) as info:
        run_on_ranks(fn, 2)
    assert str(info.value) == expected
    assert (info.value.rank, info.value.exitcode) == (1, exitcode)
    assert time.monotonic() - start < 30


def _hang(rank: int, world_size: int):
    time.sleep(600)


def test_ranks_that_run_past_the_timeout_are_stopped() -> None:
    start = time.monotonic()
    with within(60), pytest.raises(RankError, match=r"^ranks 0, 1 did not finish within 2 s"):
        run_on_ranks(_hang, 2, timeout_s=2)
    assert time.monotonic() - start < 20


def _rank_0_waits_on_a_sleeping_rank_1(rank: int, world_size: int):
    if rank == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


def test_a_collective_waiting_on_a_hung_peer_times_out() -> None:
    """init_process_group gets a bounded timeout (torch's default is 30 minutes)."""
    start = time.monotonic()
    with within(60), pytest.raises(RankError, match=r"^rank 0 failed: ") as info:
        run_on_ranks(_rank_0_waits_on_a_sleeping_rank_1, 2, collective_timeout_s=2)
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 30


def _listening_addresses(rank: int, world_size: int) -> list[str]:
    """Local addresses of this process's listening TCP sockets, after a collective."""
    dist.all_reduce(torch.ones(2))
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    addresses = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/self/net/{table}") as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    addresses.append(_address(local.split(":")[0]))
    return addresses


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6} writes addresses as 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(ordered))


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.skipif(not os.path.exists("/proc/self/net/tcp"), reason="needs Linux /proc")
def test_nothing_a_local_run_opens_listens_beyond_loopback() -> None:
    """No rendezvous store on 0.0.0.0 / :: (the FileStore opens no socket), and gloo's
    own listeners bound to 127.0.0.1 rather than the hostname's address."""
    with within(60):
        per_rank = run_on_ranks(_listening_addresses, 2)
    for rank, addresses in enumerate(per_rank):
        assert addresses, f"rank {rank}: gloo's listener not found; the parser is broken"
        assert all(_is_loopback(a) for a in addresses), f"rank {rank} listens on {addresses}"
