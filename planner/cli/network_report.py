"""`--bandwidth-sweep` on `plan`: the best plan's step and exposed communication as each
tier of the fabric gets slower or faster, and the bandwidth per tier at which its
communication hides (`cost_models.bandwidth_sweep`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

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
    given = parser.get_default("training_flags") or ()
    parser.set_defaults(training_flags=(*given, (FLAG, action.dest, action.default)))


def print_bandwidth_sweep_if_asked(args: argparse.Namespace, plan: Plan,
                                   model: TransformerConfig, cluster: Cluster,
                                   console: Console) -> None:
    """With --bandwidth-sweep, the sweep of `plan` (the best) on `cluster`, tier by tier."""
    if not getattr(args, "bandwidth_sweep", False):
        return
    from cost_models.bandwidth_sweep import FACTORS, HIDDEN, tier_keys, tier_name, tier_sweep
    from planner.export.plan_config import parallel_config, stage_layouts

    cluster = cluster.with_devices(plan.num_gpus)
    parallel, stages = parallel_config(plan), stage_layouts(plan)
    sweeps = [tier_sweep(model, cluster, parallel, stages, tier) for tier in tier_keys(cluster)]
    table = Table(title=f"the best plan's step by bandwidth, {plan.num_gpus:,} x "
                  f"{cluster.device.name}")
    for column in ("tier", "GB/s per GPU", "of the cluster's", "step s", "exposed comm."):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for sweep in sweeps:
        for factor, point in zip(FACTORS, sweep.points):
            table.add_row(tier_name(cluster, sweep.tier) if factor == FACTORS[0] else "",
                          f"{point.bandwidth_gbs:,.4g}", f"{factor:g}x", f"{point.step_s:.3f}",
                          f"{point.exposed_s:.3f} s ({point.exposed_s / point.step_s:.0%})",
                          end_section=factor == FACTORS[-1])
    console.print(table)
    for sweep in sweeps:
        name = tier_name(cluster, sweep.tier)
        if sweep.hides_at_gbs is None:
            console.print(f"{name}: this plan sends nothing over it that its step waits on",
                          highlight=False)
            continue
        console.print(
            f"{name}: communication hides (step within {HIDDEN:.0%} of an unbounded link's, "
            f"{sweep.unbounded_step_s:.3f} s) at {sweep.hides_at_gbs:,.1f} GB/s per GPU and "
            f"direction, {sweep.hides_at_gbs / sweep.preset_gbs:.2g}x the cluster's "
            f"{sweep.preset_gbs:g}", highlight=False)
