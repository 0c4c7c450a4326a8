"""The flags of a whole training run: its length, what a GPU-hour costs, how often GPUs
fail, how checkpoints are written and restarts take, and what to rank plans by."""

from __future__ import annotations

import argparse
import re
from typing import Any

from cost_models.economics import DEFAULT_PUE, RunAssumptions
from planner.cli.errors import UsageError
from planner.cli.parsing import training_only, whole
from planner.vocabulary.cluster import Cluster

CHECKPOINT_WRITE_GBPS = 5.0
"""Storage write bandwidth per host, GB/s: a host's share of a parallel file system
(a DGX has two 200 Gb/s storage ports; about 5 GB/s is sustained), stated."""
RESTART_MINUTES = 10.0
"""Minutes from a failure to training again: detection, rescheduling, the process group
and the checkpoint read back (Llama 3 and Meta's RSC report several to tens of minutes),
stated."""
_SUFFIXES = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
MAX_ITERS = 1 << 40


MAX_TRAIN_TOKENS = 1e16
"""The most --train-tokens takes: 10,000T, hundreds of times the largest published
pretraining runs (Llama 3 15.6T, Qwen3 36T); beyond it a run's days are no plan."""


def tokens(text: str) -> float:
    """'1T', '300B', '15.6T', '2e12' -> a token count (argparse type), up to
    `MAX_TRAIN_TOKENS`."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a token count; write e.g. 1T, 300B or 2e12")
    count = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if not count <= MAX_TRAIN_TOKENS:  # inf (1e999) included
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than 10,000T tokens, the most a run's totals are counted for; "
            "give fewer")
    return count


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def power_usage_effectiveness(text: str) -> float:
    """A data centre's PUE: its total power over its IT equipment's, 1 or more by definition
    (The Green Grid, "PUE: a comprehensive examination of the metric", 2012)."""
    value = positive(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is below 1; a PUE is total power over IT power (1.1-1.6 is typical)")
    return value


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """--train-tokens / --train-iters and the assumptions of the run's totals."""
    group = parser.add_argument_group(
        "whole run (give --train-tokens or --train-iters for days, GPU-hours, cost, energy "
        "and failures)")
    actions: list[argparse.Action] = []

    def add(*names: str, **options: Any) -> None:
        actions.append(group.add_argument(*names, **options))

    add("--train-tokens", type=tokens, metavar="N",
                       help="tokens to train on (1T, 300B, ...)")
    add("--train-iters", type=whole(1, MAX_ITERS), metavar="N",
                       help="optimizer steps to train (instead of --train-tokens)")
    add("--gpu-hour-price", type=positive, metavar="USD",
                       help="price of one GPU-hour (default: the middle of the cluster "
                       "preset's list-price range)")
    add("--failure-rate", type=positive, metavar="PER_GPU_HOUR",
                       help="job-stopping failures per GPU-hour (default: the preset's, "
                       "with its source)")
    add("--checkpoint-write-gbps", type=positive, metavar="GB/s",
                       default=CHECKPOINT_WRITE_GBPS,
                       help=f"storage write bandwidth per host (default {CHECKPOINT_WRITE_GBPS:g})")
    add("--sync-checkpoints", action="store_true",
                       help="checkpoints block until written (default: asynchronous saves, "
                       "which block only while the state is copied to host memory)")
    add("--restart-minutes", type=positive, metavar="MIN",
                       default=RESTART_MINUTES,
                       help=f"time from a failure to training again (default {RESTART_MINUTES:g})")
    add("--pue", type=power_usage_effectiveness, default=DEFAULT_PUE,
                       help=f"data-centre power usage effectiveness (default {DEFAULT_PUE:g})")
    add("--objective", choices=("time", "cost"), default=None,
                       help="rank plans by the expected whole-run time or cost with failures "
                       "(cost: fewer GPUs than --gpus are tried too)")
    # An operator-level --mesh plan has no run to total: these are training-plan flags.
    training_only(parser, *actions)


def wants_totals(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a whole run's totals."""
    if args.train_tokens is not None and args.train_iters is not None:
        raise UsageError("--train-tokens and --train-iters both give the run's length; "
                         "give one")
    given = args.train_tokens is not None or args.train_iters is not None
    if args.objective and not given:
        raise UsageError(f"--objective {args.objective} ranks plans by the whole run: add "
                         "--train-tokens N or --train-iters N")
    return given


def run_assumptions(args: argparse.Namespace, cluster: Cluster) -> RunAssumptions:
    """The totals' assumptions: flags as given, the preset's values for the rest."""
    costs = cluster.run_costs
    if costs is None:
        raise UsageError(f"--cluster {cluster.name} has no run_costs (price per GPU-hour, "
                         "failure rate, power) for --train-tokens; use a preset that has "
                         "them or add run_costs to the cluster file")
    return RunAssumptions(
        gpu_hour_usd=args.gpu_hour_price or costs.default_price,
        failure_rate_per_gpu_hour=args.failure_rate or costs.failure_rate_per_gpu_hour,
        checkpoint_write_gbps=args.checkpoint_write_gbps,
        restart_minutes=args.restart_minutes,
        asynchronous_checkpoints=not args.sync_checkpoints, pue=args.pue,
    )


def objective_key(objective: str | None) -> Any:
    """Sort key of a plan with totals under `objective` (fitting plans first, then those
    whose reserved memory fits too, as the search ranks them)."""
    def key(plan: Any) -> tuple:
        totals = plan.training
        value = (totals.expected_cost_usd if objective == "cost" else totals.expected_days)
        return (not plan.predicted.fits, not plan.predicted.reserved_fits, value)
    return key
