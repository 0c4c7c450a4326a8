"""Start local ranks through torch's elastic launcher (what torchrun runs), one process per
rank, and return each rank's result to the caller.

`launch(fn, world_size, *args)` runs ``fn(rank, world_size, *args)`` on every rank inside
an initialized gloo group and returns the results in rank order (tensors travel as numpy
arrays, as in `runtime.local_ranks`). It calls `elastic_launch` with a `LaunchConfig`; the
elastic agent starts and watches the workers, and a failing rank raises torch's
`ChildFailedError`, which `launch` turns into `runtime.local_ranks.RankError` (one line, the
rank's traceback in `rank_traceback`) naming the rank that failed first-hand. torch's
own report names the failure its agent saw first, which is often a peer that only lost
the failed rank's connection (and it stops the other workers before they report), so each
rank writes its own exception to a file, and `launch` picks the earliest one that is not a
lost connection.

What the ranks print (torch's own logs, such as a pipeline schedule's account of the
exception it caught, warnings, a rank's own lines) goes to a file per rank and attempt,
not to the terminal: the RankError of a failed run carries all of it, with every rank's
traceback, in `output`; a run that completes removes it with the rest of its temporary
folder. (Each rank points its own file descriptors 1 and 2 at its file: torch's
``redirects`` need the parent's ``sys.stdout`` to be a file, which under a notebook or
pytest's capture it is not.)

Nothing listens beyond loopback: the rendezvous is torch's dynamic rendezvous over a
`FileStore` in a private temporary directory (backend ``tessel-file``, registered here),
the agent's shared TCPStore is turned off (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``), the
workers join their process group through a FileStore too, and gloo's pair sockets are
bound to the loopback interface. (The agent still picks a MASTER_PORT number, which no
one uses here, by opening and at once closing a socket on localhost.) The workers' store
is prefixed by the restart count, so a restarted attempt never reads the previous one's
peer addresses (trap 2 of the gloo notes). A real multi-node job uses torchrun's own
``c10d`` rendezvous instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from runtime.faults import LAST_GOOD, LAUNCHER_REPORTS_ENV
from runtime.flight_recorder import FLIGHT_DIR_ENV
from runtime.local_ranks import (
    RankError,
    _tree_map_tensors,
    forget_parent_meshes,
    loopback_interface,
)

__all__ = ["launch"]

RDZV_BACKEND = "tessel-file"


class _FileRendezvousBackend(C10dRendezvousBackend):
    """torch's c10d rendezvous backend, over a FileStore instead of a TCPStore."""

    @property
    def name(self) -> str:
        return RDZV_BACKEND


def _file_rendezvous(params):
    store = dist.FileStore(params.endpoint, -1)
    return create_handler(store, _FileRendezvousBackend(store, params.run_id), params)


if RDZV_BACKEND not in rendezvous_handler_registry._registry:
    rendezvous_handler_registry.register(RDZV_BACKEND, _file_rendezvous)


def launch(
    fn: Callable[..., Any], world_size: int, *args: Any, collective_timeout_s: float = 120.0,
    max_restarts: int = 0, start_method: str = "fork",
    checkpoint_root: str | Path | None = None,
) -> list[Any]:
    """`fn(rank, world_size, *args)` on `world_size` local ranks; results in rank order.

    `start_method` ``fork`` (the default) starts 8 ranks in about a second less than
    ``spawn``, which re-imports torch in each; `fn` and `args` must pickle for ``spawn``.
    `max_restarts`: how often the agent starts every rank again after one fails (each
    attempt's store is fresh; `fn` resumes from its own checkpoints). `checkpoint_root`:
    where `fn` checkpoints, so that a failure names the last complete checkpoint.
    """
    if dist.is_initialized():
        dist.destroy_process_group()  # a fake group left by planning must not be inherited
    tmp = Path(tempfile.mkdtemp(prefix="tessel-elastic-"))  # mode 0700: this user only
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size,
        run_id=uuid.uuid4().hex, rdzv_backend=RDZV_BACKEND,
        rdzv_endpoint=str(tmp / "rdzv"), rdzv_configs={"timeout": 60},
        max_restarts=max_restarts, monitor_interval=0.05, start_method=start_method,
        local_addr="127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp / "logs")),
    )
    if start_method == "fork":
        forget_parent_meshes()
    previous = {name: os.environ.get(name) for name in
                ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", FLIGHT_DIR_ENV, LAUNCHER_REPORTS_ENV)}
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ[LAUNCHER_REPORTS_ENV] = "1"  # the ranks' own fault lines: see _root_cause
    # Each rank's record of the collectives it entered (`runtime.flight_recorder`).
    os.environ[FLIGHT_DIR_ENV] = str(tmp / "flight")
    # torch.multiprocessing gives each worker a `pytorch-errorfile-*.pickle` in the
    # temporary folder and never removes it after a failure: keep them in ours, removed
    # below, with whatever else the agent and the workers make there.
    system_tmp, tempfile.tempdir = tempfile.tempdir, str(tmp)
    # The agent logs each failed worker's whole traceback and each worker it stops;
    # `_root_cause` says in one line what failed (its traceback kept aside).
    quieted = {logging.getLogger("torch.distributed.elastic"): logging.CRITICAL,
               logging.getLogger("torch.multiprocessing.spawn"): logging.ERROR}
    levels = {log: log.level for log in quieted}
    for log, level in quieted.items():
        log.setLevel(level)
    try:
        results = elastic_launch(config, _worker)(
            fn, str(tmp / "store"), collective_timeout_s, args, str(tmp / "output")
        )
    except ChildFailedError as error:
        failure = _root_cause(error, tmp, checkpoint_root)
        failure.output = _ranks_output(tmp)
        raise failure from None
    finally:
        tempfile.tempdir = system_tmp
        for log, level in levels.items():
            log.setLevel(level)
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(tmp, ignore_errors=True)
    return [
        _tree_map_tensors(results[r], torch.from_numpy, numpy_leaves=True)
        for r in range(world_size)
    ]


# What a rank reports when it only lost a peer (or was stopped by the agent after a peer
# failed): not the root cause of a failed run.
_SECOND_HAND = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                "PeerLost:", "SignalException:")


def _root_cause(
    error: ChildFailedError, tmp: Path, checkpoint_root: str | Path | None = None,
) -> RankError:
    """The failure to report, from the last attempt: a rank's own error first (the
    earliest), else a rank that died without a word (killed, `os._exit`: what its peers
    lost) as the agent saw it or else as its peers did, else the earliest peer that lost
    one."""
    reports = [r for p in sorted((tmp / "store.errors").glob("rank*.json"))
               if (r := _read_report(p)) is not None]
    last = max((r["attempt"] for r in reports), default=0)
    current = [r for r in reports if r["attempt"] == last]
    hung = [r for r in current if r.get("hung")]
    first_hand = [r for r in current if not any(m in r["summary"] for m in _SECOND_HAND)]
    reported = {r["rank"] for r in current}
    silent = {rank: f for rank, f in error.failures.items() if rank not in reported}
    # Ranks that peers saw gone (`runtime.faults.PeerLost`), for when the agent saw only
    # the peers fail.
    lost = sorted({r for report in current for r in report.get("lost", [])} - reported)
    if hung:
        # Peers timed out waiting for ranks that never entered the collective (named from
        # the flight records); those ranks were then stopped by the agent.
        report = min(hung, key=lambda r: r["time_ns"])
        # "rank 0 timed out within 5 s: rank 2 never entered ...": from "rank 2" on.
        said = report["summary"].removeprefix("PeerLost: ").split(": ", 1)[-1]
        found = RankError(said, report["hung"][0], report["traceback"])
    elif first_hand or (current and not silent and not lost):
        report = min(first_hand or current, key=lambda r: r["time_ns"])
        rank = report["rank"]
        # A step that diverged under --on-divergence stop stops every rank alike: the
        # line names the step and the rank whose loss or gradients diverged.
        summary = report["summary"]
        said = summary.removeprefix("Diverged: ") if summary.startswith("Diverged: ") \
            else f"rank {rank} failed: {summary}"
        found = RankError(said, rank, report["traceback"])
    elif silent or not lost:
        rank, failure = min((silent or error.failures).items())
        summary = " ".join(str(failure.message).split()) or f"exit code {failure.exitcode}"
        # The step its peers lost it in, where one said.
        steps = [r["step"] for r in current if rank in r.get("lost", []) and
                 r.get("step") is not None]
        when = f" in step {min(steps)}" if steps else ""
        found = RankError(f"rank {rank} failed{when}: {summary}", rank, "", failure.exitcode)
    else:
        rank = lost[0]
        seen = min((r for r in current if rank in r.get("lost", [])), key=lambda r: r["time_ns"])
        found = RankError(f"rank {rank} failed without a word; "
                          f"{seen['summary'].removeprefix('PeerLost: ')}", rank)
    if checkpoint_root is not None:
        from runtime.checkpoint import latest_checkpoint

        # Looked for here, once every rank has stopped, rather than as the rank that
        # reported saw it: a save still being written then may have completed since.
        latest = latest_checkpoint(checkpoint_root)
        found.args = (f"{found.args[0].split(LAST_GOOD)[0]}{LAST_GOOD}"
                      f"{latest if latest is not None else 'none yet'}",)
    return found


def _ranks_output(tmp: Path) -> str:
    """What every rank printed (its stdout and stderr, `_print_to_file`) and the exception
    it raised, attempt by attempt and rank by rank, each under a header; empty when they
    printed and raised nothing."""
    logs = {(int(attempt), int(rank)): path for path in (tmp / "output").glob("rank*.log")
            for rank, attempt in [path.stem.removeprefix("rank").split(".attempt")]}
    reports = {(r["attempt"], r["rank"]): r for p in (tmp / "store.errors").glob("rank*.json")
               if (r := _read_report(p)) is not None}
    parts = []
    for attempt, rank in sorted(set(logs) | set(reports)):
        text = logs[attempt, rank].read_text(errors="replace").rstrip() \
            if (attempt, rank) in logs else ""
        if text:
            parts.append(f"== attempt {attempt}, rank {rank}: printed ==\n{text}\n")
        if (attempt, rank) in reports:
            parts.append(f"== attempt {attempt}, rank {rank}: raised ==\n"
                         f"{reports[attempt, rank]['traceback'].rstrip()}\n")
    return "\n".join(parts)


def _read_report(path: Path) -> dict | None:
    """A rank's report, or None where it is not whole (a full disk cut it short): that rank
    then counts as one that died without a word."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _report(folder: Path, rank: int, attempt: int, error: BaseException) -> None:
    """Write this rank's exception where `launch` looks for the root cause."""
    folder.mkdir(exist_ok=True)
    lines = str(error).strip().splitlines()
    summary = f"{type(error).__name__}: {' '.join(lines[0].split())}" if lines else type(
        error).__name__
    report = {"rank": rank, "attempt": attempt, "summary": summary,
              "traceback": traceback.format_exc(), "time_ns": time.time_ns(),
              # runtime.faults.PeerLost's
              "lost": list(getattr(error, "lost", [])), "hung": list(getattr(error, "hung", [])),
              "step": getattr(error, "step", None)}
    # Written whole and renamed: the agent may stop this rank (SIGTERM) mid-write, after a
    # peer failed, and must never read half a report.
    final = folder / f"rank{rank}.attempt{attempt}.json"
    partial = final.with_suffix(".partial")
    partial.write_text(json.dumps(report))
    partial.replace(final)


def _print_to_file(folder: Path, rank: int, attempt: str) -> None:
    """Send this process's standard output and error (its file descriptors 1 and 2, so
    C++ and child processes' output too) to ``folder/rankR.attemptA.log``."""
    folder.mkdir(exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    log = os.open(folder / f"rank{rank}.attempt{attempt}.log",
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # Python's own streams, anew on those descriptors (the parent's may not be files).
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _worker(fn, store_path: str, collective_timeout_s: float, args, output_dir: str) -> Any:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _print_to_file(Path(output_dir), rank, attempt)
    loopback = loopback_interface()
    os.environ.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
    torch.set_num_threads(1)  # each rank gets a share of the cores; oversubscribed gloo crawls
    store = dist.PrefixStore(f"attempt{attempt}", dist.FileStore(store_path, world_size))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=collective_timeout_s),
    )
    try:
        result = fn(rank, world_size, *args)
    except BaseException as error:
        _report(Path(store_path + ".errors"), rank, int(attempt), error)
        # The agent stops the others once one fails (SIGTERM); its handler would raise in
        # the middle of torch formatting this rank's traceback, printing a second one.
        # This rank has reported: let SIGTERM end it quietly.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise
    dist.barrier()  # no rank tears the group down while a peer still works (trap 8)
    dist.destroy_process_group()
    return _tree_map_tensors(result, lambda t: t.detach().numpy().copy())
