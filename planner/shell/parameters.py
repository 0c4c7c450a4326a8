"""The shell's parameters as the evaluator knows them: variables, arrays, positional
parameters, and what is not known about them.

A value is a tuple of `Word`s (one for a string, one per item for an array). A word knows
where its text was written (for `--explain-args`), the variable it came through (a node
count set by `NNODES=${SLURM_NNODES:-1}` is a default `--gpus` may change), and, when
Tessel cannot know its text, why: a command substitution it does not run, a loop it does
not run, an `if` on a condition it cannot evaluate, a `source`d file it does not read.
Variables the machine sets (`$PWD`, `$HOME`, ...) are kept as written, as paths whose
value changes neither time nor memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.shell.limits import Budget, check_length


@dataclass(frozen=True)
class Word:
    """One word of expanded text."""

    text: str
    line: int
    """Line where its text was written (an array item's line, a variable's assignment)."""
    unknown: str | None = None
    """Why its text cannot be known (the construct and its line); None when known."""
    machine: bool = False
    """Holds a variable the machine sets ($PWD, ...), kept as written."""
    via: str | None = None
    """The variable it was read through, when it is that variable's whole value."""


@dataclass(frozen=True)
class Variable:
    values: tuple[Word, ...]
    array: bool = False

    @property
    def text(self) -> str:
        """A string's text; an array's first item (bash's $A for an array)."""
        return self.values[0].text if self.values else ""

    @property
    def unknown(self) -> str | None:
        return next((w.unknown for w in self.values if w.unknown), None)


# Variables bash or the login sets on any machine, whose values are the machine's: kept as
# written ("$PWD") where they reach the training command, unknown in a condition.
MACHINE_VARIABLES = frozenset({
    "PWD", "OLDPWD", "HOME", "USER", "LOGNAME", "HOSTNAME", "SHELL", "PATH", "TMPDIR",
    "UID", "EUID", "PPID", "BASHPID", "RANDOM", "SECONDS", "LINENO", "HOSTTYPE", "OSTYPE",
})


@dataclass
class Parameters:
    """Variables and positional parameters at one point of a script's evaluation."""

    variables: dict[str, Variable] = field(default_factory=dict)
    positional: list[Word] = field(default_factory=list)
    script_name: str = "script"
    unset_unknown: str | None = None
    """Why a variable the script has not set may be set anyway (a `source`d file, an
    `eval`); None: unset is unset."""
    budget: Budget = field(default_factory=Budget)
    """What the whole evaluation has spent of its limits, shared by every copy."""

    def copy(self) -> Parameters:
        return Parameters(dict(self.variables), list(self.positional), self.script_name,
                          self.unset_unknown, self.budget)

    def get(self, name: str, line: int) -> Variable | None:
        """The variable `name` (positional and special ones included); None when unset."""
        if name.isdigit():
            index = int(name)
            if index == 0:
                return Variable((Word(self.script_name, line),))
            return Variable((self.positional[index - 1],)) \
                if index <= len(self.positional) else None
        if name == "#":
            return Variable((Word(str(len(self.positional)), line),))
        if name in ("?", "$", "!", "-"):
            return Variable((Word(f"${name}", line, unknown=f"${name} on line {line}, a value "
                                  "of the running shell"),))
        variable = self.variables.get(name)
        if variable is not None:
            return variable
        if name in MACHINE_VARIABLES:
            return Variable((Word(f"${name}", line, machine=True, via=name),))
        if self.unset_unknown:
            return Variable((Word(f"${name}", line, unknown=f"${name} ({self.unset_unknown} "
                                  "may set it)"),))
        return None

    def set(self, name: str, values: tuple[Word, ...], array: bool = False) -> None:
        """Sets `name`; ShellError where a string is longer than a word can be or the
        script's text comes to more than its limit (`planner.shell.limits`)."""
        line = values[-1].line if values else 0
        if array:  # its items were checked as they were expanded; each slot is copied
            self.budget.spend_text(len(values), line)
            self.variables[name] = Variable(values, array)
            return
        size = sum(len(w.text) for w in values)
        check_length(size, line)
        self.budget.spend_text(size, line)
        self.variables[name] = Variable(tuple(replace(w, via=w.via or name) for w in values))

    def unset(self, name: str) -> None:
        self.variables.pop(name, None)

    def taint(self, name: str, why: str, line: int) -> None:
        """`name` set to a value Tessel cannot know, for `why`."""
        self.variables[name] = Variable((Word(f"${name}", line, unknown=why),))
