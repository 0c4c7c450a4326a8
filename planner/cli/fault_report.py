"""What `plan check` prints of a training run's faults and of how it ended: the verdict
line (`training_verdict`: a loss that became NaN named with its step and rank), and for a
run given a fault flag its verdict first, in at most 20 lines (`print_fault_check`,
`print_fault_failure`): what the faults did, the checkpoint the job would resume from, the
ranks' own output kept in a log, the plan in one line."""

from __future__ import annotations

import argparse
import math
import tempfile

from rich.markup import escape

from planner.checks.operator import RELATIVE_TOLERANCE
from planner.checks.training_check import PlanComparison
from planner.cli.console import console


def print_restarts(report, args: argparse.Namespace) -> None:
    """What the faults flags did: the kill, the restarts, where the job resumed, the
    stragglers named and the batches skipped on divergence."""
    for rank, times in sorted(report.stragglers.items()):
        console.print(f"straggler: rank {rank} worked {times:.1f}x as long as its peers "
                      "(per predicted stage time)", highlight=False, soft_wrap=True)
    if report.skipped:
        console.print(f"diverged: batch{'es' * (len(report.skipped) > 1)} "
                      f"{', '.join(map(str, report.skipped))} skipped (--on-divergence "
                      f"{args.on_divergence}); the reference skipped the same", highlight=False,
                      soft_wrap=True)
    if not (args.checkpoint_every or args.kill_rank is not None or report.attempt):
        return  # nothing saved, killed or restarted
    every = ("every step" if args.checkpoint_every == 1 else
             f"every {args.checkpoint_every} steps" if args.checkpoint_every else "never")
    line = f"checkpoints: {every}"
    if args.kill_rank is not None:
        line += f"; rank {args.kill_rank} was killed (SIGKILL) at step {args.kill_at_step}"
    if report.attempt:
        start = (f"from the checkpoint of step {report.resumed_from}"
                 if report.resumed_from is not None else "from the start (no checkpoint yet)")
        line += (f"; the job restarted {report.attempt} time{'s' * (report.attempt > 1)} "
                 f"and resumed {start}; every step's loss is compared with one process")
    elif report.resumed_from is not None:  # --elastic: a new job on the ranks left
        line += (f"; the re-planned job went on from the checkpoint of step "
                 f"{report.resumed_from}, resharded; every step's loss is compared with one "
                 "process")
    console.print(line, highlight=False, soft_wrap=True)


MISMATCH_LINES = 5
"""Mismatches a fault run prints (the rest: --json)."""


def print_fault_plan(plan, args: argparse.Namespace) -> None:
    """The plan a fault run trained, in one line (its tables: without the fault flags)."""
    from planner.cli.train import layout

    console.print(f"plan: {layout(plan)}, {plan.schedule} schedule, on {plan.num_gpus} gloo "
                  f"ranks for {args.steps} steps (predicted step "
                  f"{plan.predicted.step_time_s:.3f} s; its tables: plan check without the "
                  "fault flags)", highlight=False, soft_wrap=True)


def print_fault_check(report, comparison: PlanComparison, plan,
                      args: argparse.Namespace, story: list[str] = ()) -> None:
    """A fault run that completed: the verdict first, then what the faults did (an
    elastic run's lost rank and re-plan: `story`; restarts, stragglers, skipped batches),
    the first mismatches and the plan; every table goes to --json."""
    from runtime.divergence import policies_line

    console.print(training_verdict(report, comparison, _injected(args)), highlight=False,
                  soft_wrap=True)
    for line in story:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if (diverged := first_non_finite_loss(report)) is not None:
        console.print(policies_line(diverged[0], args.checkpoint_every or 0),
                      highlight=False, soft_wrap=True)
    print_restarts(report, args)
    for line in comparison.mismatches[:MISMATCH_LINES]:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if len(comparison.mismatches) > MISMATCH_LINES:
        console.print(f"  and {len(comparison.mismatches) - MISMATCH_LINES} more (--json "
                      "lists them all)", highlight=False)
    print_fault_plan(plan, args)
    if not args.json:
        console.print("every step's loss, collective and held byte: --json PATH",
                      highlight=False)


def print_fault_failure(error, plan, args: argparse.Namespace, folder: str) -> None:
    """A fault run that failed (a rank lost, hung or stopped on divergence, no restart
    left): what failed and where, the checkpoint the job would resume from, where the
    ranks' own output went, and the plan."""
    cause = failure_cause(error)
    injected = f" ({_injected(args)})" if _injected(args) else ""
    console.print(f"[red]FAILED[/red]: {escape(cause)}{escape(injected)}",
                  highlight=False, soft_wrap=True)
    console.print(f"would resume from: {escape(resume_point(folder, args))}", highlight=False,
                  soft_wrap=True)
    print_ranks_output(error, args)
    print_fault_plan(plan, args)


def failure_cause(error) -> str:
    """A failed run's `RankError` without the last-good-checkpoint clause the launcher adds
    (`resume_point` says where the job would resume, as it stands after every rank
    stopped)."""
    from runtime.faults import LAST_GOOD

    return str(error).split(LAST_GOOD)[0].rstrip("; ")


def resume_point(folder: str, args: argparse.Namespace) -> str:
    """Where a job checkpointing into `folder` as the flags ask would resume, and how."""
    from runtime.checkpoint import cut_short, latest_checkpoint, step_of

    if not args.checkpoint_every:
        return "the start (the run saves no checkpoint: --checkpoint-every K saves one)"
    kept = "" if args.checkpoint_dir is not None else \
        "; a temporary folder, removed at exit: --checkpoint-dir DIR keeps it"
    latest = latest_checkpoint(folder)
    if latest is not None:
        return (f"{latest} (the checkpoint of step {step_of(latest)}{kept}); --max-restarts "
                "1 restarts the job from it by itself")
    short = [path.name for path in cut_short(folder)]
    cut = f"; {', '.join(short)} {'were' if len(short) > 1 else 'was'} cut short by the " \
        "failure" if short else ""
    return f"the start (no checkpoint was complete yet{cut}{kept})"


def print_ranks_output(error, args: argparse.Namespace) -> None:
    """What the ranks printed and raised (`RankError.output`), kept off the terminal by
    the launcher: printed with --debug, else written to a log file named in one line."""
    text = getattr(error, "output", "")
    if not text:
        return
    if getattr(args, "debug", False):
        console.print(text.rstrip("\n"), highlight=False, markup=False, soft_wrap=True)
        return
    with tempfile.NamedTemporaryFile("w", prefix="tessel-check-ranks-", suffix=".log",
                                     delete=False) as log:
        log.write(text)
    console.print(f"the ranks' output and tracebacks ({len(text.splitlines()):,} lines): "
                  f"{log.name} (--debug prints them instead)", highlight=False,
                  soft_wrap=True, markup=False)


def _injected(args: argparse.Namespace) -> str:
    """'injected: --kill-rank 1 --kill-at-step 4': the faults the flags inject ('' for
    none)."""
    flags = [f"--{name.replace('_', '-')} {getattr(args, name)}"
             for name in ("kill_rank", "kill_at_step", "stall_rank", "stall_at_step",
                          "slow_rank", "slow_factor", "nan_at_step")
             if getattr(args, name, None) is not None]
    return f"injected: {' '.join(flags)}" if flags else ""


def first_non_finite_loss(report) -> tuple[int, float] | None:
    """(step, loss) of the first step whose loss is NaN or infinite, or None."""
    return next(((step, loss) for step, loss in enumerate(report.losses)
                 if loss is not None and not math.isfinite(loss)), None)


def _loss_ranks(report) -> tuple[str, str]:
    """('rank 3', '') or ('ranks 2, 3', why): the ranks whose loss a step's loss is (the
    last pipeline stage's, one per data-parallel shard; the check keeps their mean)."""
    last = max(coords["pp"] for coords in report.coordinates)
    ranks = [rank for rank, coords in enumerate(report.coordinates) if coords["pp"] == last
             and coords.get("tp", 0) == 0 and coords.get("cp", 0) == 0]
    if len(ranks) == 1:
        return f"rank {ranks[0]}", ""
    return (f"ranks {', '.join(map(str, ranks))}",
            "the mean of the last stage's data-parallel ranks' losses")


def training_verdict(report, comparison: PlanComparison, injected: str = "") -> str:
    """The check of a training plan in one line: PASSED or FAILED, how far the run is
    from one process and whether it ran as planned; a loss that became NaN or infinite
    is named with its step and rank (an error over it would say nothing)."""
    passed = report.passed(RELATIVE_TOLERANCE) and comparison.passed
    verdict = "[green]PASSED[/green]" if passed else "[red]FAILED[/red]"
    state = "match" if comparison.passed else "differ"
    planned = f"collectives, held bytes and saved activations {state} the plan's"
    diverged = first_non_finite_loss(report)
    if diverged is not None:
        step, loss = diverged
        reference = report.reference_losses[step]
        ranks, mean = _loss_ranks(report)
        said = "; ".join(filter(None, (mean, injected, "one process: " + (
            f"{reference:.8f}" if reference is not None else "skipped"))))
        return (f"{verdict}: the loss became {loss} at step {step} on {ranks} ({said}) and "
                f"training went on with it (no --on-divergence); {planned}")
    return (f"{verdict}: losses within {report.loss_max_rel_error:.3e} (relative), "
            f"parameters within {report.parameter_rel_error:.3e} (relative norm) of one "
            f"process{f' ({injected})' if injected else ''}; {planned}")

