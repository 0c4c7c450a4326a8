"""Word expansion as bash does it (bash(1), EXPANSION), with nothing run.

`expand` turns a word as written into the words a command receives: parameter expansion
(`$NAME`, `${NAME}`, `${NAME:-default}` and the other operators, `${A[@]}`, `${#A[@]}`,
`$1`, `"$@"`), arithmetic (`$(( ))`), quote removal, and word splitting of unquoted
expansions at blanks (an item `"--fp8-format hybrid"` of an unquoted `${A[@]}` becomes two
words). `expand_text` is the same without splitting (assignments, `[[ ]]` operands, `case`
subjects); `expand_pattern` keeps unquoted glob characters active. A command substitution
(`$( )`, backquotes) is never run: its value is unknown, and so is any word it reaches.
Pathname expansion is not done: a launch script's flags match no files (bash leaves a
pattern that matches nothing as written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from planner.shell.arithmetic import Unknown, evaluate
from planner.shell.globs import Pattern, replace_matches, tokens_of
from planner.shell.limits import check_length
from planner.shell.parameters import Parameters, Variable, Word
from planner.shell.lexer import (
    Raw, ShellError, end_of_backquoted, end_of_balanced, end_of_double_quoted,
    end_of_single_quoted, is_name,
)

_BLANKS = " \t\n"
_SPECIAL = "@*#?$!-"
# ${NAME<op>word}: the operators, longest first.
_OPERATORS = (":-", ":=", ":+", ":?", "##", "%%", "//", "/#", "/%", "^^", ",,",
              "-", "=", "+", "?", "#", "%", "/", "^", ",", ":")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a",
            "b": "\b", "e": "\x1b", "f": "\f", "v": "\v"}


@dataclass(frozen=True)
class _Piece:
    """Part of a word: text with how it was written."""

    text: str
    quoted: bool
    """Written inside quotes or escaped: never split, never a pattern."""
    split: bool = False
    """An unquoted expansion: split at blanks."""
    word: Word | None = None
    """Where the text came from, for an expansion (line, variable, unknown)."""
    items: tuple[Word, ...] | None = None
    """"${A[@]}" / "$@" (or unquoted: `split`): one word per item."""


class _Expansion:
    """Expands the words of one line of a script against `parameters`."""

    def __init__(self, parameters: Parameters, line: int) -> None:
        self.parameters, self.line = parameters, line

    # -- the text of a word, piece by piece ----------------------------------------------

    def pieces(self, text: str, quoted: bool) -> list[_Piece]:
        out: list[_Piece] = []
        literal: list[str] = []

        def flush() -> None:
            if literal:
                out.append(_Piece("".join(literal), quoted))
                literal.clear()

        at = 0
        while at < len(text):
            char = text[at]
            if char == "\\":
                escaped = text[at + 1:at + 2]
                if not quoted:
                    flush()
                    out.append(_Piece(escaped, True))
                elif escaped in ('$', '`', '"', "\\"):
                    literal.append(escaped)
                elif escaped == "\n":
                    pass
                else:
                    literal.append(char + escaped)
                at += 2
            elif char == "'" and not quoted:
                end = end_of_single_quoted(text, at)
                flush()
                out.append(_Piece(text[at + 1:end - 1], True))
                at = end
            elif char == '"' and not quoted:
                end = end_of_double_quoted(text, at)
                flush()
                inner = self.pieces(text[at + 1:end - 1], True)
                out += inner or [_Piece("", True)]
                at = end
            elif char == "$" and text.startswith("$'", at) and not quoted:
                end = at + 2
                chars: list[str] = []
                while end < len(text) and text[end] != "'":
                    if text[end] == "\\":
                        chars.append(_ESCAPES.get(text[end + 1], "\\" + text[end + 1]))
                        end += 2
                    else:
                        chars.append(text[end])
                        end += 1
                flush()
                out.append(_Piece("".join(chars), True))
                at = end + 1
            elif char == "$" and text.startswith('$"', at) and not quoted:
                at += 1
            elif char == "$":
                flush()
                piece, at = self._dollar(text, at, quoted)
                if piece is not None:
                    out.append(piece)
            elif char == "`":
                flush()
                end = end_of_backquoted(text, at)
                out.append(self._substitution(text[at:end], quoted))
                at = end
            elif char == "~" and at == 0 and not quoted and text[1:2] in ("", "/"):
                flush()
                out.append(_Piece("$HOME", True, word=Word("$HOME", self.line, machine=True)))
                at += 1
            else:
                literal.append(char)
                at += 1
        flush()
        return out

    def _substitution(self, written: str, quoted: bool) -> _Piece:
        why = (f"the command substitution {_short(written)} on line {self.line}, which "
               "Tessel does not run")
        return _Piece(written, quoted, word=Word(written, self.line, unknown=why))

    def _dollar(self, text: str, at: int, quoted: bool) -> tuple[_Piece | None, int]:
        """The expansion at `text[at]` == "$" and the index after it."""
        if text.startswith("$((", at):
            end = end_of_balanced(text, at + 1)
            return self._arithmetic(text[at + 3:end - 2], text[at:end], quoted), end
        if text.startswith("$(", at):
            end = end_of_balanced(text, at + 1)
            return self._substitution(text[at:end], quoted), end
        if text.startswith("${", at):
            end = end_of_balanced(text, at + 1)
            return self._braced(text[at + 2:end - 1], quoted), end
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!-]", text[at + 1:])
        if not name:
            return _Piece("$", quoted), at + 1
        return self._value(name[0], None, quoted), at + 1 + len(name[0])

    def _arithmetic(self, expression: str, written: str, quoted: bool) -> _Piece:
        expanded = self.text(Raw(expression, self.line))
        if expanded.unknown or expanded.machine:
            why = expanded.unknown or f"{written} reads a value of the machine"
            return _Piece(written, quoted, word=Word(written, self.line, unknown=why))
        try:
            value = evaluate(expanded.text, self.parameters, self.line)
        except Unknown as unknown:
            return _Piece(written, quoted, word=Word(written, self.line, unknown=unknown.why))
        return _Piece(str(value), quoted, word=Word(str(value), self.line))

    # -- parameters -----------------------------------------------------------------------

    def _lookup(self, name: str, subscript: str | None) -> Variable | None:
        """The variable, or the item `subscript` of it, or None when unset."""
        variable = self.parameters.get(name, self.line)
        if variable is None or subscript is None or subscript in ("@", "*"):
            return variable
        index_text = self.text(Raw(subscript, self.line))
        try:
            index = evaluate(index_text.text, self.parameters, self.line) \
                if not index_text.unknown else None
        except Unknown:
            index = None
        if index is None or variable.unknown:
            why = index_text.unknown or variable.unknown or "an index Tessel cannot know"
            return Variable((Word(f"${{{name}[{subscript}]}}", self.line, unknown=why),))
        values = variable.values
        if index < 0:
            index += len(values)
        return Variable((values[index],)) if 0 <= index < len(values) else None

    def _value(self, name: str, subscript: str | None, quoted: bool) -> _Piece | None:
        """$name / ${name[subscript]}, unmodified."""
        if name in ("@", "*") or subscript in ("@", "*"):
            items = tuple(self.parameters.positional) if name in ("@", "*") else (
                (self._lookup(name, None) or Variable(())).values)
            joined = "*" in (name, subscript)
            if quoted and joined:
                return _joined(items, True, self.line)
            return _Piece("", quoted, split=not quoted, items=items)
        variable = self._lookup(name, subscript)
        if variable is None:
            return _Piece("", quoted, split=not quoted)
        word = variable.values[0] if variable.values else Word("", self.line)
        return _Piece(word.text, quoted, split=not quoted and not word.unknown, word=word)

    def _braced(self, inner: str, quoted: bool) -> _Piece | None:
        """${...}: the name, its subscript, and the operator applied."""
        written = "${" + inner + "}"
        if inner.startswith("!") and len(inner) > 1:
            target = self.parameters.get(inner[1:], self.line)
            if target is None or target.unknown or not is_name(target.text):
                why = (target and target.unknown) or f"the indirection {written} on line " \
                    f"{self.line}"
                return _Piece(written, quoted, word=Word(written, self.line, unknown=why))
            return self._braced(target.text, quoted)
        length = inner.startswith("#") and len(inner) > 1
        body = inner[1:] if length else inner
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(\[([^\]]*)\])?", body)
        if not match:
            raise ShellError(f"line {self.line}: {written} is a bad substitution for bash "
                             "too; fix it")
        name, subscript, rest = match[1], match[3], body[match.end():]
        if length:
            if rest:
                raise ShellError(f"line {self.line}: {written} is a bad substitution")
            return self._length(name, subscript, quoted)
        if not rest:
            return self._value(name, subscript, quoted)
        op = next((o for o in _OPERATORS if rest.startswith(o)), None)
        if op is None:
            raise ShellError(f"line {self.line}: {written} is a bad substitution for bash "
                             "too; fix it")
        return self._operator(name, subscript, op, rest[len(op):], written, quoted)

    def _length(self, name: str, subscript: str | None, quoted: bool) -> _Piece:
        if subscript in ("@", "*") or name in ("@", "*"):
            variable = self._lookup(name, None) if name not in ("@", "*") else None
            count = len(self.parameters.positional) if variable is None and name in "@*" \
                else len(variable.values) if variable else 0
            if variable and variable.unknown:
                return _Piece("", quoted, word=Word("", self.line, unknown=variable.unknown))
            return _Piece(str(count), quoted, word=Word(str(count), self.line))
        variable = self._lookup(name, subscript)
        if variable and variable.unknown:
            return _Piece("", quoted, word=Word("", self.line, unknown=variable.unknown))
        size = len(variable.text) if variable else 0
        return _Piece(str(size), quoted, word=Word(str(size), self.line))

    def _operator(self, name: str, subscript: str | None, op: str, operand: str,
                  written: str, quoted: bool) -> _Piece | None:
        variable = self._lookup(name, subscript) if name not in "@*" else (
            Variable(tuple(self.parameters.positional), True) if self.parameters.positional
            else None)
        if variable is not None and variable.unknown:
            return _Piece(written, quoted, word=Word(written, self.line,
                                                     unknown=variable.unknown))
        is_set = variable is not None
        is_null = not is_set or all(w.text == "" for w in variable.values[:1])
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            empty = not is_set if op in ("-", "=", "+", "?") else is_null
            if op in (":+", "+"):
                return self._operand(operand, quoted) if not empty else None
            if not empty:
                return self._value(name, subscript, quoted)
            if op in (":?", "?"):
                raise ShellError(f"line {self.line}: {written} stops the script when {name} "
                                 f"is unset or empty; give it with --env {name}=VALUE")
            value = self._operand(operand, quoted)
            if op in (":=", "="):
                if not is_name(name):
                    raise ShellError(f"line {self.line}: {written} cannot assign ${name}")
                self.parameters.set(name, (self._joined_word(operand),))
            return value
        words = variable.values if variable else ()
        if subscript not in ("@", "*") and name not in "@*":
            words = words[:1]
        changed = tuple(replace(w, text=self._transform(w, op, operand, written))
                        for w in words)
        if subscript in ("@", "*") or name in "@*":
            return _Piece("", quoted, split=not quoted, items=changed)
        word = changed[0] if changed else Word("", self.line)
        return _Piece(word.text, quoted, split=not quoted and not word.unknown, word=word)

    def _operand(self, operand: str, quoted: bool) -> _Piece:
        """The word after an operator (`${X:-word}`), expanded, as one piece group."""
        # Quotes inside the operand are quotes even within double quotes
        # ("${X:-"a b"}" is `a b`).
        pieces = self.pieces(operand, False)
        word = _combine(pieces, self.line)
        text = _joined_text(pieces, self.line)
        all_quoted = bool(pieces) and all(p.quoted for p in pieces)
        return _Piece(text, quoted or all_quoted, split=not quoted and not all_quoted
                      and not word.unknown, word=replace(word, text=text))

    def _joined_word(self, operand: str) -> Word:
        return self.text(Raw(operand, self.line))

    def _transform(self, word: Word, op: str, operand: str, written: str) -> str:
        """${X#pattern} and the other operators that change the text."""
        if word.machine:
            raise ShellError(f"line {self.line}: {written} changes the machine's "
                             f"{word.text}, which Tessel does not know; write the value out")
        text = word.text
        if op in ("^^", ",,", "^", ","):
            changed = text.upper() if op == "^^" else text.lower() if op == ",," else (
                text[:1].upper() if op == "^" else text[:1].lower()) + text[1:]
            check_length(len(changed), self.line)  # "ß".upper() is "SS"
            return changed
        if op == ":":
            start_text, _, count_text = operand.partition(":")
            start = evaluate(self.text(Raw(start_text, self.line)).text,
                             self.parameters, self.line)
            start = max(start + len(text), 0) if start < 0 else start
            if not count_text:
                return text[start:]
            count = evaluate(self.text(Raw(count_text, self.line)).text,
                             self.parameters, self.line)
            return text[start:start + count] if count >= 0 else text[start:count]
        if op in ("/", "//", "/#", "/%"):
            pattern_text, _, replacement_text = operand.partition("/")
            pattern = self.pattern(Raw(pattern_text, self.line))
            replacement = self.text(Raw(replacement_text, self.line)).text
            return replace_matches(pattern, text, replacement, op)
        pattern = self.pattern(Raw(operand, self.line))
        if op in ("#", "##"):
            cut = pattern.prefix(text, longest=op == "##")
            return text if cut is None else text[cut:]
        cut = pattern.suffix(text, longest=op == "%%")
        return text if cut is None else text[:len(text) - cut]

    # -- words ------------------------------------------------------------------------------

    def words(self, raw: Raw) -> list[Word]:
        words = _fields(self.pieces(raw.text, False), raw.line)
        self.parameters.budget.spend_steps(len(words), raw.line)
        self.parameters.budget.spend_text(sum(len(w.text) for w in words), raw.line)
        return words

    def text(self, raw: Raw) -> Word:
        """The word as one text: no splitting (assignment values, [[ ]] operands)."""
        pieces = self.pieces(raw.text, False)
        word = _combine(pieces, raw.line)
        text = _joined_text(pieces, raw.line)
        self.parameters.budget.spend_text(len(text), raw.line)
        return replace(word, text=text)

    def pattern(self, raw: Raw) -> Pattern:
        """The word as a glob pattern: quoted characters match themselves, unquoted *, ?
        and [...] are patterns."""
        pieces = self.pieces(raw.text, False)
        tokens = [token for piece in pieces for token in tokens_of(
            _joined_text([piece], raw.line), piece.quoted)]
        return Pattern.of(tokens, self.parameters.budget, raw.line)


def _joined_text(pieces: list[_Piece], line: int) -> str:
    """The pieces as one text, an array's items joined by a space; ShellError, before
    joining, where it would be longer than a word can be."""
    check_length(sum(len(p.text) if p.items is None else
                     sum(len(w.text) for w in p.items) + max(len(p.items) - 1, 0)
                     for p in pieces), line)
    return "".join(p.text if p.items is None else " ".join(w.text for w in p.items)
                   for p in pieces)


def _joined(items: tuple[Word, ...], quoted: bool, line: int) -> _Piece:
    """"${A[*]}" / "$*": the items joined by a space, one word."""
    unknown = next((w.unknown for w in items if w.unknown), None)
    check_length(sum(len(w.text) for w in items) + max(len(items) - 1, 0), line)
    text = " ".join(w.text for w in items)
    return _Piece(text, quoted, word=Word(text, line, unknown=unknown,
                                          machine=any(w.machine for w in items)))


def _combine(pieces: list[_Piece], line: int) -> Word:
    """What a word made of `pieces` knows: the one expansion's word when it is the only
    piece, else the line, the first unknown and whether it holds a machine value."""
    words = [p.word for p in pieces if p.word is not None] + [
        w for p in pieces if p.items is not None for w in p.items]
    unknown = next((w.unknown for w in words if w.unknown), None)
    machine = any(w.machine for w in words)
    if len(pieces) == 1 and pieces[0].word is not None:
        return pieces[0].word
    return Word("", line, unknown=unknown, machine=machine)


def _fields(pieces: list[_Piece], line: int) -> list[Word]:
    """Pieces joined into words, unquoted expansions split at blanks (bash(1), Word
    Splitting): an unquoted expansion that is empty makes no word, "" makes one."""
    fields: list[Word] = []
    current: list[_Piece] | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            fields.append(_field(current, line))
        current = None

    def add(piece: _Piece) -> None:
        nonlocal current
        current = (current or []) + [piece]

    for piece in pieces:
        if piece.items is not None:
            for index, item in enumerate(piece.items):
                if index:
                    close()
                item_piece = _Piece(item.text, piece.quoted, split=piece.split
                                    and not item.unknown, word=item)
                if item_piece.split:
                    _split_into(item_piece, add, close)
                else:
                    add(item_piece)
        elif piece.split:
            _split_into(piece, add, close)
        else:
            add(piece)
    close()
    return fields


def _split_into(piece: _Piece, add, close) -> None:  # type: ignore[no-untyped-def]
    text = piece.text
    if not text:
        return
    parts = text.split()
    if text[0] in _BLANKS:
        close()
    for index, part in enumerate(parts):
        if index:
            close()
        add(replace(piece, text=part))
    if text[-1] in _BLANKS and parts:
        close()


def _field(pieces: list[_Piece], line: int) -> Word:
    check_length(sum(len(p.text) for p in pieces), line)
    text = "".join(p.text for p in pieces)
    with_words = [p for p in pieces if p.word is not None]
    if len(pieces) == 1 and with_words:
        return replace(with_words[0].word, text=text)  # type: ignore[arg-type]
    unknown = next((p.word.unknown for p in with_words if p.word and p.word.unknown), None)
    machine = any(p.word and p.word.machine for p in with_words)
    first = next((p.word.line for p in with_words if p.word and p.text), line)
    literal = any(p.word is None and p.text for p in pieces)
    return Word(text, line if literal else first, unknown=unknown, machine=machine)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


def expand(raw: Raw, parameters: Parameters) -> list[Word]:
    """The words `raw` becomes (expansions, quote removal, splitting)."""
    return _Expansion(parameters, raw.line).words(raw)


def expand_text(raw: Raw, parameters: Parameters) -> Word:
    """`raw` expanded as one word, unsplit (an assignment's value, a [[ ]] operand)."""
    return _Expansion(parameters, raw.line).text(raw)


def expand_pattern(raw: Raw, parameters: Parameters) -> Pattern:
    """The glob pattern `raw` expands to."""
    return _Expansion(parameters, raw.line).pattern(raw)
