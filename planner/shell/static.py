"""What a part of a script may assign and run, read from its text without evaluating it.

The evaluator does not run loops (`planner.shell.evaluator`): what a loop's body (and the
functions it calls) may assign is found here from the syntax tree, by the constructs that
assign (assignments, `declare` and its kin, `read`, `printf -v`, `let`, `(( ))`,
`${X:=...}`), and the simple commands it holds, to mark what they touch unknown.
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

from planner.shell.lexer import DECLARATIONS, Raw, is_name
from planner.shell.syntax import (
    AndOr, Arith, Case, Command, FunctionDef, Group, If, Loop, Pipeline, Sequence, Simple,
)


def simple_commands(node: object, functions: Mapping[str, Command]) -> Iterator[Simple]:
    """Every simple command inside `node` (called functions' included), unexpanded."""
    return (child for child in _walk(node, functions) if isinstance(child, Simple))


def _children(node: object) -> Iterator[object]:
    if isinstance(node, Sequence):
        yield from node.items
    elif isinstance(node, AndOr):
        yield node.first
        yield from (pipeline for _, pipeline in node.rest)
    elif isinstance(node, Pipeline):
        yield from node.commands
    elif isinstance(node, If):
        for condition, body in node.clauses:
            yield condition
            yield body
        if node.otherwise is not None:
            yield node.otherwise
    elif isinstance(node, Case):
        yield from (body for _, body in node.items)
    elif isinstance(node, Loop):
        if node.head is not None:
            yield node.head
        yield node.body
    elif isinstance(node, (Group, FunctionDef)):
        yield node.body
    elif isinstance(node, Arith):
        yield node.expression


_ARITH_TARGET = re.compile(r"([A-Za-z_]\w*)\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)|"
                           r"([A-Za-z_]\w*)\s*(?:\+\+|--)|(?:\+\+|--)\s*([A-Za-z_]\w*)")
_DEFAULT_TARGET = re.compile(r"\$\{([A-Za-z_]\w*):?=")


def assigned_names(node: object, functions: Mapping[str, Command]) -> Iterator[str]:
    """The names a part of a script may assign, read from its text (for loops, which
    are not run)."""
    for child in _walk(node, functions):
        if isinstance(child, Simple):
            for assign in child.assigns if not child.words else ():
                yield assign.name
            for assign in child.declared:
                yield assign.name
            texts = [raw.text for raw in child.words]
            if texts and texts[0] in ("read", "mapfile", "readarray", "getopts", "let",
                                      "printf", "unset") + tuple(DECLARATIONS):
                yield from (t for t in texts[1:] if is_name(t))
                if texts[0] == "let":
                    for text in texts[1:]:
                        yield from _arith_targets(text)
            for raw in child.words + tuple(a.value for a in child.assigns if a.value):
                yield from _DEFAULT_TARGET.findall(raw.text)
        elif isinstance(child, Raw):
            yield from _arith_targets(child.text)


def _arith_targets(text: str) -> Iterator[str]:
    for match in _ARITH_TARGET.finditer(text):
        yield next(name for name in match.groups() if name)


def _walk(node: object, functions: Mapping[str, Command],
          seen: frozenset[str] = frozenset()) -> Iterator[object]:
    yield node
    if isinstance(node, Simple):
        name = node.words[0].text if node.words else ""
        if name in functions and name not in seen:
            yield from _walk(functions[name], functions, seen | {name})
        return
    for child in _children(node):
        yield from _walk(child, functions, seen)
