"""Profiled costs: op and collective times measured on the machine at hand.

`measure_profile` times, on this machine's device (CUDA when present, else the CPU):

- matmuls (`torch.mm`) of square (n x n @ n x n) and skinny (8n x n @ n x n/8: the same
  FLOPs, a long thin output) shapes for n = 32, 64, ... `max_dim`, in fp32 (and bf16 on a
  GPU);
- an elementwise op, `torch.add(a, b, out=c)` (3 x the tensor's bytes moved), over tensor
  sizes `min_bytes` ... `max_tensor_bytes`;
- collectives (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) among groups
  of local ranks (`runtime.launch`; gloo on CPU, NCCL on GPUs) over message sizes
  `min_bytes` ... `max_bytes`,

each the median of several repetitions after a warm-up, and keeps them in a
`ProfileDatabase`, a JSON file. A plan made with it (`plan --profile PATH`) charges each op
`ProfileDatabase.op_time`, and each collective `ProfileDatabase.collective_time` where the
database has that kind on that group size; the analytical models (`cost_models.compute`,
`cost_models.comm`) price the rest.

Between measured sizes, times are interpolated linearly in log(size)-log(seconds). Beyond
the largest size the largest measurement's rate is kept (time grows linearly with size:
throughput has saturated). Below the smallest size a matmul keeps the smallest one's FLOP
rate, while an elementwise op or a collective costs what the smallest one did (a fixed
launch or latency cost dominates there). Measured times are made non-decreasing in size
(each size takes the least time measured at it or at any larger size), so noise never
predicts a larger op faster than a smaller one. Where matmul shapes of equal FLOPs differ,
the fastest counts: the bandwidth side of the roofline (`op_time`) charges the extra
traffic of skinny shapes.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import functools
import math
import platform
import statistics
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from cost_models.comm import COLLECTIVE_KINDS, check_kind

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Square matmuls start at this dimension and double up to max_dim.
_MIN_DIM = 32
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
# Bounds on what `ProfileSettings` may ask for: past them a measurement would need more
# memory than any one machine has (a 16 GiB message per rank, an 8n x n matmul of 8 GiB at
# n = 16384) or run for days, so a larger value is a typo, not a plan.
MAX_RANKS = 64
MAX_BYTES = 16 * GIB
MAX_DIM = 16384
MAX_REPETITIONS = 1000
MAX_THREADS = 1024

Point = tuple[PositiveFloat, PositiveFloat]
ProgressFn = Callable[[str, int, int], None]
"""progress(what is being measured, steps done, steps in all)."""


class _Model(BaseModel):
    # Infinite and NaN numbers (JSON's Infinity and NaN, or 1e999) are no measurement.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ProfileSettings(_Model):
    """What `measure_profile` measures."""

    ranks: list[int] = Field(
        default=[2, 4],
        description=f"Group sizes to time collectives on, each a group of local ranks "
        f"(2 to {MAX_RANKS}).",
    )
    min_bytes: int = Field(
        default=4 * KIB,
        description="Smallest collective message and elementwise tensor, in bytes (64 B to "
        "16 GiB).",
    )
    max_bytes: int = Field(
        default=16 * MIB,
        description="Largest collective message, in bytes (at most 16 GiB); sizes grow 4x "
        "from min_bytes.",
    )
    max_tensor_bytes: int | None = Field(
        default=None,
        description="Largest elementwise-op tensor, in bytes (default max_bytes on CPU, "
        "1 GiB on a GPU).",
    )
    max_dim: int | None = Field(
        default=None,
        description=f"Largest matmul dimension, {_MIN_DIM} to {MAX_DIM}; dimensions double "
        f"from {_MIN_DIM} (default 1024 on CPU, 8192 on a GPU).",
    )
    repetitions: int = Field(
        default=5,
        description=f"Timed repetitions of each measurement after a warm-up, 1 to "
        f"{MAX_REPETITIONS}; the median is kept.",
    )
    threads: int = Field(
        default=1,
        description=f"CPU threads for op timings, 1 to {MAX_THREADS} (each gloo rank of "
        "`plan check` runs with 1); unused on a GPU.",
    )

    @field_validator("ranks")
    @classmethod
    def _groups(cls, ranks: list[int]) -> list[int]:
        if any(not 2 <= n <= MAX_RANKS for n in ranks):
            raise ValueError(f"each group size must be from 2 to {MAX_RANKS}")
        return sorted(set(ranks))

    @field_validator("min_bytes", "max_bytes", "max_tensor_bytes")
    @classmethod
    def _bytes(cls, nbytes: int | None) -> int | None:
        if nbytes is not None and not 64 <= nbytes <= MAX_BYTES:
            raise ValueError(f"must be from 64 B to {format_bytes(MAX_BYTES)}")
        return nbytes

    @field_validator("max_dim")
    @classmethod
    def _dim(cls, dim: int | None) -> int | None:
        if dim is not None and not _MIN_DIM <= dim <= MAX_DIM:
            raise ValueError(f"must be from {_MIN_DIM} to {MAX_DIM}")
        return dim

    @field_validator("repetitions")
    @classmethod
    def _repetitions(cls, repetitions: int) -> int:
        if not 1 <= repetitions <= MAX_REPETITIONS:
            raise ValueError(f"must be from 1 to {MAX_REPETITIONS}")
        return repetitions

    @field_validator("threads")
    @classmethod
    def _threads(cls, threads: int) -> int:
        if not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"must be from 1 to {MAX_THREADS}")
        return threads

    @model_validator(mode="after")
    def _byte_range(self) -> ProfileSettings:
        if self.min_bytes > self.max_bytes:
            raise ValueError(
                f"min_bytes ({format_bytes(self.min_bytes)}) is larger than max_bytes "
                f"({format_bytes(self.max_bytes)}); raise max_bytes or lower min_bytes"
            )
        if self.max_tensor_bytes is not None and self.min_bytes > self.max_tensor_bytes:
            raise ValueError(
                f"min_bytes ({format_bytes(self.min_bytes)}) is larger than max_tensor_bytes "
                f"({format_bytes(self.max_tensor_bytes)}); raise max_tensor_bytes or lower "
                "min_bytes"
            )
        return self


class MatmulSample(_Model):
    """One timed matmul, (m x k) @ (k x n)."""

    m: int = Field(gt=0, description="Rows of the left operand and of the output.")
    k: int = Field(gt=0, description="The contracted dimension.")
    n: int = Field(gt=0, description="Columns of the right operand and of the output.")
    dtype: str = Field(description="dtype key of the operands, e.g. 'fp32' or 'bf16'.")
    seconds: PositiveFloat = Field(description="Median time of one matmul.")

    @property
    def flops(self) -> float:
        """2 m n k: one multiply and one add per term."""
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class Curve:
    """Seconds as a function of size, piecewise linear in log-log (see the module doc)."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]
    latency_floor: bool
    """Below the smallest size: its time (True) or its rate (False)."""

    @classmethod
    def of(cls, points: list[tuple[float, float]], latency_floor: bool) -> Curve:
        """The curve through `(size, seconds)` points: the least time at each size, made
        non-decreasing in size."""
        best: dict[float, float] = {}
        for size, seconds in points:
            best[size] = min(seconds, best.get(size, math.inf))
        sizes = sorted(best)
        seconds = [best[s] for s in sizes]
        for i in range(len(seconds) - 2, -1, -1):
            seconds[i] = min(seconds[i], seconds[i + 1])
        return cls(tuple(sizes), tuple(seconds), latency_floor)

    def __call__(self, size: float) -> float:
        xs, ts = self.sizes, self.seconds
        if size <= xs[0]:
            return ts[0] if self.latency_floor else ts[0] * size / xs[0]
        if size >= xs[-1]:
            return ts[-1] * size / xs[-1]
        i = bisect.bisect_right(xs, size)
        weight = math.log(size / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
        return ts[i - 1] * (ts[i] / ts[i - 1]) ** weight


@dataclass(frozen=True)
class _Curves:
    matmul: dict[str, Curve]
    memory: Curve
    collectives: dict[tuple[str, int], Curve]


class ProfileDatabase(_Model):
    """Op and collective times measured on one machine; see the module doc."""

    version: int = Field(default=1, description="Schema version.")
    device: str = Field(description="Where ops ran: 'cpu' or 'cuda'.")
    device_name: str = Field(default="", description="The processor or GPU model.")
    backend: str = Field(description="Process-group backend of the collectives: 'gloo' or "
                         "'nccl'.")
    torch_version: str = Field(description="torch.__version__ of the measuring process.")
    created: str = Field(description="When the profile was measured (ISO 8601, UTC).")
    settings: ProfileSettings = Field(
        default_factory=ProfileSettings, description="What was measured."
    )
    matmul: list[MatmulSample] = Field(
        min_length=1, description="Timed matmuls; fp32 at least."
    )
    memory: list[Point] = Field(
        min_length=1,
        description="(bytes moved, seconds) of an elementwise op: read a and b, write c.",
    )
    collectives: dict[str, dict[int, list[Point]]] = Field(
        default_factory=dict,
        description="Collective kind -> group size -> (message bytes, seconds), the bytes "
        "as `cost_models.comm.collective_time` counts them.",
    )
    notes: list[str] = Field(
        default_factory=list, description="What was not measured, and why."
    )
    _path: str | None = PrivateAttr(default=None)

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != 1:
            raise ValueError(f"version {version} is not one this Tessel reads (1)")
        return version

    @field_validator("matmul")
    @classmethod
    def _has_fp32(cls, samples: list[MatmulSample]) -> list[MatmulSample]:
        if not any(s.dtype == "fp32" for s in samples):
            raise ValueError("needs fp32 samples: other dtypes fall back to them")
        return samples

    @field_validator("collectives")
    @classmethod
    def _known_kinds(cls, table: dict[str, dict[int, list]]) -> dict[str, dict[int, list]]:
        for kind, groups in table.items():
            if kind not in COLLECTIVE_KINDS:
                raise ValueError(f"unknown collective kind {kind!r}; known: {COLLECTIVE_KINDS}")
            if any(n < 2 or not points for n, points in groups.items()):
                raise ValueError(f"{kind}: groups need at least 2 ranks and one measurement")
        return table

    @property
    def cost_source(self) -> str:
        """'profile:PATH' for a database loaded or saved there, 'profile:unsaved' else."""
        return f"profile:{self._path or 'unsaved'}"

    @cached_property
    def _curves(self) -> _Curves:
        by_dtype: dict[str, list[tuple[float, float]]] = {}
        for s in self.matmul:
            by_dtype.setdefault(s.dtype, []).append((s.flops, s.seconds))
        return _Curves(
            matmul={d: Curve.of(p, latency_floor=False) for d, p in by_dtype.items()},
            memory=Curve.of(self.memory, latency_floor=True),
            collectives={
                (kind, n): Curve.of(points, latency_floor=True)
                for kind, groups in self.collectives.items()
                for n, points in groups.items()
            },
        )

    def op_time(self, flops: float, bytes_moved: float, dtype: str = "fp32") -> float:
        """Seconds of one op: the larger of the matmul curve's time at `flops` and the
        elementwise curve's time at `bytes_moved` (the roofline, with measured ceilings).

        `dtype` is a `cost_models.compute.dtype_key`; one not measured uses fp32's curve.
        """
        if flops < 0 or bytes_moved < 0:
            raise ValueError(f"flops and bytes_moved must be >= 0, got {flops} and {bytes_moved}")
        curves = self._curves
        compute = curves.matmul.get(dtype, curves.matmul["fp32"])(flops)
        memory = curves.memory(bytes_moved) if bytes_moved > 0 else 0.0
        return max(compute, memory)

    def collective_time(self, kind: str, nbytes: float, group_size: int) -> float | None:
        """Measured seconds of one collective (bytes counted as in
        `cost_models.comm.collective_time`), or None when this database has no
        measurement of `kind` on `group_size` ranks. A message of 0 bytes costs what the
        smallest measured one did: the latency."""
        check_kind(kind)
        curve = self._curves.collectives.get((kind, group_size))
        return None if curve is None else curve(nbytes)

    def save(self, path: str | Path) -> None:
        """Write the database as JSON to `path`."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")
        self._path = str(path)

    @classmethod
    def load(cls, path: str | Path) -> ProfileDatabase:
        """Read a database written by `save` (or `plan profile`).

        Raises ValueError in one sentence naming the file (and the bad entry with its
        value) when it is missing, not JSON, not a profile database, or holds a time or
        size that is zero, negative, infinite or NaN.
        """
        file = Path(path)
        again = f"measure it again with `plan profile --output {path}`"
        if not file.is_file():
            raise ValueError(
                f"Profile database {str(path)!r} does not exist; measure one with "
                f"`plan profile --output {path}`."
            )
        try:
            database = cls.model_validate_json(file.read_bytes())
        except OSError as error:
            raise ValueError(
                f"Cannot read profile database {str(path)!r}: {error.strerror or error}."
            ) from None
        except ValidationError as error:
            raise ValueError(
                f"Profile database {str(path)!r} {_problem(error)}; {again}."
            ) from None
        database._path = str(path)
        return database


def _problem(error: ValidationError) -> str:
    """What is wrong with a file that failed to validate as a database, as the end of a
    sentence starting with its name."""
    errors = error.errors()
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"is not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    if first["type"] == "model_type":
        return (f"is not a profile database: it holds a JSON "
                f"{_json_kind(first['input'])}, not an object")
    missing = [e["loc"][0] for e in errors if e["type"] == "missing" and len(e["loc"]) == 1]
    required = [name for name, f in ProfileDatabase.model_fields.items() if f.is_required()]
    if set(required) <= set(missing):
        return f"is not a profile database (it has none of the keys {', '.join(required)})"
    if missing:
        return f"is not a valid profile (it lacks {', '.join(map(str, missing))})"
    message = str(first["msg"]).removeprefix("Value error, ")
    value = first.get("input")
    shown = (f", got {value!r}" if isinstance(value, (int, float, str))
             and first["type"] not in ("missing", "value_error") else "")
    more = f", and {len(errors) - 1} more problems" if len(errors) > 1 else ""
    return f"is not a valid profile ({_entry(first['loc'])}: {message}{shown}{more})"


def _json_kind(value: object) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _entry(loc: tuple) -> str:
    """A validation error's location as the entry it names: ('memory', 3, 1) ->
    'memory[3] seconds', ('collectives', 'all_reduce', 2, 0, 0) ->
    'collectives.all_reduce.2[0] bytes', ('matmul', 1, 'seconds') -> 'matmul[1].seconds'."""
    parts = [str(p) for p in loc]
    points = (loc[:1] == ("memory",) and len(loc) == 3) or (
        loc[:1] == ("collectives",) and len(loc) == 5
    )
    if points:
        *head, index, item = parts
        return f"{'.'.join(head)}[{index}] {'bytes' if item == '0' else 'seconds'}"
    if loc[:1] == ("matmul",) and len(loc) >= 2:
        return f"matmul[{parts[1]}]" + "".join(f".{p}" for p in parts[2:])
    return ".".join(parts) or "file"


def byte_sizes(smallest: int, largest: int) -> list[int]:
    """`smallest`, 4x that, 16x, ... up to `largest`, which is always included."""
    sizes = [smallest]
    while sizes[-1] * 4 < largest:
        sizes.append(sizes[-1] * 4)
    return sizes if sizes[-1] == largest else sizes + [largest]


def matmul_shapes(max_dim: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the square and skinny matmuls, smallest first."""
    shapes = []
    dim = _MIN_DIM
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


def format_bytes(nbytes: float) -> str:
    """4096 -> '4 KiB', 12288 -> '12 KiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


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
    from runtime.launch import run_on_ranks

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
