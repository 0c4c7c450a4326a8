"""A bash script evaluated as bash would run it, with no command ever run.

`evaluate_script` walks the syntax tree (`planner.shell.syntax`) in order: assignments and
arrays change the parameters, `if` / `case` / `&&` / `||` take the branch their condition
selects (`planner.shell.conditions`), functions are called, `exit` stops. Commands other
than the shell's own are never run: those that run a Python script (and lines of flags
alone) are kept, with their words expanded (`planner.shell.words`); the others are only
named. Where the answer depends on what Tessel cannot know (a file test, a command's exit
status, a command substitution's output), every way the script could go is followed and
what differs between them is marked unknown, with the construct and its line, never
guessed: a value, or a command that runs on one side only. Loops are not run: what they
assign is unknown, and a command inside one is unknown. `source` and `eval` make every
value set before them (and every unset one) unknown, as the file or text could set it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable, Literal, Mapping, Sequence

from planner.shell.arithmetic import Unknown, evaluate
from planner.shell.conditions import double_bracket, single_bracket
from planner.shell.parameters import Parameters, Variable, Word
from planner.shell.lexer import DECLARATIONS, Raw, ShellError, is_name
from planner.shell.static import assigned_names, simple_commands
from planner.shell.syntax import (
    AndOr, Arith, Assign, Case, Command, FunctionDef, Group, If, Loop, Pipeline,
    Sequence as Commands, Simple, Test, parse,
)
from planner.shell.words import expand, expand_pattern, expand_text

Status = int | None
"""A command's exit status: 0, another number, or None when it cannot be known."""

# Commands that only mention a script (print, copy, look for it): never the training run.
_MENTIONS = frozenset({
    "echo", "printf", "cat", "tee", "grep", "egrep", "sed", "awk", "ls", "mkdir", "cp", "mv",
    "rm", "touch", "ln", "chmod", "chown", "sleep", "wait", "cd", "pushd", "popd", "test",
    "[", "wget", "curl", "git", "pip", "pip3", "nvidia-smi", "hostname", "date", "tail",
    "head", "sort", "tr", "cut", "basename", "dirname", "readlink", "realpath", "find",
    "which", "type", "trap", "kill", "ps", "env_check", "logger", "tar", "scp", "rsync",
})
# Words that run the command after them: read through.
_PREFIXES = frozenset({"exec", "command", "builtin", "nohup", "time", "env"})
_MOST_CALLS = 64
# The shell's own commands that change what the evaluator knows, by the method that
# carries each out.
_BUILTINS = {"unset": "_unset", "shift": "_shift", "set": "_set", "exit": "_exit",
             "return": "_return", "source": "_source", ".": "_source", "eval": "_eval",
             "let": "_let", "test": "_test", "[": "_test", "read": "_read",
             "mapfile": "_read", "readarray": "_read", "getopts": "_read",
             "printf": "_printf"}


@dataclass(frozen=True)
class Ran:
    """A command of the script Tessel keeps: one that runs a Python script, or a line of
    flags alone."""

    words: tuple[Word, ...]
    line: int
    kind: Literal["script", "flags"]
    env: tuple[str, ...] = ()
    """Its `NAME=value` prefix, as written after expansion."""
    unknown: str | None = None
    """Why Tessel cannot know whether it runs, or what it runs; None when it can."""


@dataclass(frozen=True)
class ScriptRun:
    """What a script runs, as far as the training command goes."""

    commands: tuple[Ran, ...]
    """The commands that run a Python script and the lines of flags alone, in order."""
    others: tuple[str, ...]
    """The names of the other commands it runs (echo, mkdir, ...), in order, once each."""


class _Exit(Exception):
    """`exit`: the script stops."""


class _Return(Exception):
    """`return`: the function stops."""


@dataclass
class _State:
    parameters: Parameters
    functions: dict[str, Command] = field(default_factory=dict)
    ran: list[Ran] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    locals: list[dict[str, Variable | None]] = field(default_factory=list)
    calls: int = 0

    def copy(self) -> _State:
        # Copied where both sides of an `if` are followed: each slot is text copied.
        self.parameters.budget.spend_text(
            len(self.parameters.variables) + len(self.functions) + len(self.ran)
            + len(self.others))
        return _State(self.parameters.copy(), dict(self.functions), list(self.ran),
                      list(self.others), [dict(frame) for frame in self.locals], self.calls)


class _Evaluator:
    def run(self, commands: Commands, state: _State) -> Status:
        status: Status = 0
        for item in commands.items:
            status = self._and_or(item, state)
        return status

    def _and_or(self, node: AndOr, state: _State) -> Status:
        status = self._pipeline(node.first, state)
        for op, pipeline in node.rest:
            runs = status == 0 if op == "&&" else status not in (0, None)
            if status is None:
                why = f"the exit status before {op} on line {pipeline.line}, which Tessel " \
                      "cannot know"
                status = self._branches(state, [
                    lambda s, p=pipeline: self._pipeline(p, s), lambda s: None], why)
            elif runs:
                status = self._pipeline(pipeline, state)
        return status

    def _pipeline(self, node: Pipeline, state: _State) -> Status:
        if len(node.commands) == 1:
            status = self._command(node.commands[0], state)
        else:  # each part in a subshell of its own: only what it runs is kept
            status = 0
            for command in node.commands:
                status = self._subshell(lambda s, c=command: self._command(c, s), state)
        if node.negated:
            return None if status is None else int(status == 0)
        return status

    def _subshell(self, action: Callable[[_State], Status], state: _State) -> Status:
        inner = state.copy()
        try:
            status = action(inner)
        except _Exit:
            status = None
        state.ran[:] = inner.ran
        state.others[:] = inner.others
        return status

    def _command(self, node: Command, state: _State) -> Status:
        budget = state.parameters.budget
        budget.line = node.line
        budget.spend_steps(1)
        if isinstance(node, Simple):
            return self._simple(node, state)
        if isinstance(node, If):
            return self._if(node.clauses, node.otherwise, node.line, state)
        if isinstance(node, Case):
            return self._case(node, state)
        if isinstance(node, Loop):
            return self._loop(node, state)
        if isinstance(node, Group):
            if node.subshell:
                return self._subshell(lambda s: self.run(node.body, s), state)
            return self.run(node.body, state)
        if isinstance(node, FunctionDef):
            state.functions[node.name] = node.body
            return 0
        if isinstance(node, Test):
            return _status(double_bracket(node.words, state.parameters))
        if isinstance(node, Arith):
            text = expand_text(node.expression, state.parameters)
            if text.unknown or text.machine:
                return None
            try:
                return _status(evaluate(text.text, state.parameters, node.line) != 0)
            except Unknown:
                return None
        raise AssertionError(node)

    # -- branches ------------------------------------------------------------------------

    def _if(self, clauses: tuple[tuple[Commands, Commands], ...], otherwise: Commands | None,
            line: int, state: _State) -> Status:
        for index, (condition, body) in enumerate(clauses):
            status = self.run(condition, state)
            if status == 0:
                return self.run(body, state)
            if status is None:
                why = f"the condition of the `if` on line {line}, which Tessel cannot " \
                      "evaluate (a file test, a command's status or a value it does not know)"
                rest = clauses[index + 1:]
                return self._branches(state, [
                    lambda s, b=body: self.run(b, s),
                    lambda s, r=rest: self._if(r, otherwise, line, s)], why)
        return self.run(otherwise, state) if otherwise is not None else 0

    def _case(self, node: Case, state: _State) -> Status:
        subject = expand_text(node.subject, state.parameters)
        if subject.unknown or subject.machine:
            why = f"the `case` on line {node.line}, whose word Tessel cannot know"
            return self._branches(state, [lambda s, b=body: self.run(b, s)
                                          for _, body in node.items] + [lambda s: 0], why)
        for patterns, body in node.items:
            for pattern in patterns:
                if expand_pattern(pattern, state.parameters).matches(subject.text):
                    return self.run(body, state)
        return 0

    def _branches(self, state: _State, actions: list[Callable[[_State], Status]],
                  why: str) -> Status:
        """Every way the script could go from here, merged into `state`: what the ways
        agree on is kept, what they do not is unknown for `why`. A way that exits is
        dropped (the script is taken to reach its training command)."""
        ways: list[tuple[_State, Status]] = []
        for action in actions:
            way = state.copy()
            try:
                status = action(way)
            except _Exit:
                continue
            except _Return:
                status = 0
            ways.append((way, status))
        if not ways:
            raise _Exit
        self._merge(state, [way for way, _ in ways], why)
        statuses = {status for _, status in ways}
        return statuses.pop() if len(statuses) == 1 else None

    def _merge(self, state: _State, ways: list[_State], why: str) -> None:
        names = set().union(*(way.parameters.variables for way in ways))
        known = len(state.ran)
        added = [way.ran[known:] for way in ways]
        state.parameters.budget.spend_steps(
            len(names) + sum(len(way.others) + len(more) for way, more in zip(ways, added)))
        first = ways[0].parameters
        for name in sorted(names):
            values = [way.parameters.variables.get(name) for way in ways]
            if all(_same(value, values[0]) for value in values):
                if values[0] is None:
                    state.parameters.unset(name)
                else:
                    state.parameters.variables[name] = values[0]
            else:
                state.parameters.taint(name, f"${name}, set differently by {why}", 0)
        state.parameters.positional = first.positional
        state.parameters.unset_unknown = next(
            (way.parameters.unset_unknown for way in ways if way.parameters.unset_unknown),
            None)
        for way in ways:
            state.functions.update(way.functions)
        if all(commands == added[0] for commands in added):
            state.ran += added[0]
        else:
            seen = dict.fromkeys(command for commands in added for command in commands)
            state.ran += [_unknown(command, f"it runs only on one side of {why}")
                          for command in seen]
        named = set(state.others)
        for way in ways:
            for name in way.others:
                if name not in named:
                    named.add(name)
                    state.others.append(name)

    # -- loops -------------------------------------------------------------------------------

    def _loop(self, node: Loop, state: _State) -> Status:
        why = f"the {node.kind} loop on line {node.line}, which Tessel does not run"
        names = set(assigned_names(node.body, state.functions))
        if node.variable:
            names.add(node.variable)
        if node.head is not None:
            names |= set(assigned_names(node.head, state.functions))
        for name in sorted(names):
            state.parameters.taint(name, f"${name}, set in {why}", node.line)
        for simple in simple_commands(node.body, state.functions):
            texts = [raw.text for raw in simple.words]
            if texts and _basename(texts[0]) not in _MENTIONS and any(
                    ".py" in text for text in texts):
                state.ran.append(Ran(tuple(Word(t, r.line) for t, r in zip(texts, simple.words)),
                                     simple.line, "script",
                                     unknown=f"it runs inside {why}"))
        return None

    # -- simple commands ---------------------------------------------------------------------

    def _simple(self, node: Simple, state: _State) -> Status:
        parameters = state.parameters
        words = [word for raw in node.words for word in expand(raw, parameters)]
        if not words:
            unknown = False
            for assign in node.assigns:
                unknown |= self._assign(assign, state) is not None
            return None if unknown else 0
        env = [self._env(assign, parameters) for assign in node.assigns]
        return self._run(words, env, node, state)

    def _run(self, words: list[Word], env: list[str], node: Simple, state: _State) -> Status:
        name = words[0].text
        args = words[1:]
        if name in _PREFIXES and args:
            if name == "env":
                while args and re.match(r"[A-Za-z_]\w*=", args[0].text):
                    env.append(args[0].text)
                    args = args[1:]
                if not args:
                    return 0
            return self._run(args, env, node, state)
        if name in DECLARATIONS:
            return self._declare(name, args, node, state)
        builtin = _BUILTINS.get(name)
        if builtin is not None and not words[0].unknown:
            return getattr(self, builtin)(args, node, state)
        if name in (":", "true"):
            return 0
        if name == "false":
            return 1
        if name in state.functions and not words[0].unknown:
            return self._call(name, args, state)
        script = next((w for w in words if w.text.endswith(".py")), None)
        unknown_name = words[0].unknown and any(".py" in w.text for w in words)
        if _basename(name) in ("bash", "sh") and len(args) >= 2 and args[0].text == "-c" \
                and ".py" in args[1].text:
            state.ran.append(Ran(tuple(words), node.line, "script", tuple(env),
                                 unknown=f"it runs its command from a string ({name} -c)"))
            return None
        if (script is not None and _basename(name) not in _MENTIONS) or unknown_name:
            state.ran.append(Ran(tuple(words), node.line, "script", tuple(env)))
            return None
        if name.startswith("-"):
            state.ran.append(Ran(tuple(words), node.line, "flags", tuple(env)))
            return 0
        if name not in state.others:
            state.others.append(name)
        return 0 if name in ("echo", "printf") else None

    def _env(self, assign: Assign, parameters: Parameters) -> str:
        value = "" if assign.value is None else expand_text(assign.value, parameters).text
        return f"{assign.name}={value}"

    def _assign(self, assign: Assign, state: _State) -> str | None:
        """Carries out `assign`; why its value is unknown, or None."""
        parameters = state.parameters
        if assign.items is not None:
            values = tuple(w for raw in assign.items for w in expand(raw, parameters))
            if assign.append:
                old = parameters.get(assign.name, assign.line)
                values = (old.values if old else ()) + values
            parameters.set(assign.name, values, array=True)
            return next((w.unknown for w in values if w.unknown), None)
        assert assign.value is not None
        word = expand_text(assign.value, parameters)
        old = parameters.get(assign.name, assign.line)
        if assign.index is not None:
            return self._assign_item(assign, word, old, state)
        if assign.append and old is not None:
            if old.array:
                parameters.set(assign.name, old.values + (word,), array=True)
                return word.unknown
            word = Word(old.text + word.text, assign.line, old.unknown or word.unknown,
                        old.values[0].machine or word.machine)
        parameters.set(assign.name, (Word(word.text, assign.line, word.unknown, word.machine,
                                          word.via),))
        return word.unknown

    def _assign_item(self, assign: Assign, word: Word, old: Variable | None,
                     state: _State) -> str | None:
        index_word = expand_text(Raw(assign.index or "0", assign.line), state.parameters)
        try:
            index = evaluate(index_word.text, state.parameters, assign.line)
        except Unknown as unknown:
            state.parameters.taint(assign.name, unknown.why, assign.line)
            return unknown.why
        values = list(old.values if old else ())
        if index < 0 or index > len(values):
            raise ShellError(f"line {assign.line}: {assign.name}[{assign.index}] leaves a gap "
                             "in the array, which Tessel does not read; assign items in order")
        values[index:index + 1] = [Word(word.text, assign.line, word.unknown, word.machine)]
        state.parameters.set(assign.name, tuple(values), array=True)
        return word.unknown

    def _declare(self, name: str, args: list[Word], node: Simple, state: _State) -> Status:
        options = "".join(w.text[1:] for w in args if w.text.startswith("-"))
        assigned = {assign.name for assign in node.declared}
        if name == "local" and state.locals:
            frame = state.locals[-1]
            for word in args:
                target = word.text.partition("=")[0]
                if is_name(target) and target not in frame:
                    frame[target] = state.parameters.variables.get(target)
            for assign in node.declared:
                if assign.name not in frame:
                    frame[assign.name] = state.parameters.variables.get(assign.name)
        for assign in node.declared:
            self._assign(assign, state)
        for word in args:
            if is_name(word.text) and word.text not in assigned:
                if "a" in options and state.parameters.get(word.text, node.line) is None:
                    state.parameters.set(word.text, (), array=True)
                if "A" in options:
                    state.parameters.taint(word.text, f"${word.text}, an associative array "
                                           f"(line {node.line}), which Tessel does not read",
                                           node.line)
        return 0

    def _unset(self, args: list[Word], node: Simple, state: _State) -> Status:
        for word in args:
            if word.text.startswith("-"):
                continue
            if word.unknown:
                raise ShellError(f"line {node.line}: unset of a name Tessel cannot know")
            state.parameters.unset(word.text)
            state.functions.pop(word.text, None)
        return 0

    def _shift(self, args: list[Word], node: Simple, state: _State) -> Status:
        count = int(args[0].text) if args and args[0].text.isdigit() else 1
        positional = state.parameters.positional
        if count > len(positional):
            return 1
        state.parameters.positional = positional[count:]
        return 0

    def _set(self, args: list[Word], node: Simple, state: _State) -> Status:
        texts = [w.text for w in args]
        if "--" in texts:
            state.parameters.positional = list(args[texts.index("--") + 1:])
        elif args and not texts[0].startswith(("-", "+")):
            state.parameters.positional = list(args)
        return 0

    def _exit(self, args: list[Word], node: Simple, state: _State) -> Status:
        raise _Exit

    def _return(self, args: list[Word], node: Simple, state: _State) -> Status:
        raise _Return

    def _source(self, args: list[Word], node: Simple, state: _State) -> Status:
        target = args[0].text if args else ""
        self._taint_all(state, f"`source {target}` on line {node.line}, a file Tessel does "
                               "not read")
        return None

    def _eval(self, args: list[Word], node: Simple, state: _State) -> Status:
        why = f"`eval` on line {node.line}, text Tessel does not evaluate"
        if any(".py" in w.text for w in args):
            state.ran.append(Ran(tuple(args), node.line, "script",
                                 unknown=f"it runs through {why}"))
        self._taint_all(state, why)
        return None

    def _taint_all(self, state: _State, why: str) -> None:
        for name in list(state.parameters.variables):
            state.parameters.taint(name, f"${name} ({why} may set it)", 0)
        state.parameters.unset_unknown = why

    def _let(self, args: list[Word], node: Simple, state: _State) -> Status:
        value = 0
        for word in args:
            if word.unknown or word.machine:
                return None
            try:
                value = evaluate(word.text, state.parameters, node.line)
            except Unknown:
                return None
        return _status(value != 0)

    def _test(self, args: list[Word], node: Simple, state: _State) -> Status:
        if node.words[0].text == "[":
            if not args or args[-1].text != "]":
                raise ShellError(f"line {node.line}: [ is not closed by ]; close it")
            args = args[:-1]
        return _status(single_bracket(args, state.parameters))

    def _read(self, args: list[Word], node: Simple, state: _State) -> Status:
        name = node.words[0].text
        for word in args:
            if is_name(word.text):
                state.parameters.taint(word.text, f"${word.text}, read by `{name}` on line "
                                       f"{node.line} from input Tessel does not have",
                                       node.line)
        if name in ("mapfile", "readarray") and not any(is_name(w.text) for w in args):
            state.parameters.taint("MAPFILE", f"`{name}` on line {node.line}", node.line)
        return None

    def _printf(self, args: list[Word], node: Simple, state: _State) -> Status:
        if len(args) >= 2 and args[0].text == "-v":
            state.parameters.taint(args[1].text, f"${args[1].text}, set by `printf -v` on "
                                   f"line {node.line}", node.line)
        return 0

    def _call(self, name: str, args: list[Word], state: _State) -> Status:
        if state.calls >= _MOST_CALLS:
            raise ShellError(f"the function {name} calls itself more than {_MOST_CALLS} "
                             "deep; Tessel stops there")
        saved = state.parameters.positional
        state.parameters.positional = list(args)
        state.locals.append({})
        state.calls += 1
        try:
            return self._command(state.functions[name], state)
        except _Return:
            return 0
        finally:
            state.calls -= 1
            for local, value in state.locals.pop().items():
                if value is None:
                    state.parameters.unset(local)
                else:
                    state.parameters.variables[local] = value
            state.parameters.positional = saved


def _same(a: Variable | None, b: Variable | None) -> bool:
    """Whether two ways leave a variable the same value (where it was written aside)."""
    if a is None or b is None:
        return a is b
    return a.array == b.array and [(w.text, w.unknown, w.machine) for w in a.values] == [
        (w.text, w.unknown, w.machine) for w in b.values]


def _status(truth: bool | None) -> Status:
    return None if truth is None else int(not truth)


def _unknown(command: Ran, why: str) -> Ran:
    return command if command.unknown else Ran(command.words, command.line, command.kind,
                                               command.env, unknown=why)


def _basename(text: str) -> str:
    return PurePosixPath(text).name if text else text


def evaluate_script(text: str, environment: Mapping[str, str] | None = None,
                    arguments: Sequence[str] = (), name: str = "script") -> ScriptRun:
    """What the bash script `text` runs, evaluated without running anything: the
    commands that run a Python script and the lines of flags alone, their words as bash
    expands them. `environment` holds the variables set before the script
    (`--env NAME=VALUE`), `arguments` its positional parameters; every other variable the
    script does not set is unset, except the machine's own ($PWD, ...), kept as written.
    ShellError, naming the line, for text bash would not read either."""
    parameters = Parameters(script_name=name)
    for variable, value in (environment or {}).items():
        parameters.set(variable, (Word(value, 0),))
    parameters.positional = [Word(value, 0, via=str(index))
                             for index, value in enumerate(arguments, 1)]
    state = _State(parameters)
    try:
        _Evaluator().run(parse(text), state)
    except (_Exit, _Return):
        pass
    except RecursionError:
        raise ShellError("the script nests deeper than Tessel reads; simplify it") from None
    return ScriptRun(tuple(state.ran), tuple(state.others))
