"""The MODEL argument and the flags every model-taking command shares."""

from __future__ import annotations

import argparse

from typing import Any

from planner.cli.errors import UsageError
from planner.cli.parsing import gibibytes, seconds, whole
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.pools import AnyCluster, PooledCluster, load_any
from planner.megatron.arguments import layer_pattern
from planner.models.flags import NORMALIZATION, POSITION_EMBEDDING, SWITCHES, VALUE_FLAGS
from planner.models.sources import ACCEPTED_FORMS, LoadedModel
from planner.models.config import TransformerConfig
from planner.search.solver import DEFAULT_TIME_LIMIT_S

# Longest --time-limit: a day. Planning that needs more is not planning in seconds.
MAX_TIME_LIMIT_S = 86400.0
# Most training steps `plan check` runs: each is a full forward and backward on every rank.
MAX_STEPS = 1000


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=ACCEPTED_FORMS)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_model_shape_flags(parser)


def add_mesh_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of an operator-level plan on one device mesh."""
    parser.add_argument(
        "--mesh", default=None,
        help="logical device mesh for operator shardings, e.g. 4 or 2x2 (default 4; zoo "
        "and hf: models plan a cluster with --gpus instead)",
    )
    parser.add_argument(
        "--cluster", default="cpu",
        help="cluster preset or YAML/JSON file (default cpu; `plan clusters` lists presets)",
    )
    add_headroom_argument(parser)
    add_segment_argument(parser)
    parser.add_argument(
        "--time-limit", type=seconds(0.0, MAX_TIME_LIMIT_S), default=DEFAULT_TIME_LIMIT_S,
        help="seconds for choosing the shardings: enumerating strategies, building and "
        f"solving the ILP (default {DEFAULT_TIME_LIMIT_S:g}, a safety net: solves end sooner "
        "when proven optimal; the best plan found by then is kept); with --gpus, "
        "each layer's or stage's ILP's solver limit",
    )
    parser.add_argument(
        "--profile", metavar="PATH",
        help="price ops and collectives with this `plan profile` database where it has "
        "measurements (default: the cluster's analytical models)",
    )


def _help(field: str) -> str:
    return TransformerConfig.model_fields[field].description or field


def add_model_shape_flags(parser: argparse.ArgumentParser) -> None:
    """Add the model-shape flags, in a group of their own, all defaulting to 'not given'."""
    group = parser.add_argument_group(
        "model shape (Megatron-LM flags; for gpt/llama/mixtral, or to override a preset)"
    )
    for flag, (field, largest) in VALUE_FLAGS.items():
        group.add_argument(flag, dest=field, type=whole(1, largest), default=None,
                           help=_help(field))
    group.add_argument(
        "--normalization", choices=sorted(NORMALIZATION), default=None, help=_help("norm")
    )
    group.add_argument(
        "--position-embedding-type",
        choices=sorted(POSITION_EMBEDDING),
        default=None,
        help=_help("position_embedding"),
    )
    for flag, (field, _) in SWITCHES.items():
        dest = flag.removeprefix("--").replace("-", "_")
        group.add_argument(flag, dest=dest, action="store_true", help=_help(field))
    # Megatron-LM's moe_freq_type: N, or a 0/1 list expression such as "([0]*3+[1]*58)",
    # read without eval (planner.megatron.arguments.layer_pattern).
    group.add_argument("--moe-layer-freq", dest="moe_layer_freq", type=layer_pattern,
                       default=None, metavar="N|PATTERN", help=_help("moe_layer_freq"))


def shape_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TransformerConfig fields the command line gave, and only those."""
    shape = {field: getattr(args, field) for field, _ in VALUE_FLAGS.values()}
    shape["moe_layer_freq"] = getattr(args, "moe_layer_freq", None)
    if args.normalization:
        shape["norm"] = NORMALIZATION[args.normalization]
    if args.position_embedding_type:
        shape["position_embedding"] = POSITION_EMBEDDING[args.position_embedding_type]
    for flag, (field, value) in SWITCHES.items():
        if getattr(args, flag.removeprefix("--").replace("-", "_")):
            shape[field] = value
    return {k: v for k, v in shape.items() if v is not None}


def load(args: argparse.Namespace) -> LoadedModel:
    """The model the MODEL argument and the shape flags name."""
    from planner.models.sources import load_model

    return load_model(args.model, shape_overrides(args))


def add_headroom_argument(parser: argparse.ArgumentParser) -> None:
    """--memory-headroom: GiB of each device a plan must leave free."""
    parser.add_argument(
        "--memory-headroom", type=gibibytes(1024.0), default=0.0, metavar="GIB",
        help="GiB of each GPU a plan must leave free (default 0): a plan fits only in the "
        "device's memory less this margin",
    )


def add_segment_argument(parser: argparse.ArgumentParser) -> None:
    """--segment: the job's hosts placed in segments, each inside one scale-up domain."""
    parser.add_argument(
        "--segment", type=whole(1, 1024), default=None, metavar="HOSTS",
        help="the job's hosts are placed in segments of HOSTS hosts, each inside one "
        "scale-up domain (Slurm's --segment on NVL72 racks: --segment 16 runs 256 GB200s "
        "as four racks of 64); default: domains filled in order",
    )


def load_cluster(args: argparse.Namespace) -> Cluster:
    """--cluster with the --segment and --memory-headroom asked for; UsageError naming
    the flag (and for a mixed cluster's file, which only `plan` takes)."""
    cluster = load_any_cluster(args)
    if isinstance(cluster, PooledCluster):
        raise UsageError(f"--cluster {args.cluster}: a mixed cluster (pools) is planned by "
                         "`plan` and `plan check` only; give one pool's cluster here")
    return cluster


def load_any_cluster(args: argparse.Namespace) -> AnyCluster:
    """--cluster, one kind of machine or pools of several (`planner.vocabulary.pools`),
    with the --segment and --memory-headroom asked for; UsageError naming the flag."""
    cluster = load_any(args.cluster)
    # (A mixed cluster takes no --segment: `plan` refuses it there by name.)
    if getattr(args, "segment", None) is not None and isinstance(cluster, Cluster):
        try:
            cluster = cluster.with_segments(args.segment)
        except ValueError as error:
            raise UsageError(f"--segment {args.segment}: {error}") from None
    if not args.memory_headroom:
        return cluster
    try:
        return cluster.with_memory_headroom(args.memory_headroom)
    except ValueError as error:
        raise UsageError(f"--memory-headroom {args.memory_headroom:g}: {error}") from None
