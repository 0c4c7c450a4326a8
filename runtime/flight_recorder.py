"""Which rank a hung collective waits for: each rank records the collectives it enters, and
a rank that times out reads every rank's record and names the ones that never entered
the collective it waited in.

torch's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``torch.distributed.flight_
recorder``) keeps such a ring per rank for NCCL and dumps it on a timeout; gloo has none.
`FlightRecorder` is a dispatch mode that sees every collective the rank issues (as
`runtime.comm_counter.CommCounter` does) and appends one line per collective to a file of
its own: the process group's name and ranks, the collective's sequence number on that
group (the n-th this rank entered there), its kind, the training step and the time.
Collectives on
one group are entered in the same order on each member, so the n-th on a group is the
same collective everywhere; a rank that is blocked makes no further entries, so its last
line is where it waits. A functional collective also records when its wait returned
(``left``); an eager one is known left when the rank enters the next.

`diagnose` reads the records of the ranks on this host and says, in one line, which
ranks never entered the collective others waited in. `--stall-rank`/`--stall-at-step`
(`Stall`) make a rank sleep as it enters its first collective of a step, for tests.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from runtime.comm_counter import collective_kind, process_group

__all__ = ["FLIGHT_DIR_ENV", "FlightRecorder", "Stall", "diagnose", "read_records"]

FLIGHT_DIR_ENV = "TESSEL_FLIGHT_DIR"
"""The folder each rank's record goes to (set by `runtime.elastic.launch`)."""

_WAIT = torch.ops._c10d_functional.wait_tensor.default


@dataclass(frozen=True)
class Stall:
    """An injected hang: rank `rank` sleeps for `seconds` as it enters its first
    collective of step `step` (first attempt only), before it is recorded."""

    rank: int
    step: int
    seconds: float = 3600.0


class FlightRecorder(TorchDispatchMode):
    """This rank's record of the collectives it entered; `step` is set by the loop."""

    def __init__(self, rank: int, folder: str | Path | None = None,
                 stall: Stall | None = None) -> None:
        super().__init__()
        self.rank, self.stall, self.step = rank, stall, 0
        self.sequence: dict[str, int] = {}
        self._pending: dict[int, tuple[str, int]] = {}  # output id -> (group, sequence)
        folder = folder if folder is not None else os.environ.get(FLIGHT_DIR_ENV)
        self._file: TextIO | None = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            # Line-buffered: a rank blocked in a collective has written its entry.
            self._file = open(Path(folder) / f"rank{rank}.attempt{attempt}.jsonl", "w",  # noqa: SIM115
                              buffering=1)

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor's collectives come back here as plain ones
        if func is _WAIT:
            out = func(*args, **kwargs)
            entered = self._pending.pop(id(args[0]), None)
            if entered is not None:
                self._write({"group": entered[0], "seq": entered[1], "left": True})
            return out
        kind = collective_kind(func)
        if kind is None:
            return func(*args, **kwargs)
        group, ranks = _group(func, args)
        self._maybe_stall()
        seq = self.sequence[group] = self.sequence.get(group, 0) + 1
        self._write({"group": group, "ranks": ranks, "seq": seq, "kind": kind,
                     "step": self.step, "time": time.time()})
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):  # a functional collective: waited on later
            self._pending[id(out)] = (group, seq)
        return out

    def _maybe_stall(self) -> None:
        stall = self.stall
        if stall is None or (self.rank, self.step) != (stall.rank, stall.step) or \
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        self.stall = None  # once
        time.sleep(stall.seconds)  # its peers time out and name this rank

    def _write(self, entry: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(entry) + "\n")


def _group(func, args: tuple) -> tuple[str, list[int] | None]:
    """(name, global ranks) of the process group a collective runs on."""
    group = process_group(func, args)
    if group is None:
        return "?", None
    return group.group_name, list(dist.get_process_group_ranks(group))


def read_records(folder: str | Path, attempt: int | str = 0) -> dict[int, list[dict]]:
    """Every rank's entries of attempt `attempt` in `folder`, by rank."""
    records = {}
    for path in Path(folder).glob(f"rank*.attempt{attempt}.jsonl"):
        rank = int(path.name.removeprefix("rank").split(".")[0])
        entries = []
        for line in path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short where the rank was stopped
        records[rank] = entries
    return records


def _span(ranks: list[int]) -> str:
    """Ranks as people write them: "0-3", or "0, 2, 5"."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


# Point-to-point kinds: a pipeline's batched sends and receives are entered in another
# order on each side, so their sequence numbers on a pair's group do not pair up.
_POINT_TO_POINT = frozenset({"send", "recv"})


def diagnose(records: dict[int, list[dict]]) -> tuple[str, list[int]] | None:
    """(one line, the ranks blamed) for a hang seen in `records`, or None when no rank
    waits in a collective.

    A rank is blamed when it never entered a collective a peer entered while it waits in
    none itself (its last collective was left, or every member of it entered it): it is
    stuck outside communication, and its peers wait for it, directly or through a third
    rank (a pipeline's receive waits on a stage that waits on the stuck rank). Of several
    such collectives, the one the most ranks wait in is named, then the one a peer entered
    first (the first the stuck rank failed to join). Without one: the collective the most
    ranks wait in, and the members that never entered it; or that every member entered it
    and none came out."""
    entered: dict[int, dict[str, int]] = {}
    waiting: dict[int, dict] = {}
    for rank, entries in records.items():
        counts = entered.setdefault(rank, {})
        left = {(e["group"], e["seq"]) for e in entries if e.get("left")}
        starts = [e for e in entries if not e.get("left")]
        for e in starts:
            counts[e["group"]] = max(counts.get(e["group"], 0), e["seq"])
        if starts and (starts[-1]["group"], starts[-1]["seq"]) not in left:
            waiting[rank] = starts[-1]
    if not waiting:
        return None

    def missing(e: dict) -> list[int]:
        members = e.get("ranks") or sorted(records)
        return sorted(r for r in members if entered.get(r, {}).get(e["group"], 0) < e["seq"])

    def blocked(rank: int) -> bool:
        e = waiting.get(rank)
        return e is not None and (e["kind"] in _POINT_TO_POINT or bool(missing(e)))

    def waiters(e: dict) -> list[int]:
        return sorted(r for r, w in waiting.items()
                      if (w["group"], w["seq"]) == (e["group"], e["seq"]))

    def entrants(e: dict) -> list[int]:
        return sorted(r for r, counts in entered.items() if counts.get(e["group"], 0) >= e["seq"])

    held_up: dict[tuple[str, int], dict] = {}
    for e in (e for entries in records.values() for e in entries if not e.get("left")):
        key = (e["group"], e["seq"])
        if e["kind"] in _POINT_TO_POINT or not any(not blocked(r) for r in missing(e)):
            continue
        if key not in held_up or e.get("time", 0.0) < held_up[key].get("time", 0.0):
            held_up[key] = e  # as its first entrant entered it
    if held_up:
        e = min(held_up.values(),
                key=lambda e: (-len(waiters(e)), e["step"], e.get("time", 0.0), e["seq"]))
        stuck = [r for r in missing(e) if not blocked(r)]
        return _never_entered(_what(e, e.get("ranks") or sorted(records)), stuck,
                              waiters(e) or entrants(e))
    e = min((waiting[r] for r in sorted(waiting)),
            key=lambda e: (-len(waiters(e)), e["step"], e["seq"]))
    what = _what(e, e.get("ranks") or sorted(records))
    if missing(e):
        return _never_entered(what, missing(e), waiters(e))
    return f"every rank of {what} entered it and none left it", []


def _what(e: dict, members: list[int]) -> str:
    """'all_gather #7 on ranks 2, 3 (step 1)'."""
    return f"{e['kind']} #{e['seq']} on ranks {_span(members)} (step {e['step']})"


def _never_entered(what: str, missing: list[int], waiters: list[int]
                   ) -> tuple[str, list[int]]:
    who = f"rank{'s' * (len(missing) > 1)} {_span(missing)}"
    return (f"{who} never entered {what}, in which rank{'s' * (len(waiters) > 1)} "
            f"{_span(waiters)} waited"), missing
