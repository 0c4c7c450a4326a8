"""Profiled costs: op and collective times measured on the machine at hand.

A `ProfileDatabase` (a JSON file, written by `runtime/measure.py`'s
`measure_profile`, i.e. `plan profile`) holds matmul, elementwise and collective times. A
plan made with it (`plan --profile PATH`) charges each op `ProfileDatabase.op_time`, and
each collective `ProfileDatabase.collective_time` where the database has that kind on that
group size; the analytical models (`cost_models.compute`, `cost_models.comm`) price the
rest. Loading validates every entry (finite, positive times and sizes), naming the bad one.

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
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cost_models.comm import COLLECTIVE_KINDS, check_kind
from planner.user_files import NotTextError, UserFileError, read_user_file

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Square matmuls start at this dimension and double up to max_dim.
MIN_DIM = 32
# Bounds on what `ProfileSettings` may ask for: past them a measurement would need more
# memory than any one machine has (a 16 GiB message per rank, an 8n x n matmul of 8 GiB at
# n = 16384) or run for days, so a larger value is a typo, not a plan.
MAX_RANKS = 64
MAX_BYTES = 16 * GIB
MAX_DIM = 16384
MAX_REPETITIONS = 1000
MAX_THREADS = 1024
PROFILE_BYTES = 256 * MIB
"""The most read of a profile database (one of a model's ops and collectives is a few MiB)."""
# The fields of `ProfileSettings` that count something, with their bounds.
_COUNT_RANGES = {"max_dim": (MIN_DIM, MAX_DIM), "repetitions": (1, MAX_REPETITIONS),
                 "threads": (1, MAX_THREADS)}

Point = tuple[PositiveFloat, PositiveFloat]


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
        description=f"Largest matmul dimension, {MIN_DIM} to {MAX_DIM}; dimensions double "
        f"from {MIN_DIM} (default 1024 on CPU, 8192 on a GPU).",
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

    @field_validator(*_COUNT_RANGES)
    @classmethod
    def _count(cls, value: int | None, info: ValidationInfo) -> int | None:
        low, high = _COUNT_RANGES[info.field_name]
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be from {low} to {high}")
        return value

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
        if not file.exists():
            raise ValueError(
                f"Profile database {str(path)!r} does not exist; measure one with "
                f"`plan profile --output {path}`."
            )
        try:
            # Bounded as every file a user names is (`planner.user_files`): a regular
            # file of at most PROFILE_BYTES (a profile of a model's ops is a few MiB).
            text = read_user_file(file, f"Profile database {str(path)!r}",
                                  "one `plan profile` wrote", limit=PROFILE_BYTES)
            database = cls.model_validate_json(text)
        except NotTextError:
            raise ValueError(f"Profile database {str(path)!r} is not JSON (it is not UTF-8 "
                             f"text); {again}.") from None
        except UserFileError as error:
            raise ValueError(f"{error}.") from None
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


def format_bytes(nbytes: float) -> str:
    """4096 -> '4 KiB', 12288 -> '12 KiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
