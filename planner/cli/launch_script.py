"""`plan predict --args-file`: the launch script read as bash runs it (`planner/shell/`,
through `planner.megatron.launch_text`), with the environment and positional parameters
the user gives (--env, --script-arg), the world size it starts (--gpus rescaling a node
count the script sets through a variable), errors about a flag named by the script's line,
and --explain-args' table of each flag and where it was written."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.cli.errors import UsageError
from planner.search.megatron_space import MAX_GPUS
from planner.user_files import read_user_file

if TYPE_CHECKING:
    from planner.megatron import LaunchLine, MegatronArgs


def environment_pair(text: str) -> tuple[str, str]:
    """--env's NAME=VALUE, checked as argparse reads it."""
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier() or not name.isascii():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=VALUE; give the variable and its value, e.g. --env "
            "SLURM_NNODES=8")
    return name, value


def launch_line(args: argparse.Namespace) -> LaunchLine:
    """The launch line of --args-file and of the words after --, as one."""
    from planner.megatron import LaunchLine, launch_words, split_launcher

    given = split_launcher(args.flags)
    if args.args_file is None:
        if args.script_arg:
            raise UsageError("--script-arg sets what a launch script reads; give the script "
                             "with --args-file, or drop it")
        if not given.flags:
            raise UsageError(
                "plan predict needs a launch line: put pretrain_gpt.py's flags after -- "
                "(plan predict --cluster C --gpus N -- --num-layers ...) or give --args-file"
            )
        return given
    text = read_user_file(args.args_file, f"--args-file {args.args_file!r}",
                          "the launch script")
    from_file = launch_words(text, dict(args.env), args.script_arg, args.args_file)
    if from_file.launcher and given.launcher:
        raise UsageError(
            f"both --args-file {args.args_file!r} and the words after -- start a launcher; "
            "give the extra flags alone after --"
        )
    first = from_file if from_file.launcher else given
    return LaunchLine(from_file.flag_words + given.flag_words, script=first.script,
                      launcher=first.launcher, world_size=first.world_size,
                      per_node=first.per_node, nodes_set_by=first.nodes_set_by,
                      environment=from_file.environment + given.environment)


def parsed_flags(args: argparse.Namespace, launch: LaunchLine) -> MegatronArgs:
    """The flags as Megatron-LM parses them; an error about one word of a launch script
    names the script's line that word was written on."""
    from planner.megatron import LaunchLineError, parse_megatron_flags

    try:
        return parse_megatron_flags(launch.flags)
    except LaunchLineError as error:
        written = next((w for w in launch.flag_words if w.text == error.word and w.line), None)
        if written is None or args.args_file is None:
            raise
        raise LaunchLineError(f"{args.args_file}, line {written.line}: {error}") from None


def world_size(args: argparse.Namespace, launch: LaunchLine) -> tuple[int, list[str]]:
    """--gpus, or the launcher's world size, and a note where --gpus changes the node count
    a script sets through a variable (`NNODES=${SLURM_NNODES:-1}`): the nodes then are
    --gpus / --nproc-per-node. A node count the launch line writes out must agree."""
    started, notes = launch.world_size, []
    if args.gpus is not None and started is not None and args.gpus != started:
        per_node = launch.per_node
        if launch.nodes_set_by is None or per_node is None:
            raise UsageError(
                f"--gpus {args.gpus} but the launch line's torchrun starts {started} processes "
                "(--nnodes x --nproc-per-node); make them agree or drop --gpus"
            )
        if args.gpus % per_node:
            raise UsageError(
                f"--gpus {args.gpus} is not a whole number of the launch line's nodes of "
                f"{per_node} processes (torchrun --nproc-per-node {per_node}); give a multiple "
                f"of {per_node}")
        notes.append(
            f"--gpus {args.gpus}: the script's torchrun starts {started // per_node} node(s) of "
            f"{per_node} (set by {launch.nodes_set_by}); read as {args.gpus // per_node} nodes "
            f"of {per_node}, the degrees as written")
        started = args.gpus
    gpus = args.gpus or started
    if gpus is None:
        raise UsageError(
            "plan predict needs the GPU count: add --gpus N (Megatron-LM takes it from the "
            "launcher, and this launch line has no torchrun --nnodes / --nproc-per-node)"
        )
    if gpus > MAX_GPUS:
        raise UsageError(f"the launch line's torchrun starts {gpus:,} processes, more than "
                         f"the {MAX_GPUS:,} GPUs Tessel plans; check --nnodes")
    return gpus, notes


def print_launch_words(launch: LaunchLine, console: Console) -> None:
    """--explain-args: each flag of the training command, its value, the line of the launch
    script it was written on, and where a value came from when elsewhere (a variable set
    on another line, --env)."""
    table = Table(title=f"What {launch.script or 'the training script'} receives",
                  title_justify="left")
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("flag", no_wrap=True)
    table.add_column("value (from)", overflow="fold")
    rows: list[tuple[str, str, list[str], list[str]]] = []
    for word in launch.flag_words:
        if word.text.startswith("-") or not rows:
            rows.append((str(word.line) if word.line else "--", word.text, [], []))
            continue
        rows[-1][2].append(word.text)
        source = (f"{word.via}, line {word.line}" if word.via and word.line
                  else f"--env {word.via}" if word.via else "")
        if source and source not in rows[-1][3]:
            rows[-1][3].append(source)
    for line, flag, values, sources in rows:
        origin = f" (from {'; '.join(sources)})" if sources else ""
        table.add_row(line, flag, Text(" ".join(values) + origin))
    console.print(table)
