"""`plan check MODEL --mesh SHAPE`: train the plan on gloo ranks and on one process."""

from __future__ import annotations

import argparse
from dataclasses import replace
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.table import Table

from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.fault_flags import check_fault_flags, faults_given, refuse_faults
from planner.cli.model_args import load, load_any_cluster
from planner.checks.operator import RELATIVE_TOLERANCE
from planner.checks.check_report import PlanCheckReport, operator_report, training_report
from planner.cli.plan_command import mesh_for, plan_on_mesh, print_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.pools import AnyCluster, PooledCluster
from planner.models.sources import with_weights
from planner.checks.training_check import ActivationRow, PlanComparison, compare
from planner.cli.fault_report import (
    failure_cause,
    first_non_finite_loss,
    print_fault_check,
    print_fault_failure,
    print_ranks_output,
    print_restarts,
    training_verdict,
)

# Most ranks a check starts: each is a process on this machine.
MAX_LOCAL_RANKS = 16


def run_check(args: argparse.Namespace) -> int:
    from planner.checks.operator import check_plan

    cluster = load_any_cluster(args)
    if args.gpus is not None:
        return run_training_check(args, cluster)
    if isinstance(cluster, PooledCluster):
        raise UsageError(f"--cluster {args.cluster} has pools: check a training plan "
                         f"(--gpus {cluster.num_devices} --global-batch-size B); a --mesh "
                         "plan runs on one kind of device")
    refuse_faults(args, "give --gpus (a training plan of a zoo or hf: transformer)")
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
        _write_report(args.json, operator_report("mesh", planned.plan, report))
    return 0 if report.passed else 1


def print_check(report) -> None:
    console.print(_losses(f"check over {report.steps} steps", "loss (sharded)",
                          report.losses, report.reference_losses))
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


def run_training_check(args: argparse.Namespace, cluster: AnyCluster) -> int:
    """`plan check MODEL --gpus N ...`: plan (keeping the knobs given) as Tessel's runtime
    runs it (engine tessel), train the best plan on N local gloo ranks and the same steps
    in one process, and compare the losses and parameters with one process and the
    collectives, held bytes and bytes saved for backward with the Plan's."""
    from planner.cli.train import as_transformers_build_it, plan_from_flags, print_training_plans

    if args.mesh is not None:
        raise UsageError("--mesh checks an operator-level plan and --gpus a training plan; "
                         "give one of the two")
    if args.gpus > MAX_LOCAL_RANKS:
        raise UsageError(
            f"--gpus {args.gpus}: plan check runs each rank as a process on this machine "
            f"(at most {MAX_LOCAL_RANKS}); check a smaller plan"
        )
    if args.precision not in (None, "fp32"):
        raise UsageError(
            f"--precision {args.precision}: plan check trains in fp32, where the ranks and "
            "one process agree to rounding; drop --precision"
        )
    if getattr(args, "finetune", None) == "qlora":
        raise UsageError(
            "--finetune qlora: plan check trains in fp32, and QLoRA's 4-bit NF4 base is "
            "dequantized to bf16; check the same plan with --finetune lora (its adapters "
            "and their collectives are QLoRA's)"
        )
    offloaded = [flag for flag, dest in (("--offload-optimizer", "offload_optimizer"),
                                         ("--offload-params", "offload_params"),
                                         ("--cpu-offloading-num-layers",
                                          "offload_activation_layers"),
                                         ("--offload-checkpoints", "offload_checkpoints"))
                 if getattr(args, dest, None) not in (None, "none", 0, False)]
    if offloaded:
        raise UsageError(
            f"{' and '.join(offloaded)}: plan check trains on CPU ranks, whose tensors are all in "
            "host memory already, so offload has nothing to move; check the plan without "
            "it (what offload moves is priced, not run: tests/cost_models/test_offload.py)"
        )
    check_fault_flags(args, args.gpus)
    if args.engine not in (None, "tessel"):
        raise UsageError(
            f"--engine {args.engine}: plan check trains the plan on Tessel's own runtime and "
            "compares it with a plan priced as that runtime runs it (engine tessel); drop "
            "--engine"
        )
    loaded = load(args)
    # A model of one's own, or a transformer whose operators the intra-op ILP shards: its
    # traced graph is planned (a zoo or hf: model trains with weights of its own
    # initialisation).
    if isinstance(cluster, PooledCluster) and (loaded.config is None or faults_given(args)):
        raise UsageError(f"--cluster {args.cluster} has pools: plan check runs a zoo or hf: "
                         "transformer's plan across them, without faults")
    if loaded.config is None or args.intra_op == "ilp":
        refuse_faults(args, "they run the transformer plans of --intra-op analytic, not "
                      "graph plans")
        loaded = with_weights(loaded) or loaded
        if loaded.on_meta:
            raise UsageError(
                f"{args.model} is built on the meta device (no weights), so it cannot "
                "train; check a model with real weights"
            )
        return run_graph_check(args, loaded, cluster, console)
    # Priced as the runtime below runs it: its activations, not Megatron-LM's. (A graph
    # plan above is Tessel's runtime's by construction: it takes no engine.)
    args.engine = "tessel"
    hf_config = None
    if loaded.hf_path is not None:
        from planner.models.huggingface import load_hf_config

        hf_config = load_hf_config(loaded.hf_path).to_dict()
        loaded = as_transformers_build_it(loaded, console)
    # What the runtime runs of this model fixes knobs before the search, and of the
    # plans ranked the best it runs is the one trained: no rank refuses it.
    parts = _fix_what_the_runtime_dictates(args, loaded, hf_config)
    if isinstance(cluster, PooledCluster):
        from planner.cli.pool_command import pooled_plans

        plans, model = pooled_plans(args, cluster, console, RUNNABLE_CANDIDATES, loaded)
    else:
        plans, model, loaded = plan_from_flags(args, cluster, console,
                                               top=RUNNABLE_CANDIDATES, loaded=loaded)
    plan, spec = _refuse_what_the_runtime_cannot_run(args, plans, parts)
    if not faults_given(args):  # a fault run is read for its verdict: the plan follows it
        print_training_plans([plan], console)
    from planner.checks.training_check import routing_note
    from runtime.local_ranks import RankError

    if routing_note(plan):
        console.print(f"note: {routing_note(plan)}", highlight=False, soft_wrap=True)

    elastic_story: list[str] = []  # --elastic: the lost rank and the re-plan
    with _checkpoint_folder(args) as folder:
        resilience = _resilience(args, folder) if faults_given(args) else None
        try:
            with console.status(f"training {args.steps} steps on {plan.num_gpus} gloo ranks"):
                report = _train(args, model, plan, spec, hf_config, resilience,
                                args.max_restarts)
        except RankError as error:
            if resilience is None:
                print_ranks_output(error, args)
                raise
            if args.elastic is None or args.elastic[0] >= plan.num_gpus:
                # An injected fault (or a divergence stopped on) ended the job, with no
                # restart left: the check ran and failed; its lines say where, why, and
                # where the job would resume.
                print_fault_failure(error, plan, args, folder)
                return 1
            plan, spec, report = _go_on_elastic(args, cluster, loaded, model, plan, error,
                                                resilience, hf_config, parts, elastic_story)
    # A restarted job's collectives are counted over the steps its last attempt ran.
    # A Hugging Face model runs transformers' own modules, which save other tensors than
    # the zoo's decoder the Plan counts (its rotary tables once per stage, for one).
    note = "not compared: transformers' own modules" if hf_config is not None else ""
    comparison = compare(plan, report.coordinates, report.collectives, report.local_bytes,
                         report.steps_run, report.saved_activations, note)
    if resilience is not None:
        print_fault_check(report, comparison, plan, args, elastic_story)
    else:
        print_training_check(report, comparison, plan, args.steps)
        if report.stragglers:
            print_restarts(report, args)
    passed = report.passed(RELATIVE_TOLERANCE) and comparison.passed
    if args.json:
        _write_report(args.json, training_report(plan, report, comparison, passed))
    return 0 if passed else 1


def _refuse_what_the_runtime_cannot_run(args: argparse.Namespace, plans, parts):
    """The best of the ranked `plans` that the runtime runs on this model (`parts`), and
    its RunSpec: the check each rank would make, made here; a note where faster plans
    were passed over. UsageError (one line, before any rank starts) where it runs none."""
    from planner.cli.train import layout

    runnable, refused = _best_runnable(plans, parts)
    if runnable is None:
        what = "this plan" if len(plans) == 1 else f"any of the {len(plans)} best plans"
        raise UsageError(f"{args.model}: the runtime cannot train {what}: {refused[0][1]}")
    if refused:
        best, why = refused[0]
        faster = f"the {len(refused)} faster plans" if len(refused) > 1 else "the faster plan"
        console.print(f"note: the runtime does not run {faster} ({layout(best)}: "
                      f"{why.rstrip('.')}); checking the best it runs",
                      highlight=False, soft_wrap=True)
    return runnable


def _best_runnable(plans, parts):
    """((plan, RunSpec) of the first of `plans` the runtime runs on the model `parts`
    states, or None; the plans before it, each with why the runtime refuses it)."""
    from runtime.spec import from_training_plan

    refused: list[tuple[object, str]] = []
    for plan in plans:
        try:
            spec = from_training_plan(plan)
            parts.check(spec)
        except ValueError as error:
            refused.append((plan, str(error)))
            continue
        return (plan, spec), refused
    return None, refused


def _train(args: argparse.Namespace, model, plan, spec, hf_config, resilience,
           max_restarts: int = 0):
    """`check_training` of `plan` with the flags' steps and timeout, and each stage's
    predicted seconds for the straggler monitor to divide by."""
    from planner.checks.training_check import check_training

    stage_seconds = tuple(sum(stage.phases_s.values()) for stage in plan.stages) \
        if all(stage.phases_s for stage in plan.stages) else None
    # AdamW: the optimizer the Plan's memory (two moments per parameter) assumes.
    return check_training(model, spec, args.steps, optimizer="adamw", hf_config=hf_config,
                          resilience=resilience, max_restarts=max_restarts,
                          stage_seconds=stage_seconds,
                          collective_timeout_s=args.collective_timeout)


def _go_on_elastic(args: argparse.Namespace, cluster: Cluster, loaded, model, lost_plan,
                   error, resilience, hf_config, parts, story: list[str]):
    """--elastic: rank `error.rank` is lost for good. Re-plan for the most ranks left
    (down to MIN) that a plan the runtime runs (`parts`) fits, and train it from the newest
    checkpoint, which `runtime.checkpoint` reshards onto the new plan: (plan, spec,
    report). What happened is added to `story`, printed after the verdict."""
    import io

    from rich.console import Console

    from planner.cli.train import layout, plan_from_flags

    low = args.elastic[0]
    story.append(f"lost: {failure_cause(error)}; rank {error.rank} is gone for good (--elastic "
                 f"{low}:{args.elastic[1]})")
    quiet = Console(file=io.StringIO())  # the re-plan's search line would come first
    for world in range(lost_plan.num_gpus - 1, low - 1, -1):
        try:
            plans, _, _ = plan_from_flags(argparse.Namespace(**{**vars(args), "gpus": world}),
                                        cluster, quiet, top=8, loaded=loaded)
        except UsageError:
            continue
        runnable, _ = _best_runnable(plans, parts)
        if runnable is None:  # e.g. the runtime runs stages of one shape
            continue
        plan, spec = runnable
        story.append(f"re-planned on {world} ranks: {layout(plan)} (was {layout(lost_plan)} "
                     f"on {lost_plan.num_gpus})")
        # The faults were injected into the lost run; the rest goes on without them.
        resumed = replace(resilience, kill_rank=None, kill_at_step=None, stall=None,
                          slow=None, nan_at_step=None)
        with console.status(f"going on with {world} gloo ranks"):
            report = _train(args, model, plan, spec, hf_config, resumed)
        return plan, spec, report
    raise UsageError(f"--elastic {low}:{args.elastic[1]}: no plan fits on {low} to "
                     f"{lost_plan.num_gpus - 1} ranks with the knobs given; widen MIN:MAX or "
                     "give fewer knobs")


def _resilience(args: argparse.Namespace, folder: str):
    """The checkpoints, injected faults and divergence policy the flags ask for."""
    from runtime.divergence import DivergencePolicy
    from runtime.flight_recorder import Stall
    from runtime.resilience import Resilience
    from runtime.stragglers import Slow

    divergence = None
    if args.on_divergence is not None:
        spike = {} if args.spike_factor is None else {"spike_factor": args.spike_factor}
        divergence = DivergencePolicy(args.on_divergence, **spike)
    return Resilience(
        folder, args.checkpoint_every or 0, args.kill_rank, args.kill_at_step,
        stall=Stall(args.stall_rank, args.stall_at_step)
        if args.stall_rank is not None else None,
        slow=Slow(args.slow_rank, args.slow_factor) if args.slow_rank is not None else None,
        nan_at_step=args.nan_at_step, divergence=divergence)


@contextmanager
def _checkpoint_folder(args: argparse.Namespace) -> Iterator[str]:
    """--checkpoint-dir (kept), or a temporary folder removed after the check."""
    if args.checkpoint_dir is not None:
        Path(args.checkpoint_dir).expanduser().mkdir(parents=True, exist_ok=True)
        yield str(Path(args.checkpoint_dir).expanduser())
        return
    with tempfile.TemporaryDirectory(prefix="tessel-check-checkpoints-") as folder:
        yield folder


def print_training_check(report, comparison: PlanComparison, plan, steps: int) -> None:
    console.print(_losses(f"check over {steps} steps on {report.world_size} ranks",
                          "loss (plan)", report.losses, report.reference_losses))
    # One rank per stage: every rank of a stage is predicted alike (all are compared).
    firsts = {}
    for rank, coords in enumerate(report.coordinates):
        firsts.setdefault(coords["pp"], rank)
    counted = report.steps_run or steps
    last = " (the last attempt's)" if counted != steps else ""
    comm = Table(title=f"collectives over {counted} steps{last}, measured vs predicted "
                 "(first rank of each stage; every rank is compared)")
    for column in ("stage", "rank", "kind", "measured", "predicted"):
        comm.add_column(column)
    for stage, rank in sorted(firsts.items()):
        measured, predicted = comparison.measured[rank], comparison.predicted[rank]
        for kind in sorted(set(measured) | set(predicted)):
            m = measured.get(kind, {"count": 0, "bytes": 0})
            p = predicted.get(kind, {"count": 0, "bytes": 0})
            comm.add_row(str(stage), str(rank), kind, f"{m['count']} x, {m['bytes']:,} B",
                         f"{p['count']} x, {p['bytes']:,} B")
    console.print(comm)
    if comparison.memory:
        memory = Table(title="model state a rank holds (bytes), measured vs predicted")
        for column in ("stage", "rank", "state", "measured", "predicted", "error"):
            memory.add_column(column)
        for row in comparison.memory:
            stage = report.coordinates[row.rank]["pp"]
            if firsts[stage] == row.rank:
                memory.add_row(str(stage), str(row.rank), row.kind, f"{row.measured:,}",
                               f"{row.predicted:,}",
                               row.note or f"{row.relative_error:.2%}")
        console.print(memory)
    if comparison.activations:
        console.print(_activation_table(comparison.activations, report.coordinates, firsts))
    console.print(training_verdict(report, comparison), highlight=False)
    if (diverged := first_non_finite_loss(report)) is not None:
        from runtime.divergence import policies_line

        console.print(policies_line(diverged[0], 0), highlight=False)
    for line in comparison.mismatches:
        console.print(f"  {line}", highlight=False)


def _activation_table(rows: list[ActivationRow], coordinates: list[dict[str, int]],
                      firsts: dict[int, int]) -> Table:
    """Bytes saved for backward per micro-batch, measured vs predicted, for the first rank
    of each stage; consecutive micro-batches that measured alike share a row."""
    table = Table(title="activations saved for backward per micro-batch (bytes), measured "
                  "vs predicted (first rank of each stage; every rank is compared)")
    for column in ("stage", "rank", "chunk", "micro-batches", "measured", "predicted",
                   "error"):
        table.add_column(column)
    shown = [row for row in rows if firsts[coordinates[row.rank]["pp"]] == row.rank]
    groups: list[list[ActivationRow]] = []
    for row in shown:
        last = groups[-1][-1] if groups else None
        if last is not None and (last.rank, last.stage, last.measured) == (
                row.rank, row.stage, row.measured):
            groups[-1].append(row)
        else:
            groups.append([row])
    for group in groups:
        row, end = group[0], group[-1].micro_batch
        batches = str(row.micro_batch) if end == row.micro_batch else f"{row.micro_batch}-{end}"
        table.add_row(str(coordinates[row.rank]["pp"]), str(row.rank), str(row.stage),
                      batches, f"{row.measured:,}", f"{row.predicted:,}",
                      row.note or f"{row.relative_error:.2%}")
    return table


def _losses(title: str, label: str, losses: list[float], reference: list[float]) -> Table:
    """Each step's loss next to the one-process loss."""
    table = Table(title=title)
    for column in ("step", label, "loss (one process)"):
        table.add_column(column, justify="right")
    for step, (got, want) in enumerate(zip(losses, reference)):
        table.add_row(str(step), "skipped" if got is None else f"{got:.8f}",
                      "skipped" if want is None else f"{want:.8f}")
    return table


def run_graph_check(args: argparse.Namespace, loaded, cluster: Cluster, console) -> int:
    """`plan check MODEL --gpus N ...` for a model of one's own: plan its graph, train the
    best plan on --gpus gloo ranks and in one process, compare losses, parameters and
    every rank's collectives with its stage's prediction."""
    from planner.checks.operator import check_graph_plan
    from planner.cli.graph import plan_graph, print_graph_plans

    plan = plan_graph(args, loaded, cluster, console, checking=True)[0]
    print_graph_plans([plan], console)
    with console.status(f"training {args.steps} steps on {plan.num_gpus} gloo ranks"):
        report = check_graph_plan(loaded.model, plan, loaded.loss_fn, loaded.example_inputs,
                                  args.steps)
    print_check(report)
    if args.json:
        _write_report(args.json, operator_report("graph", plan, report))
    return 0 if report.passed else 1


def _write_report(path: str, report: PlanCheckReport) -> None:
    """The check's JSON report (`planner.checks.check_report`: one model for every kind)."""
    report.to_json(path)
    console.print(f"report written to {path}")


# Ranked plans `plan check` looks through for the best one its runtime runs on the model.
RUNNABLE_CANDIDATES = 32


def _fix_what_the_runtime_dictates(args: argparse.Namespace, loaded, hf_config):
    """The runtime's parts for the model (`runtime.model_parts`). Before the search, each
    knob the runtime runs one value of for this model (`needs`) is fixed at it, in one
    note line; a flag given with another value is refused in one line, as is a model the
    runtime runs no plan of (UsageError)."""
    from planner.cli.train import transformer_config
    from planner.search.knobs import FLAG
    from runtime.model_parts import model_parts

    shape = transformer_config(loaded)
    try:
        parts = model_parts(shape, hf_config)
        needs = parts.needs()
    except ValueError as error:
        raise UsageError(f"{args.model}: the runtime cannot train this model: "
                         f"{str(error).rstrip('.')}") from None
    fixed = []
    for rule in needs:
        given = getattr(args, rule.knob)
        if given is None and rule.knob in _MOE_KNOBS and not shape.num_experts:
            continue  # the search varies no MoE knob of a dense model
        if given is None:
            setattr(args, rule.knob, rule.value)
            fixed.append(f"{_as_flag(FLAG[rule.knob], rule.value)} ({rule.reason})")
        elif not rule.allows(given):
            raise UsageError(
                f"{_as_flag(FLAG[rule.knob], given)}: {rule.reason}; give "
                f"{_as_flag(FLAG[rule.knob], rule.value)} or leave it to plan check")
    if fixed:
        console.print(f"note: fixed for the search, as the runtime runs this model: "
                      f"{'; '.join(fixed)}", highlight=False, soft_wrap=True)
    return parts


# Knobs of a mixture of experts (a dense model's search keeps them at their defaults).
_MOE_KNOBS = ("expert", "moe_token_dispatcher")


def _as_flag(flag: str, value) -> str:
    """A knob's value as its flag is typed: '--context-parallel-size 1', a switch bare
    or negated ('--sequence-parallel', 'no --sequence-parallel')."""
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {value}"
