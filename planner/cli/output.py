"""Where a command's results go: JSON to a file, or with `--json -` to stdout (the tables
then go to stderr, so `plan ... --json - | jq` reads only JSON); launch lines as shell
commands that fit 80 columns and paste as they are."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from planner.cli.console import console

STDOUT = "-"
WIDTH = 80


def json_to_stdout(path: str | None) -> bool:
    """Whether `--json` names stdout; if so, the console moves to stderr."""
    if path == STDOUT:
        console.file = sys.stderr
        return True
    return False


def write_json(path: str, text: str, what: str) -> None:
    """`text` (JSON) to the file `path`, saying so, or to stdout for '-'."""
    if path == STDOUT:
        sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
        return
    Path(path).write_text(text.rstrip("\n") + "\n")
    console.print(f"{what} written to {path}")


def shell_lines(words: list[str], width: int = WIDTH) -> str:
    """`words` (a command and its arguments, each flag followed by its values) as a shell
    command over lines of at most `width` columns where a word allows it, continued with
    ' \\'; a flag stays on the line of its first value."""
    groups: list[str] = []
    for word in words:
        quoted = word if word.startswith("$") and " " not in word else shlex.quote(word)
        if groups and not word.startswith("-") and groups[-1].startswith("-") \
                and " " not in groups[-1]:
            groups[-1] += " " + quoted
        else:
            groups.append(quoted)
    lines, current = [], ""
    for group in groups:
        if current and len(current) + 1 + len(group) + 2 > width:
            lines.append(current + " \\")
            current = "    " + group
        else:
            current = f"{current} {group}" if current else group
    lines.append(current)
    return "\n".join(lines)
