"""`[[ ... ]]`, `[ ... ]` and `test`, evaluated as bash evaluates them, in three values.

True or False when the operands are known; None when the answer depends on what Tessel
cannot know: a file's existence (`-f`, `-d`, ...), a value of the machine in a comparison,
an unknown value (a command substitution, ...), a regular expression (`=~`). The grammar
is bash(1)'s CONDITIONAL EXPRESSIONS: `[[ ]]` with `!`, `&&`, `||`, parentheses, patterns on
the right of `==` / `!=`, arithmetic operands of `-eq` ...; `[` / `test` with POSIX's rules by
the number of arguments, then `!`, `-a`, `-o` and parentheses.
"""

from __future__ import annotations

import re
from typing import Sequence

from planner.shell.arithmetic import Unknown, evaluate
from planner.shell.parameters import Parameters, Word
from planner.shell.lexer import Raw
from planner.shell.words import expand_pattern, expand_text

_FILE_TESTS = frozenset("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S".split())
_UNARY = _FILE_TESTS | {"-z", "-n", "-v", "-o", "-R"}
_NUMERIC = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b,
            "-lt": lambda a, b: a < b, "-le": lambda a, b: a <= b,
            "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}
_STRING = {"=": lambda a, b: a == b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
           "<": lambda a, b: a < b, ">": lambda a, b: a > b}
_BINARY = frozenset(_NUMERIC) | frozenset(_STRING) | {"=~", "-nt", "-ot", "-ef"}


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


# Both sides are always read (a parser must consume them); tests have no side effects
# that short-circuiting would skip, but `${X:=...}`, which is rare in a test.
def _and(left: bool | None, right: bool | None) -> bool | None:
    if False in (left, right):
        return False
    return None if None in (left, right) else True


def _or(left: bool | None, right: bool | None) -> bool | None:
    if True in (left, right):
        return True
    return None if None in (left, right) else False


def _unary(op: str, word: Word, parameters: Parameters) -> bool | None:
    if op in ("-z", "-n"):
        if word.unknown:
            return None
        empty = not word.text and not word.machine
        return empty if op == "-z" else not empty
    if op == "-v" and not word.unknown:
        if parameters.get(word.text, word.line) is not None:
            return True
        return None if parameters.unset_unknown else False
    return None  # files, shell options: the machine's


def _integer(word: Word, parameters: Parameters, arithmetic: bool) -> int | None:
    """An operand of -eq ...: an arithmetic expression in [[ ]], a whole number in [ ]."""
    if word.unknown or word.machine:
        return None
    if arithmetic:
        try:
            return evaluate(word.text, parameters, word.line)
        except Unknown:
            return None
    text = word.text.strip()
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else None


class _Logic:
    """`!`, and, or and parentheses over primaries (`_primary`): `[[ ]]`'s `&&` / `||`, or
    `test`'s `-a` / `-o`; and binds tighter than or."""

    AND, OR = "&&", "||"

    def __init__(self, words: Sequence[Raw | Word], parameters: Parameters) -> None:
        self.words, self.parameters, self.at = list(words), parameters, 0

    def _peek(self, ahead: int = 0) -> str | None:
        at = self.at + ahead
        return self.words[at].text if at < len(self.words) else None

    def _or(self) -> bool | None:
        value = self._and()
        while self._peek() == self.OR:
            self.at += 1
            value = _or(value, self._and())
        return value

    def _and(self) -> bool | None:
        value = self._not()
        while self._peek() == self.AND:
            self.at += 1
            value = _and(value, self._not())
        return value

    def _not(self) -> bool | None:
        if self._peek() == "!":
            self.at += 1
            return _not(self._not())
        return self._primary()

    def _group(self) -> bool | None:
        """`( ... )`, the cursor on its opening word."""
        self.at += 1
        value = self._or()
        if self._peek() == ")":
            self.at += 1
        return value

    def _primary(self) -> bool | None:
        raise NotImplementedError


class _DoubleBracket(_Logic):
    """`[[ ... ]]` over its unexpanded words."""

    def run(self) -> bool | None:
        value = self._or()
        return value if self.at == len(self.words) else None

    def _primary(self) -> bool | None:
        first = self._peek()
        if first is None:
            return None
        if first == "(":
            return self._group()
        if first in _UNARY and self._peek(1) not in (None, "&&", "||", ")") \
                and self._peek(1) not in _BINARY:
            self.at += 2
            return _unary(first, expand_text(self.words[self.at - 1], self.parameters),
                          self.parameters)
        left = expand_text(self.words[self.at], self.parameters)
        op = self._peek(1)
        if op in _BINARY and self._peek(2) is not None:
            right_raw = self.words[self.at + 2]
            self.at += 3
            return self._binary(left, op, right_raw)
        self.at += 1
        return _unary("-n", left, self.parameters)

    def _binary(self, left: Word, op: str, right_raw: Raw) -> bool | None:
        if op in ("==", "=", "!="):
            if left.unknown or left.machine:
                return None
            right = expand_text(right_raw, self.parameters)
            if right.unknown or right.machine:
                return None
            matched = expand_pattern(right_raw, self.parameters).matches(left.text)
            return matched if op != "!=" else not matched
        right = expand_text(right_raw, self.parameters)
        if op in _NUMERIC:
            a = _integer(left, self.parameters, True)
            b = _integer(right, self.parameters, True)
            return None if a is None or b is None else _NUMERIC[op](a, b)
        if op in ("<", ">") and not (left.unknown or left.machine or right.unknown
                                     or right.machine):
            return _STRING[op](left.text, right.text)
        return None  # =~, -nt, -ot, -ef, or a value not known


def double_bracket(words: Sequence[Raw], parameters: Parameters) -> bool | None:
    """The truth of `[[ words ]]`; None when it cannot be known."""
    return _DoubleBracket(words, parameters).run()


def single_bracket(args: Sequence[Word], parameters: Parameters) -> bool | None:
    """The truth of `test args` (or `[ args ]`, the closing bracket removed): POSIX's
    rules by the number of arguments, then `!`, `-a`, `-o` and parentheses."""
    args = list(args)
    texts = [w.text for w in args]
    if len(args) == 0:
        return False
    if len(args) == 1:
        return _unary("-n", args[0], parameters)
    if len(args) == 2:
        if texts[0] == "!":
            return _not(_unary("-n", args[1], parameters))
        return _unary(texts[0], args[1], parameters) if texts[0] in _UNARY else False
    if len(args) == 3:
        if texts[1] in _BINARY or texts[1] in ("-a", "-o"):
            return _binary_single(args[0], texts[1], args[2], parameters)
        if texts[0] == "!":
            return _not(single_bracket(args[1:], parameters))
        if texts[0] == "(" and texts[2] == ")":
            return _unary("-n", args[1], parameters)
    if len(args) == 4 and texts[0] == "!":
        return _not(single_bracket(args[1:], parameters))
    return _SingleBracket(args, parameters).run()


def _binary_single(left: Word, op: str, right: Word, parameters: Parameters) -> bool | None:
    if op == "-a":
        return _and(_unary("-n", left, parameters), _unary("-n", right, parameters))
    if op == "-o":
        return _or(_unary("-n", left, parameters), _unary("-n", right, parameters))
    if left.unknown or right.unknown or left.machine or right.machine:
        return None
    if op in _NUMERIC:
        a, b = _integer(left, parameters, False), _integer(right, parameters, False)
        return False if a is None or b is None else _NUMERIC[op](a, b)
    if op in _STRING:
        return _STRING[op](left.text, right.text)
    return None


class _SingleBracket(_Logic):
    """`[ ... ]` of five or more arguments: -o looser than -a, then !, ( ), tests."""

    AND, OR = "-a", "-o"

    def __init__(self, args: Sequence[Word], parameters: Parameters) -> None:
        super().__init__(args, parameters)
        self.args = list(args)
        """The arguments, expanded (`words`, typed as what they are)."""

    def run(self) -> bool | None:
        value = self._or()
        return value if self.at == len(self.words) else False

    def _primary(self) -> bool | None:
        first = self._peek()
        if first is None:
            return False
        if first == "(":
            return self._group()
        args = self.args
        if first in _UNARY and self._peek(1) is not None:
            self.at += 2
            return _unary(first, args[self.at - 1], self.parameters)
        if self._peek(1) in _BINARY and self._peek(2) is not None:
            self.at += 3
            return _binary_single(args[self.at - 3], args[self.at - 2].text,
                                  args[self.at - 1], self.parameters)
        self.at += 1
        return _unary("-n", args[self.at - 1], self.parameters)
