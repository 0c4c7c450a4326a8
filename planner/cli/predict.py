"""`plan predict`: the prediction of exactly the run a Megatron-LM launch line or a
TorchTitan job config starts, and the best plan the search finds for the same model,
cluster and global batch.

    plan predict --cluster dgx-h100 --gpus 512 -- --num-layers 80 --hidden-size 8192 ...
    plan predict --cluster dgx-h100 --args-file launch.sh [--env NNODES=8] [--explain-args]
    plan predict --cluster dgx-h100 --gpus 64 --torchtitan llama3_70b [-- --parallelism...]
    plan predict --cluster dgx-h100 --torchtitan llama3_8b.toml [--gpus 64]

The launch line (or script, evaluated as bash runs it by `planner/shell/`) is read as
Megatron-LM reads it (`planner/megatron/`), a TorchTitan job (0.3's registry config or
config module, 0.2's TOML) as TorchTitan reads it (`planner/torchtitan/`): the engine's own
defaults for everything absent, its rules, what changes neither time nor memory ignored.
The output is `plan`'s: step time, tokens/s, model and hardware TFLOP/s, MFU, memory per
GPU, allocated and reserved (a run that would not fit is called out, not refused) and the
breakdown; then the best plans of the search, priced as the same engine runs them (the
run's precision kept, every other knob free), the speed-up of the best and the Megatron-LM
flags or TorchTitan keys that change. --json writes both plans and the comparison.
"""

from __future__ import annotations


import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from planner.vocabulary.parallel import FixedKnobs
from planner.cli.errors import UsageError
from planner.cli.launch_script import (
    environment_pair, launch_line, parsed_flags, print_launch_words, world_size,
)
from planner.cli.model_args import add_headroom_argument, add_segment_argument, load_cluster
from planner.cli.parallel_flags import MAX_TOP
from planner.cli.output import write_json
from planner.cli.parsing import Parser, whole
from planner.cli.run_flags import add_run_flags, wants_totals
from planner.cli.whole_run import print_totals, with_totals
from planner.search.megatron_space import MAX_GPUS, SEARCH_SPACES

if TYPE_CHECKING:
    from planner.vocabulary.cluster import Cluster
    from planner.megatron import MegatronArgs, MegatronRun
    from planner.models.config import TransformerConfig
    from planner.vocabulary.parallel import ParallelConfig
    from planner.vocabulary.plan import Plan
    from planner.torchtitan import TorchTitanJob

# Knobs the best plan keeps from the launch line: the precision and fp8 recipe change the
# numerics, not only the speed; the attention kernels and CUDA graphs are software
# choices the search does not make (it runs attention as the device does, graphs off).
KEPT = ("precision", "fp8_recipe", "attention_backend", "cuda_graphs")
# What the best plan keeps from a job config: the precision and recipe, TorchTitan as the
# engine, and compile and fp8 all-gathers (software choices the search does not make).
TORCHTITAN_KEPT = ("precision", "fp8_recipe", "engine", "compile", "compile_loss",
                   "fp8_param_gather")


@dataclass(frozen=True)
class Given:
    """What a prediction was read from, in the words its output uses."""

    label: str
    """"launch line" or "job config"."""
    unit: str
    """What it is made of: "flag" or "key"."""
    notes: list[str]
    """Defaults worth saying out loud."""
    ignored: list[str]
    """What it sets that changes neither time nor memory."""


def predict_parser(prog: str, description: str) -> Parser:
    """The parser of `plan predict`: an unknown --flag that is not a misspelt one of its
    own is most likely a Megatron-LM flag given before `--`; it says so."""

    def hint(flag: str) -> str:
        if not flag.startswith("--"):
            return f"see {prog} -h"
        return f"put Megatron-LM's flags after --, e.g. {prog} --cluster C --gpus N -- {flag} ..."

    parser = Parser(prog=prog, description=description, unknown_hint=hint)
    add_predict_arguments(parser)
    return parser


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "flags", nargs="*", metavar="-- MEGATRON_FLAGS",
        help="the flags of a pretrain_gpt.py launch line, after -- (a torchrun prefix is "
        "allowed); with --args-file, added after the file's",
    )
    parser.add_argument(
        "--cluster", help="cluster preset or YAML/JSON file the run is on (`plan clusters` "
        "lists the presets)",
    )
    add_headroom_argument(parser)
    add_segment_argument(parser)
    parser.add_argument(
        "--gpus", type=whole(1, MAX_GPUS),
        help="GPUs of the run (the world size); optional when the launch line's torchrun "
        "gives --nnodes and --nproc-per-node, or the job config's degrees give it (no -1)",
    )
    parser.add_argument(
        "--torchtitan", metavar="CONFIG",
        help="predict a TorchTitan job instead of a launch line: a config of TorchTitan "
        "0.3's registries by name (llama3_8b, ...), a config module FILE.py[:FUNCTION] "
        "(read, never run; `plan --emit torchtitan` writes one) or a 0.2 job config "
        "FILE.toml; TorchTitan's overrides (--parallelism.tensor_parallel_degree 8) after --",
    )
    parser.add_argument(
        "--args-file", metavar="FILE",
        help="a launch script or command (continuations, comments, shell variables and a "
        "torchrun prefix allowed) holding the flags",
    )
    parser.add_argument(
        "--env", action="append", default=[], type=environment_pair, metavar="NAME=VALUE",
        help="a variable of the environment the run starts in (repeatable): --args-file's "
        "script reads it as bash would (--env SLURM_NNODES=8), and Megatron-LM's processes "
        "inherit it (--env CUDA_DEVICE_MAX_CONNECTIONS=1 serializes its streams)",
    )
    parser.add_argument(
        "--script-arg", action="append", default=[], metavar="VALUE",
        help="a positional parameter of --args-file's script ($1, $2, ... in order; "
        "repeatable); unset unless given",
    )
    parser.add_argument(
        "--explain-args", action="store_true",
        help="print each word the training command received and the line of the launch "
        "script it came from (and the variable it came through) before the prediction",
    )
    parser.add_argument("--top", type=whole(1, MAX_TOP), default=3,
                        help="best plans of the search to list (default 3)")
    parser.add_argument(
        "--space", choices=SEARCH_SPACES, default="megatron",
        help="the search's space: megatron (default: one layout for every stage, as "
        "Megatron-LM and TorchTitan run, so the flags or keys that change apply to the run) "
        "or auto (Alpa's, stages may differ; launch lines only)",
    )
    parser.add_argument(
        "--search", action=argparse.BooleanOptionalAction, default=True,
        help="also search the best plan for the same model, cluster and batch (--no-search: "
        "predict the launch line only)",
    )
    parser.add_argument("--json", metavar="PATH",
                        help="also write both plans and the comparison as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_run_flags(parser)


def run_predict(args: argparse.Namespace) -> int:
    """Predict the launch line, search the best plan for the same model, cluster and
    batch, print both and the difference, and write them as JSON."""
    from planner.cli.console import console
    from planner.megatron import megatron_run
    from planner.plans.transformer_plan import training_plan

    if args.torchtitan is not None:
        return _predict_torchtitan(args, console)
    launch = launch_line(args)
    if args.explain_args:
        print_launch_words(launch, console)
    parsed = parsed_flags(args, launch)
    gpus, launch_notes = world_size(args, launch)
    cluster = _cluster(args, gpus, f"the launch line's {gpus} processes")
    run = megatron_run(parsed, gpus, {**dict(args.env), **dict(launch.environment)})
    _check_on_cluster(parsed, run, cluster)
    name = Path(launch.script).stem if launch.script else "pretrain_gpt"
    launched = training_plan(name, run.model, cluster, run.parallel, run.layers_per_stage,
                             chunk_layers=run.chunk_layers)
    launched = launched.model_copy(update={"provenance": launched.provenance.model_copy(
        update={"launch_argv": launch.argv})})
    totals = wants_totals(args)
    if totals:
        launched = with_totals([launched], run.model, cluster, args)[0]
    given = Given("launch line", "flag", launch_notes + run.notes, run.ignored)
    print_given(launched, given, cluster, console)
    if totals:
        print_totals([launched], console, None)
    best = _best_plans(args, name, run.model, run.parallel, KEPT, cluster, console) \
        if args.search else []
    if totals and best:
        best = with_totals(best, run.model, cluster, args)
    changes = [] if not best or best[0].megatron_flags is None else flag_changes(
        _launch_flags(launched, run), best[0].megatron_flags)
    if args.search:
        _print_comparison(launched, best, cluster, args.space, console, given, [
            describe_change(c["flag"], c["launch_line"], c["best"]) for c in changes])
    if args.json:
        write_json(args.json, json.dumps(_report(launched, given, best, changes), indent=2),
                   "prediction")
    return 0


def _predict_torchtitan(args: argparse.Namespace, console: Console) -> int:
    """`run_predict` for a TorchTitan job config: the file is read and checked before any
    other work, the run predicted as TorchTitan runs it, the search priced under the same
    engine, and the job config's keys that change listed."""
    from planner.torchtitan.next_job import load_job
    from planner.plans.transformer_plan import training_plan

    source = args.torchtitan
    if args.args_file is not None:
        raise UsageError("--torchtitan reads a TorchTitan job, and --args-file a Megatron-LM "
                         "launch line, which starts another run; give one of the two")
    if args.space != "megatron":
        raise UsageError("--space auto gives stages meshes of their own, which TorchTitan "
                         "cannot run; drop --space with --torchtitan")
    # The words after -- are TorchTitan's own command-line overrides of the config.
    job = load_job(source, args.flags, args.gpus)
    if job.num_gpus > MAX_GPUS:
        raise UsageError(f"{source}: its degrees make {job.num_gpus:,} GPUs, more than the "
                         f"{MAX_GPUS:,} Tessel plans")
    cluster = _cluster(args, job.num_gpus, f"{source}'s {job.num_gpus} GPUs")
    _check_job_on_cluster(job, cluster, source)
    launched = training_plan(job.preset, job.model, cluster, job.parallel,
                             job.layers_per_stage, chunk_layers=job.chunk_layers)
    totals = wants_totals(args)
    if totals:
        launched = with_totals([launched], job.model, cluster, args)[0]
    given = Given("job config", "key", job.notes, job.ignored)
    print_given(launched, given, cluster, console)
    if totals:
        print_totals([launched], console, None)
    best = _best_plans(args, job.preset, job.model, job.parallel, TORCHTITAN_KEPT, cluster,
                       console) if args.search else []
    if totals and best:
        best = with_totals(best, job.model, cluster, args)
    changes = key_changes(launched, best[0], job.model, job.release) if best else []
    if args.search:
        _print_comparison(launched, best, cluster, args.space, console, given, [
            describe_change(c["key"], c["job_config"], c["best"], toml=True)
            for c in changes])
    if args.json:
        report = {
            "job_config": json.loads(launched.to_json()), "notes": job.notes,
            "ignored_keys": job.ignored, "best": [json.loads(plan.to_json()) for plan in best],
            "speed_up": speed_up(launched, best[0]) if best else None, "keys_changed": changes,
        }
        write_json(args.json, json.dumps(report, indent=2), "prediction")
    return 0


def _check_job_on_cluster(job: TorchTitanJob, cluster: Cluster, source: str) -> None:
    """The job's matmul precision on the cluster's tensor cores, named by its keys."""
    q, device = job.parallel, cluster.device
    precision, recipe = q.numerics.precision, q.numerics.fp8_recipe
    needed = "mxfp8" if precision == "fp8" and recipe == "mxfp8" else precision
    if needed in device.peak_tflops:
        return
    setting = {"fp8": "model.converters [\"quantize.linear.float8\"]",
               "mxfp8": "model.converters [\"quantize.linear.mx\"]" if job.release == "0.2"
               else "MXFP8LinearConverter",
               "bf16": 'training.mixed_precision_param "bfloat16"',
               "fp32": 'training.mixed_precision_param "float32"'}[needed]
    has = ", ".join(sorted(device.peak_tflops))
    raise UsageError(f"{source}: {setting} needs {needed} tensor cores, which {device.name} "
                     f"lacks ({has}); change it or the cluster")


def _cluster(args: argparse.Namespace, gpus: int, source: str) -> Cluster:
    """--cluster with `gpus` of its devices; `source` names where the count came from
    when --gpus did not give it."""
    if args.cluster is None:
        raise UsageError(
            "plan predict needs --cluster C, the GPUs the run is on (a preset such as "
            "dgx-h100, see `plan clusters`, or a YAML/JSON file)"
        )
    cluster = load_cluster(args)
    try:
        return cluster.with_devices(gpus)
    except ValueError as error:
        raise UsageError(f"{f'--gpus {gpus}' if args.gpus else source}: {error}") from None


def _check_on_cluster(parsed: MegatronArgs, run: MegatronRun, cluster: Cluster) -> None:
    """The rules the cluster sets (tensor cores of the precision, tensor parallelism within
    a node, ...), named as the launch line's flags."""
    from planner.search.knobs import check_knobs

    q, device = run.parallel, cluster.device
    if q.numerics.precision not in device.peak_tflops:
        flag = {"fp8": f"{parsed.flag('fp8')} {parsed.values.fp8}", "bf16": "--bf16",
                "fp16": "--fp16", "fp32": "fp32 (no --bf16 or --fp16)"}[q.numerics.precision]
        has = ", ".join(sorted(device.peak_tflops))
        raise UsageError(f"{flag} needs {q.numerics.precision} tensor cores, which {device.name} "
                         f"lacks; use a precision it has ({has}) or another cluster")
    dims = q.dims
    knobs = FixedKnobs(
        tensor=dims.tensor, pipeline=dims.pipeline, context=dims.context, expert=dims.expert,
        micro_batch_size=q.batch.micro_batch_size, sequence_parallel=q.sharding.sequence_parallel,
        zero_stage=q.sharding.zero_stage, recompute=q.recomputation.recompute,
        precision=q.numerics.precision,
        virtual_pipeline=q.pipelining.virtual_pipeline,
        overlap_grad_reduce=q.overlap.overlap_grad_reduce,
        overlap_param_gather=q.overlap.overlap_param_gather,
        tp_comm_overlap=q.overlap.tp_comm_overlap,
        attention_backend=q.execution.attention_backend, cuda_graphs=q.execution.cuda_graphs,
    )
    # Knobs that apply only where they act, as check_knobs expects them.
    if q.recomputation.recompute == "full":
        knobs = knobs.but(recompute_method=q.recomputation.recompute_method,
                          recompute_num_layers=q.recomputation.recompute_num_layers)
    if q.numerics.precision == "fp8":
        knobs = knobs.but(fp8_recipe=q.numerics.fp8_recipe)
    if run.model.num_experts:
        knobs = knobs.but(moe_token_dispatcher=q.moe.moe_token_dispatcher)
    check_knobs(knobs, run.model, cluster, q.batch.global_batch_size, "megatron")


def print_given(plan: Plan, given: Given, cluster: Cluster, console: Console) -> None:
    """The prediction of the run as given: its numbers, the breakdown, memory allocated and
    reserved (out-of-memory called out); the defaults worth knowing and what was ignored."""
    from planner.cli.train import layout, print_summary

    p = plan.predicted
    table = Table(title=f"{given.label}: {plan.model} on {plan.num_gpus} x {plan.cluster}, "
                        f"{plan.precision}, global batch {plan.global_batch_size}")
    for column in ("layout", "recompute", "step s", "tokens/s", "MFU", "GiB/GPU"):
        table.add_column(column, justify="left" if column in ("layout", "recompute")
                         else "right", no_wrap=True)
    table.add_row(layout(plan), plan.recompute, f"{p.step_time_s:.3f}",
                  f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}",
                  f"{p.memory_gib_per_gpu:.1f}" + ("" if p.fits else " !"))
    console.print(table)
    print_summary(plan, console, label=given.label)
    device = f"the {cluster.device.memory_gib:g} GiB of a {cluster.device.name}"
    reserved = getattr(p, "reserved_gib_per_gpu", None)
    held = f"{p.memory_gib_per_gpu:.1f} GiB" + (
        "" if reserved is None else f" allocated, {reserved:.1f} GiB reserved")
    if not p.fits:
        console.print(f"[red]out of memory:[/red] the run needs {held} per GPU, more than "
                      f"{device}", highlight=False)
    elif not getattr(p, "reserved_fits", True):
        console.print(f"memory {held} per GPU of {device}: what the caching allocator "
                      "reserves does not fit, so fragmentation may run it out of memory "
                      "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps)",
                      highlight=False)
    else:
        console.print(f"memory {held} per GPU of {device}", highlight=False)
    for note in given.notes:
        console.print(f"note: {note}", highlight=False)
    if given.ignored:
        shown = ", ".join(given.ignored[:8]) + (", ..." if len(given.ignored) > 8 else "")
        plural = "s" if len(given.ignored) > 1 else ""
        console.print(f"ignored {len(given.ignored)} {given.unit}{plural} that change neither "
                      f"time nor memory: {shown}", highlight=False)


def _best_plans(
    args: argparse.Namespace, name: str, model: TransformerConfig, parallel: ParallelConfig,
    kept: tuple[str, ...], cluster: Cluster, console: Console,
) -> list[Plan]:
    """The best plans the search finds for the run's model, cluster and global batch.
    Every knob the search chooses is free; those it does not choose are kept as the run
    sets them (`kept`: `KEPT` or `TORCHTITAN_KEPT`)."""
    from rich.progress import Progress

    from planner.plans.transformer_plan import ranked_plans
    from planner.search import search

    # A progress bar only where someone watches: piped, it would leave a blank line.
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"searching the {args.space} space", total=None)
        fixed = FixedKnobs({knob: parallel.knob(knob) for knob in kept})
        result = search(model, cluster, parallel.batch.global_batch_size, fixed, args.space,
                        lambda done, total: progress.update(task, completed=done, total=total))
    return ranked_plans(name, model, cluster, result, args.top)


def _print_comparison(
    launched: Plan, best: list[Plan], cluster: Cluster, space: str, console: Console,
    given: Given, changes: list[str],
) -> None:
    """The search's best plans, the best's speed-up and the `changes` (described) of the
    flags or keys that would run it."""
    from planner.cli.train import print_training_plans

    if not best:
        console.print(
            f"the search ({space} space) finds no plan that fits {cluster.num_devices} x "
            f"{cluster.device.name} with global batch {launched.global_batch_size}",
            highlight=False,
        )
        return
    titan = given.unit == "key"
    kept = ("precision, fp8 recipe, compile and fp8 all-gathers kept from the job config, "
            "priced as TorchTitan runs them" if titan else "precision, fp8 recipe, attention "
            "kernels and CUDA graphs kept from the launch line")
    console.print(f"the best plans the search finds ({space} space; {kept}):",
                  highlight=False)
    print_training_plans(best, console, megatron=not titan)
    if best[0].training is not None:
        print_totals(best, console, None)
    ratio = speed_up(launched, best[0])
    if ratio <= 1.0:
        # The run uses knobs the search does not try (or is already the best).
        console.print(f"the {given.label} is as fast as the best plan found, or faster "
                      f"({ratio:.2f}x): keep it", highlight=False)
        return
    console.print(f"speed-up of the best plan over the {given.label}: {ratio:.2f}x "
                  f"({launched.predicted.step_time_s:.3f} s -> "
                  f"{best[0].predicted.step_time_s:.3f} s per step"
                  + (f"; the {given.label} does not fit)" if not launched.predicted.fits
                     else ")"), highlight=False)
    if changes:
        what = "keys" if titan else "flags"
        console.print(f"{what} that change: " + "; ".join(changes), highlight=False,
                      soft_wrap=True)


def speed_up(launched: Plan, best: Plan) -> float:
    """How many times faster `best`'s step is than the launch line's."""
    return launched.predicted.step_time_s / best.predicted.step_time_s


def _launch_flags(plan: Plan, run: MegatronRun) -> list[str]:
    """The launch line's configuration as Tessel writes Megatron-LM flags, so that it and
    the best plan's flags compare word for word."""
    from planner.export.megatron import megatron_flags

    layers = [stage.layers[1] - stage.layers[0] for stage in plan.stages]
    return megatron_flags(run.model, run.parallel, layers)


def flag_changes(before: list[str], after: list[str]) -> list[dict[str, str | None]]:
    """The flags whose value differs between two flag lists ("--flag value" or "--flag"
    entries): each as {"flag", "launch_line", "best"}, a switch's value "" and an absent
    flag's None."""
    old, new = _values(before), _values(after)
    return [{"flag": flag, "launch_line": old.get(flag), "best": new.get(flag)}
            for flag in dict.fromkeys([*old, *new]) if old.get(flag) != new.get(flag)]


def _values(flags: list[str]) -> dict[str, str]:
    return {flag: value for flag, _, value in (entry.partition(" ") for entry in flags)}


def key_changes(launched: Plan, best: Plan, model: TransformerConfig,
                release: str = "0.2") -> list[dict[str, Any]]:
    """The TorchTitan keys (dotted, as its command line names them) whose value differs
    between the job config as Tessel writes it for the two plans in `release`'s form
    ("0.2" or "0.3"), so that they compare key by key: each as {"key", "job_config",
    "best"}, an absent key's value None."""
    from planner.export.torchtitan import job_config, torchtitan_incompatibility
    from planner.export.torchtitan_config import next_incompatibility, next_settings

    if release != "0.2":
        if next_incompatibility(best, model) is not None:
            return []
        old, new = (next_settings(plan, model) for plan in (launched, best))
        return [{"key": key, "job_config": old.get(key), "best": new.get(key)}
                for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]
    if torchtitan_incompatibility(best, model) is not None:
        return []
    old, new = (_dotted(job_config(plan, model)) for plan in (launched, best))
    return [{"key": key, "job_config": old.get(key), "best": new.get(key)}
            for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]


def _dotted(tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {f"{table}.{key}": value for table, values in tables.items()
            for key, value in values.items()}


def describe_change(name: str, old: Any, new: Any, toml: bool = False) -> str:
    """'--tensor-model-parallel-size 8 -> 4', '+ --sequence-parallel', '- --recompute-...';
    with `toml`, values as TOML writes them (a long list shortened)."""
    if toml:
        old, new = (None if v is None else _short(v) for v in (old, new))
    if old is None:
        return f"+ {name} {new}".rstrip()
    if new is None:
        return f"- {name} {old}".rstrip()
    return f"{name} {old} -> {new}"


def _short(value: Any) -> str:
    """A TOML value; a list of lists (the pipeline's model parts) by its length."""
    from planner.torchtitan.keys import shown

    if isinstance(value, list) and value and isinstance(value[0], list):
        blocks = [str(sum(name.startswith("layers.") for name in part)) for part in value]
        more = ", ..." if len(blocks) > 8 else ""
        return f"[{len(blocks)} parts of {', '.join(blocks[:8])}{more} blocks]"
    return shown(value)


def _report(
    launched: Plan, given: Given, best: list[Plan], changes: list[dict[str, str | None]]
) -> dict[str, Any]:
    """The JSON of a prediction: both plans (as `plan --json` writes a Plan) and the
    comparison."""
    return {
        "launch_line": json.loads(launched.to_json()),
        "notes": given.notes,
        "ignored_flags": given.ignored,
        "best": [json.loads(plan.to_json()) for plan in best],
        "speed_up": speed_up(launched, best[0]) if best else None,
        "flags_changed": changes,
    }
