"""`plan check`'s flags that exercise checkpoints and faults of the training-plan runtime:
checkpoint every K steps, SIGKILL one rank at one step, let torch's elastic agent restart
the job, which then resumes from its last checkpoint by itself; stall or slow a rank
(named by the flight recorder and the straggler monitor), make a step's loss NaN and say
what a diverging step does (skip, roll back, stop)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from planner.cli.errors import UsageError
from planner.cli.model_args import MAX_STEPS
from planner.cli.parsing import number, rank_range, seconds, whole

# Most restarts a check asks of the agent: each one restarts every rank.
MAX_RESTARTS = 10
# Highest rank --kill-rank names: plan check runs at most this many ranks.
MAX_RANK = 15
FLAGS = ("--checkpoint-every", "--checkpoint-dir", "--kill-rank", "--kill-at-step",
         "--max-restarts", "--stall-rank", "--stall-at-step", "--slow-rank", "--slow-factor",
         "--nan-at-step", "--on-divergence", "--spike-factor", "--elastic")
# The attributes the flags above set (--max-restarts is given when above 0).
_GIVEN = ("checkpoint_every", "checkpoint_dir", "kill_rank", "kill_at_step", "stall_rank",
          "stall_at_step", "slow_rank", "slow_factor", "nan_at_step", "on_divergence",
          "spike_factor", "elastic")
MAX_SLOW_FACTOR = 100.0
MAX_TIMEOUT_S = 3600.0


def add_fault_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every", type=whole(1, MAX_STEPS), metavar="K",
        help="training plans (--gpus): save a sharded checkpoint every K steps, in the "
        "background (torch.distributed.checkpoint)")
    parser.add_argument(
        "--checkpoint-dir", metavar="DIR",
        help="where the checkpoints go, kept after the check (an empty or new folder; "
        "default: a temporary one, removed)")
    _rank_flag(parser, "--kill-rank",
               "SIGKILL rank R's process as step --kill-at-step begins (first attempt only)")
    _step_flag(parser, "--kill-at-step",
               "the step (0-based, as the loss table counts) at which --kill-rank dies")
    parser.add_argument(
        "--max-restarts", type=whole(0, MAX_RESTARTS), default=0, metavar="N",
        help="times torch's elastic agent restarts every rank after one fails; the job "
        "resumes from its last complete checkpoint (default 0)")
    _rank_flag(parser, "--stall-rank",
               "rank R sleeps as it enters its first collective of step --stall-at-step: "
               "its peers time out (--collective-timeout) and the check names it")
    _step_flag(parser, "--stall-at-step", "the step (0-based) at which --stall-rank stalls")
    _rank_flag(parser, "--slow-rank",
               "rank R works --slow-factor times as long each step; the straggler monitor "
               "names it and the job completes")
    parser.add_argument(
        "--slow-factor", type=number(1.0, MAX_SLOW_FACTOR), metavar="F",
        help="how many times as long --slow-rank works (1-100)")
    _step_flag(parser, "--nan-at-step", "make step S's loss NaN, once (its gradients follow)")
    parser.add_argument(
        "--on-divergence", choices=("skip", "rollback", "stop"),
        help="a step whose loss or gradients are not finite, or whose loss is above "
        "--spike-factor times the recent mean: skip its update, roll back to the last "
        "checkpoint and skip its batch (needs --checkpoint-every), or stop (default: "
        "train on, unchecked)")
    parser.add_argument(
        "--spike-factor", type=number(1.0, 1e6), metavar="X",
        help="with --on-divergence: a loss above X times the mean of the last 8 diverges "
        "(default 10)")
    parser.add_argument(
        "--elastic", type=rank_range(MAX_RANK + 1), metavar="MIN:MAX",
        help="training plans: when ranks are lost for good (no restart left), re-plan for "
        "the ranks left (at least MIN), reshard the last checkpoint onto the new plan and "
        "go on (needs --checkpoint-every)")
    parser.add_argument(
        "--collective-timeout", type=seconds(0.0, MAX_TIMEOUT_S), default=120.0,
        metavar="SECONDS",
        help="how long a rank waits in a collective before the check names the rank that "
        "hangs (default 120; torch's is 30 minutes)")


def _rank_flag(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A flag naming one rank R of the check."""
    parser.add_argument(flag, type=whole(0, MAX_RANK), metavar="R", help=help)


def _step_flag(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A flag naming one step S of the check, 0-based."""
    parser.add_argument(flag, type=whole(0, MAX_STEPS - 1), metavar="S", help=help)


def faults_given(args: argparse.Namespace) -> bool:
    """Whether any of these flags was given (--max-restarts above 0)."""
    return any(getattr(args, name, None) is not None for name in _GIVEN) or \
        bool(getattr(args, "max_restarts", 0))


def refuse_faults(args: argparse.Namespace, why: str) -> None:
    """UsageError if a fault flag was given to a check that does not run them."""
    if faults_given(args):
        raise UsageError(f"{'/'.join(FLAGS)} exercise the training-plan runtime: {why}")


def check_fault_flags(args: argparse.Namespace, gpus: int) -> None:
    """UsageError for values that cannot be run on `gpus` ranks over `args.steps` steps."""
    if (args.kill_rank is None) != (args.kill_at_step is None):
        raise UsageError("--kill-rank and --kill-at-step go together: give both")
    if args.kill_rank is not None and args.kill_rank >= gpus:
        raise UsageError(f"--kill-rank {args.kill_rank}: the plan runs ranks 0-{gpus - 1}")
    if args.kill_at_step is not None and args.kill_at_step >= args.steps:
        raise UsageError(f"--kill-at-step {args.kill_at_step}: the check trains steps "
                         f"0-{args.steps - 1} (--steps {args.steps})")
    for rank_flag, step_flag in (("stall_rank", "stall_at_step"),
                                 ("slow_rank", "slow_factor")):
        rank, other = getattr(args, rank_flag), getattr(args, step_flag)
        a, b = ("--" + rank_flag.replace("_", "-"), "--" + step_flag.replace("_", "-"))
        if (rank is None) != (other is None):
            raise UsageError(f"{a} and {b} go together: give both")
        if rank is not None and rank >= gpus:
            raise UsageError(f"{a} {rank}: the plan runs ranks 0-{gpus - 1}")
    for flag in ("stall_at_step", "nan_at_step"):
        step = getattr(args, flag)
        if step is not None and step >= args.steps:
            raise UsageError(f"--{flag.replace('_', '-')} {step}: the check trains steps "
                             f"0-{args.steps - 1} (--steps {args.steps})")
    if args.elastic is not None:
        low, high = args.elastic
        if not low <= gpus <= high:
            raise UsageError(f"--elastic {low}:{high}: --gpus {gpus} is not within it")
        if not args.checkpoint_every:
            raise UsageError("--elastic goes on from the last checkpoint on the ranks left: "
                             "give --checkpoint-every K as well")
    if args.on_divergence == "rollback" and not args.checkpoint_every:
        raise UsageError("--on-divergence rollback goes back to the last checkpoint: give "
                         "--checkpoint-every K as well")
    if args.spike_factor is not None and args.on_divergence is None:
        raise UsageError("--spike-factor says what --on-divergence meets: give "
                         "--on-divergence skip, rollback or stop")
    folder = args.checkpoint_dir
    if folder is not None:
        path = Path(folder).expanduser()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError(f"--checkpoint-dir {folder!r} is not an empty folder; a check "
                             "starts from no checkpoint: give a new or empty one")
        # The nearest folder that exists must take a new one: found before any rank starts.
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--checkpoint-dir {folder!r} cannot be written ({existing} is "
                             "not a folder this user can write to); give another")
