"""`plan profile`: measure this machine's op and collective times into a database file.

    plan profile [--output tessel-profile.json] [--ranks 2,4] [--max-bytes 16MiB] ...

Each flag's help is the `ProfileSettings` field's description. The database is what
`plan MODEL --profile PATH` prices ops and collectives with.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cost_models.profiled_costs import (
    GIB,
    KIB,
    MIB,
    ProfileDatabase,
    ProfileSettings,
    format_bytes,
)
from planner.cli.console import console
from planner.cli.errors import UsageError

DEFAULT_OUTPUT = "tessel-profile.json"
_UNITS = {"": 1, "B": 1, "K": KIB, "KIB": KIB, "M": MIB, "MIB": MIB, "G": GIB, "GIB": GIB}


def parse_bytes(flag: str, text: str) -> int:
    """'16MiB' -> 16777216; also '4KiB', '1G', '4096'."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = match and _UNITS.get(match.group(2).upper())
    if not unit:
        raise UsageError(
            f"{flag} {text!r} is not a size; write bytes with an optional unit, e.g. 4096, "
            "4KiB or 16MiB"
        )
    return int(match.group(1)) * unit


def parse_ranks(flag: str, text: str) -> list[int]:
    """'2,4' -> [2, 4]."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not a list of group sizes; write them joined by commas, "
            "e.g. 2,4"
        ) from None


def parse_whole(flag: str, text: str) -> int:
    """'5' -> 5."""
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a whole number; write e.g. 5") from None


# Flag -> (ProfileSettings field, parse(flag, text) into the field's value).
_FLAGS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "--ranks": ("ranks", parse_ranks),
    "--min-bytes": ("min_bytes", parse_bytes),
    "--max-bytes": ("max_bytes", parse_bytes),
    "--max-tensor-bytes": ("max_tensor_bytes", parse_bytes),
    "--max-dim": ("max_dim", parse_whole),
    "--repetitions": ("repetitions", parse_whole),
    "--threads": ("threads", parse_whole),
}


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """`--output`, `--debug` and one flag per `ProfileSettings` field, all as text."""
    parser.add_argument(
        "--output", metavar="PATH", default=DEFAULT_OUTPUT,
        help=f"where to write the database (default {DEFAULT_OUTPUT})",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    for flag, (field, parse) in _FLAGS.items():
        default = ProfileSettings.model_fields[field].default
        help_text = ProfileSettings.model_fields[field].description or field
        if default is not None:
            help_text += f" (default {_shown(default, parse)})"
        parser.add_argument(
            flag, dest=field, default=None, metavar=_METAVARS[parse], help=help_text
        )


_METAVARS = {parse_ranks: "N,N", parse_bytes: "SIZE", parse_whole: "N"}


def _shown(default: Any, parse: Callable[[str, str], Any]) -> str:
    """A default as its flag is written: [2, 4] -> '2,4', 4096 -> '4KiB'."""
    if parse is parse_ranks:
        return ",".join(map(str, default))
    if parse is parse_bytes:
        return format_bytes(default).replace(" ", "")
    return str(default)


def settings_from_args(args: argparse.Namespace) -> ProfileSettings:
    """The flags given, parsed and validated; the defaults for the rest."""
    typed = {
        field: (flag, getattr(args, field))
        for flag, (field, _) in _FLAGS.items()
        if getattr(args, field) is not None
    }
    given = {field: _FLAGS[flag][1](flag, text) for field, (flag, text) in typed.items()}
    try:
        return ProfileSettings(**given)
    except ValidationError as error:
        first = error.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        field = str(first["loc"][0]) if first["loc"] else None
        if field in typed:
            flag, text = typed[field]
            raise UsageError(f"{flag} {text}: {message}.") from None
        raise UsageError(_with_flags(message) + ".") from None


def _with_flags(message: str) -> str:
    """A ProfileSettings message with its field names written as the flags that set them:
    'raise max_bytes' -> 'raise --max-bytes'."""
    for flag, (field, _) in _FLAGS.items():
        message = re.sub(rf"\b{field}\b", flag, message)
    return message


def run_profile(args: argparse.Namespace) -> int:
    """Measure, write the database to `--output`, and print what was measured."""
    settings = settings_from_args(args)
    folder = Path(args.output).resolve().parent
    if not folder.is_dir():
        raise UsageError(
            f"--output {args.output!r}: folder {str(folder)!r} does not exist; create it or "
            "choose another path"
        )
    start = time.perf_counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("profiling", total=None)

        def report(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total)

        from runtime.measure import measure_profile  # torch: only to measure

        database = measure_profile(settings, report)
    database.save(args.output)
    print_profile(database)
    console.print(
        f"profile written to {args.output} in {time.perf_counter() - start:.1f} s; plan with "
        f"it: plan MODEL --profile {args.output}"
    )
    return 0


def print_profile(database: ProfileDatabase) -> None:
    """Tables of achieved matmul FLOP/s, elementwise bandwidth and collective times."""
    console.print(_matmul_table(database))
    console.print(_memory_table(database))
    if database.collectives:
        console.print(_collective_table(database))
    for note in database.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)


def _matmul_table(database: ProfileDatabase) -> Table:
    table = Table(title=f"matmul (torch.mm) on {database.device} ({database.device_name})")
    for column in ("dtype", "n", "n^3 ms", "n^3 GFLOP/s", "8n x n @ n x n/8 GFLOP/s"):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    square = {(s.dtype, s.k): s for s in database.matmul if s.m == s.k == s.n}
    skinny = {(s.dtype, s.k): s for s in database.matmul if not s.m == s.k == s.n}
    for (dtype, dim), s in sorted(square.items()):
        other = skinny.get((dtype, dim))
        table.add_row(
            dtype, str(dim), f"{s.seconds * 1e3:.3f}", f"{s.flops / s.seconds / 1e9:,.1f}",
            f"{other.flops / other.seconds / 1e9:,.1f}" if other else "-",
        )
    return table


def _memory_table(database: ProfileDatabase) -> Table:
    table = Table(title="elementwise add (reads a and b, writes c)")
    for column in ("bytes moved", "us", "GB/s"):
        table.add_column(column, justify="right")
    for nbytes, seconds in database.memory:
        table.add_row(
            format_bytes(nbytes), f"{seconds * 1e6:,.1f}", f"{nbytes / seconds / 1e9:,.2f}"
        )
    return table


def _collective_table(database: ProfileDatabase) -> Table:
    table = Table(
        title=f"collectives on {database.backend}: ms per call, as plans charge them",
        caption="the least time measured at each size or a larger one",
    )
    table.add_column("kind", no_wrap=True)
    table.add_column("ranks", justify="right")
    first = next(iter(next(iter(database.collectives.values())).values()))
    shown = _spread(len(first), _SHOWN_SIZES)
    for i in shown:
        table.add_column(format_bytes(first[i][0]), justify="right")
    for kind, groups in database.collectives.items():
        for n, points in sorted(groups.items()):
            seconds = (database.collective_time(kind, points[i][0], n) for i in shown)
            table.add_row(kind, str(n), *(f"{s * 1e3:.3f}" for s in seconds))
    return table


# Message sizes in the collective table: enough to see latency and bandwidth, few enough
# for an 80-column terminal.
_SHOWN_SIZES = 4


def _spread(count: int, most: int) -> list[int]:
    """Up to `most` indices into `count` items, evenly spread, first and last included."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})
