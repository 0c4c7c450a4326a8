"""`--report PATH` on `plan`: the training plans as one self-contained HTML page
(`planner/export/html_report.py`)."""

from __future__ import annotations

import argparse
from typing import Callable

from rich.console import Console

from planner.cli.errors import UsageError, check_output_file
from planner.cli.parsing import training_only
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan

FLAG = "--report"


def report_path(text: str) -> str:
    """An argparse type: a file `--report` can write, checked as the command line is read
    (like --json), so that a search is not thrown away for a path that cannot be written."""
    try:
        check_output_file(FLAG, text)
    except UsageError as error:
        # The parser puts the flag in front of the message itself.
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"{FLAG} ")) from None
    return text


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """--report, a training-plan flag (a --mesh plan refuses it by name)."""
    action = parser.add_argument(
        FLAG, type=report_path, metavar="PATH",
        help="write the plans as one HTML page (nothing fetched when opened): the best "
        "plan's pipeline schedule of one step, its memory per stage, its step-time "
        "breakdown, the top plans' step time against memory, and the whole-run totals "
        "with --train-tokens or --train-iters")
    training_only(parser, action)


def write_report_if_asked(args: argparse.Namespace, plans: list[Plan],
                          model: TransformerConfig, cluster: Cluster, console: Console,
                          label: Callable[[Plan], str]) -> None:
    """With --report, write the report of `plans` (best first) and say where; `label`
    names a plan's layout as the plans' table does."""
    if not getattr(args, "report", None):
        return
    from planner.export.html_report import write_report

    write_report(args.report, plans, model, cluster, label)
    console.print(f"report written to {args.report}")
