"""`plan check`'s flags that exercise checkpoints and faults of the training-plan runtime:
checkpoint every K steps, SIGKILL one rank at one step, let torch's elastic agent restart
the job, which then resumes from its last checkpoint by itself."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.cli.errors import UsageError
from planner.cli.model_args import MAX_STEPS
from planner.cli.parsing import whole

# Most restarts a check asks of the agent: each one restarts every rank.
MAX_RESTARTS = 10
# Highest rank --kill-rank names: plan check runs at most this many ranks.
MAX_RANK = 15
FLAGS = ("--checkpoint-every", "--checkpoint-dir", "--kill-rank", "--kill-at-step",
         "--max-restarts")


def add_fault_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every", type=whole(1, MAX_STEPS), metavar="K",
        help="training plans (--gpus): save a sharded checkpoint every K steps, in the "
        "background (torch.distributed.checkpoint)")
    parser.add_argument(
        "--checkpoint-dir", metavar="DIR",
        help="where the checkpoints go, kept after the check (an empty or new folder; "
        "default: a temporary one, removed)")
    parser.add_argument(
        "--kill-rank", type=whole(0, MAX_RANK), metavar="R",
        help="SIGKILL rank R's process as step --kill-at-step begins (first attempt only)")
    parser.add_argument(
        "--kill-at-step", type=whole(0, MAX_STEPS - 1), metavar="S",
        help="the step (0-based, as the loss table counts) at which --kill-rank dies")
    parser.add_argument(
        "--max-restarts", type=whole(0, MAX_RESTARTS), default=0, metavar="N",
        help="times torch's elastic agent restarts every rank after one fails; the job "
        "resumes from its last complete checkpoint (default 0)")


def faults_given(args: argparse.Namespace) -> bool:
    """Whether any of these flags was given (--max-restarts above 0)."""
    return any(getattr(args, name, None) is not None for name in
               ("checkpoint_every", "checkpoint_dir", "kill_rank", "kill_at_step")) or \
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
    folder = args.checkpoint_dir
    if folder is not None:
        path = Path(folder).expanduser()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError(f"--checkpoint-dir {folder!r} is not an empty folder; a check "
                             "starts from no checkpoint: give a new or empty one")
