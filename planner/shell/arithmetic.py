"""Bash arithmetic, `$(( ... ))`, `(( ... ))` and `let`, evaluated on whole numbers.

The operators of bash(1) ARITHMETIC EVALUATION with C's precedence: unary + - ! ~, **,
* / %, + -, << >>, comparisons, == !=, & ^ |, && ||, ?:, assignments (= += -= *= /= %=)
and ++ / --. Names are variables (unset or empty: 0; a variable's text is itself
evaluated, as bash does); division truncates toward zero, as C's. Every value is a 64-bit
signed integer that wraps around, as bash's intmax_t does: `2 ** 2 ** 40` is 0, not a
number of 2^40 bits. `$`-expansions are done before (`planner.shell.words`). A value
Tessel cannot know makes the result unknown (`Unknown`), never a guess.
"""

from __future__ import annotations

import re
from typing import Callable

from planner.shell.parameters import Parameters, Word
from planner.shell.lexer import ShellError

_TOKEN = re.compile(r"\s*(?:(?P<number>0[xX][0-9a-fA-F]+|\d+#[0-9a-zA-Z@_]+|\d+)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>\*\*=?|<<=|>>=|\+\+|--|<=|>=|==|!=|&&|\|\||<<|>>|[-+*/%&|^]=|"
                    r"[-+*/%<>=!~&|^?:(),]))")
# Binary operators, loosest first (C's precedence, as bash(1) lists it).
_LEVELS: tuple[tuple[str, ...], ...] = (
    ("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="),
    ("<<", ">>"), ("+", "-"), ("*", "/", "%"),
)
_ASSIGNMENTS = ("=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^=", "**=")
# Depth of a variable's text evaluated as arithmetic inside another (bash: 1024).
_MOST_NESTED = 64
_BITS = 64
_MODULUS = 1 << _BITS
# Digits of bash's bases up to 64 (bash(1), ARITHMETIC EVALUATION); up to base 36 a
# letter of either case is the same digit.
_DIGITS = {char: value for value, char in enumerate(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_")}


def _wrapped(value: int) -> int:
    """`value` as a 64-bit signed integer (two's complement wrap-around)."""
    return (value + (_MODULUS >> 1)) % _MODULUS - (_MODULUS >> 1)


class Unknown(Exception):
    """The expression reads a value Tessel cannot know; `why` says which."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _truncated(a: int, b: int, op: str, line: int) -> int:
    if b == 0:
        raise ShellError(f"line {line}: division by 0 in an arithmetic expression")
    quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return quotient if op == "/" else a - b * quotient


# A shift counts modulo 64, as x86-64 shifts bash's intmax_t.
_BINARY: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "<<": lambda a, b: a << (b % _BITS), ">>": lambda a, b: a >> (b % _BITS),
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b), ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
}


class _Evaluator:
    def __init__(self, text: str, parameters: Parameters, line: int, depth: int) -> None:
        self.parameters, self.line, self.depth = parameters, line, depth
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        at = 0
        while at < len(text):
            if text[at:].strip() == "":
                break
            match = _TOKEN.match(text, at)
            if not match:
                raise ShellError(f"line {line}: {text.strip()!r} is not an arithmetic "
                                 "expression bash evaluates")
            kind = match.lastgroup or "op"
            self.tokens.append((kind, match[kind]))
            at = match.end()
        self.at = 0

    def _peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens) or expected and self.tokens[self.at][1] != expected:
            raise ShellError(f"line {self.line}: {self.text.strip()!r} is not a complete "
                             "arithmetic expression")
        self.at += 1
        return self.tokens[self.at - 1]

    def run(self) -> int:
        if not self.tokens:
            return 0
        value = self._comma()
        if self.at != len(self.tokens):
            raise ShellError(f"line {self.line}: {self.text.strip()!r} has "
                             f"{self.tokens[self.at][1]!r} where bash expects an operator")
        return value

    def _comma(self) -> int:
        value = self._assignment()
        while self._peek() == ",":
            self._take()
            value = self._assignment()
        return value

    def _assignment(self) -> int:
        if self.at + 1 < len(self.tokens) and self.tokens[self.at][0] == "name" \
                and self.tokens[self.at + 1][1] in _ASSIGNMENTS:
            name = self._take()[1]
            op = self._take()[1]
            value = self._assignment()
            if op != "=":
                value = self._apply(op[:-1], self._variable(name), value)
            self._store(name, value)
            return value
        return self._conditional()

    def _conditional(self) -> int:
        condition = self._binary(0)
        if self._peek() != "?":
            return condition
        self._take()
        yes = self._assignment()
        self._take(":")
        no = self._assignment()
        return yes if condition else no

    def _binary(self, level: int) -> int:
        if level == len(_LEVELS):
            return self._power()
        value = self._binary(level + 1)
        while self._peek() in _LEVELS[level]:
            op = self._take()[1]
            value = self._apply(op, value, self._binary(level + 1))
        return value

    def _apply(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%"):
            return _wrapped(_truncated(a, b, op, self.line))
        if op == "&&":
            return int(bool(a) and bool(b))
        if op == "||":
            return int(bool(a) or bool(b))
        if op == "**":
            return self._raised(a, b)
        return _wrapped(_BINARY[op](a, b))

    def _power(self) -> int:
        base = self._unary()
        if self._peek() == "**":
            self._take()
            return self._raised(base, self._power())
        return base

    def _raised(self, base: int, exponent: int) -> int:
        if exponent < 0:
            raise ShellError(f"line {self.line}: a negative exponent in arithmetic")
        return _wrapped(pow(base, exponent, _MODULUS))

    def _unary(self) -> int:
        op = self._peek()
        if op in ("+", "-", "!", "~"):
            self._take()
            value = self._unary()
            return _wrapped({"+": value, "-": -value, "!": int(not value), "~": ~value}[op])
        if op in ("++", "--"):
            self._take()
            name = self._take()[1]
            value = _wrapped(self._variable(name) + (1 if op == "++" else -1))
            self._store(name, value)
            return value
        return self._postfix()

    def _postfix(self) -> int:
        kind, text = self._take()
        if text == "(":
            value = self._comma()
            self._take(")")
            return value
        if kind == "number":
            return _number(text, self.line)
        if kind != "name":
            raise ShellError(f"line {self.line}: {self.text.strip()!r} has {text!r} where "
                             "bash expects a number")
        value = self._variable(text)
        if self._peek() in ("++", "--"):
            self._store(text, _wrapped(value + (1 if self._take()[1] == "++" else -1)))
        return value

    def _variable(self, name: str) -> int:
        variable = self.parameters.get(name, self.line)
        if variable is None or not variable.values:
            return 0
        if variable.unknown or variable.values[0].machine:
            raise Unknown(variable.unknown or f"${name}, a value of the machine")
        text = variable.text.strip()
        if not text:
            return 0
        if self.depth >= _MOST_NESTED:
            raise ShellError(f"line {self.line}: ${name} refers to itself in arithmetic")
        return _Evaluator(text, self.parameters, self.line, self.depth + 1).run()

    def _store(self, name: str, value: int) -> None:
        self.parameters.set(name, (Word(str(value), self.line),))


def _number(text: str, line: int) -> int:
    """A constant as bash reads it (0x hex, 0 octal, BASE#digits), wrapped to 64 bits:
    digit by digit, so that no constant however long makes a huge integer."""
    if text[:2].lower() == "0x":
        base, digits = 16, text[2:]
    elif "#" in text:
        base_text, _, digits = text.partition("#")
        base = int(base_text) if len(base_text) <= 2 else 0
    elif len(text) > 1 and text.startswith("0"):
        base, digits = 8, text[1:]
    else:
        base, digits = 10, text
    if not 2 <= base <= 64:
        raise ShellError(f"line {line}: {text!r} has a base bash does not read (2 to 64)")
    value = 0
    for char in digits:
        digit = _DIGITS.get(char.lower() if base <= 36 else char, _MODULUS)
        if digit >= base:
            raise ShellError(f"line {line}: {text!r} is not a number bash reads")
        value = (value * base + digit) % _MODULUS
    return _wrapped(value)


def evaluate(text: str, parameters: Parameters, line: int) -> int:
    """The value of the arithmetic expression `text` (its `$`-expansions already done);
    assignments in it change `parameters`. Unknown when it reads a value Tessel cannot
    know; ShellError for text bash would refuse."""
    return _Evaluator(text, parameters, line, 0).run()
