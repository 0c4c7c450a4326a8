"""The `plan` command line: one module per command, the flag tables, and the one handler
that turns every failure into one line (`errors.py`)."""

from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.main import main
from planner.cli.plan_command import parse_mesh

__all__ = ["UsageError", "console", "main", "parse_mesh"]
