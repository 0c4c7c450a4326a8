"""`plan check MODEL --mesh SHAPE`: train the plan on gloo ranks and on one process."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.table import Table

from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.model_args import load
from planner.cli.plan import mesh_for, plan_on_mesh, print_plan
from planner.cluster import Cluster

# Most training steps a check runs: each is a full forward and backward on every rank.
MAX_STEPS = 1000
# Most ranks a check starts: each is a process on this machine.
MAX_LOCAL_RANKS = 16


def run_check(args: argparse.Namespace) -> int:
    from planner.check import check_plan

    cluster = Cluster.load(args.cluster)
    ranks = math.prod(mesh_for(args, cluster))
    if ranks > MAX_LOCAL_RANKS:
        raise UsageError(
            f"--mesh {args.mesh} needs {ranks} ranks, and plan check runs each as a process "
            f"on this machine (at most {MAX_LOCAL_RANKS}); check a smaller mesh"
        )
    loaded = load(args)
    if loaded.on_meta:
        raise UsageError(
            f"{args.model} is built on the meta device (no weights), so it cannot train; "
            "check a model with real weights (demo:NAME or a file.py:function factory)"
        )
    planned = plan_on_mesh(args, loaded, cluster)
    print_plan(planned)
    with console.status(f"training {args.steps} steps on {planned.plan.num_devices} gloo ranks"):
        report = check_plan(
            loaded.model,
            planned.program,
            planned.plan,
            loaded.loss_fn,
            loaded.example_inputs,
            steps=args.steps,
        )
    print_check(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        console.print(f"report written to {args.json}")
    return 0 if report.passed else 1


def print_check(report) -> None:
    table = Table(title=f"check over {report.steps} steps")
    table.add_column("step", justify="right")
    table.add_column("loss (sharded)", justify="right")
    table.add_column("loss (one process)", justify="right")
    for step, (got, want) in enumerate(zip(report.losses, report.reference_losses)):
        table.add_row(str(step), f"{got:.8f}", f"{want:.8f}")
    console.print(table)
    comm = Table(title="collectives per step: measured vs predicted")
    for column in ("kind", "measured", "predicted"):
        comm.add_column(column)
    kinds = sorted(set(report.measured_communication) | set(report.predicted_communication))
    for kind in kinds:
        m = report.measured_communication.get(kind, {"count": 0, "bytes": 0})
        p = report.predicted_communication.get(kind, {"count": 0, "bytes": 0})
        comm.add_row(kind, f"{m['count']} x, {m['bytes']:,} B", f"{p['count']} x, {p['bytes']:,} B")
    console.print(comm)
    verdict = "[green]PASSED[/green]" if report.passed else "[red]FAILED[/red]"
    collectives = "match" if report.communication_matches else "differ"
    console.print(
        f"{verdict}: max abs error {report.max_abs_error:.3e}, max rel error "
        f"{report.max_rel_error:.3e}; collectives {collectives}"
    )
    for line in report.mismatches:
        console.print(f"  {line}")


