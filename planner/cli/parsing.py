"""argparse, made to answer in one line: bad flags and values raise `UsageError`.

argparse's own way is to print the whole usage and exit; a user who misspelt one flag
wants to hear which flag and what it probably was (`--tensor-parallel-size` ->
`--tensor-model-parallel-size`). Value types bound every number, so that no input asks
for more work than can finish (a 10^9-GPU cluster, a million training steps).
"""

from __future__ import annotations

import argparse
import difflib
import math
from typing import Callable, NoReturn, Sequence

from planner.cli.errors import UsageError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one-line `UsageError`s naming the flag as typed,
    with the closest known flag for an unknown one. `-h` prints the usage as usual."""

    def __init__(
        self, *args, unknown_hint: Callable[[str], str] | None = None, **kwargs
    ) -> None:
        """`unknown_hint(flag)`: the advice after "unknown option FLAG; " for an unknown
        option that is no misspelling of a known one (default: "see PROG -h"), e.g. to
        say where a command's pass-through flags go."""
        # Abbreviations make a misspelt prefix silently mean another flag.
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.unknown_hint = unknown_hint

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._unknown(extra[0])
        return parsed

    def _unknown(self, word: str) -> NoReturn:
        if not word.startswith("-") or word == "-":
            raise UsageError(
                f"{self.prog}: unexpected argument {word!r}; see {self.prog} -h"
            )
        flag = word.split("=", 1)[0]
        known = [o for action in self._actions for o in action.option_strings]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]}?"
        elif self.unknown_hint:
            hint = self.unknown_hint(flag)
        else:
            hint = f"see {self.prog} -h"
        raise UsageError(f"{self.prog}: unknown option {flag}; {hint}")

    def error(self, message: str) -> NoReturn:
        # "argument --gpus: 0 must be ..." -> "--gpus 0 must be ..."; argparse's own
        # wording elsewhere ("the following arguments are required: model").
        if message.startswith("argument "):
            flag, _, rest = message.removeprefix("argument ").partition(": ")
            flag = flag.split("/")[0]
            if rest.startswith("invalid choice: "):
                rest = rest.removeprefix("invalid choice: ")
                rest = rest.replace("(choose from", "is not one of").rstrip(")").replace("'", "")
            message = f"{flag} {rest}"
        raise UsageError(message)


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} must be from {low} to {high:,}")
        return value

    parse.__name__ = "whole number"
    return parse


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above `low`, at most `high`."""
    return _finite("seconds", "a number of seconds", lambda v: low < v <= high,
                   f"must be more than {low:g} and at most {high:g} seconds")


def number(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number from `low` to `high` (a factor, a threshold)."""
    return _finite("number", "a number", lambda v: low <= v <= high,
                   f"is not between {low:g} and {high:g}")


def gibibytes(high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of GiB from 0 to `high`."""
    return _finite("GiB", "a number of GiB", lambda v: 0 <= v <= high,
                   f"must be from 0 to {high:g} GiB")


def _finite(name: str, noun: str, within: Callable[[float], bool],
            bounds: str) -> Callable[[str], float]:
    """An argparse type named `name`: a finite float for which `within` holds; else
    "'x' is not `noun`" or "x `bounds`"."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not (math.isfinite(value) and within(value)):
            raise argparse.ArgumentTypeError(f"{text} {bounds}")
        return value

    parse.__name__ = name
    return parse


def rank_range(most: int) -> Callable[[str], tuple[int, int]]:
    """argparse type of MIN:MAX ranks, 1 <= MIN <= MAX <= `most` (--elastic)."""
    def parse(text: str) -> tuple[int, int]:
        low, sep, high = text.partition(":")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX (e.g. 2:4)")
        pair = int(low), int(high)
        if not 1 <= pair[0] <= pair[1] <= most:
            raise argparse.ArgumentTypeError(f"{text} needs 1 <= MIN <= MAX <= {most:,}")
        return pair
    return parse


def training_only(parser: argparse.ArgumentParser, *actions: argparse.Action) -> None:
    """Mark `actions` as training-plan flags: (flag, dest, default) of each joins the
    parser's `training_flags`, so that a plan on --mesh refuses them by name
    (`parallel_flags.training_flags_given`)."""
    given = parser.get_default("training_flags") or ()
    parser.set_defaults(training_flags=(*given, *(
        (action.option_strings[0], action.dest, action.default) for action in actions)))
