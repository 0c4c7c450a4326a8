"""The `plan` command.

    plan MODEL --gpus N --global-batch-size B [--cluster C] [knobs]   a training plan
    plan MODEL --mesh 4 [--cluster cpu] [--json PATH] [--emit-code DIR]
    plan check MODEL --mesh 2x2 [--steps 3] [--json PATH]
    plan inspect MODEL [--json PATH]
    plan profile [--output tessel-profile.json] [--ranks 2,4] [--max-bytes 16MiB]
    plan calibrate CSV [--cluster C]
    plan models [--json PATH]
    plan clusters [--json PATH]

MODEL is a preset (`plan models`), `gpt`/`llama`/`mixtral` with Megatron-LM shape flags
(`--num-layers 96 --hidden-size 12288 ...`), `hf:path/to/config.json`, `demo:NAME`,
`path/to/file.py:function` or `package.module:function`. A mistake in the input exits
with status 2 and one line saying what to change (a traceback too with --debug);
`plan check` exits 1 when the sharded run does not match the single process.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from planner.cli.console import console
from planner.cli.errors import check_output_file, check_output_folder, report_failure
from planner.cli.model_args import add_mesh_arguments, add_model_arguments
from planner.cli.parallel_flags import add_parallel_flags
from planner.cli.parsing import Parser, whole


def _plan_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="plan",
        description="Plan how to train a model: with --gpus and --global-batch-size, the "
        "best parallel configuration for a cluster (every knob not given is searched); "
        "with --mesh, the sharding of every operator on one device mesh.",
    )
    add_model_arguments(parser)
    add_mesh_arguments(parser)
    parser.add_argument(
        "--emit-code", metavar="DIR", help="write each rank's program as DIR/rankN.py"
    )
    add_parallel_flags(parser)
    return parser


def _check_parser() -> argparse.ArgumentParser:
    from planner.cli.check import MAX_STEPS

    parser = Parser(
        prog="plan check",
        description="Plan, train on gloo ranks and on one process, and compare: an "
        "operator-level plan (--mesh) or a training plan (--gpus N --global-batch-size B "
        "and knobs; zoo transformers).",
    )
    add_model_arguments(parser)
    add_mesh_arguments(parser)
    parser.add_argument("--steps", type=whole(1, MAX_STEPS), default=3,
                        help="training steps (default 3)")
    add_parallel_flags(parser)
    return parser


def _inspect_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="plan inspect",
        description="Trace a model (on the meta device for zoo and hf: models) and list "
        "its layers, templates, parameters, FLOPs and activation bytes per token.",
    )
    add_model_arguments(parser)
    return parser


def _profile_parser() -> argparse.ArgumentParser:
    from planner.cli.profile import add_profile_arguments

    parser = Parser(
        prog="plan profile",
        description="Time matmuls, an elementwise op and collectives on this machine (CPU "
        "and gloo, or GPUs and NCCL) and write them to a database for `plan --profile`.",
    )
    add_profile_arguments(parser)
    return parser


def _calibrate_parser() -> argparse.ArgumentParser:
    from planner.cli.calibrate import add_calibrate_arguments

    parser = Parser(
        prog="plan calibrate",
        description="Fit a cluster preset's efficiency parameters to measured step times.",
    )
    add_calibrate_arguments(parser)
    return parser


def _catalog_parser(name: str, what: str) -> argparse.ArgumentParser:
    from planner.cli.catalog import add_catalog_arguments

    parser = Parser(prog=f"plan {name}", description=f"List the built-in {what} presets.")
    add_catalog_arguments(parser)
    return parser


def _runner(command: str) -> Callable[[argparse.Namespace], int]:
    if command == "":
        from planner.cli.plan import run_plan as run
    elif command == "check":
        from planner.cli.check import run_check as run
    elif command == "inspect":
        from planner.cli.inspect import run_inspect as run
    elif command == "profile":
        from planner.cli.profile import run_profile

        return lambda args: run_profile(args, console)
    elif command == "calibrate":
        from planner.cli.calibrate import run_calibrate

        return lambda args: run_calibrate(args, console)
    elif command == "models":
        from planner.cli.catalog import run_models as run
    else:
        from planner.cli.catalog import run_clusters as run
    return run


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "": _plan_parser,
    "check": _check_parser,
    "inspect": _inspect_parser,
    "profile": _profile_parser,
    "calibrate": _calibrate_parser,
    "models": lambda: _catalog_parser("models", "model"),
    "clusters": lambda: _catalog_parser("clusters", "cluster"),
}
# Flags that name where output goes: checked before any work, so none is thrown away.
_OUTPUT_FILES = {"json": "--json", "output": "--output"}
_OUTPUT_FOLDERS = {"emit_code": "--emit-code"}


def build_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand; "" is plain `plan MODEL`."""
    return {command: make() for command, make in PARSERS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (see `planner/cli/errors.py`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in PARSERS and argv[0] else ""
    words = argv[1:] if command else argv
    try:
        args = PARSERS[command]().parse_args(words)
        for dest, flag in _OUTPUT_FILES.items():
            if getattr(args, dest, None):
                check_output_file(flag, getattr(args, dest))
        for dest, flag in _OUTPUT_FOLDERS.items():
            if getattr(args, dest, None):
                check_output_folder(flag, getattr(args, dest))
        return _runner(command)(args)
    except (Exception, KeyboardInterrupt) as error:
        return report_failure(error, console, debug="--debug" in words)


if __name__ == "__main__":
    sys.exit(main())
