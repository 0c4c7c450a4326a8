"""Bash launch scripts read as bash runs them, without running anything.

A launch script is a program: variables with defaults, arrays built with `+=`, flags set
inside `if` blocks, `$(( ))` arithmetic. `evaluate_script` evaluates it as bash would and
returns what it runs (the command that runs a Python script, with its words as bash
expands them, each knowing the line it came from), never running a command: a command
substitution, a loop, `source` or `eval` leave what they touch unknown, named with its
line, for the reader of the training command to refuse. Modules import one way:
`evaluator` -> `conditions` -> `words` -> `arithmetic` -> `parameters`;
`evaluator` -> `static` -> `syntax` -> `lexer`.
"""

from planner.shell.evaluator import Ran, ScriptRun, evaluate_script
from planner.shell.parameters import Word
from planner.shell.lexer import ShellError

__all__ = ["Ran", "ScriptRun", "ShellError", "Word", "evaluate_script"]
