"""Where the tests find the read-only shared inputs (`../shared` beside the checkout, or
`TESSEL_SHARED`): `plan predict` reads Megatron-LM's option list through
TESSEL_MEGATRON_ARGUMENTS, set here when the checkout is not beside them (a CI clone).

Fixtures of the tests that run the `plan` command line: `piped_width` and
`one_line_error`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(os.environ["TESSEL_SHARED"])] if "TESSEL_SHARED" in os.environ else []
_CANDIDATES += [REPO.parent / "shared", Path("/work/shared")]
SHARED = next((p for p in _CANDIDATES if (p / "reference").is_dir()), None)

if SHARED is not None and "TESSEL_MEGATRON_ARGUMENTS" not in os.environ:
    os.environ["TESSEL_MEGATRON_ARGUMENTS"] = str(
        SHARED / "reference" / "megatron_lm_arguments.json")


@pytest.fixture
def piped_width(monkeypatch) -> None:
    """The width rich uses when stdout is not a terminal (a pipe, a CI log): 80 columns,
    unless COLUMNS was set when planner.cli was imported. Fixed here so the one-line
    check does not depend on the environment."""
    from planner import cli

    monkeypatch.setattr(cli.console, "_width", 80)


@pytest.fixture
def one_line_error(piped_width, capsys) -> Callable[[list[str]], str]:
    """`run(argv)` runs `plan argv` at a pipe's width and checks that it refused its input
    as the command line refuses a mistake: exit status 2, no traceback, one line. It
    returns that output (stdout, then stderr)."""
    from planner import cli

    def run(argv: list[str]) -> str:
        code = cli.main(argv)
        captured = capsys.readouterr()
        output = captured.out + captured.err
        assert code == 2, output
        assert "Traceback" not in output
        assert len(output.strip().splitlines()) == 1, output
        return output

    return run
