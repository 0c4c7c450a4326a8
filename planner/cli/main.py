"""The `plan` command.

    plan MODEL --mesh 4 [--cluster cpu] [--json PATH] [--emit-code DIR]
    plan check MODEL --mesh 2x2 [--steps 3] [--json PATH]
    plan inspect MODEL [--json PATH]
    plan profile [--output tessel-profile.json] [--ranks 2,4] [--max-bytes 16MiB]
    plan models
    plan clusters

MODEL is a preset (`plan models`), `gpt`/`llama`/`mixtral` with Megatron-LM shape flags
(`--num-layers 96 --hidden-size 12288 ...`), `hf:path/to/config.json`, `demo:NAME`,
`path/to/file.py:function` or `package.module:function`. A mistake in the input exits
with status 2 and one line saying what to change (a traceback only with --debug);
`plan check` exits 1 when the sharded run does not match the single process.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from rich.table import Table

from passes.trace import TraceError
from planner.model_flags import add_model_shape_flags, shape_overrides
from planner.model_spec import ACCEPTED_FORMS, ModelSpecError
from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.parallel_flags import add_parallel_flags



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
    return shape


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=ACCEPTED_FORMS)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_model_shape_flags(parser)


def _common(parser: argparse.ArgumentParser) -> None:
    _model_arguments(parser)
    parser.add_argument(
        "--mesh", default=None,
        help="logical device mesh for operator shardings, e.g. 4 or 2x2 (default 4; zoo "
        "and hf: models plan a cluster with --gpus instead)",
    )
    parser.add_argument(
        "--cluster", default="cpu",
        help="cluster preset or YAML/JSON file (default cpu; `plan clusters` lists presets)",
    )
    parser.add_argument("--time-limit", type=float, default=60.0, help="ILP time limit in seconds")
    parser.add_argument(
        "--profile", metavar="PATH",
        help="price ops and collectives with this `plan profile` database where it has "
        "measurements (default: the cluster's analytical models)",
    )


def build_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand; "" is plain `plan MODEL`."""
    plan = argparse.ArgumentParser(
        prog="plan",
        description="Plan how to train a model: with --gpus and --global-batch-size, the "
        "best parallel configuration for a cluster (every knob not given is searched); "
        "with --mesh, the sharding of every operator on one device mesh.",
    )
    _common(plan)
    plan.add_argument(
        "--emit-code", metavar="DIR", help="write each rank's program as DIR/rankN.py"
    )
    add_parallel_flags(plan)
    check = argparse.ArgumentParser(
        prog="plan check",
        description="Plan, train on gloo ranks and on one process, and compare.",
    )
    _common(check)
    check.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    inspect = argparse.ArgumentParser(
        prog="plan inspect",
        description="Trace a model (on the meta device for zoo and hf: models) and list "
        "its layers, templates, parameters, FLOPs and activation bytes per token.",
    )
    _model_arguments(inspect)
    from planner.cli.profile import add_profile_arguments

    profile = argparse.ArgumentParser(
        prog="plan profile",
        description="Time matmuls, an elementwise op and collectives on this machine (CPU "
        "and gloo, or GPUs and NCCL) and write them to a database for `plan --profile`.",
    )
    add_profile_arguments(profile)
    from planner.cli.calibrate import add_calibrate_arguments

    calibrate = argparse.ArgumentParser(
        prog="plan calibrate",
        description="Fit a cluster preset's efficiency parameters to measured step times.",
    )
    add_calibrate_arguments(calibrate)
    return {"": plan, "check": check, "inspect": inspect, "profile": profile,
            "calibrate": calibrate}


_RUNNERS = {
    "": "run_plan", "check": "run_check", "inspect": "run_inspect", "profile": "run_profile",
    "calibrate": "run_calibrate",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["models"]:
        return run_models()
    if argv[:1] == ["clusters"]:
        return run_clusters()
    command = argv[0] if argv and argv[0] in _RUNNERS else ""
    args = build_parsers()[command].parse_args(argv[1:] if command else argv)
    try:
        return globals()[_RUNNERS[command]](args)
    except (UsageError, ModelSpecError, TraceError, ValueError, FileNotFoundError) as error:
        if args.debug:
            raise
        console.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        return 2


def _load(args: argparse.Namespace):
    from planner.model_spec import load_model

    return load_model(args.model, shape_overrides(args))


def _plan(args: argparse.Namespace, loaded):
    from planner.api import plan_model

    if args.mesh is None and loaded.config is not None:
        # Tracing a full-size model whole for one operator-level ILP is rarely what the
        # user meant; a cluster plan is.
        raise UsageError(
            f"{args.model} is a transformer given by its shape: add --gpus N "
            "--global-batch-size B for a training plan, or --mesh SHAPE to shard its "
            "operators on one mesh"
        )
    mesh = parse_mesh(args.mesh or "4")
    with console.status(f"planning {args.model} on mesh {'x'.join(map(str, mesh))}"):
        planned = plan_model(
            loaded.model,
            loaded.example_inputs,
            mesh,
            args.cluster,
            loaded.loss_fn,
            name=args.model,
            time_limit_s=args.time_limit,
            profile=args.profile,
        )
    return planned


def run_plan(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if args.gpus is not None:
        from planner.cli.train import run_training

        return run_training(args, _transformer_config(loaded), console, loaded)
    planned = _plan(args, loaded)
    print_plan(planned)
    if args.json:
        planned.plan.to_json(args.json)
        console.print(f"plan written to {args.json}")
    if args.emit_code:
        from passes.emit import emit_rank_programs

        paths = emit_rank_programs(planned.program, planned.plan, args.emit_code)
        console.print(f"{len(paths)} rank programs written to {args.emit_code}/")
    return 0


def _transformer_config(loaded):
    """The zoo shape of a model, for training plans; UsageError for other models."""
    from planner.models.config import TransformerConfig

    if isinstance(loaded.config, TransformerConfig):
        return loaded.config
    if loaded.config is not None:
        from planner.models.huggingface import to_transformer_config

        shape = to_transformer_config(loaded.config, loaded.seq_length)
        # --num-layers rebuilt the model at that depth; plan that depth.
        return shape.model_copy(update={"num_layers": loaded.num_layers or shape.num_layers})
    raise UsageError(
        f"--gpus plans a transformer given by its shape (a preset, gpt/llama/mixtral flags "
        f"or hf:config.json); for {loaded.name}, plan operator shardings with --mesh"
    )


def run_check(args: argparse.Namespace) -> int:
    from planner.check import check_plan

    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be at least 1")
    loaded = _load(args)
    if loaded.on_meta:
        raise UsageError(
            f"{args.model} is built on the meta device (no weights), so it cannot train; "
            "check a model with real weights (demo:NAME or a file.py:function factory)"
        )
    planned = _plan(args, loaded)
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


def run_profile(args: argparse.Namespace) -> int:
    """`plan profile`: measure this machine into a profile database."""
    from planner.cli.profile import run_profile as measure

    return measure(args, console)


def run_calibrate(args: argparse.Namespace) -> int:
    """`plan calibrate`: fit a preset's efficiency to measured step times."""
    from planner.cli.calibrate import run_calibrate as fit

    return fit(args, console)


def run_inspect(args: argparse.Namespace) -> int:
    """`plan inspect`: layers and templates of a model, traced once per template."""
    from passes.model_graph import trace_model
    from planner.layer_report import inspect_report

    loaded = _load(args)
    with console.status(f"tracing {args.model}"):
        graph = trace_model(loaded.build, loaded.num_layers)
    report = inspect_report(args.model, graph)
    print_inspect(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        console.print(f"report written to {args.json}")
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


def run_models() -> int:
    """`plan models`: the built-in model presets with their parameter counts."""
    from planner.models.presets import PRESETS

    table = Table(title="model presets")
    for column in ("name", "parameters", "layers", "hidden", "heads", "kv heads", "experts"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for name, config in PRESETS.items():
        table.add_row(
            name,
            f"{config.num_parameters() / 1e9:,.2f} B",
            str(config.num_layers),
            str(config.hidden_size),
            str(config.num_attention_heads),
            str(config.num_kv_heads),
            str(config.num_experts or "-"),
        )
    console.print(table)
    return 0


def _figure(value: float | None) -> str:
    """989.5 -> '989.5', 2000.0 -> '2000', None -> '-': datasheet numbers, compactly."""
    return "-" if value is None else f"{value:g}"


def run_clusters() -> int:
    """`plan clusters`: the built-in cluster presets with their datasheet numbers."""
    from planner.cluster import Cluster

    table = Table(
        title="cluster presets",
        caption="per node: devices in one scale-up domain. up: scale-up link (NVLink, "
        "Infinity Fabric, RoCE), out: scale-out network; GB/s per GPU per direction. "
        "Datasheet peaks: `description` in each preset names its sources.",
    )
    columns = ("name", "device", "per\nnode", "memory\nGiB", "HBM\nGB/s", "bf16\nTFLOP/s",
               "fp8\nTFLOP/s", "up\nGB/s", "out\nGB/s")
    for column in columns:
        # Names and numbers never wrap; on a narrow terminal the device name folds instead.
        table.add_column(column, justify="left" if column in columns[:2] else "right",
                         no_wrap=column != "device", overflow="fold")
    for name in Cluster.presets():
        cluster = Cluster.load(name)
        device = cluster.device
        table.add_row(
            name,
            device.name,
            str(cluster.devices_per_node),
            _figure(device.memory_gib),
            _figure(device.memory_bandwidth_gbs),
            _figure(device.peak_tflops.get("bf16")),
            _figure(device.peak_tflops.get("fp8")),
            _figure(cluster.intra_node.bandwidth_gbs),
            _figure(cluster.inter_node.bandwidth_gbs),
        )
    console.print(table)
    return 0


def print_plan(planned) -> None:
    plan = planned.plan
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
    for phase, kinds in plan.communication_by_phase.items():
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
        f"solver {plan.solver.status} (gap {plan.solver.gap:.2%}, {plan.solver.num_variables:,} "
        f"variables); trace {t.trace_s:.1f} s, strategies {t.strategies_s:.1f} s, "
        f"ILP {t.ilp_s:.1f} s"
    )
    if plan.solver.status != "OPTIMAL" and plan.solver.gap > 0.01:
        console.print(
            f"[yellow]not proven optimal:[/yellow] the ILP stopped at its time limit with a "
            f"{plan.solver.gap:.0%} optimality gap; raise --time-limit for a better plan",
            highlight=False,
        )
    if plan.fallback_ops:
        ops = ", ".join(sorted({f.op for f in plan.fallback_ops}))
        console.print(f"[yellow]replicated (no sharding rule):[/yellow] {ops}")


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


if __name__ == "__main__":
    sys.exit(main())
