"""`measure_profile`: time this machine's ops and collectives into a `ProfileDatabase`.

On this machine's device (CUDA when present, else the CPU) it times:

- matmuls (`torch.mm`) of square (n x n @ n x n) and skinny (8n x n @ n x n/8: the same
  FLOPs, a long thin output) shapes for n = 32, 64, ... `max_dim`, in fp32 (and bf16 on a
  GPU);
- an elementwise op, `torch.add(a, b, out=c)` (3 x the tensor's bytes moved), over tensor
  sizes `min_bytes` ... `max_tensor_bytes`;
- collectives (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) among groups
  of local ranks (`runtime.local_ranks`; gloo on CPU, NCCL on GPUs) over message sizes
  `min_bytes` ... `max_bytes`,

each the median of several repetitions after a warm-up. `cost_models/profiled_costs.py` holds
the database and how plans read it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from cost_models.comm import COLLECTIVE_KINDS
from cost_models.profiled_costs import (
    GIB,
    KIB,
    MIN_DIM,
    MatmulSample,
    ProfileDatabase,
    ProfileSettings,
    format_bytes,
)

# Skinny matmuls: (ratio*n x n) @ (n x n/ratio), the FLOPs of the square one.
_SKINNY_RATIO = 8
# Defaults that depend on the device: (max_dim, max_tensor_bytes). A GPU's elementwise ops
# only reach full bandwidth on tensors far larger than a CPU's caches.
_DEVICE_DEFAULTS = {"cpu": (1024, None), "cuda": (8192, 1 * GIB)}
# Each timed sample of an op runs it back to back for at least this long.
_MIN_SAMPLE_S = 2e-3
# Collectives run at least this many times untimed first: the first calls on a new group
# (connections, buffers) are several times slower than the rest.
_WARM_UP_CALLS = 4

ProgressFn = Callable[[str, int, int], None]
"""progress(what is being measured, steps done, steps in all)."""


def byte_sizes(smallest: int, largest: int) -> list[int]:
    """`smallest`, 4x that, 16x, ... up to `largest`, which is always included."""
    sizes = [smallest]
    while sizes[-1] * 4 < largest:
        sizes.append(sizes[-1] * 4)
    return sizes if sizes[-1] == largest else sizes + [largest]


def matmul_shapes(max_dim: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the square and skinny matmuls, smallest first."""
    shapes = []
    dim = MIN_DIM
    while dim <= max_dim:
        shapes += [(dim, dim, dim), (dim * _SKINNY_RATIO, dim, dim // _SKINNY_RATIO)]
        dim *= 2
    return shapes


def measure_profile(
    settings: ProfileSettings | None = None, progress: ProgressFn | None = None
) -> ProfileDatabase:
    """Measure ops and collectives on this machine (see the module doc).

    `progress(what, done, total)` is called before each step and once at the end.
    """
    settings = settings or ProfileSettings()
    # device_count asks NVML, which does not initialize CUDA here: the collective ranks
    # fork, and CUDA cannot be used in a child forked after the parent used it.
    gpus = torch.cuda.device_count()
    found = _Measured()
    steps = _steps(settings, gpus, found)
    report = progress or (lambda what, done, total: None)
    with _cpu_threads(None if gpus else settings.threads):
        for done, (what, step) in enumerate(steps):
            report(what, done, len(steps))
            step()
    report("done", len(steps), len(steps))
    return ProfileDatabase(
        device="cuda" if gpus else "cpu",
        device_name=torch.cuda.get_device_name(0) if gpus else platform.processor() or "cpu",
        backend="nccl" if gpus else "gloo",
        torch_version=torch.__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        settings=settings,
        matmul=found.matmul,
        memory=found.memory,
        collectives=found.collectives,
        notes=found.notes,
    )


@dataclass
class _Measured:
    """What the steps of `measure_profile` found, filled in as they run."""

    matmul: list[MatmulSample] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)
    collectives: dict[str, dict[int, list]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


Step = tuple[str, Callable[[], None]]


def _steps(settings: ProfileSettings, gpus: int, found: _Measured) -> list[Step]:
    """(description, measure it into `found`) of every step, collectives first: their
    ranks fork before this process touches CUDA."""
    device, backend = ("cuda", "nccl") if gpus else ("cpu", "gloo")
    max_dim, max_tensor = _DEVICE_DEFAULTS[device]
    max_dim = settings.max_dim or max_dim
    max_tensor = settings.max_tensor_bytes or max_tensor or settings.max_bytes
    measurable = [n for n in settings.ranks if not gpus or n <= gpus]
    if len(measurable) < len(settings.ranks):
        found.notes.append(
            f"collectives on {sorted(set(settings.ranks) - set(measurable))} ranks not "
            f"measured: NCCL needs a GPU per rank and this machine has {gpus}"
        )
    reps = settings.repetitions
    steps: list[Step] = [
        (f"{kind} on {n} ranks", functools.partial(
            _collectives_step, found, kind, n, settings, backend, device))
        for n in measurable for kind in COLLECTIVE_KINDS
    ]
    steps += [
        (f"{dtype} matmul {m}x{k} @ {k}x{n}", functools.partial(
            _matmul_step, found.matmul, (m, k, n), dtype, device, reps))
        for dtype in (("fp32", "bf16") if gpus else ("fp32",))
        for m, k, n in matmul_shapes(max_dim)
    ]
    steps += [
        (f"elementwise add of {format_bytes(nbytes)}", functools.partial(
            _memory_step, found.memory, nbytes, device, reps))
        for nbytes in byte_sizes(settings.min_bytes, max_tensor)
    ]
    return steps


@contextlib.contextmanager
def _cpu_threads(threads: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _synchronize(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _median_seconds(
    call: Callable[[], object],
    repetitions: int,
    calls: int,
    sync: Callable[[], None],
    before: Callable[[], object] = lambda: None,
) -> float:
    """Median over `repetitions` samples of the time of one call, each sample running
    `calls` calls back to back (after `before()`)."""
    samples = []
    for _ in range(repetitions):
        before()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _time_op(call: Callable[[], object], device: str, repetitions: int) -> float:
    """Median seconds of one call after a warm-up, each sample lasting `_MIN_SAMPLE_S`."""
    sync = _synchronize(device)
    call()
    estimate = _median_seconds(call, 1, 1, sync)
    calls = max(1, min(1000, int(_MIN_SAMPLE_S / max(estimate, 1e-9))))
    return _median_seconds(call, repetitions, calls, sync)


_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _matmul_step(
    out: list[MatmulSample], shape: tuple[int, int, int], dtype: str, device: str,
    repetitions: int,
) -> None:
    m, k, n = shape
    a = torch.randn(m, k, dtype=_TORCH_DTYPES[dtype], device=device)
    b = torch.randn(k, n, dtype=_TORCH_DTYPES[dtype], device=device)
    c = torch.empty(m, n, dtype=_TORCH_DTYPES[dtype], device=device)
    seconds = _time_op(lambda: torch.mm(a, b, out=c), device, repetitions)
    out.append(MatmulSample(m=m, k=k, n=n, dtype=dtype, seconds=seconds))


def _memory_step(
    out: list[tuple[float, float]], nbytes: int, device: str, repetitions: int
) -> None:
    a, b, c = (torch.rand(max(1, nbytes // 4), device=device) for _ in range(3))
    seconds = _time_op(lambda: torch.add(a, b, out=c), device, repetitions)
    out.append((3.0 * a.numel() * a.element_size(), seconds))


def _collectives_step(
    found: _Measured,
    kind: str,
    group_size: int,
    settings: ProfileSettings,
    backend: str,
    device: str,
) -> None:
    from runtime.local_ranks import run_on_ranks

    sizes = byte_sizes(settings.min_bytes, settings.max_bytes)
    results = run_on_ranks(
        _collective_rank, group_size, kind, sizes, settings.repetitions, device,
        backend=backend,
    )
    failed = next((r for r in results if isinstance(r, str)), None)
    if failed is not None:
        found.notes.append(f"{kind} not measured on {backend} ({group_size} ranks): {failed}")
        return
    # A collective is as slow as its slowest rank.
    points = [(nbytes, max(r[i][1] for r in results)) for i, (nbytes, _) in enumerate(results[0])]
    found.collectives.setdefault(kind, {})[group_size] = points


def _collective_rank(
    rank: int, world: int, kind: str, sizes: list[int], repetitions: int, device: str
) -> list[tuple[float, float]] | str:
    """On one rank: (bytes, median seconds) of `kind` at each size, or why it failed."""
    sync = _synchronize(device)
    points = []
    try:
        for nbytes in sizes:
            call, actual = _collective_call(kind, nbytes, rank, world, device)
            calls = _calls_per_sample(actual)
            _median_seconds(call, 1, max(calls, _WARM_UP_CALLS), sync, dist.barrier)
            points.append((actual, _median_seconds(call, repetitions, calls, sync, dist.barrier)))
    except RuntimeError as error:  # e.g. a collective this backend does not implement
        return str(error).splitlines()[0]
    return points


def _calls_per_sample(nbytes: float) -> int:
    """Back-to-back calls per timed sample: more for small messages, whose time the skew
    between ranks leaving the barrier would otherwise swamp. The same on every rank."""
    return max(1, min(16, 256 * KIB // int(nbytes)))


def _collective_call(
    kind: str, nbytes: int, rank: int, world: int, device: str
) -> tuple[Callable[[], object], int]:
    """A call running one `kind` collective of about `nbytes` (rounded down to whole fp32
    elements, split evenly over the ranks), and its exact bytes."""
    numel = max(world, nbytes // 4 // world * world)
    full = torch.zeros(numel, device=device)
    part = torch.zeros(numel // world, device=device)
    swapped = torch.zeros_like(full)
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: dist.all_gather_single(full, part),
        "reduce_scatter": lambda: dist.reduce_scatter_single(part, full),
        "all_to_all": lambda: dist.all_to_all_single(swapped, full),
        "send_recv": _send_recv(full, rank, world),
    }
    return calls[kind], numel * 4


def _send_recv(buffer: torch.Tensor, rank: int, world: int) -> Callable[[], object]:
    """Ranks in pairs (0->1, 2->3, ...), every pair at once; an odd rank out idles."""
    peer = rank ^ 1
    if peer >= world:
        return lambda: None
    if rank % 2 == 0:
        return lambda: dist.send(buffer, peer)
    return lambda: dist.recv(buffer, peer)
