"""A whole training run in `plan`'s output: each plan's days, GPU-hours, cost, energy and
failure-adjusted totals (`planner.plans.totals`), plans ranked by `--objective`, and with
`--objective cost` the same search on fewer GPUs (a cheaper run may take longer)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from planner.cli.emit_flags import emit_if_asked
from planner.cli.errors import UsageError
from planner.cli.output import STDOUT, write_json
from planner.cli.run_flags import objective_key, run_assumptions
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan
from planner.plans.totals import plan_totals, run_steps

FEWER_GPU_HALVINGS = 3
"""With --objective cost, --gpus is a ceiling: the search also runs on 1/2, 1/4 and 1/8
of it (where the cluster allows that size)."""

Search = Callable[[int], tuple[list[Plan], TransformerConfig]]


def with_totals(plans: list[Plan], model: TransformerConfig, cluster: Cluster,
                args: argparse.Namespace) -> list[Plan]:
    """`plans` with their whole-run totals, ranked by --objective (as given otherwise)."""
    settings = run_assumptions(args, cluster)
    out = []
    for plan in plans:
        steps = run_steps(model, plan.global_batch_size or 1, args.train_tokens,
                          args.train_iters)
        totals = plan_totals(plan, model.num_parameters(), cluster.with_devices(plan.num_gpus),
                             steps, settings)
        out.append(plan.model_copy(update={"training": totals}))
    if args.objective:
        out.sort(key=objective_key(args.objective))
    return out


def fewer_gpu_plans(args: argparse.Namespace, cluster: Cluster, search: Search) -> list[Plan]:
    """With --objective cost: the plans of the same search on fewer GPUs (halving --gpus
    while the cluster takes that size and some plan fits), each with its totals."""
    if args.objective != "cost":
        return []
    out: list[Plan] = []
    gpus = args.gpus
    for _ in range(FEWER_GPU_HALVINGS):
        gpus //= 2
        try:
            cluster.with_devices(gpus)
        except ValueError:
            break
        try:
            plans, model = search(gpus)
        except UsageError:
            break  # nothing fits on so few
        out += with_totals(plans, model, cluster, args)
    return out


def emit_totals_and_json(args: argparse.Namespace, plans: list[Plan],
                         model: TransformerConfig | None, console: Console,
                         totals: bool) -> None:
    """What `plan` writes after its table of plans: the best plan's launch files (--emit),
    the whole run of each plan (`totals`: where asked), and with --json the best plan's
    JSON (a `Plan`, which `Plan.from_json` reads) and, where the table ranked more than one,
    every plan of the table, best first, as a list beside it (`ranked_path`)."""
    emit_if_asked(args, plans[0], model, console)
    if totals:
        print_totals(plans, console, args.objective)
    if args.json:
        write_json(args.json, plans[0].to_json(), "plan")
        if len(plans) > 1 and args.json != STDOUT:
            ranked = ",\n".join(plan.to_json() for plan in plans)
            write_json(ranked_path(args.json), f"[\n{ranked}\n]",
                       f"the {len(plans)} ranked plans")


def ranked_path(path: str) -> str:
    """Where --json PATH writes the ranked plans: PATH with '.ranked' before its suffix
    (plan.json -> plan.ranked.json)."""
    file = Path(path)
    return str(file.with_name(f"{file.stem}.ranked{file.suffix or '.json'}"))


def print_totals(plans: list[Plan], console: Console, objective: str | None) -> None:
    """The plans' whole-run table, in their order (that of the plans' table), and the
    assumptions behind it."""
    first = plans[0].training
    assert first is not None
    ranked = f", ranked by expected {objective}" if objective else ""
    table = Table(title=f"the whole run of each plan above: {first.steps:,} steps{ranked}")
    columns = ("#", "GPUs", "days", "GPU-h", "$k", "MWh", "ETTR", "E days", "E $k")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for rank, plan in enumerate(plans, 1):
        t = plan.training
        assert t is not None
        table.add_row(str(rank), str(plan.num_gpus), f"{t.days:.1f}", f"{t.gpu_hours:,.0f}",
                      f"{t.cost_usd / 1e3:,.0f}", f"{t.energy_kwh / 1e3:,.0f}", f"{t.ettr:.3f}",
                      f"{t.expected_days:.1f}", f"{t.expected_cost_usd / 1e3:,.0f}")
    console.print(table)
    console.print("E days, E $k: expected with failures, checkpoints and restarts; ETTR: "
                  "useful over expected wall time.", highlight=False)
    console.print(
        f"assumes ${first.gpu_hour_usd:g} per GPU-hour; failures every "
        f"{first.mttf_hours:.1f} h on {plans[0].num_gpus} GPUs (MTTF); a checkpoint of "
        f"{first.checkpoint_bytes / 1e9:,.0f} GB blocking {first.checkpoint_blocking_s:.1f} s "
        f"every {first.checkpoint_interval_s / 60:.1f} min (Young/Daly); see --help for each",
        highlight=False,
    )
