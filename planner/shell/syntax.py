"""Bash text to a syntax tree, as bash's own grammar reads it; nothing is run.

`parse(text)` returns the script's commands: simple commands (assignments and words,
redirections set aside, here-document bodies skipped), pipelines, `&&` / `||` lists,
`if`, `case`, loops, `{ }` groups, `( )` subshells, function definitions, `[[ ]]` tests and
`(( ))` arithmetic. Words stay as written (quotes included, each with its line) for
`planner.shell.words` to expand when the evaluator reaches them. What bash's grammar
(bash(1), SHELL GRAMMAR) has that launch scripts do not use (coprocesses, `select`'s menu,
process substitution) is read as far as is needed to skip it or refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from planner.shell.lexer import (
    DECLARATIONS, REDIRECTIONS, Raw, ShellError, Token, is_name, tokens,
)


@dataclass(frozen=True)
class Assign:
    """`NAME=value`, `NAME+=value`, `NAME=( items )`, `NAME[i]=value`."""

    name: str
    line: int
    value: Raw | None = None
    """A scalar's value (None for an array)."""
    items: tuple[Raw, ...] | None = None
    """An array's items as written (None for a scalar)."""
    append: bool = False
    index: str | None = None
    """The subscript of `NAME[i]=value`, as written."""


@dataclass(frozen=True)
class Simple:
    """A simple command: its assignments, then its words (redirections set aside)."""

    assigns: tuple[Assign, ...]
    """`NAME=value` words before the command: the command's environment, or, with no
    command, assignments that last."""
    words: tuple[Raw, ...]
    line: int
    declared: tuple[Assign, ...] = ()
    """The assignments an `export` / `declare` / `local` / `readonly` command makes."""


@dataclass(frozen=True)
class Pipeline:
    commands: tuple[Command, ...]
    negated: bool
    line: int


@dataclass(frozen=True)
class AndOr:
    """`first && second || third ...`: each operator with the pipeline after it."""

    first: Pipeline
    rest: tuple[tuple[str, Pipeline], ...]
    line: int


@dataclass(frozen=True)
class Sequence:
    """Commands run one after the other (`;`, `&` or a new line between them)."""

    items: tuple[AndOr, ...]


@dataclass(frozen=True)
class If:
    clauses: tuple[tuple[Sequence, Sequence], ...]
    """(condition, body) of the `if` and each `elif`."""
    otherwise: Sequence | None
    line: int


@dataclass(frozen=True)
class Case:
    subject: Raw
    items: tuple[tuple[tuple[Raw, ...], Sequence], ...]
    """(patterns, body) of each `pattern | pattern) body ;;`."""
    line: int


@dataclass(frozen=True)
class Loop:
    """`for`, `while`, `until` or `select`: read, never run (`planner.shell.evaluator`)."""

    kind: str
    variable: str | None
    body: Sequence
    line: int
    head: Sequence | None = None
    """A while/until loop's condition."""


@dataclass(frozen=True)
class Group:
    """`{ ...; }` (same shell) or `( ... )` (a subshell: its assignments do not last)."""

    body: Sequence
    subshell: bool
    line: int


@dataclass(frozen=True)
class FunctionDef:
    name: str
    body: Command
    line: int


@dataclass(frozen=True)
class Test:
    """`[[ ... ]]`: its words, operators as words, unexpanded."""

    words: tuple[Raw, ...]
    line: int


@dataclass(frozen=True)
class Arith:
    """`(( expression ))`."""

    expression: Raw
    line: int


Command = Union[Simple, If, Case, Loop, Group, FunctionDef, Test, Arith]


class _Parser:
    """Tokens to commands: bash's grammar (lists, pipelines, compound commands)."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def _next(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _is(self, *words: str) -> bool:
        return self.token.kind == "word" and self.token.text in words

    def _is_op(self, *ops: str) -> bool:
        return self.token.kind == "op" and self.token.text in ops

    def _newlines(self) -> None:
        while self.token.kind == "newline":
            self.at += 1

    def _expect(self, word: str, opened: Token) -> None:
        self._newlines()
        if not self._is(word):
            found = self.token.text.strip() or "the end of the text"
            raise ShellError(f"line {opened.line}: {opened.text!r} expects {word!r}, found "
                             f"{found!r} on line {self.token.line}")
        self.at += 1

    def script(self) -> Sequence:
        body = self.sequence(())
        if self.token.kind != "end":
            raise ShellError(f"line {self.token.line}: unexpected {self.token.text!r}")
        return body

    def sequence(self, enders: tuple[str, ...]) -> Sequence:
        """And-or lists up to one of the keywords `enders` (or `)` / `;;` / the end)."""
        items: list[AndOr] = []
        while True:
            self._newlines()
            if self.token.kind == "end" or self._is(*enders) or self._is_op(")", ";;", ";&",
                                                                              ";;&"):
                return Sequence(tuple(items))
            items.append(self._and_or())
            if self._is_op(";", "&"):
                self.at += 1
            elif self.token.kind not in ("newline", "end") and not self._is(*enders) and \
                    not self._is_op(")", ";;", ";&", ";;&"):
                raise ShellError(f"line {self.token.line}: unexpected {self.token.text!r}")

    def _and_or(self) -> AndOr:
        first = self._pipeline()
        rest: list[tuple[str, Pipeline]] = []
        while self._is_op("&&", "||"):
            op = self._next().text
            self._newlines()
            rest.append((op, self._pipeline()))
        return AndOr(first, tuple(rest), first.line)

    def _pipeline(self) -> Pipeline:
        line = self.token.line
        negated = False
        if self._is("!"):
            self.at += 1
            negated = True
        commands = [self._command()]
        while self._is_op("|", "|&"):
            self.at += 1
            self._newlines()
            commands.append(self._command())
        return Pipeline(tuple(commands), negated, line)

    def _command(self) -> Command:
        token = self.token
        if token.kind == "test":
            self.at += 1
            self._redirections()
            return Test(token.items, token.line)
        if token.kind == "arith":
            self.at += 1
            self._redirections()
            return Arith(Raw(token.text, token.line), token.line)
        if token.kind == "op" and token.text == "(":
            self.at += 1
            body = self.sequence(())
            if not self._is_op(")"):
                raise ShellError(f"line {token.line}: ( is not closed by )")
            self.at += 1
            self._redirections()
            return Group(body, True, token.line)
        if token.kind == "word":
            compound = {"if": self._if, "for": self._loop, "select": self._loop,
                        "while": self._loop, "until": self._loop, "case": self._case,
                        "{": self._brace, "function": self._function}.get(token.text)
            if compound:
                command = compound()
                self._redirections()
                return command
            after = self.tokens[self.at + 1:self.at + 3]
            if [(t.kind, t.text) for t in after] == [("op", "("), ("op", ")")] \
                    and is_name(token.text.replace("-", "_")):  # name() { ... }
                self.at += 3
                self._newlines()
                return FunctionDef(token.text, self._command(), token.line)
        return self._simple()

    def _redirections(self) -> None:
        while self.token.kind == "op" and self.token.text in REDIRECTIONS or (
                self.token.kind == "word" and self.token.text.isdigit()
                and self.tokens[self.at + 1].kind == "op"
                and self.tokens[self.at + 1].text in REDIRECTIONS):
            if self.token.kind == "word":
                self.at += 1
            self.at += 1
            if self.token.kind != "word":
                raise ShellError(f"line {self.token.line}: a redirection without its target")
            self.at += 1

    def _simple(self) -> Simple:
        line = self.token.line
        assigns: list[Assign] = []
        declared: list[Assign] = []
        words: list[Raw] = []
        while True:
            self._redirections()
            token = self.token
            declaring = bool(words) and words[0].text in DECLARATIONS
            if token.kind == "array":
                if words and not declaring:
                    raise ShellError(f"line {token.line}: {token.text}( ... ) is an array "
                                     "assignment in the middle of a command")
                name, append = token.text.rstrip("=").rstrip("+"), token.text.endswith("+=")
                assign = Assign(name, token.line, items=token.items, append=append)
                (declared if declaring else assigns).append(assign)
            elif token.kind == "word":
                assign = _assignment(token) if not words or declaring else None
                if assign is None:
                    words.append(Raw(token.text, token.line))
                else:
                    (declared if declaring else assigns).append(assign)
            else:
                break
            self.at += 1
        if not assigns and not words:
            raise ShellError(f"line {self.token.line}: unexpected "
                             f"{self.token.text.strip() or 'end of the text'!r}")
        return Simple(tuple(assigns), tuple(words), line, tuple(declared))

    def _if(self) -> If:
        opened = self._next()
        clauses: list[tuple[Sequence, Sequence]] = []
        otherwise: Sequence | None = None
        while True:
            condition = self.sequence(("then",))
            self._expect("then", opened)
            body = self.sequence(("elif", "else", "fi"))
            clauses.append((condition, body))
            if self._is("elif"):
                self.at += 1
                continue
            if self._is("else"):
                self.at += 1
                otherwise = self.sequence(("fi",))
            self._expect("fi", opened)
            return If(tuple(clauses), otherwise, opened.line)

    def _loop(self) -> Loop:
        opened = self._next()
        variable: str | None = None
        head: Sequence | None = None
        if opened.text in ("for", "select"):
            if self.token.kind == "arith":  # for (( i = 0; ... ))
                self.at += 1
            else:
                variable = self._next().text
                self._newlines()
                if self._is("in"):
                    self.at += 1
                    while self.token.kind == "word":
                        self.at += 1
            if self._is_op(";"):
                self.at += 1
        else:
            head = self.sequence(("do",))
        self._expect("do", opened)
        body = self.sequence(("done",))
        self._expect("done", opened)
        return Loop(opened.text, variable, body, opened.line, head)

    def _case(self) -> Case:
        opened = self._next()
        subject = self._next()
        self._expect("in", opened)
        items: list[tuple[tuple[Raw, ...], Sequence]] = []
        while True:
            self._newlines()
            if self._is("esac"):
                self.at += 1
                return Case(Raw(subject.text, subject.line), tuple(items), opened.line)
            if self._is_op("("):
                self.at += 1
            pattern = self._next()
            patterns = [Raw(pattern.text, pattern.line)]
            while self._is_op("|"):
                self.at += 1
                pattern = self._next()
                patterns.append(Raw(pattern.text, pattern.line))
            if not self._is_op(")"):
                raise ShellError(f"line {self.token.line}: a case pattern ends with )")
            self.at += 1
            body = self.sequence(("esac",))
            if self._is_op(";&", ";;&"):
                raise ShellError(f"line {self.token.line}: {self.token.text} (fall-through "
                                 "in case) is not read; end each pattern with ;;")
            if self._is_op(";;"):
                self.at += 1
            items.append((tuple(patterns), body))
            if self.token.kind == "end":
                raise ShellError(f"line {opened.line}: case is not closed by esac")

    def _brace(self) -> Group:
        opened = self._next()
        body = self.sequence(("}",))
        self._expect("}", opened)
        return Group(body, False, opened.line)

    def _function(self) -> FunctionDef:
        opened = self._next()
        name = self._next().text
        if self._is_op("(") and self.tokens[self.at + 1].text == ")":
            self.at += 2
        self._newlines()
        return FunctionDef(name, self._command(), opened.line)


def _assignment(token: Token) -> Assign | None:
    """The assignment a word spells (`NAME=value`, `NAME+=value`, `NAME[i]=value`)."""
    text = token.text
    equals = text.find("=")
    if equals <= 0:
        return None
    target, append = text[:equals], False
    if target.endswith("+"):
        target, append = target[:-1], True
    index = None
    if target.endswith("]") and "[" in target:
        target, _, index = target[:-1].partition("[")
    if not is_name(target):
        return None
    return Assign(target, token.line, value=Raw(text[equals + 1:], token.line),
                  append=append, index=index)


def parse(text: str) -> Sequence:
    """The commands of bash `text`, unexpanded; ShellError naming the line for text bash
    would not read either (an unclosed quote, `if` without `fi`, ...)."""
    return _Parser(tokens(text)).script()
