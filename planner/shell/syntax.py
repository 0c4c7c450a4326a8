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


class ShellError(ValueError):
    """Bash text Tessel cannot read or evaluate; the message names the line and the
    construct."""


@dataclass(frozen=True)
class Raw:
    """A word as written: quotes, `$` and backslashes kept, for expansion later."""

    text: str
    line: int
    """1-based line of the text where the word starts."""


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


@dataclass(frozen=True)
class Token:
    kind: str
    """"word", "op", "newline", "array" (NAME=( ... )), "test" ([[ ... ]]), "arith"
    ((( ... ))) or "end"."""
    text: str
    line: int
    items: tuple[Raw, ...] = ()


_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", "&>>", "&>", ">>", ">&", "<&", "<<<",
              "<<-", "<<", "<>", ">|", ";", "&", "|", "(", ")", "<", ">")
_REDIRECTIONS = frozenset({"&>>", "&>", ">>", ">&", "<&", "<<<", "<<-", "<<", "<>", ">|",
                           "<", ">"})
_METACHARACTERS = frozenset(" \t\n;&|<>()")
_KEYWORDS = frozenset({"if", "then", "elif", "else", "fi", "for", "in", "do", "done",
                       "while", "until", "case", "esac", "function", "{", "}", "!", "select"})
_DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def is_name(text: str) -> bool:
    """Whether `text` is a shell variable name."""
    return bool(text) and not text[0].isdigit() and all(c in _NAME_CHARS for c in text)


class _Lexer:
    """Bash text to tokens: words as written, operators, new lines; comments, backslash-
    new-lines and here-document bodies dropped."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.line = 1
        self.heredocs: list[tuple[str, bool]] = []
        self.tokens: list[Token] = []

    def run(self) -> list[Token]:
        text = self.text
        while True:
            self._blanks()
            if self.at >= len(text):
                self.tokens.append(Token("end", "", self.line))
                return self.tokens
            char = text[self.at]
            if char == "#":
                while self.at < len(text) and text[self.at] != "\n":
                    self.at += 1
            elif char == "\n":
                self.tokens.append(Token("newline", "\n", self.line))
                self.at += 1
                self.line += 1
                self._heredoc_bodies()
            elif text.startswith("((", self.at) and self._command_position():
                self._arithmetic_command()
            elif char in "<>" and text.startswith("(", self.at + 1):
                raise ShellError(f"line {self.line}: process substitution {char}( ... ) is "
                                 "not read; write the command without it")
            elif char in _METACHARACTERS:
                self._operator()
            else:
                self._word_token()

    def _blanks(self) -> None:
        text = self.text
        while self.at < len(text):
            if text[self.at] in " \t\r":
                self.at += 1
            elif text.startswith("\\\n", self.at):
                self.at += 2
                self.line += 1
            else:
                return

    def _command_position(self) -> bool:
        return not self.tokens or self.tokens[-1].kind == "newline" or (
            self.tokens[-1].kind == "op" and self.tokens[-1].text in (";", "&", "&&", "||", "|")
        ) or (self.tokens[-1].kind == "word" and self.tokens[-1].text in _KEYWORDS)

    def _operator(self) -> None:
        op = next(o for o in _OPERATORS if self.text.startswith(o, self.at))
        self.at += len(op)
        if op in ("<<", "<<-"):
            self._blanks()
            start, delimiter = self.line, self._word()
            if not delimiter:
                raise ShellError(f"line {start}: a here-document without its delimiter")
            word = delimiter.replace("'", "").replace('"', "").replace("\\", "")
            self.heredocs.append((word, op == "<<-"))
            self.tokens += [Token("op", op, start), Token("word", delimiter, start)]
            return
        self.tokens.append(Token("op", op, self.line))

    def _heredoc_bodies(self) -> None:
        for delimiter, strip_tabs in self.heredocs:
            start = self.line
            while True:
                end = self.text.find("\n", self.at)
                line = self.text[self.at:] if end < 0 else self.text[self.at:end]
                self.at = len(self.text) if end < 0 else end + 1
                self.line += 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                if end < 0:
                    raise ShellError(f"line {start}: the here-document ends before its "
                                     f"delimiter {delimiter!r}")
        self.heredocs = []

    def _arithmetic_command(self) -> None:
        line = self.line
        self.at += 2
        start = self.at
        depth = 0
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == "(":
                depth += 1
            elif char == ")":
                if depth == 0 and self.text.startswith("))", self.at):
                    expression = self.text[start:self.at]
                    self.at += 2
                    self.line += expression.count("\n")
                    self.tokens.append(Token("arith", expression, line))
                    return
                depth -= 1
            self.at += 1
        raise ShellError(f"line {line}: (( is not closed by ))")

    def _word_token(self) -> None:
        line = self.line
        word = self._word()
        if word == "[[":
            self.tokens.append(Token("test", "[[", line, tuple(self._test_words(line))))
            return
        name = word[:-2] if word.endswith("+=") else word[:-1]
        if word.endswith("=") and is_name(name) and self.text.startswith("(", self.at):
            self.at += 1
            self.tokens.append(Token("array", word, line, tuple(self._array_items(line))))
            return
        self.tokens.append(Token("word", word, line))

    def _array_items(self, line: int) -> list[Raw]:
        items: list[Raw] = []
        while True:
            self._blanks()
            if self.at >= len(self.text):
                raise ShellError(f"line {line}: the array started here is not closed by )")
            char = self.text[self.at]
            if char == ")":
                self.at += 1
                return items
            if char == "\n":
                self.at += 1
                self.line += 1
            elif char == "#":
                while self.at < len(self.text) and self.text[self.at] != "\n":
                    self.at += 1
            elif char in _METACHARACTERS:
                raise ShellError(f"line {self.line}: {char!r} inside an array's ( ) is not "
                                 "read; quote it")
            else:
                start = self.line
                items.append(Raw(self._word(), start))

    def _test_words(self, line: int) -> list[Raw]:
        words: list[Raw] = []
        while True:
            self._blanks()
            if self.at >= len(self.text) or self.text[self.at] == "\n":
                raise ShellError(f"line {line}: [[ is not closed by ]] on its line")
            op = next((o for o in ("&&", "||", "(", ")", "<", ">")
                       if self.text.startswith(o, self.at)), None)
            if op:
                self.at += len(op)
                words.append(Raw(op, self.line))
                continue
            start = self.line
            word = self._word()
            if word == "]]":
                return words
            words.append(Raw(word, start))

    def _word(self) -> str:
        """The word at the cursor, as written; the cursor moves past it."""
        text, start = self.text, self.at
        self.at = end_of_word(text, start)
        self.line += text.count("\n", start, self.at)
        return text[start:self.at].replace("\\\n", "")


def _line_at(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _past(text: str, at: int, single_quotes: bool) -> int:
    """Index past the character or quoted construct at `at`: an escape, a quote ('...'
    only where `single_quotes` count, as outside double quotes), backquotes or a
    $-construct."""
    char = text[at]
    if char == "\\":
        return at + 2
    if char == "'" and single_quotes:
        return end_of_single_quoted(text, at)
    if char == '"':
        return end_of_double_quoted(text, at)
    if char == "`":
        return end_of_backquoted(text, at)
    if char == "$":
        return end_of_dollar(text, at)
    return at + 1


def end_of_word(text: str, at: int) -> int:
    """Index just past the word that starts at `at` (up to an unquoted metacharacter)."""
    while at < len(text) and text[at] not in _METACHARACTERS:
        at = _past(text, at, single_quotes=True)
    return min(at, len(text))


def end_of_single_quoted(text: str, at: int) -> int:
    """Index just past the '...' that starts at `at`."""
    end = text.find("'", at + 1)
    if end < 0:
        raise ShellError(f"line {_line_at(text, at)}: the quote ' opened here is not "
                         "closed; close it")
    return end + 1


def end_of_double_quoted(text: str, at: int) -> int:
    """Index just past the "..." that starts at `at`."""
    start, at = at, at + 1
    while at < len(text):
        if text[at] == '"':
            return at + 1
        at = _past(text, at, single_quotes=False)
    raise ShellError(f'line {_line_at(text, start)}: the quote " opened here is not closed; '
                     "close it")


def end_of_backquoted(text: str, at: int) -> int:
    """Index just past the `...` that starts at `at`."""
    start, at = at, at + 1
    while at < len(text) and text[at] != "`":
        at += 2 if text[at] == "\\" else 1
    if at >= len(text):
        raise ShellError(f"line {_line_at(text, start)}: the backquote opened here is not "
                         "closed")
    return at + 1


def end_of_dollar(text: str, at: int) -> int:
    """Index just past the $-construct at `at`: $'...', $"...", $( ), $(( )), ${ }, or
    the `$` alone (a name after it is read by the expansion)."""
    if text.startswith("$'", at):
        at += 2
        while at < len(text) and text[at] != "'":
            at += 2 if text[at] == "\\" else 1
        return at + 1
    if text.startswith('$"', at):
        return end_of_double_quoted(text, at + 1)
    if text.startswith(("$(", "${"), at):
        return end_of_balanced(text, at + 1)
    return at + 1


def end_of_balanced(text: str, at: int) -> int:
    """Index just past the ( ... ) or { ... } that opens at `at`, across quotes and
    nesting."""
    start = at
    opening = text[at]
    closing = ")" if opening == "(" else "}"
    depth = 0
    while at < len(text):
        char = text[at]
        if char == opening:
            depth += 1
            at += 1
        elif char == closing:
            depth -= 1
            at += 1
            if depth == 0:
                return at
        elif char == "\\":
            at += 2
        elif char == "'":
            at = end_of_single_quoted(text, at)
        elif char == '"':
            at = end_of_double_quoted(text, at)
        elif char == "`":
            at = end_of_backquoted(text, at)
        elif char == "$" and text.startswith(("$(", "${"), at):
            at = end_of_balanced(text, at + 1)
        else:
            at += 1
    raise ShellError(f"line {_line_at(text, start)}: ${opening} opened here is not closed "
                     f"by {closing}")


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
        while self.token.kind == "op" and self.token.text in _REDIRECTIONS or (
                self.token.kind == "word" and self.token.text.isdigit()
                and self.tokens[self.at + 1].kind == "op"
                and self.tokens[self.at + 1].text in _REDIRECTIONS):
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
            declaring = bool(words) and words[0].text in _DECLARATIONS
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
    return _Parser(_Lexer(text).run()).script()
