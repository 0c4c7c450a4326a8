"""`plan inspect MODEL`: the layers and templates the planner sees, traced on meta."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from planner.cli.console import console
from planner.cli.output import write_json
from planner.cli.model_args import load


def run_inspect(args: argparse.Namespace) -> int:
    """`plan inspect`: layers and templates of a model, traced once per template."""
    from passes.model_graph import trace_model
    from planner.cli.layer_report import inspect_report

    loaded = load(args)
    with console.status(f"tracing {args.model}"):
        graph = trace_model(loaded.build, loaded.num_layers)
    report = inspect_report(args.model, graph)
    print_inspect(report)
    if args.json:
        write_json(args.json, json.dumps(report.to_dict(), indent=2), "report")
    return 0


def print_inspect(report) -> None:
    table = Table(
        title=f"{report.model}: layers (forward ops, FLOPs and saved activations per token)"
    )
    for column in ("layers", "x", "template", "ops", "params", "GFLOP/tok", "act KiB/tok"):
        justify = "left" if column in ("layers", "template") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    for row in report.rows:
        # "layers.0-95": the run's first name and the last one's index.
        span = row.first if row.count == 1 else f"{row.first}-{row.last.rpartition('.')[2]}"
        table.add_row(
            span, str(row.count), row.template[:8], str(row.forward_ops),
            _compact(row.parameters), f"{row.flops_per_token / 1e9:,.3f}",
            f"{row.activation_bytes_per_token / 1024:,.1f}",
        )
    console.print(table)
    traced = (
        f"{report.traced_blocks} blocks traced, the rest reuse their template"
        if report.traced_blocks else "traced whole"
    )
    console.print(
        f"{report.num_layers} layers, {report.num_templates} templates, "
        f"{report.num_parameters:,} parameters ({report.num_parameters / 1e9:,.2f} B); "
        f"trace {report.trace_s:.2f} s ({traced}), layers {report.layers_s:.2f} s"
    )
    if report.ops_without_rule:
        console.print(
            "[yellow]no sharding rule (run replicated):[/yellow] "
            + ", ".join(report.ops_without_rule)
        )
    else:
        console.print("every op has a sharding rule")


def _compact(count: float) -> str:
    """1234567 -> '1.23M': parameter counts that fit a narrow terminal."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(int(count))


