"""The `plan` command.

    plan MODEL --gpus N --global-batch-size B [--cluster C] [knobs]   a training plan
    plan MODEL --mesh 4 [--cluster cpu] [--json PATH] [--emit-code DIR]
    plan check MODEL --mesh 2x2 [--steps 3] [--json PATH]
    plan check MODEL --gpus N ... [--checkpoint-every K] [--kill-rank R --kill-at-step S]
               [--max-restarts N]
    plan inspect MODEL [--json PATH]
    plan predict --cluster C --gpus N -- MEGATRON_FLAGS | --args-file FILE
    plan predict --cluster C [--gpus N] --torchtitan JOB.toml
    plan profile [--output tessel-profile.json] [--ranks 2,4] [--max-bytes 16MiB]
    plan calibrate CSV [--cluster C]
    plan calibration [--kind ENGINE,FAMILY,GENERATION] [--rows] [--refresh]
    plan models [--json PATH]
    plan clusters [--json PATH]
    plan --help, plan COMMAND --help   every command (COMMANDS), each one's flags

MODEL is a preset (`plan models`), `gpt`/`llama`/`mixtral` with Megatron-LM shape flags
(`--num-layers 96 --hidden-size 12288 ...`), `hf:path/to/config.json`, `demo:NAME`,
`path/to/file.py:function` or `package.module:function`. A mistake in the input exits
with status 2 and one line saying what to change (a traceback too with --debug);
`plan check` exits 1 when the sharded run does not match the single process.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
import threading
from typing import Callable, NamedTuple, NoReturn, Sequence

from planner.cli.calibrate import add_calibrate_arguments
from planner.cli.calibration import add_calibration_arguments
from planner.cli.catalog import add_catalog_arguments
from planner.cli.console import console
from planner.cli.emit_flags import add_emit_flags
from planner.cli.errors import check_output_file, check_output_folder, report_failure
from planner.cli.output import json_to_stdout
from planner.cli.fault_flags import add_fault_flags
from planner.cli.model_args import MAX_STEPS, add_mesh_arguments, add_model_arguments
from planner.cli.network_report import add_network_flags
from planner.cli.parallel_flags import add_parallel_flags
from planner.cli.report_flags import add_report_flags
from planner.cli.run_flags import add_run_flags
from planner.cli.parsing import Parser, whole
from planner.cli.predict import predict_parser
from planner.cli.profile import add_profile_arguments


def _parser(prog: str, description: str, *add: Callable[[Parser], None]) -> Parser:
    parser = Parser(prog=prog, description=description)
    for add_arguments in add:
        add_arguments(parser)
    return parser


def _steps(parser: Parser) -> None:
    parser.add_argument("--steps", type=whole(1, MAX_STEPS), default=3,
                        help="training steps (default 3)")


def _emit_code(parser: Parser) -> None:
    parser.add_argument(
        "--emit-code", metavar="DIR", help="write each rank's program as DIR/rankN.py"
    )


class Command(NamedTuple):
    """One `plan` command: its line in `plan --help`, its parser, and the module and
    function that run it (imported only when it runs, so `--help` stays instant)."""

    summary: str
    make_parser: Callable[[], Parser]
    module: str
    function: str


def _plan_parser() -> Parser:
    """Plain `plan MODEL`, whose help also lists every other command near its top (as
    pip's does): a newcomer's first `plan --help` must show that `plan check` exists."""
    parser = Parser(
        prog="plan",
        usage="plan MODEL [flags]     a plan of MODEL (the flags below)\n"
              "       plan COMMAND [flags]   one of the commands below",
        description="Plan how to train a model: with --gpus and --global-batch-size, the best "
        "parallel configuration for a cluster (every knob not given is searched); with "
        "--mesh, the sharding of every operator on one device mesh." + _commands_list(),
        formatter_class=_HelpWithCommands,
    )
    for add_arguments in (add_model_arguments, add_mesh_arguments, _emit_code,
                          add_parallel_flags, add_run_flags, add_report_flags,
                          add_network_flags, add_emit_flags):
        add_arguments(parser)
    return parser


_COMMANDS_HEADING = "\n\ncommands (plan COMMAND --help for each one's flags):\n"


class _HelpWithCommands(argparse.HelpFormatter):
    """argparse's formatter, except that the command list after the description keeps its
    lines (RawDescriptionHelpFormatter would stop the prose re-wrapping too)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        prose, heading, commands = text.partition(_COMMANDS_HEADING)
        return super()._fill_text(prose, width, indent) + heading + commands


def _commands_list() -> str:
    rows = [(name, command.summary) for name, command in COMMANDS.items() if name]
    width = max(len(name) for name, _ in rows)
    return _COMMANDS_HEADING + "\n".join(
        f"  {name.ljust(width)}  {summary}" for name, summary in rows
    ) + "\n\nEvery command and flag: docs/cli.md."


# Command -> what runs it; "" is plain `plan MODEL`. Each summary is its line in
# `plan --help`.
COMMANDS: dict[str, Command] = {
    "": Command("plan a model", _plan_parser, "planner.cli.plan_command", "run_plan"),
    "check": Command(
        "train a plan on gloo ranks and on one process; exit 1 on a mismatch",
        lambda: _parser(
            "plan check", "Plan, train on gloo ranks and on one process, and compare: an "
            "operator-level plan (--mesh) or a training plan (--gpus N --global-batch-size B "
            "and knobs; zoo transformers).",
            add_model_arguments, add_mesh_arguments, _steps, add_parallel_flags,
            add_fault_flags,
        ), "planner.cli.check", "run_check"),
    "predict": Command(
        "predict a Megatron-LM launch line or a TorchTitan TOML job config",
        lambda: predict_parser(
            "plan predict", "Predict exactly the run a Megatron-LM launch line (its "
            "pretrain_gpt.py flags after --, or --args-file) or a TorchTitan job config "
            "(--torchtitan JOB.toml) starts: step time, tokens/s, TFLOP/s, MFU and memory per "
            "GPU; then the best plan the search finds for the same model, cluster and batch, "
            "its speed-up and the flags or keys that change.",
        ), "planner.cli.predict", "run_predict"),
    "inspect": Command(
        "a model's layers, templates, parameters, FLOPs and activations",
        lambda: _parser(
            "plan inspect", "Trace a model (on the meta device for zoo and hf: models) and "
            "list its layers, templates, parameters, FLOPs and activation bytes per token.",
            add_model_arguments,
        ), "planner.cli.inspect", "run_inspect"),
    "models": Command(
        "list the built-in model presets",
        lambda: _parser("plan models", "List the built-in model presets.",
                        add_catalog_arguments),
        "planner.cli.catalog", "run_models"),
    "clusters": Command(
        "list the built-in cluster presets and their calibration",
        lambda: _parser("plan clusters", "List the built-in cluster presets.",
                        add_catalog_arguments),
        "planner.cli.catalog", "run_clusters"),
    "profile": Command(
        "time matmuls and collectives on this machine, for plan --profile",
        lambda: _parser(
            "plan profile", "Time matmuls, an elementwise op and collectives on this machine "
            "(CPU and gloo, or GPUs and NCCL) and write them to a database for "
            "`plan --profile`.",
            add_profile_arguments,
        ), "planner.cli.profile", "run_profile"),
    "calibrate": Command(
        "fit a cluster preset's efficiency to measured step times",
        lambda: _parser(
            "plan calibrate", "Fit a cluster preset's efficiency parameters to measured step "
            "times.", add_calibrate_arguments,
        ), "planner.cli.calibrate", "run_calibrate"),
    "calibration": Command(
        "how sure predictions are: the band of each kind of run and its evidence",
        lambda: _parser(
            "plan calibration", "List the band of measured over predicted step time of "
            "every kind of run (engine x model family x GPU generation) with the published "
            "runs it rests on, each held out of the fit that predicted it.",
            add_calibration_arguments,
        ), "planner.cli.calibration", "run_calibration"),
}
# Flags that name where output goes: checked before any work, so none is thrown away.
_OUTPUT_FILES = {"json": "--json", "output": "--output"}
_OUTPUT_FOLDERS = {"emit_code": "--emit-code"}


def build_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand; "" is plain `plan MODEL`."""
    return {name: command.make_parser() for name, command in COMMANDS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (see `planner/cli/errors.py`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS and argv[0] else ""
    words = argv[1:] if command else argv
    _, make_parser, module, function = COMMANDS[command]
    redirected = False
    try:
        args = make_parser().parse_args(words)
        redirected = json_to_stdout(getattr(args, "json", None))
        for dest, flag in _OUTPUT_FILES.items():
            if getattr(args, dest, None):
                check_output_file(flag, getattr(args, dest))
        for dest, flag in _OUTPUT_FOLDERS.items():
            if getattr(args, dest, None):
                check_output_folder(flag, getattr(args, dest))
        return getattr(importlib.import_module(module), function)(args)
    except (Exception, KeyboardInterrupt) as error:
        return report_failure(error, console, debug="--debug" in words)
    finally:
        if redirected:
            console.file = None  # back to stdout for the next command in this process


def run() -> NoReturn:
    """The `plan` command: `main()`, then the process ends without freeing its modules one
    by one (torch's two thousand take about a second, which nothing needs): exit handlers
    run and output is flushed as at any exit. Where a thread of ours still runs, the exit
    is the ordinary one, which waits for it."""
    # A command lives seconds and allocates millions of small objects (torch's modules,
    # traced graphs, DTensor's specs), which set off a young collection every 700 by
    # default, each costly on such a heap: an eighth of a traced plan's time. A young
    # collection every 200,000, as mypy's command does.
    gc.set_threshold(200_000, 30, 30)
    code = main()
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say there
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
