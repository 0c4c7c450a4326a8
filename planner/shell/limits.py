"""The bounds on reading one script, so that no script runs the reader out of time or
memory: `A="$A$A"` forty times asks for a 1 TiB value, a function calling another ten
times over seven levels for ten million commands.

Each limit is far above what a launch script needs (Megatron-LM's examples, in
tests/planner/megatron/launch_scripts, set values of under a KiB and take a few hundred
steps), and each refusal is one line naming the limit and the line of the script where
it was reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.shell.lexer import ShellError

MAX_WORD = 128 << 10
"""The longest value or word, in characters: 128 KiB is the most Linux passes as one
argument to a command (MAX_ARG_STRLEN), so bash could not hand a longer word to the
training command either."""

MAX_TEXT = 64 << 20
"""All the text the script's expansions produce and its assignments store, with each
array slot and variable copied counted as a character (work done at C speed):
Megatron-LM's example launch scripts come to 2 to 5 KiB; 64 MiB take well under a
second."""

MAX_STEPS = 500_000
"""Work done a Python step at a time: commands evaluated, words made, variables merged
after both sides of an `if` Tessel cannot decide, characters matched against a pattern.
Megatron-LM's example launch scripts take 165 to 389; 500,000 take about 1.5 s here."""


def check_length(size: int, line: int) -> None:
    """ShellError where a word or value of `size` characters, made on `line`, is longer
    than MAX_WORD."""
    if size > MAX_WORD:
        raise ShellError(f"line {line}: a value of {size:,} characters, longer than the "
                         f"{MAX_WORD:,} (128 KiB) Linux passes as one word to a command "
                         "(MAX_ARG_STRLEN); Tessel stops there")


@dataclass
class Budget:
    """What one script's evaluation has spent, shared by every way it follows."""

    text: int = 0
    steps: int = 0
    line: int = 0
    """The line of the command being evaluated, named where a limit is reached."""

    def spend_text(self, size: int, line: int | None = None) -> None:
        """Counts `size` characters (or slots) copied; ShellError past MAX_TEXT."""
        self.text += size
        if self.text > MAX_TEXT:
            raise ShellError(f"line {line or self.line}: the script's values come to more "
                             f"than {MAX_TEXT >> 20} MiB of text in all (a launch script's "
                             "come to a few KiB); Tessel stops there")

    def spend_steps(self, count: int, line: int | None = None) -> None:
        """Counts `count` steps; ShellError past MAX_STEPS."""
        self.steps += count
        if self.steps > MAX_STEPS:
            raise ShellError(f"line {line or self.line}: reading the script takes more than "
                             f"{MAX_STEPS:,} steps (commands, values copied at each `if` "
                             "Tessel cannot decide, characters matched against a pattern; "
                             "a launch script takes a few hundred); Tessel stops there")
