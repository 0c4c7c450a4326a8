"""A launch line or script, read as the shell reads it, down to the training script's flags.

`launch_words` reads a command or a script: backslash continuations joined, comments and
blank lines dropped, `NAME=value` and `NAME=( ... )` assignments remembered and expanded
where the command uses them, and the one command that runs a `*.py` script picked out.
`split_launcher` sets aside leading environment assignments and the launcher before the
script; torchrun's --nnodes x --nproc-per-node is the world size.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from planner.megatron.errors import LaunchLineError


@dataclass(frozen=True)
class LaunchLine:
    """The flags a training script gets, and what the launcher says about the world."""

    flags: list[str]
    """The script's command-line words, in order."""
    script: str | None = None
    """The training script (`pretrain_gpt.py`), when the line names one."""
    launcher: list[str] = field(default_factory=list)
    """The launcher's words before the script (`torchrun --nnodes 8 ...`)."""
    world_size: int | None = None
    """Processes the launcher starts (--nnodes x --nproc-per-node), when it says."""


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# NAME=( item ... ), possibly over several lines (bash arrays, as Megatron-LM's example
# scripts hold their flags).
_ARRAY = re.compile(r"^\s*(?:export\s+|declare\s+-a\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"=\((?P<body>.*)\)\s*(?:#.*)?$", re.DOTALL)
_ARRAY_START = re.compile(r"^\s*(?:export\s+|declare\s+-a\s+)?[A-Za-z_][A-Za-z0-9_]*=\(")
# $NAME, ${NAME}, ${NAME[@]}, ${NAME[*]}, ${NAME:-default}
_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?(?::-(?P<default>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)
# Shell words that only qualify an assignment.
_DECLARATIONS = ("export", "declare", "local", "readonly")


def launch_words(text: str) -> LaunchLine:
    """The launch line in a shell command or script: continuations joined, comments and
    blank lines dropped, `NAME=value` and `NAME=( ... )` assignments remembered and
    expanded where the command uses them, and the command split as the shell splits it.
    A script is read at the one command that runs a `*.py` script (other commands, such
    as `mkdir`, are skipped); text of flags alone is taken whole."""
    variables: dict[str, str | list[str]] = {}
    commands: list[list[str]] = []
    for line in _logical_lines(text):
        array = _ARRAY.match(line)
        if array:
            variables[array["name"]] = _expand(_shell_words(array["body"]), variables)
            continue
        words = _shell_words(line)
        if words and words[0] in _DECLARATIONS:
            words = [w for w in words[1:] if not w.startswith("-")]
        if words and all(_ASSIGNMENT.match(w) for w in words):
            for word in words:
                name, _, value = word.partition("=")
                variables[name] = " ".join(_expand([value], variables))
        elif words:
            commands.append(_expand(words, variables))
    launches = [words for words in commands if _script_index(_unprefixed(words)) is not None]
    if len(launches) > 1:
        raise LaunchLineError(
            f"the launch text runs {len(launches)} training scripts; keep the one to predict"
        )
    if launches:
        return split_launcher(launches[0])
    others = [words[0] for words in commands if not words[0].startswith("-")]
    if others:
        raise LaunchLineError(
            f"no command of the launch text runs a *.py training script (it runs "
            f"{', '.join(dict.fromkeys(others))}); give the line that runs pretrain_gpt.py, "
            "or only its flags"
        )
    return LaunchLine(flags=[word for words in commands for word in words])


def split_launcher(words: Sequence[str]) -> LaunchLine:
    """The script's flags from a launch line already split into words: leading
    `NAME=value` words and the launcher up to and including the `*.py` script are set
    aside; torchrun's --nnodes x --nproc-per-node is the world size. Words that start
    with a flag are flags only."""
    words = _unprefixed(list(words))
    if not words or words[0].startswith("-"):
        return LaunchLine(flags=words)
    index = _script_index(words)
    if index is None:
        raise LaunchLineError(
            f"the launch line starts {words[0]!r} but runs no *.py training script; give "
            "the line that runs pretrain_gpt.py, or only its flags"
        )
    launcher = words[:index]
    return LaunchLine(flags=words[index + 1:], script=words[index], launcher=launcher,
                      world_size=_torchrun_world(launcher))


def _unprefixed(words: list[str]) -> list[str]:
    """The command without its leading `NAME=value` environment assignments."""
    index = 0
    while index < len(words) and _ASSIGNMENT.match(words[index]):
        index += 1
    return words[index:]


def _script_index(words: list[str]) -> int | None:
    """Index of the `*.py` script a command runs (its first such word); None for flags
    alone or a command that runs none."""
    if not words or words[0].startswith("-"):
        return None
    return next((i for i, word in enumerate(words) if word.endswith(".py")), None)


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and `NAME=( ... )` arrays kept whole."""
    lines, pending = [], ""
    for raw in re.sub(r"\\\r?\n", " ", text).splitlines():
        pending = f"{pending}\n{raw}" if pending else raw
        if _ARRAY_START.match(pending) and not _ARRAY.match(pending):
            continue  # an array that goes on over the next lines
        lines.append(pending)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _shell_words(line: str) -> list[str]:
    """A line's words as the shell splits them, comments dropped."""
    try:
        return shlex.split(line, comments=True)
    except ValueError as error:  # an unclosed quote
        raise LaunchLineError(
            f"cannot read {line.strip()[:60]!r} in the launch line ({error}); close the quote"
        ) from None


def _expand(words: list[str], variables: dict[str, str | list[str]]) -> list[str]:
    """Shell variables the text defines, expanded: a word that is one variable becomes its
    words (an array's items; a string split as an unquoted expansion splits it), one
    inside a word is replaced by its text. Variables it does not define stay as written
    (the environment's, e.g. a data path, which the flags' reader may ignore)."""
    expanded: list[str] = []
    for word in words:
        if word in ("$@", "$*"):
            continue  # the script's own arguments: none when read from a file
        whole = _VARIABLE.fullmatch(word)
        name = whole and (whole["braced"] or whole["plain"])
        if whole and name in variables:
            value = variables[name]
            expanded += value.split() if isinstance(value, str) else value
            continue
        if whole and whole["default"] is not None:
            expanded += whole["default"].split()
            continue

        def text(match: re.Match[str]) -> str:
            value = variables.get(match["braced"] or match["plain"])
            if value is not None:
                return value if isinstance(value, str) else " ".join(value)
            return match["default"] if match["default"] is not None else match[0]

        expanded.append(_VARIABLE.sub(text, word))
    return expanded


def _torchrun_world(launcher: list[str]) -> int | None:
    """--nnodes x --nproc-per-node of the torchrun (or `python -m torch.distributed.run`)
    in a launcher; None without one, when it gives neither, or when it leaves the count to
    the machines (a range of nodes, `--nproc-per-node gpu`)."""
    start = next((i for i, word in enumerate(launcher)
                  if Path(word).name == "torchrun" or word in _TORCHRUN_MODULES), None)
    if start is None:
        return None
    options: dict[str, str] = {}
    words = launcher[start + 1:]
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if name.startswith("-") and key in ("nnodes", "nproc-per-node", "standalone"):
            if not equals and key != "standalone":
                value = words[index + 1] if index + 1 < len(words) else ""
            options[key] = value
    if "nnodes" not in options and "nproc-per-node" not in options:
        return None
    nodes = "1" if "standalone" in options else options.get("nnodes", "1")
    per_node = options.get("nproc-per-node", "1")  # torchrun's default
    low, _, high = nodes.partition(":")
    if high and low == high:
        nodes = low  # "8:8" is 8 nodes
    if not (nodes.isdigit() and per_node.isdigit()) or int(nodes) < 1 or int(per_node) < 1:
        return None
    return int(nodes) * int(per_node)


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
