"""Bash text to tokens, and the scanners of its quoted constructs; nothing is run.

`tokens(text)` reads bash text as bash's lexer does (bash(1), DEFINITIONS, QUOTING):
words as written (quotes, `$` and backslashes kept, each with its line, for
`planner.shell.words` to expand later), operators, new lines; comments, backslash-new-lines
and here-document bodies dropped; `NAME=( ... )` arrays, `[[ ... ]]` tests and `(( ))`
arithmetic as single tokens. The `end_of_*` scanners find where a quoted or `$`-construct
ends, for the lexer and for the expansion of a word.
"""

from __future__ import annotations

from dataclasses import dataclass


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
class Token:
    kind: str
    """"word", "op", "newline", "array" (NAME=( ... )), "test" ([[ ... ]]), "arith"
    ((( ... ))) or "end"."""
    text: str
    line: int
    items: tuple[Raw, ...] = ()


_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", "&>>", "&>", ">>", ">&", "<&", "<<<",
              "<<-", "<<", "<>", ">|", ";", "&", "|", "(", ")", "<", ">")
REDIRECTIONS = frozenset({"&>>", "&>", ">>", ">&", "<&", "<<<", "<<-", "<<", "<>", ">|",
                           "<", ">"})
_METACHARACTERS = frozenset(" \t\n;&|<>()")
_KEYWORDS = frozenset({"if", "then", "elif", "else", "fi", "for", "in", "do", "done",
                       "while", "until", "case", "esac", "function", "{", "}", "!", "select"})
DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})
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


def tokens(text: str) -> list[Token]:
    """The tokens of bash `text`, ending with an "end" token; ShellError naming the line
    for an unclosed quote or construct."""
    return _Lexer(text).run()
