"""Files a user names (a launch script, a TorchTitan job config, a Hugging Face
config.json, a cluster file), read with bounds: `read_user_file` reads only a regular file
and at most `MAX_BYTES` of it, and `parse_nested` parses its text with nesting bounded.

Without them a FIFO blocked the read forever, /dev/zero (or a symlink to it) read until
memory ran out, and a config nested 200,000 arrays deep ended in a RecursionError.
Every refusal is one line naming the file as the user gave it and the limit.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

MAX_BYTES = 1 << 20
"""The most read of one file: a launch script or a config is a few KiB (Megatron-LM's
example scripts in tests/planner/megatron/launch_scripts are 2 to 6 KiB), and a file of
1 MiB is still read and parsed in seconds."""

MAX_NESTING = 100
"""The deepest nesting of arrays and tables read: a config nests a few levels (a
text_config's rope_scaling is three); Python's parsers fail somewhere past a few hundred,
with a RecursionError that names nothing."""


class UserFileError(ValueError):
    """A file the user named that Tessel does not read; the message names it and why."""


class NotTextError(UserFileError):
    """A file the user named that is not UTF-8 text (a caller may word it as its format's
    error: not JSON, not a CSV)."""


def read_user_file(path: str | Path, named: str, give: str, limit: int = MAX_BYTES) -> str:
    """The text of the file at `path`; UserFileError, in one line starting with `named`
    (the file as the user gave it, e.g. "--args-file 'run.sh'") and ending "give `give`",
    when it is missing, not a regular file, over `limit` bytes, unreadable or not UTF-8.
    Nothing is read of a file that is not regular, and no more than `limit` + 1 bytes of
    one that is."""
    target = Path(path).expanduser()
    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer forever.
        handle = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise _unreadable(error, named, give) from None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise UserFileError(f"{named} is not a regular file (a pipe, a device or a "
                                f"folder); give {give}")
        # Read past the limit by a byte rather than trust st_size (a file may grow, and
        # /proc's files state a size of 0).
        with os.fdopen(handle, "rb", closefd=False) as file:
            data = file.read(limit + 1)
    except OSError as error:
        raise _unreadable(error, named, give) from None
    finally:
        os.close(handle)
    if len(data) > limit:
        raise UserFileError(f"{named} is over {_size(limit)}, the most Tessel reads of one "
                            f"file; give {give}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotTextError(f"{named} is not text (not UTF-8); give {give}") from None


def parse_nested(parse: Callable[[str], T], text: str, named: str) -> T:
    """`parse(text)` (json.loads, yaml.safe_load, tomllib.loads), refused in one line
    starting with `named` where the data nests deeper than `MAX_NESTING` or holds a
    number longer than Python converts. The parser's own syntax errors pass through for
    the caller to word."""
    try:
        data = parse(text)
    except RecursionError:
        raise _too_deep(named) from None
    except ValueError as error:
        # The parsers' syntax errors are subclasses; a plain ValueError is int()'s limit
        # on digits (sys.get_int_max_str_digits), which names no file.
        if type(error) is not ValueError:
            raise
        raise UserFileError(f"{named} holds a number of more than "
                            f"{sys.get_int_max_str_digits():,} digits; fix the file") from None
    _check_depth(data, named, 0, set())
    return data


def _check_depth(value: Any, named: str, depth: int, seen: set[int]) -> None:
    """UserFileError where `value` nests deeper than MAX_NESTING. Each container is
    walked once (YAML aliases share one object many times), and recursion stops at the
    limit, so a self-referencing alias is refused too."""
    if not isinstance(value, (dict, list, tuple)) or id(value) in seen:
        return
    if depth >= MAX_NESTING:
        raise _too_deep(named)
    for item in value.values() if isinstance(value, dict) else value:
        _check_depth(item, named, depth + 1, seen)
    seen.add(id(value))


def _too_deep(named: str) -> UserFileError:
    return UserFileError(f"{named} nests arrays or tables deeper than {MAX_NESTING} levels "
                         "(a config nests a few); fix the file")


def _unreadable(error: OSError, named: str, give: str) -> UserFileError:
    return UserFileError(f"{named} cannot be read ({error.strerror or error}); give {give}")


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB"
