"""`--bandwidth-sweep` on `plan`: the best plan's step and exposed communication as each
tier of the fabric gets slower or faster, and the bandwidth per tier at which its
communication hides (`cost_models.bandwidth_sweep`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from planner.cli.parsing import training_only
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.plan import Plan

if TYPE_CHECKING:
    from planner.models.config import TransformerConfig

FLAG = "--bandwidth-sweep"


def add_network_flags(parser: argparse.ArgumentParser) -> None:
    """--bandwidth-sweep, a training-plan flag (a --mesh plan refuses it by name)."""
    action = parser.add_argument(
        FLAG, action="store_true",
        help="after the plans, the best plan's step time and exposed communication with "
        "each tier of the fabric (scale-up within a node, scale-out between nodes) at 1/8x "
        "to 8x its bandwidth, and the bandwidth per GPU at which each tier's communication "
        "hides (the step within one percent of an unbounded link's)")
    training_only(parser, action)


def with_network_if_asked(args: argparse.Namespace, plan: Plan,
                          model: TransformerConfig, cluster: Cluster) -> Plan:
    """With --bandwidth-sweep, `plan` (the best) with its sweep on `cluster`, tier by tier
    (`Plan.network`: what the table below and the report read); else `plan`."""
    if not getattr(args, "bandwidth_sweep", False):
        return plan
    from cost_models.bandwidth_sweep import tier_keys, tier_sweep
    from planner.export.plan_config import parallel_config, stage_layouts

    cluster = cluster.with_devices(plan.num_gpus)
    parallel, stages = parallel_config(plan), stage_layouts(plan)
    sweeps = [tier_sweep(model, cluster, parallel, stages, key) for key in tier_keys(cluster)]
    return plan.model_copy(update={"network": sweeps})


def print_network(plan: Plan, console: Console) -> None:
    """The best plan's sweep (`Plan.network`), tier by tier; nothing when it has none."""
    if not plan.network:
        return
    from cost_models.bandwidth_sweep import HIDDEN

    table = Table(title=f"the best plan's step by bandwidth, {plan.num_gpus:,} x "
                  f"{plan.cluster}")
    for column in ("tier", "GB/s per GPU", "of the cluster's", "step s", "exposed comm."):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for sweep in plan.network:
        for k, point in enumerate(sweep.points):
            table.add_row(sweep.name if k == 0 else "",
                          f"{point.bandwidth_gbs:,.4g}", f"{point.factor:g}x",
                          f"{point.step_s:.3f}",
                          f"{point.exposed_s:.3f} s ({point.exposed_s / point.step_s:.0%})",
                          end_section=k == len(sweep.points) - 1)
    console.print(table)
    for sweep in plan.network:
        if sweep.hides_at_gbs is None:
            console.print(f"{sweep.name}: this plan sends nothing over it that its step "
                          "waits on", highlight=False)
            continue
        console.print(
            f"{sweep.name}: communication hides (step within {HIDDEN:.0%} of an unbounded "
            f"link's, {sweep.unbounded_step_s:.3f} s) at {sweep.hides_at_gbs:,.1f} GB/s per "
            f"GPU and direction, {sweep.hides_at_gbs / sweep.cluster_gbs:.2g}x the "
            f"cluster's {sweep.cluster_gbs:g}", highlight=False)
