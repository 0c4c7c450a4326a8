"""Glob patterns (bash(1), Pattern Matching: `*`, `?`, `[...]`) matched as bash matches
them, in time linear in the text: `case` words, `[[ x == pattern ]]`, and the operators
that cut or replace by a pattern (`${X#p}`, `${X%%p}`, `${X//p/r}`).

A pattern is a sequence of one-character tests and stars, run as an automaton over the
text (every position the pattern could be at, at once), never by backtracking: a
regular expression of `*a*a*b` took 26 s on 1,000 characters. Each character read is a
step of the script's budget (`planner.shell.limits`), so a pattern scanned from every
position of a long value ends with the limit named rather than running on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

from planner.shell.limits import Budget, check_length

_STAR = "*"
_ANY = "?"
# A token tests one character: a literal (a 1-tuple holding it), any character, or a
# bracket expression (its regular expression, on one character only); or is a star.
_Token = Union[str, tuple[str], "re.Pattern[str]", None]
_State = frozenset[int]


def tokens_of(text: str, quoted: bool) -> list[_Token]:
    """The tokens of one piece of a pattern as written: quoted text matches itself,
    unquoted `*`, `?` and `[...]` are patterns and `\\x` is x."""
    if quoted:
        return [(char,) for char in text]
    out: list[_Token] = []
    at = 0
    while at < len(text):
        char = text[at]
        if char == "*":
            out.append(_STAR)
        elif char == "?":
            out.append(_ANY)
        elif char == "[" and "]" in text[at + 2:]:
            end = text.index("]", at + 2)
            inner = text[at + 1:end]
            if inner[:1] in ("!", "^"):
                inner = "^" + inner[1:]
            try:
                out.append(re.compile("[" + inner.replace("\\", "\\\\") + "]", re.DOTALL))
            except re.error:  # a bracket expression bash reads as matching nothing
                out.append(None)
            at = end
        elif char == "\\" and at + 1 < len(text):
            at += 1
            out.append((text[at],))
        else:
            out.append((char,))
        at += 1
    return out


@dataclass
class Pattern:
    """A glob pattern, ready to match; each character read is charged to `budget`."""

    tokens: tuple[_Token, ...]
    budget: Budget
    line: int
    _moves: dict[tuple[_State, str], _State] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tokens: list[_Token], budget: Budget, line: int) -> Pattern:
        """The pattern of `tokens`, a run of stars read as one (as bash reads `**`)."""
        kept = [token for index, token in enumerate(tokens)
                if not (token == _STAR and index and tokens[index - 1] == _STAR)]
        return cls(tuple(kept), budget, line)

    @property
    def empty(self) -> bool:
        """The null pattern (bash: it matches nothing in `${X/p/r}`)."""
        return not self.tokens

    def matches(self, text: str) -> bool:
        """Whether the whole of `text` matches."""
        return self._ends(text, 0, longest=True) == len(text)

    def prefix(self, text: str, longest: bool) -> int | None:
        """The length of the shortest (or longest) start of `text` that matches."""
        return self._ends(text, 0, longest)

    def suffix(self, text: str, longest: bool) -> int | None:
        """The length of the shortest (or longest) end of `text` that matches."""
        backwards = Pattern(self.tokens[::-1], self.budget, self.line)
        return backwards._ends(text[::-1], 0, longest)

    def search(self, text: str, start: int) -> tuple[int, int] | None:
        """The leftmost match at or after `start`, longest there, as (start, end)."""
        # A pattern that starts with a star matches at `start` if it matches anywhere.
        last = start if self.tokens[:1] == (_STAR,) else len(text)
        for at in range(start, last + 1):
            end = self._ends(text, at, longest=True)
            if end is not None:
                return at, end
        return None

    def _ends(self, text: str, start: int, longest: bool) -> int | None:
        """The shortest (or longest) end of a match starting at `start`, or None."""
        state = self._closure({0})
        accept = len(self.tokens)
        found = start if accept in state else None
        if found is not None and not longest:
            return found
        at = start
        while state and at < len(text):
            self.budget.spend_steps(1, self.line)
            key = (state, text[at])
            moved = self._moves.get(key)
            if moved is None:
                moved = self._moves[key] = self._move(state, text[at])
            state, at = moved, at + 1
            if accept in state:
                found = at
                if not longest:
                    return found
        return found

    def _move(self, state: _State, char: str) -> _State:
        self.budget.spend_steps(len(state), self.line)
        after = set()
        for index in state:
            if index == len(self.tokens):
                continue
            token = self.tokens[index]
            if token == _STAR:
                after.add(index)
            elif token == _ANY or (token == (char,) if isinstance(token, tuple)
                                   else token is not None and token.fullmatch(char)):
                after.add(index + 1)
        return self._closure(after)

    def _closure(self, indices: set[int]) -> _State:
        """`indices` and every position after stars there (a star may match nothing)."""
        # No two stars are adjacent (`of`): a position after a star is never a star.
        return frozenset(indices | {index + 1 for index in indices
                                    if index < len(self.tokens) and self.tokens[index] == _STAR})


def replace_matches(pattern: Pattern, text: str, replacement: str, op: str) -> str:
    """${X/p/r} (op "/"), ${X//p/r}, ${X/#p/r} and ${X/%p/r} as bash's pat_subst does
    them: leftmost-longest matches, a null pattern replacing nothing (but prefixing or
    appending with # or %), an empty value matched as a whole."""
    if op in ("/#", "/%"):
        cut = pattern.prefix(text, True) if op == "/#" else pattern.suffix(text, True)
        if cut is None:
            return text
        return replacement + text[cut:] if op == "/#" else text[:len(text) - cut] + replacement
    if pattern.empty:
        return text
    if not text:
        return replacement if pattern.matches(text) else text
    out: list[str] = []
    at = size = 0
    while at < len(text):
        found = pattern.search(text, at)
        if found is None:
            break
        start, end = found
        out += [text[at:start], replacement]
        # Each replacement may lengthen the value: bound it before it is joined.
        size += start - at + len(replacement)
        check_length(size, pattern.line)
        if end == start:  # an empty match: keep one character and go on after it
            out.append(text[start])
            end += 1
        at = end
        if op == "/":
            break
    out.append(text[at:])
    return "".join(out)
