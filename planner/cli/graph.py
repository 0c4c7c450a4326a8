"""`plan MODEL --gpus N ...` and `plan check MODEL --gpus N ...` for a model of one's own
(`file.py:function`, `package.module:function`, `demo:NAME`), and for a zoo or hf:
transformer with `--intra-op ilp`: the graph plan (`planner/search/graph_space.py`), stages
of the traced model each sharded by the intra-op ILP on its own submesh."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from planner.cli.errors import UsageError
from planner.cli.model_args import shape_overrides
from planner.cli.run_flags import objective_key, run_assumptions, wants_totals
from planner.cli.whole_run import emit_totals_and_json
from planner.cli.parallel_flags import training_flags_given
from planner.vocabulary.cluster import Cluster
from planner.models.sources import LoadedModel
from planner.vocabulary.plan import Plan
from planner.plans.totals import plan_totals
from planner.search.graph_knobs import GRAPH_PRECISIONS, GRAPH_SCHEDULES, GraphKnobs

if TYPE_CHECKING:
    from planner.search.graph_space import ReducedModel

# Flags a graph plan reads; the others are a transformer's knobs, which the ILP chooses.
GRAPH_FLAGS = ("--gpus", "--global-batch-size", "--micro-batch-size", "--top", "--space",
               "--intra-op", "--zero-stage", "--recompute-granularity", "--schedule",
               "--precision", "--train-iters", "--train-tokens", "--gpu-hour-price",
               "--failure-rate", "--checkpoint-write-gbps", "--sync-checkpoints",
               "--restart-minutes", "--pue", "--objective", "--emit", "--elastic")


def plan_graph(args: argparse.Namespace, loaded: LoadedModel, cluster: Cluster,
               console: Console, checking: bool = False) -> list[Plan]:
    """The best graph plans for the command line (best first, at most --top); `checking`:
    for `plan check`, which trains in the model's own precision unless told."""
    from planner.plans.graph_plan import graph_plan
    from planner.search.graph_space import search_graph

    if args.global_batch_size is None:
        raise UsageError("--gpus needs --global-batch-size (samples per optimizer step)")
    refused = [flag for flag in training_flags_given(args) if flag not in GRAPH_FLAGS]
    if refused:
        raise UsageError(
            f"{', '.join(refused)}: {loaded.name} is planned from its traced graph, where "
            "the intra-op ILP chooses every operator's sharding; drop "
            f"{'it' if len(refused) == 1 else 'them'} (--micro-batch-size, --zero-stage, "
            "--recompute-granularity, --schedule, --precision, --emit, --elastic and the "
            "whole run's flags are kept)"
        )
    knobs = graph_knobs(args)
    if args.precision is None and loaded.config is not None and not checking:
        # A transformer trains in mixed precision unless told, as its analytic plans do:
        # bf16, or fp16 with loss scaling on a device without bf16 (a V100).
        knobs = replace(knobs, precision=cluster.device.default_precision)
    try:
        cluster = cluster.with_devices(args.gpus)
    except ValueError as error:
        raise UsageError(f"--gpus {args.gpus}: {error}") from None
    problem = knobs.precision_problem(cluster.device.peak_tflops, cluster.device.name)
    if problem:
        raise UsageError(f"--precision {problem}")
    gbs = args.global_batch_size
    micro_batches = None
    if args.micro_batch_size is not None:
        if gbs % args.micro_batch_size:
            raise UsageError(f"--micro-batch-size {args.micro_batch_size} must divide "
                             f"--global-batch-size {gbs}")
        micro_batches = gbs // args.micro_batch_size
    with console.status(f"planning {loaded.name} on {args.gpus} x {cluster.device.name}"):
        found = search_graph(loaded.model, loaded.example_inputs, cluster, gbs,
                             loaded.loss_fn, micro_batches=micro_batches,
                             time_limit_s=args.time_limit, knobs=knobs,
                             reduced=reduced_model(loaded))
    console.print(
        f"{found.num_layers} layers, {found.layer_solves} layer ILPs, "
        f"{found.layer_bounds} bounds, {found.layouts_bounded} layouts bounded out; "
        + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in found.timings.items()),
        highlight=False)
    fitting = [c for c in found.candidates if c.fits]
    if not fitting:
        best = found.candidates[0]
        raise UsageError(
            f"no plan fits: {loaded.name} needs {max(best.memory_bytes) / 2**20:,.1f} MiB per "
            f"device at best, more than the {cluster.device.memory_gib * 1024:g} MiB of a "
            f"{cluster.device.name}; use more --gpus or a smaller --micro-batch-size"
        )
    shape = shape_overrides(args)
    return [graph_plan(c, cluster, loaded.name, gbs, args.model, shape)
            for c in fitting[: args.top]]


def reduced_model(loaded: LoadedModel) -> ReducedModel | None:
    """A model that can be rebuilt at another depth (a zoo or hf: transformer), built with
    REDUCED_BLOCKS blocks to trace in its place; None for others."""
    from passes.model_layers import REDUCED_BLOCKS
    from planner.search.graph_space import ReducedModel

    if loaded.num_layers is None or loaded.num_layers <= REDUCED_BLOCKS:
        return None
    # Only traced: built on the meta device even where the model itself has weights.
    built = (loaded.build_on(REDUCED_BLOCKS, "meta") if loaded.build_on
             else loaded.build(REDUCED_BLOCKS))
    return ReducedModel(built.model, loaded.num_layers)


def graph_knobs(args: argparse.Namespace) -> GraphKnobs:
    """The graph search's fixed choices from the command line; UsageError for a value a
    graph plan cannot run."""
    if args.recompute == "selective":
        raise UsageError("--recompute-granularity selective: a graph plan recomputes whole "
                         "stages; use full or none, or leave it to the search")
    if args.schedule not in (None, *GRAPH_SCHEDULES):
        raise UsageError(f"--schedule {args.schedule}: graph plans run "
                         f"{' or '.join(GRAPH_SCHEDULES)}")
    if args.precision not in (None, *GRAPH_PRECISIONS):
        raise UsageError(f"--precision {args.precision}: graph plans train in "
                         f"{', '.join(GRAPH_PRECISIONS)} (bf16 and fp16 with fp32 master "
                         "weights)")
    if args.zero_stage in (1, 2):
        raise UsageError(
            f"--zero-stage {args.zero_stage}: a graph plan shards a parameter, its gradient "
            "and optimizer state together (3) or leaves them to the ILP (0)")
    return GraphKnobs(
        recompute=None if args.recompute is None else args.recompute == "full",
        schedule=args.schedule or "1f1b",
        lean=None if args.zero_stage is None else args.zero_stage == 3,
        precision=args.precision or "fp32")


def describe(plan: Plan) -> str:
    """'4L:2x2 dp(rc) + 12L:2x2 3/20 mb8' — each stage's layers and logical mesh, how it
    splits the work (`_split`), (rc) where it recomputes."""
    stages = " + ".join(f"{s.layers[1] - s.layers[0]}L:{'x'.join(map(str, s.mesh_shape))}"
                        + _split(s) + ("(rc)" if s.recompute else "") for s in plan.stages)
    return f"{stages} mb{plan.micro_batch_size}"


def _split(stage) -> str:
    """How a stage splits its work: ' N/M' where N of its M parameters are sharded, ' dp'
    where it splits values but no parameter, ' rep' where every rank computes all of it
    (' rep+gather' where its input arrives split and is gathered first); '' on one
    device."""
    if stage.num_devices == 1:
        return ""
    placements = list(stage.parameters.values())
    sharded = sum("S" in placement for placement in placements)
    if sharded:
        return f" {sharded}/{len(placements)}"
    shardings = stage.shardings
    if any(placement is not None and placement.strip("R")
           for operators in shardings for node in operators.nodes.values()
           for placement in node.outputs):
        return " dp"
    split_input = any(placement.strip("R") for operators in shardings
                      for placement in operators.inputs.values())
    return " rep+gather" if split_input else " rep"


def print_graph_plans(plans: list[Plan], console: Console) -> None:
    best = plans[0]
    table = Table(title=f"{best.model} on {best.num_gpus} x {best.cluster}, global batch "
                        f"{best.global_batch_size}")
    for column in ("#", "stages", "step s",
                   "TFLOP/s/GPU", "MFU", "MiB/device"):
        table.add_column(column, justify="left" if column == "stages" else "right")
    for rank, plan in enumerate(plans, 1):
        p = plan.predicted
        table.add_row(str(rank), describe(plan), f"{p.step_time_s:.4f}",
                      "-" if p.model_tflops_per_gpu is None else f"{p.model_tflops_per_gpu:.3g}",
                      "-" if p.mfu is None else f"{p.mfu:.1%}",
                      f"{p.memory_gib_per_gpu * 1024:.2f}")
    console.print(table)
    console.print("stages: layers:logical mesh and how each splits its work (rep: every rank "
                  "computes all of it; dp: values split, no parameter; N/M: N of its M "
                  "parameters sharded), rc: recomputed", highlight=False)
    shards = Table(title="best plan: parameter placements per stage (first 8 of each)")
    for column in ("stage", "devices", "parameter", "placement"):
        shards.add_column(column)
    for index, stage in enumerate(best.stages):
        devices = f"{stage.first_device}-{stage.first_device + stage.num_devices - 1}"
        for fqn, placement in list(stage.parameters.items())[:8]:
            shards.add_row(str(index), devices, fqn, placement)
    console.print(shards)
    console.print(f"best: {best.num_micro_batches} micro-batches of {best.micro_batch_size}, "
                  f"{best.schedule.upper()}, {best.precision}; "
                  f"step {best.predicted.step_time_s:.4f} s, "
                  f"{best.predicted.memory_gib_per_gpu * 1024:.2f} MiB per device",
                  highlight=False)
    for note in best.replicated_notes():
        console.print(note, highlight=False)


def run_graph_training(args: argparse.Namespace, loaded: LoadedModel, cluster: Cluster,
                       console: Console) -> int:
    totals = _wants_graph_totals(args, cluster)
    plans = plan_graph(args, loaded, cluster, console)
    if totals:
        plans = _with_totals(plans, loaded, cluster, args)
    print_graph_plans(plans, console)
    emit_totals_and_json(args, plans, None, console, totals)
    return 0


def _wants_graph_totals(args: argparse.Namespace, cluster: Cluster) -> bool:
    """Whether the command line asks for the whole run (checked before any planning)."""
    if args.train_tokens is not None:
        raise UsageError("--train-tokens: a graph plan counts its run in steps (a model "
                         "of one's own has no tokens per sample); give --train-iters N")
    if not wants_totals(args):
        return False
    run_assumptions(args, cluster)  # a cluster without run costs is refused now
    return True


def _with_totals(plans: list[Plan], loaded: LoadedModel, cluster: Cluster,
                 args: argparse.Namespace) -> list[Plan]:
    """The plans with their whole run's totals (`planner.plans.totals`), ranked by --objective
    (fitting plans first) where given."""
    settings = run_assumptions(args, cluster)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    out = [plan.model_copy(update={"training": plan_totals(
        plan, parameters, cluster.with_devices(plan.num_gpus), args.train_iters, settings)})
        for plan in plans]
    return sorted(out, key=objective_key(args.objective)) if args.objective else out
