"""planner.user_files: a file the user names is read only if regular and at most 1 MiB,
never more than a byte past that, and parsed with its nesting bounded; each refusal is
one line naming the file as the user gave it."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml

from planner.user_files import MAX_BYTES, UserFileError, parse_nested, read_user_file

NAMED = "--args-file 'x'"


def refusal(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(UserFileError) as caught:
        call(*args)
    return str(caught.value)


def test_a_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("a" * MAX_BYTES)
    assert len(read_user_file(tmp_path / "x", NAMED, "the script")) == MAX_BYTES


@pytest.mark.timeout(10)
def test_a_file_of_2_gib_is_refused_after_reading_a_mib_of_it(tmp_path: Path) -> None:
    with open(tmp_path / "x", "wb") as sparse:
        sparse.truncate(2 << 30)
    assert refusal(read_user_file, tmp_path / "x", NAMED, "the script") == (
        "--args-file 'x' is over 1 MiB, the most Tessel reads of one file; give the script")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "device", "link-to-a-device", "folder"])
def test_what_is_not_a_regular_file_is_never_read(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: opening it to read would wait forever
    elif kind == "link-to-a-device":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    assert refusal(read_user_file, path, NAMED, "the script") == (
        "--args-file 'x' is not a regular file (a pipe, a device or a folder); give the "
        "script")


def test_missing_and_binary_files_are_named(tmp_path: Path) -> None:
    assert refusal(read_user_file, tmp_path / "nowhere", NAMED, "the script") == (
        "--args-file 'x' cannot be read (No such file or directory); give the script")
    (tmp_path / "x").write_bytes(b"\xff\xfe")
    assert refusal(read_user_file, tmp_path / "x", NAMED, "the script") == (
        "--args-file 'x' is not text (not UTF-8); give the script")


DEEP = ("cluster file 'c' nests arrays or tables deeper than 100 levels (a config nests a "
        "few); fix the file")


@pytest.mark.parametrize("parse, nested", [
    (json.loads, lambda depth: "[" * depth + "]" * depth),
    (yaml.safe_load, lambda depth: "[" * depth + "]" * depth),
    (yaml.safe_load, lambda depth: "- " * depth + "x"),
    (tomllib.loads, lambda depth: "a = " + "[" * (depth - 1) + "]" * (depth - 1)),
])
def test_nesting_of_100_levels_is_read_and_deeper_is_refused(parse, nested) -> None:
    assert parse_nested(parse, nested(100), "cluster file 'c'") is not None
    assert refusal(parse_nested, parse, nested(101), "cluster file 'c'") == DEEP
    # Far deeper, the parser's own RecursionError is the same one line.
    assert refusal(parse_nested, parse, nested(20_000), "cluster file 'c'") == DEEP


def test_yaml_aliases_are_walked_once_and_a_self_reference_is_refused() -> None:
    # A billion items by aliases, ten distinct lists: read at once, not walked a billion
    # times.
    laughs = "a0: &a0 [" + ",".join(["x"] * 10) + "]\n" + "".join(
        f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
    assert len(parse_nested(yaml.safe_load, laughs, "cluster file 'c'")) == 10
    assert refusal(parse_nested, yaml.safe_load, "a: &a [*a]", "cluster file 'c'") == DEEP


@pytest.mark.parametrize("parse, text", [(json.loads, '{"a": %s}'), (yaml.safe_load, "a: %s"),
                                         (tomllib.loads, "a = %s")])
def test_a_number_of_5000_digits_is_named(parse, text: str) -> None:
    assert refusal(parse_nested, parse, text % ("9" * 5_000), "cluster file 'c'") == (
        "cluster file 'c' holds a number of more than 4,300 digits; fix the file")


def test_the_parsers_own_syntax_errors_pass_through() -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_nested(json.loads, "{", "cluster file 'c'")
