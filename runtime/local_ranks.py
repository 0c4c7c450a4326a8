"""Run a function on N local ranks joined by a gloo process group.

Ranks are forked, so they inherit what the parent already built (the traced program, the
plan, the initial state) instead of rebuilding it N times on a small machine. Each rank
sends its result back through a pipe of its own; a rank's exception is re-raised in the
parent as a one-line RankError, whose `rank_traceback` holds the rank's traceback text.

Nothing a local run opens listens beyond this machine: the ranks meet through a
`FileStore` in a private temporary directory (no rendezvous socket at all), and gloo's
(and NCCL's bootstrap) sockets are bound to the loopback interface.

The parent never waits forever: it watches every rank's process as well as its pipe, so a
rank that dies without reporting (killed, segfault, `os._exit`) is named with its exit
code or signal within moments; the others are then given a short grace to report and
stopped. Collectives time out after `collective_timeout_s` (torch's default is 30
minutes), and the whole run after `timeout_s`.

Operator-level checks (`plan check --mesh`) and the tests use it; training plans start
through torch's elastic agent (`runtime/elastic.py`), as torchrun does. Forking starts
ranks several times faster than the agent, which is what keeps it for the many short runs
of checks and tests (`benchmarks/launcher_overhead.py`; its numbers in docs/runtime.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankError", "forget_parent_meshes", "loopback_interface", "run_on_ranks"]

# After the first failure, how long the other ranks get to report before they are stopped
# (a peer's death is seen by gloo within a second).
FAILURE_GRACE_S = 5.0
# Between SIGTERM and SIGKILL for a rank that has to be stopped.
TERMINATE_GRACE_S = 2.0
_IFF_LOOPBACK = 0x8


class RankError(RuntimeError):
    """A rank failed: raised its own exception, died without reporting, or ran too long.

    The message is one line; `rank_traceback` is the rank's full traceback text (empty for
    a rank that died without a word), `exitcode` the process's exit code where it exited
    (negative: killed by that signal), `output` what every rank printed and raised, where
    the launcher kept it aside (`runtime.elastic.launch`; empty otherwise).
    """

    def __init__(
        self, message: str, rank: int | None, rank_traceback: str = "",
        exitcode: int | None = None, output: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.exitcode = exitcode
        self.output = output


def loopback_interface() -> str:
    """The name of this machine's loopback network interface ("lo" on Linux)."""
    net = Path("/sys/class/net")
    try:
        names = sorted(p.name for p in net.iterdir())
    except OSError:
        names = []
    for name in names:
        try:
            flags = int((net / name / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_LOOPBACK:
            return name
    try:
        interfaces = {name for _, name in socket.if_nameindex()}
    except OSError:
        interfaces = set()
    return next((name for name in ("lo", "lo0") if name in interfaces), "lo")


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float | None = 3600.0,
    backend: str = "gloo",
    collective_timeout_s: float = 300.0,
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank inside an initialized process group
    (gloo, or NCCL with rank r on GPU r: the parent must not have used CUDA before, since
    ranks are forked); returns the results in rank order.

    Raises RankError (one line, the rank's traceback in `rank_traceback`) when a rank
    raises, dies without reporting, or the run passes `timeout_s` (None: no limit; hung
    collectives still fail after `collective_timeout_s`).
    """
    if dist.is_initialized():
        # A fake group left by planning must not be inherited by the forked ranks.
        dist.destroy_process_group()
    forget_parent_meshes()
    context = mp.get_context("fork")
    store_dir = Path(tempfile.mkdtemp(prefix="tessel-ranks-"))  # mode 0700: this user only
    pipes = [context.Pipe(duplex=False) for _ in range(world_size)]
    procs = [
        context.Process(
            target=_rank_main,
            args=(fn, rank, world_size, store_dir, pipes, args, backend, collective_timeout_s),
        )
        for rank in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        for _, writer in pipes:
            writer.close()  # each rank holds the only write end of its pipe
        results = _collect([reader for reader, _ in pipes], procs, timeout_s)
    finally:
        _stop(procs)
        for reader, _ in pipes:
            reader.close()
        shutil.rmtree(store_dir, ignore_errors=True)
    return [_tree_map_tensors(results[r], torch.from_numpy, numpy_leaves=True)
            for r in range(world_size)]


def forget_parent_meshes() -> None:
    """Clear DTensor's caches, which forked ranks would inherit (called before forking).

    DTensor caches sharding decisions and redistribution plans keyed by DeviceMesh, and a
    mesh compares equal to another of the same shape and axis names whatever its process
    groups. A parent that planned on a fake group of the same shape would hand a forked
    rank cached results naming the parent's (dead) groups: "Could not resolve the process
    group registered under the name 19". (Private caches of torch 2.13; `spawn` does not
    need this.) Cleared in the parent, once: what clears them comes from
    torch.distributed.tensor.debug, whose import in every rank would cost each rank's
    start-up far more than the clearing itself.
    """
    from torch.distributed.tensor import DTensor, _redistribute

    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ fast path's
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()


def _collect(readers: list, procs: list, timeout_s: float | None) -> dict[int, Any]:
    """Every rank's result; RankError for the first failure seen (see _failure)."""
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    pending = set(range(len(procs)))
    results: dict[int, Any] = {}
    raised: dict[int, tuple[str, str]] = {}  # rank -> (one-line summary, traceback)
    lost: dict[int, int | None] = {}  # rank -> exit code, for ranks that died silently
    give_up_at: float | None = None  # set at the first failure
    while pending:
        now = time.monotonic()
        limits = [t for t in (deadline, give_up_at) if t is not None]
        if limits and now >= min(limits):
            break
        wait(
            [readers[r] for r in pending] + [procs[r].sentinel for r in pending],
            timeout=min(limits) - now if limits else None,
        )
        # Pipes first: a rank that reported and then exited is not lost.
        for rank in sorted(pending):
            if readers[rank].poll():
                try:
                    ok, value = readers[rank].recv()
                except (EOFError, OSError):  # died part-way through sending
                    procs[rank].join(TERMINATE_GRACE_S)
                    lost[rank] = procs[rank].exitcode
                else:
                    if ok:
                        results[rank] = value
                    else:
                        raised[rank] = value
                pending.discard(rank)
            elif not procs[rank].is_alive():
                lost[rank] = procs[rank].exitcode
                pending.discard(rank)
        if (raised or lost) and give_up_at is None:
            give_up_at = time.monotonic() + FAILURE_GRACE_S
    if raised or lost:
        raise _failure(raised, lost)
    if pending:
        ranks = ", ".join(str(r) for r in sorted(pending))
        raise RankError(
            f"rank{'s' if len(pending) > 1 else ''} {ranks} did not finish within "
            f"{timeout_s:g} s and {'were' if len(pending) > 1 else 'was'} stopped",
            min(pending),
        )
    return results


def _failure(raised: dict[int, tuple[str, str]], lost: dict[int, int | None]) -> RankError:
    """The error to report: a rank that died without a word comes first (its peers' errors
    are usually only the broken connection to it), else the lowest rank that raised."""
    if lost:
        rank = min(lost)
        code = lost[rank]
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return RankError(f"rank {rank} {how} before reporting a result", rank, exitcode=code)
    rank = min(raised)
    summary, text = raised[rank]
    return RankError(f"rank {rank} failed: {summary}", rank, text)


def _stop(procs: list) -> None:
    """Terminate (then kill) every rank still running, and reap them all."""
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.kill()
            p.join()


def _summary(error: BaseException) -> str:
    """`Type: first line of the message`, on one line."""
    lines = str(error).strip().splitlines()
    name = type(error).__name__
    return f"{name}: {' '.join(lines[0].split())}" if lines else name


def _rank_main(
    fn, rank: int, world_size: int, store_dir: Path, pipes, args, backend: str,
    collective_timeout_s: float,
) -> None:
    # A parent that ran torch's elastic agent left its SIGTERM handler installed, which
    # raises in the rank when `_stop` ends it after it reported: restore the default.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    connection = pipes[rank][1]
    for index, (reader, writer) in enumerate(pipes):
        reader.close()
        if index != rank:
            writer.close()
    loopback = loopback_interface()
    # Bind gloo's pair sockets (and NCCL's bootstrap) to loopback: without it they bind
    # to whatever address the hostname resolves to.
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback,
    )
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)  # the FileStore is the rendezvous; nothing listens
    # Each rank gets a share of this machine's cores; oversubscription makes gloo crawl.
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        timeout = timedelta(seconds=collective_timeout_s)
        store = dist.FileStore(str(store_dir / "store"), world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        try:
            result = fn(rank, world_size, *args)
            # Tensors travel as numpy arrays: torch's shared-memory handles die with the rank.
            message = (True, _tree_map_tensors(result, lambda t: t.detach().numpy().copy()))
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - every failure must reach the parent
        message = (False, (_summary(error), traceback.format_exc()))
    try:
        connection.send(message)  # pickles first: a result that cannot be sent sends nothing
    except Exception as error:  # noqa: BLE001 - e.g. a result that does not pickle
        connection.send((False, (f"cannot send the result: {_summary(error)}",
                                 traceback.format_exc())))
    connection.close()


def _tree_map_tensors(value: Any, fn: Callable, numpy_leaves: bool = False) -> Any:
    import numpy as np

    leaf_type = np.ndarray if numpy_leaves else torch.Tensor
    return torch.utils._pytree.tree_map(
        lambda x: fn(x) if isinstance(x, leaf_type) else x, value
    )
