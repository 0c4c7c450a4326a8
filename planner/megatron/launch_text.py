"""A launch line or script, read as bash runs it, down to the training script's flags.

`launch_words` evaluates a launch script with `planner.shell` (variables and their
defaults, arrays, `if` blocks, arithmetic; nothing run) and picks the training command:
the one command that runs a `pretrain_*.py` script (through torchrun, `python -m
torch.distributed.run`, srun, deepspeed, ...; or, where none does, the one that runs a
Python script), or, in text of flags alone, all its flags. A value Tessel cannot know that
reaches that command (a command substitution, a loop, `source`, `eval`, an `if` it cannot
evaluate) is refused, naming the file, the line and the construct. `split_launcher` sets
aside the launcher before the script; torchrun's --nnodes x --nproc-per-node is the world
size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Mapping, Sequence

from planner.megatron.errors import LaunchLineError
from planner.shell import Ran, ShellError, Word, evaluate_script


@dataclass(frozen=True)
class LaunchLine:
    """The flags a training script gets, and what the launcher says about the world."""

    flag_words: tuple[Word, ...]
    """The script's command-line words, in order, with where each was written (line,
    variable), for --explain-args."""
    script: str | None = None
    """The training script (`pretrain_gpt.py`), when the line names one."""
    launcher: list[str] = field(default_factory=list)
    """The launcher's words before the script (`torchrun --nnodes 8 ...`)."""
    world_size: int | None = None
    """Processes the launcher starts (--nnodes x --nproc-per-node), when it says."""
    per_node: int | None = None
    """torchrun's --nproc-per-node, when it gives one."""
    nodes_set_by: str | None = None
    """Where a script sets torchrun's node count through a variable ("NNODES on line 9"),
    a default `--gpus` may change; None when the launch line writes it out."""
    environment: tuple[tuple[str, str], ...] = ()
    """The variables the training command sets for itself (its `NAME=value` prefix), which
    Megatron-LM's processes inherit."""

    @property
    def flags(self) -> list[str]:
        """The script's command-line words, in order."""
        return [word.text for word in self.flag_words]

    @property
    def argv(self) -> list[str]:
        """The training command's words: launcher, script, flags."""
        return [*self.launcher, *([self.script] if self.script else []), *self.flags]


def launch_words(text: str, environment: Mapping[str, str] | None = None,
                 arguments: Sequence[str] = (), source: str = "the launch text") -> LaunchLine:
    """The launch line in a shell command or script, evaluated as bash would run it with
    `environment` set and `arguments` as its positional parameters: the one command that
    runs the training script, or text of flags alone taken whole. LaunchLineError naming
    `source`, the line and the construct for a training command Tessel cannot know."""
    try:
        run = evaluate_script(text, environment, arguments, source)
    except ShellError as error:
        raise LaunchLineError(f"{source}: {error}; Tessel reads the script as bash would, "
                              "without running it") from None
    scripts = [command for command in run.commands if command.kind == "script"]
    if scripts:
        command = _training_command(scripts, source)
        _check_known(command, source)
        return _from_words(list(command.words), command.env)
    flags = [word for command in run.commands for word in command.words]
    if not flags and run.others:
        raise LaunchLineError(
            f"{source} runs no training script (its commands: {', '.join(run.others)}); give "
            "the script or line that runs pretrain_gpt.py, or only its flags"
        )
    _check_known(Ran(tuple(flags), 0, "flags"), source)
    return LaunchLine(tuple(flags))


def _training_command(scripts: list[Ran], source: str) -> Ran:
    """The command that runs `pretrain_*.py`, or the one Python script run."""
    pretraining = [command for command in scripts
                   if any(_is_pretrain(word.text) for word in command.words)]
    candidates = pretraining or scripts
    if len(candidates) > 1:
        lines = ", ".join(str(command.line) for command in candidates)
        raise LaunchLineError(
            f"{source} runs {len(candidates)} training commands (lines {lines}); keep the one "
            "to predict"
        )
    return candidates[0]


def _is_pretrain(word: str) -> bool:
    name = PurePosixPath(word).name
    return name.startswith("pretrain_") and name.endswith(".py")


def _check_known(command: Ran, source: str) -> None:
    """LaunchLineError for a training command whose running or words Tessel cannot know."""
    where = f"the training command on line {command.line}" if command.line else "the flags"
    if command.unknown:
        raise LaunchLineError(
            f"{source}, line {command.line}: {command.unknown}, so Tessel cannot know what "
            "runs; write the training command out, outside it (or give the variables the "
            "condition reads with --env NAME=VALUE)"
        )
    word = next((word for word in command.words if word.unknown), None)
    if word is not None:
        raise LaunchLineError(
            f"{source}, line {word.line or command.line}: {word.unknown} reaches {where}; "
            + _fix(word.unknown))


def _fix(why: str) -> str:
    """What to do about a value Tessel cannot know, by what made it unknown."""
    if "`source " in why:
        return ("Tessel reads the one script, not the files it sources: write the values it "
                "takes from them into the script")
    if "`eval`" in why:
        return "Tessel does not evaluate eval's text: write the command out"
    return ("Tessel never runs the script's commands, so write the value out (or give the "
            "variable with --env NAME=VALUE)")


def split_launcher(words: Sequence[str]) -> LaunchLine:
    """The script's flags from a launch line already split into words: leading
    `NAME=value` words and the launcher up to and including the `*.py` script are set
    aside; torchrun's --nnodes x --nproc-per-node is the world size. Words that start
    with a flag are flags only."""
    return _from_words([Word(word, 0) for word in words])


def _from_words(words: list[Word], prefix: Sequence[str] = ()) -> LaunchLine:
    """The launch line of a command's words (after its `prefix` assignments)."""
    assignments = list(prefix)
    while words and _is_assignment(words[0].text):
        assignments.append(words[0].text)
        words = words[1:]
    environment = tuple(tuple(text.split("=", 1)) for text in assignments)
    if not words or words[0].text.startswith("-"):
        return LaunchLine(tuple(words), environment=environment)
    index = next((i for i, word in enumerate(words) if word.text.endswith(".py")), None)
    if index is None:
        raise LaunchLineError(
            f"the launch line starts {words[0].text!r} but runs no *.py training script; give "
            "the line that runs pretrain_gpt.py, or only its flags"
        )
    launcher = words[:index]
    nodes, per_node = _torchrun_counts(launcher)
    world = _world(nodes, per_node)
    per_node_count = int(per_node.text) if per_node and per_node.text.isdigit() else None
    set_by = None
    if nodes is not None and nodes.via and world is not None:
        set_by = f"{nodes.via} on line {nodes.line}" if nodes.line else f"--env {nodes.via}"
    return LaunchLine(tuple(words[index + 1:]), script=words[index].text,
                      launcher=[w.text for w in launcher], world_size=world,
                      per_node=per_node_count, nodes_set_by=set_by, environment=environment)


def _is_assignment(word: str) -> bool:
    name, equals, _ = word.partition("=")
    return bool(equals) and name.isidentifier()


def _torchrun_counts(launcher: list[Word]) -> tuple[Word | None, Word | None]:
    """torchrun's (or `python -m torch.distributed.run`'s) --nnodes and --nproc-per-node
    words (--standalone: one node); (None, None) without a torchrun."""
    texts = [w.text for w in launcher]
    start = next((i for i, text in enumerate(texts)
                  if PurePosixPath(text).name == "torchrun" or text in _TORCHRUN_MODULES), None)
    if start is None:
        return None, None
    options: dict[str, Word] = {}
    rest = launcher[start + 1:]
    for index, word in enumerate(rest):
        name, equals, value = word.text.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if not name.startswith("-") or key not in ("nnodes", "nproc-per-node", "standalone"):
            continue
        if key == "standalone":
            options["nnodes"] = Word("1", word.line)
        elif equals:
            options[key] = Word(value, word.line, via=word.via)
        elif index + 1 < len(rest):
            options[key] = rest[index + 1]
    if not options:
        return None, None
    # torchrun's default is one process per node.
    return options.get("nnodes"), options.get("nproc-per-node", Word("1", 0))


def _world(nodes: Word | None, per_node: Word | None) -> int | None:
    """--nnodes x --nproc-per-node; None when the machines decide (a range of nodes,
    `--nproc-per-node gpu`) or torchrun is not given the counts."""
    if per_node is None:
        return None
    node_text = nodes.text if nodes is not None else "1"
    low, _, high = node_text.partition(":")
    if high and low == high:
        node_text = low  # "8:8" is 8 nodes
    if not (node_text.isdigit() and per_node.text.isdigit()):
        return None
    if int(node_text) < 1 or int(per_node.text) < 1:
        return None
    return int(node_text) * int(per_node.text)


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
