"""Errors a user can act on, and the one handler that reports every failure.

The contract (README): a mistake exits with status 2 and one line saying what to change;
`plan check` exits 1 only when the check ran and the runs differ; an interrupt exits 130,
as shells expect. `--debug` adds the traceback and keeps the exit code.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path

from rich.console import Console
from rich.markup import escape

INPUT_ERROR = 2
INTERRUPTED = 130
# Exceptions raised by these packages carry messages written for the user.
_PACKAGES = ("planner", "passes", "cost_models", "runtime")


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says what to change."""


def one_line(error: BaseException) -> str:
    """The error's message on one line. Errors of our own (ValueError and its kin, file
    errors) speak for themselves; anything else is named, as it may be a bug."""
    if isinstance(error, OSError) and error.strerror:
        where = f" {error.filename!r}" if error.filename else ""
        text = f"cannot use{where}: {error.strerror}"
    else:
        text = " ".join(str(error).split())
    ours = type(error).__module__.partition(".")[0] in _PACKAGES
    if not (ours or isinstance(error, (ValueError, OSError))):
        # Named once where it says nothing more ("MemoryError", not "MemoryError: MemoryError").
        named = f"{type(error).__name__}: {text}" if text else type(error).__name__
        text = f"{named} (rerun with --debug for the traceback)"
    return text or type(error).__name__


def report_failure(error: BaseException, console: Console, debug: bool) -> int:
    """Print `error` as one line (after its traceback with `debug`); the exit code."""
    if debug:
        traceback.print_exception(error)
        detail = getattr(error, "rank_traceback", None)
        if detail:
            console.print(detail, highlight=False, markup=False)
    if isinstance(error, KeyboardInterrupt):
        console.print("interrupted", highlight=False)
        return INTERRUPTED
    console.print(f"[red]error:[/red] {escape(one_line(error))}", highlight=False,
                  soft_wrap=True)
    return INPUT_ERROR


def check_output_file(flag: str, path: str) -> None:
    """UsageError unless `path` can be written as a file, checked before any work is done
    so that a long run is not thrown away at the end. Leaves no file behind. '-' is
    stdout."""
    if path == "-":
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"{flag} {path!r} is a directory; give a file path")
    folder = target.resolve().parent
    if not folder.is_dir():
        raise UsageError(
            f"{flag} {path!r}: folder {str(folder)!r} does not exist; create it or choose "
            "another path"
        )
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as error:
        raise UsageError(
            f"{flag} {path!r} cannot be written ({error.strerror}); choose another path"
        ) from None
    if not existed:
        os.unlink(target)


def check_output_folder(flag: str, path: str) -> None:
    """UsageError unless `path` is (or can be made) a folder files can be written into."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {path!r} is a file; give a folder path")
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as error:
        raise UsageError(
            f"{flag} {path!r} cannot be written ({error.strerror}); choose another folder"
        ) from None
