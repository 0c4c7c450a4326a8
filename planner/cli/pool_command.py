"""`plan MODEL --cluster POOLS.yaml --gpus N --global-batch-size B`: a training plan on a
mixed cluster (`planner.vocabulary.pools`), each pool alone and pipelines across pools
(`planner.search.pool_space`), best first, with the stages each pool runs."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from planner.cli.emit_flags import check_emit_flags, emit_if_asked
from planner.cli.errors import UsageError
from planner.cli.model_args import load
from planner.cli.output import write_json
from planner.cli.parallel_flags import fixed_knobs
from planner.cli.report_flags import write_report_if_asked
from planner.cli.train import layout, print_training_plans, transformer_config
from planner.plans.pool_plan import plan_pools
from planner.search.knobs import check_knobs
from planner.models.config import TransformerConfig
from planner.models.sources import LoadedModel
from planner.vocabulary.plan import Plan
from planner.vocabulary.pools import PooledCluster

UNPOOLED_FLAGS = (("--segment", "segment"),
                  ("--bandwidth-sweep", "bandwidth_sweep"), ("--train-tokens", "train_tokens"),
                  ("--train-iters", "train_iters"), ("--objective", "objective"),
                  ("--elastic", "elastic"), ("--intra-op", "intra_op"))
"""Flags a plan on one kind of machine takes and a mixed cluster's does not (yet)."""


def run_pooled_training(args: argparse.Namespace, pooled: PooledCluster,
                        console: Console) -> int:
    """Plan on every pool alone and across pools, print the plans and the best plan's
    stages by pool, and write the best as JSON; UsageError (one line) for what a mixed
    cluster cannot take, before any search."""
    plans, model = pooled_plans(args, pooled, console, args.top)
    print_training_plans(plans, console)
    print_pools(plans[0], console)
    if getattr(args, "emit", None):
        crossing = {stage.pool for stage in plans[0].stages}
        if len(crossing) > 1:
            raise UsageError(
                "--emit: the best plan's pipeline crosses pools "
                f"({', '.join(sorted(map(str, crossing)))}); Megatron-LM, TorchTitan and "
                "DeepSpeed run one kind of GPU: run it on Tessel's runtime (plan check, "
                "planner.parallelize) with torchrun started on each pool's hosts with its "
                "own --nproc-per-node")
        emit_if_asked(args, plans[0], model, console)
    if args.json:
        write_json(args.json, plans[0].to_json(), "plan")
    # The report's memory chart against the pool with the least memory per device.
    tightest = min((pool.cluster for pool in pooled.pools),
                   key=lambda cluster: cluster.usable_memory_bytes)
    write_report_if_asked(args, plans, model, tightest, console, layout)
    return 0


def pooled_plans(args: argparse.Namespace, pooled: PooledCluster, console: Console,
                 top: int, loaded: LoadedModel | None = None,
                 ) -> tuple[list[Plan], TransformerConfig]:
    """The `top` best plans of the command line's model on `pooled`, best first, and the
    model's shape; UsageError (one line, before any search) for a flag a mixed cluster
    does not take, a --gpus that is not all its devices, or a knob a pool cannot honour."""
    given = [flag for flag, name in UNPOOLED_FLAGS
             if getattr(args, name, None) not in (None, False, "analytic")]
    if given:
        raise UsageError(f"{', '.join(given)}: not available on a mixed cluster "
                         f"({args.cluster} has pools); plan one pool's cluster for it")
    if args.gpus != pooled.num_devices:
        sizes = " + ".join(f"{pool.devices} {pool.name}" for pool in pooled.pools)
        raise UsageError(f"--gpus {args.gpus}: {args.cluster} has {sizes} = "
                         f"{pooled.num_devices} devices; give --gpus {pooled.num_devices}")
    if args.global_batch_size is None:
        raise UsageError("--gpus needs --global-batch-size (sequences per optimizer step)")
    check_emit_flags(args)
    model = transformer_config(loaded or load(args))
    knobs = fixed_knobs(args, model.num_layers)
    for pool in pooled.pools:
        try:
            check_knobs(knobs, model, pool.cluster, args.global_batch_size, args.space)
        except ValueError as error:
            raise UsageError(f"pool {pool.name}: {error}") from None
    with console.status(f"planning {args.model} on {pooled.name}"):
        plans, evaluated = plan_pools(args.model, model, pooled, args.global_batch_size,
                                      knobs, args.space, top)
    if not plans:
        raise UsageError(f"no plan fits: {args.model} fits neither one pool of "
                         f"{pooled.name} nor a pipeline across its pools with these knobs; "
                         "give more devices or relax a knob")
    console.print(f"searched {evaluated:,} configurations on {len(pooled.pools)} pools",
                  highlight=False)
    return plans, model


def print_pools(plan: Plan, console: Console) -> None:
    """The best plan's stages by pool: ranks, mesh and layers of each."""
    table = Table(title=f"{plan.model} on {plan.cluster}: stages by pool")
    for column in ("stage", "pool", "ranks", "mesh", "layers"):
        table.add_column(column, justify="left" if column == "pool" else "right")
    for index, stage in enumerate(plan.stages):
        last = stage.first_device + stage.num_devices - 1
        mesh = " x ".join(f"{axis}{size}" for axis, size in
                          zip(stage.mesh_axes, stage.mesh_shape) if size > 1) or "1"
        table.add_row(str(index), stage.pool or "-", f"{stage.first_device}-{last}", mesh,
                      f"{stage.layers[1] - stage.layers[0]}")
    console.print(table)
