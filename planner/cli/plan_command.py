"""`plan MODEL`: a training plan for a cluster (`--gpus`, see `train.py`) or the sharding
of every operator on one device mesh (`--mesh`)."""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from rich.table import Table

from passes.deadline import DeadlinePassed
from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.output import write_json
from planner.cli.model_args import load, load_any_cluster
from planner.cli.parallel_flags import training_flags_given
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.pools import PooledCluster
from planner.models.sources import LoadedModel

# Strategies per op grow exponentially with mesh axes (each axis multiplies the
# placements of every input); past three the ILP would not be built in any time limit.
MAX_MESH_AXES = 3


def parse_mesh(text: str) -> tuple[int, ...]:
    """'4' -> (4,), '2x2' -> (2, 2)."""
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(s < 1 for s in shape):
        raise UsageError(
            f"--mesh {text!r} is not a mesh shape; write sizes joined by x, e.g. 4 or 2x2"
        )
    if len(shape) > MAX_MESH_AXES:
        raise UsageError(
            f"--mesh {text} has {len(shape)} axes; Tessel plans meshes of at most "
            f"{MAX_MESH_AXES} (strategies grow exponentially with axes): merge some, e.g. "
            f"{'x'.join(map(str, (math.prod(shape[:-2]), *shape[-2:])))}"
        )
    return shape


def mesh_for(args: argparse.Namespace, cluster: Cluster) -> tuple[int, ...]:
    """The --mesh shape (default 4), which must fit in the cluster's devices; UsageError
    for training-plan flags, which an operator-level plan has no use for."""
    given = training_flags_given(args)
    if given:
        raise UsageError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to training "
            "plans: add --gpus N "
            "--global-batch-size B (a --mesh plan chooses every operator's sharding itself)"
        )
    mesh = parse_mesh(args.mesh if args.mesh is not None else "4")
    if math.prod(mesh) > cluster.num_devices:
        raise UsageError(
            f"--mesh {'x'.join(map(str, mesh))} needs {math.prod(mesh):,} devices but "
            f"--cluster {args.cluster} has {cluster.num_devices}; use a smaller mesh or a "
            "cluster file with more (num_nodes)"
        )
    return mesh


def plan_on_mesh(args: argparse.Namespace, loaded: LoadedModel, cluster: Cluster):
    """The operator-level plan of `loaded` on --mesh."""
    from planner.api import plan_model

    if args.mesh is None and loaded.config is not None:
        # Tracing a full-size model whole for one operator-level ILP is rarely what the
        # user meant; a cluster plan is.
        raise UsageError(
            f"{args.model} is a transformer given by its shape: add --gpus N "
            "--global-batch-size B for a training plan, or --mesh SHAPE to shard its "
            "operators on one mesh"
        )
    mesh = mesh_for(args, cluster)
    with console.status(f"planning {args.model} on mesh {'x'.join(map(str, mesh))}"):
        try:
            return plan_model(
                loaded.model, loaded.example_inputs, mesh, cluster, loaded.loss_fn,
                name=args.model, time_limit_s=args.time_limit, profile=args.profile,
            )
        except DeadlinePassed as error:
            raise UsageError(
                f"--time-limit {args.time_limit:g}: {error}; raise it, or plan on a mesh with "
                "fewer axes"
            ) from None


def run_plan(args: argparse.Namespace) -> int:
    any_cluster = load_any_cluster(args)
    if isinstance(any_cluster, PooledCluster):
        if args.gpus is None:
            raise UsageError(f"--cluster {args.cluster} has pools: give --gpus "
                             f"{any_cluster.num_devices} --global-batch-size B for a training "
                             "plan (an operator-level --mesh plan runs on one kind of device)")
        from planner.cli.pool_command import run_pooled_training

        return run_pooled_training(args, any_cluster, console)
    cluster = any_cluster
    if args.gpus is not None:
        from planner.cli.train import run_training

        mesh_only = [flag for flag, value in (("--mesh", args.mesh), ("--emit-code",
                     args.emit_code), ("--profile", args.profile)) if value is not None]
        if mesh_only:
            raise UsageError(
                f"{', '.join(mesh_only)} {'is' if len(mesh_only) == 1 else 'are'} for an "
                "operator-level plan on one mesh, and --gpus "
                "asks for a training plan of a cluster; give one of the two"
            )
        return run_training(args, cluster, console)
    mesh_for(args, cluster)  # before loading the model: a bad mesh costs nothing
    planned = plan_on_mesh(args, load(args), cluster)
    print_plan(planned)
    if args.json:
        write_json(args.json, planned.plan.to_json(), "plan")
    if args.emit_code:
        from passes.emit import emit_rank_programs

        paths = emit_rank_programs(planned.program, planned.plan, args.emit_code)
        console.print(f"{len(paths)} rank programs written to {args.emit_code}/")
    return 0


def print_plan(planned) -> None:
    plan = planned.plan
    solver = plan.operators.solver
    by_module: dict[str, list[str]] = defaultdict(list)
    for fqn, placement in plan.parameters.items():
        module, _, leaf = fqn.rpartition(".")
        by_module[module or "(root)"].append(f"{leaf}={placement}")
    table = Table(title=f"{plan.model}: parameter shardings on mesh {plan.mesh_shape}")
    table.add_column("module")
    table.add_column("parameters")
    for module, entries in by_module.items():
        table.add_row(module, "  ".join(entries))
    console.print(table)

    comm = Table(title="collectives of one training step (per rank)")
    for column in ("phase", "kind", "count", "bytes"):
        comm.add_column(column, justify="right" if column in ("count", "bytes") else "left")
    for phase, kinds in plan.operators.communication_by_phase.items():
        for kind, stats in kinds.items():
            comm.add_row(phase, kind, str(stats.count), f"{stats.bytes:,}")
    console.print(comm)
    p = plan.predicted
    console.print(
        f"predicted step time {p.step_time_s * 1e3:.3f} ms (compute {p.compute_s * 1e3:.3f} ms, "
        f"communication {p.communication_s * 1e3:.3f} ms); memory per device "
        f"{p.memory_bytes_per_device / 2**20:.2f} MiB; costs {plan.cost_source}"
    )
    t = planned.timings
    console.print(
        f"solver {solver.status} (gap {solver.gap:.2%}, {solver.num_variables:,} "
        f"variables); trace {t.trace_s:.1f} s, strategies {t.strategies_s:.1f} s, "
        f"ILP {t.ilp_s:.1f} s"
    )
    if solver.status != "OPTIMAL" and solver.gap > 0.01:
        console.print(
            f"[yellow]not proven optimal:[/yellow] the ILP stopped at its time limit with a "
            f"{solver.gap:.0%} optimality gap; raise --time-limit for a better plan",
            highlight=False,
        )
    for note in plan.replicated_notes():
        console.print(note, highlight=False)
    if plan.operators.fallback_ops:
        ops = ", ".join(sorted({f.op for f in plan.operators.fallback_ops}))
        console.print(f"[yellow]replicated (no sharding rule):[/yellow] {ops}")


