"""Which rank a hung collective waits for: each rank records the collectives it enters, and
a rank that times out reads every rank's record and names the ones that never entered
the collective it waited in.

torch's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``torch.distributed.flight_
recorder``) keeps such a ring per rank for NCCL and dumps it on a timeout; gloo has none.
`FlightRecorder` is a dispatch mode that sees every collective the rank issues (as
`runtime.comm_counter.CommCounter` does) and appends one line per collective to a file of
its own: the process group's name and ranks, the collective's sequence number on that
group (the n-th this rank entered there), its kind and the training step. Collectives on
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
                     "step": self.step})
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


def diagnose(records: dict[int, list[dict]]) -> tuple[str, list[int]] | None:
    """(one line, the ranks blamed) for a hang seen in `records`: the collective the most
    ranks wait in (the last they entered, not left) and the members of its group that
    never entered it; or that every member entered it and none came out. None when no
    rank waits in a collective."""
    entered: dict[int, dict[str, int]] = {}
    waiting: dict[tuple[str, int], list[int]] = {}
    about: dict[tuple[str, int], dict] = {}
    for rank, entries in records.items():
        counts = entered.setdefault(rank, {})
        left = set()
        for e in entries:
            if e.get("left"):
                left.add((e["group"], e["seq"]))
            else:
                counts[e["group"]] = max(counts.get(e["group"], 0), e["seq"])
        last = next((e for e in reversed(entries) if not e.get("left")), None)
        if last is not None and (last["group"], last["seq"]) not in left:
            key = (last["group"], last["seq"])
            waiting.setdefault(key, []).append(rank)
            about[key] = last
    if not waiting:
        return None
    key = max(waiting, key=lambda k: len(waiting[k]))
    e, waiters = about[key], sorted(waiting[key])
    members = e.get("ranks") or sorted(records)
    what = f"{e['kind']} #{e['seq']} on ranks {_span(members)} (step {e['step']})"
    missing = sorted(r for r in members if entered.get(r, {}).get(key[0], 0) < key[1])
    if missing:
        who = f"rank{'s' * (len(missing) > 1)} {_span(missing)}"
        return (f"{who} never entered {what}, in which rank{'s' * (len(waiters) > 1)} "
                f"{_span(waiters)} waited"), missing
    return f"every rank of {what} entered it and none left it", []
