"""A rank that dies or hangs: every other rank stops within a bounded time and says which
rank it lost and where the job can resume.

Bounded: gloo sees a dead peer's connection close within a second, but a peer that hangs
alive is only seen at the process group's timeout, and torch gives every subgroup (a
DeviceMesh axis, a `new_group`) 30 minutes whatever the default group was given (trap 3
of the gloo notes). `bound_timeouts` gives a rank's subgroups the default group's timeout.

Named: `FaultWatch` learns every rank's host and process id once (one all-gather of two
integers). When a step fails it looks at which peers on this host are gone (no process,
or a zombie its launcher has not reaped yet) and raises `PeerLost`: one line naming them,
the step, and the last complete checkpoint (as its caller describes it). When every peer
is alive (a hang) the ranks' flight records name the one that never entered a collective
(`runtime.flight_recorder`), whether this rank timed out or saw a connection close (a
peer's own timeout closes its connections). A peer on another host cannot be looked at
from here; then the message says so. An error that is no fault (every peer alive, no
timeout, no hang recorded) is raised unchanged.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["LAST_GOOD", "FaultWatch", "PeerLost", "bound_timeouts", "collective_timeout"]

LAST_GOOD = "; last good checkpoint: "
"""How a fault's one line ends, before the checkpoint the job can resume from."""

# How long a rank that saw a collective fail looks for the peer that caused it: a peer
# that raised first is still exiting when its closed connection is seen.
LOOK_FOR_LOST_PEER_S = 2.0
_TIMEOUT_WORDS = ("timed out", "timeout")
# Words of an error that may come from a lost peer (gloo's, or the agent's SIGTERM).
_COMMUNICATION_WORDS = (*_TIMEOUT_WORDS, "connection", "broken pipe", "peer", "gloo", "signal")


class PeerLost(RuntimeError):
    """A step failed because a peer died or stopped answering; the message is one line.
    `lost`: the peers seen gone; `hung`: those alive that never entered the collective
    this rank waited in (`runtime.flight_recorder`); `step`: the step that failed."""

    def __init__(self, message: str, lost: list[int], hung: list[int] | None = None,
                 step: int | None = None) -> None:
        super().__init__(message)
        self.lost, self.hung, self.step = lost, hung or [], step


def collective_timeout() -> timedelta | None:
    """The default process group's timeout (what `init_process_group` was given); None
    for a backend that keeps none (the fake one planning uses), or without a group."""
    group = dist.group.WORLD
    if group is None:
        return None
    for device in group._device_types:
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def bound_timeouts(groups: Iterable[dist.ProcessGroup | None]) -> None:
    """Give each of `groups` this rank is in the default group's timeout (gloo and NCCL
    groups; torch's private `_set_pg_timeout`, torch 2.13)."""
    timeout = collective_timeout()
    if timeout is None:
        return
    for group in groups:
        if group is not None and dist.get_rank(group) >= 0:
            dist.distributed_c10d._set_pg_timeout(timeout, group)


def _is_gone(pid: int) -> bool:
    """No process `pid` on this host, or only its zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (not Linux): ask the kernel
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]  # after "(command name)"
    return state in ("Z", "X")


def _host_id() -> int:
    return zlib.crc32(socket.gethostname().encode())


class FaultWatch:
    """This rank's record of its peers' processes, to name the one a failed step lost."""

    def __init__(
        self, rank: int, peers: dict[int, tuple[int, int]],
        last_checkpoint: Callable[[], str] | None = None,
    ) -> None:
        """`peers`: every rank's (host id, process id); `last_checkpoint()`: the newest
        complete checkpoint, as a message names it (None: the run does not checkpoint)."""
        self.rank, self.peers = rank, peers
        self.host = peers[rank][0]
        self.last_checkpoint = last_checkpoint or (lambda: "none (not checkpointing)")
        self.look_s = LOOK_FOR_LOST_PEER_S

    @classmethod
    def gather(cls, last_checkpoint: Callable[[], str] | None = None) -> FaultWatch:
        """Every rank's host and process id, from all ranks (collective: each, once)."""
        mine = torch.tensor([_host_id(), os.getpid()], dtype=torch.int64)
        table = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(table, mine)
        peers = {r: (int(t[0]), int(t[1])) for r, t in enumerate(table)}
        return cls(dist.get_rank(), peers, last_checkpoint)

    def lost_peers(self, look_s: float) -> tuple[list[int], bool]:
        """Peers whose process is gone, looked for up to `look_s` seconds; and whether every
        peer could be looked at (all on this host)."""
        local = {r: pid for r, (host, pid) in self.peers.items()
                 if host == self.host and r != self.rank}
        deadline = time.monotonic() + look_s
        while True:
            lost = sorted(r for r, pid in local.items() if _is_gone(pid))
            if lost or time.monotonic() >= deadline:
                return lost, len(local) == len(self.peers) - 1
            time.sleep(0.05)

    def explain(self, error: BaseException, step: int) -> BaseException:
        """`PeerLost` when `error` came from a lost or silent peer, else `error` itself."""
        # torch's pipeline stages wrap a collective's error ("failed to run forward"):
        # read the causes too.
        text = " ".join(str(e) for e in _chain(error)).lower()
        # Only an error that may be a peer's is worth waiting for the peer to be seen gone.
        suspect = any(isinstance(e, dist.DistError) for e in _chain(error)) or any(
            word in f"{type(error).__name__.lower()} {text}" for word in _COMMUNICATION_WORDS)
        lost, all_seen = self.lost_peers(self.look_s if suspect else 0.0)
        where = f"in step {step}{LAST_GOOD}{self.last_checkpoint()}"
        timed_out = any(word in text for word in _TIMEOUT_WORDS)
        # Every peer alive: the flight records say which one hangs. A peer's own timeout
        # closes its connections, so this rank may see a closed connection rather than a
        # timeout, before any process is gone.
        named = _hung_peers() if suspect and all_seen and not lost else None
        if named is not None and (timed_out or named[1]):
            line, hung = named
            timeout = collective_timeout()
            within = f" within {timeout.total_seconds():g} s" if timeout else ""
            seen = f"timed out{within}" if timed_out else "lost its connection to a peer"
            message = f"rank {self.rank} {seen}: {line}{LAST_GOOD}{self.last_checkpoint()}"
            _say(message)
            return PeerLost(message, [], hung, step)
        if lost:
            names = ", ".join(f"{r} (process {self.peers[r][1]} is gone)" for r in lost)
            plural = "s" if len(lost) > 1 else ""
            message = f"rank {self.rank} lost rank{plural} {names} {where}"
        elif timed_out:
            timeout = collective_timeout()
            within = f" within {timeout.total_seconds():g} s" if timeout else ""
            who = ("every peer's process is alive: one hangs" if all_seen
                   else "a peer on another host hangs or is lost")
            message = f"rank {self.rank}: a peer did not answer{within} ({who}) {where}"
        elif suspect and not all_seen:
            said = " ".join(str(error).split())[:120]
            message = (f"rank {self.rank} lost a peer on another host (which one cannot be "
                       f"seen from here; {said}) {where}")
        else:
            return error
        _say(message)
        return PeerLost(message, lost, step=step)

    @contextmanager
    def step(self, index: int) -> Iterator[None]:
        """Run step `index`; a failure caused by a lost peer is raised as `PeerLost`."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 - re-raised, explained when it is a fault
            explained = self.explain(error, index)
            if explained is error:
                raise
            raise explained from error


def _hung_peers() -> tuple[str, list[int]] | None:
    """What the ranks' flight records (`runtime.flight_recorder`, in the launcher's
    folder) say of a hang: one line and the ranks that never entered the collective the
    others wait in; None without records. Read a moment after the timeout, so that the
    waiting peers' entries are all written."""
    from runtime.flight_recorder import FLIGHT_DIR_ENV, diagnose, read_records

    folder = os.environ.get(FLIGHT_DIR_ENV)
    if not folder:
        return None
    return diagnose(read_records(folder, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from, outermost first."""
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


LAUNCHER_REPORTS_ENV = "TESSEL_LAUNCHER_REPORTS"
"""Set by `runtime.elastic.launch`, which reports the root cause of a failed run itself."""


def _say(message: str) -> None:
    """A rank's own line on a fault: torchrun's log shows every rank's; under Tessel's
    launcher, which names the root cause in one line, the ranks keep quiet."""
    if not os.environ.get(LAUNCHER_REPORTS_ENV):
        print(message, file=sys.stderr, flush=True)
