"""`plan ... --emit ENGINES DIR`: the best plan's launch files for the engines people run.

    plan llama3-70b --cluster dgx-h100 --gpus 256 --global-batch-size 1024 \\
        --emit megatron,torchtitan,deepspeed,pytorch,slurm,ray,maxtext,neuronx launch/

writes each engine's files into DIR (`planner.export.engines`) and prints one line per
engine: the files written, or why that engine cannot run the plan (and no file). Both
values are checked as the command line is read, so that no search is thrown away for a
misspelt engine or a folder that cannot be written.

TorchTitan's files are in its current form by default (0.3: a config function,
`planner.export.torchtitan_config`); `--torchtitan-version 0.2` writes 0.2's TOML job
config (`planner.export.torchtitan`) instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from planner.cli.errors import UsageError, check_output_folder
from planner.cli.parsing import rank_range, training_only
from planner.export.engines import ENGINES
from planner.search.megatron_space import MAX_GPUS

from planner.export.torchrun import Elastic

if TYPE_CHECKING:
    from planner.models.config import TransformerConfig
    from planner.vocabulary.plan import Plan

FLAG = "--emit"
TORCHTITAN_VERSIONS = ("0.3", "0.2")
"""TorchTitan's config forms --emit writes: 0.3's Python config (the default), 0.2's TOML."""


def engine_list(text: str) -> list[str]:
    """'megatron,slurm' -> ['megatron', 'slurm']; 'all' is every engine. ValueError naming
    an unknown engine."""
    names = [name.strip().lower() for name in text.split(",")]
    if "" in names:
        raise ValueError(f"{text!r} has an empty engine name between its commas; give a "
                         f"comma-separated list of {', '.join(ENGINES)} (or all)")
    if names == ["all"]:
        return list(ENGINES)
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise ValueError(
            f"unknown engine {', '.join(repr(n) for n in unknown) or repr(text)}; give a "
            f"comma-separated list of {', '.join(ENGINES)} (or all)")
    return list(dict.fromkeys(names))


class _EmitAction(argparse.Action):
    """Stores (engines, folder) after checking both, as argparse errors (one line)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        text, folder = values
        try:
            engines = engine_list(text)
            check_output_folder(FLAG, folder)
        except (ValueError, UsageError) as error:
            raise argparse.ArgumentError(self, str(error).removeprefix(f"{FLAG} ")) from None
        setattr(namespace, self.dest, (engines, folder))


def add_emit_flags(parser: argparse.ArgumentParser) -> None:
    """--emit ENGINES DIR, a training-plan flag (a --mesh plan refuses it by name)."""
    action = parser.add_argument(
        FLAG, nargs=2, action=_EmitAction, metavar=("ENGINES", "DIR"),
        help="write the best plan's launch files for ENGINES (comma-separated: "
        f"{','.join(ENGINES)}, or all) into folder DIR; an engine that cannot run the "
        "plan gets one line saying why, and no file")
    elastic = parser.add_argument(
        "--elastic", type=rank_range(MAX_GPUS), metavar="MIN:MAX",
        help="with --emit pytorch, for a graph plan: torchrun restarts the job with the "
        "nodes present (--nnodes from MIN:MAX ranks), and the job re-plans for the ranks "
        "it finds and resumes from its last checkpoint, resharded")
    version = parser.add_argument(
        "--torchtitan-version", choices=TORCHTITAN_VERSIONS, default=TORCHTITAN_VERSIONS[0],
        help="with --emit torchtitan: the form of the config written, 0.3 (default: a "
        "config function, torchtitan_config.py) or 0.2 (a TOML job config, torchtitan.toml)")
    training_only(parser, action, elastic, version)


def emit(plan: Plan, engines: list[str], folder: str | Path, console: Console,
         model: TransformerConfig | None = None, elastic: Elastic | None = None,
         torchtitan_version: str = TORCHTITAN_VERSIONS[0]) -> dict[str, list[Path]]:
    """Write each engine's files for `plan` (of `model`'s shape, which the TorchTitan and
    PyTorch exports need; `elastic`: how an elastic job restarts; `torchtitan_version`:
    TorchTitan's config form) into `folder` and print one line per engine; {engine: paths
    written}, [] for an engine that cannot run the plan."""
    from planner.export.engines import Refusal

    folder = Path(folder).expanduser()
    check_output_folder(FLAG, str(folder))
    written: dict[str, list[Path]] = {}
    for name in engines:
        try:
            files = _engine_files(name, plan, model, elastic, torchtitan_version)
        except Refusal as why:
            written[name] = []
            console.print(f"{name}: no file: {why}", highlight=False, markup=False,
                          soft_wrap=True)
            continue
        paths = []
        for file_name, text in files.items():
            path = folder / file_name
            path.write_text(text)
            if file_name.endswith(".sh"):
                path.chmod(0o755)
            paths.append(path)
        written[name] = paths
        console.print(f"{name}: wrote {', '.join(str(p) for p in paths)}", highlight=False,
                      markup=False, soft_wrap=True)
    return written


def _engine_files(name: str, plan: Plan, model: TransformerConfig | None,
                  elastic: Elastic | None, torchtitan_version: str) -> dict[str, str]:
    """`engine_files`, TorchTitan's in the form asked for. engine_files writes 0.2's TOML
    and refuses what TorchTitan cannot run (graph plans, --elastic, its own rules); the 0.3
    form is written from the same plan after those checks, with 0.3's own."""
    from planner.export.engines import Refusal, engine_files
    from planner.export.torchtitan_config import torchtitan_next_files

    files = engine_files(name, plan, model, elastic)
    if name != "torchtitan" or torchtitan_version == "0.2":
        return files
    try:
        return torchtitan_next_files(plan, model)
    except ValueError as error:
        raise Refusal(str(error)) from None


def check_emit_flags(args: argparse.Namespace) -> None:
    """UsageError, before any work, for --elastic or --torchtitan-version without the
    --emit they qualify."""
    asked = getattr(args, "emit", None)
    version = getattr(args, "torchtitan_version", TORCHTITAN_VERSIONS[0])
    if version != TORCHTITAN_VERSIONS[0] and not (asked and "torchtitan" in asked[0]):
        raise UsageError(f"--torchtitan-version {version} says which TorchTitan config "
                         "--emit writes: give --emit torchtitan DIR as well")
    if getattr(args, "elastic", None) is not None and not asked:
        raise UsageError("--elastic says how an emitted job restarts: give --emit pytorch "
                         "DIR as well")


def emit_if_asked(args: argparse.Namespace, plan: Plan, model: TransformerConfig | None,
                  console: Console) -> None:
    """With --emit, write the engines' files for `plan` (see `emit`); none for a plan that
    does not fit in device memory (the command then says so and exits 2)."""
    check_emit_flags(args)
    asked = getattr(args, "emit", None)
    elastic = getattr(args, "elastic", None)
    if not asked:
        return
    if elastic is not None:
        if not elastic[0] <= plan.num_gpus <= elastic[1]:
            raise UsageError(f"--elastic {elastic[0]}:{elastic[1]}: the plan's "
                             f"{plan.num_gpus} GPUs are not within it")
        # The job re-plans on the same cluster: a file by its full path, as the job may
        # start in another folder.
        given = Path(args.cluster).expanduser()
        cluster = str(given.resolve()) if given.is_file() else args.cluster
        elastic = Elastic(elastic[0], elastic[1], cluster)
    if not plan.predicted.fits:
        console.print("--emit: no files written: the best plan does not fit in device memory",
                      highlight=False)
        return
    engines, folder = asked
    emit(plan, engines, folder, console, model, elastic,
         getattr(args, "torchtitan_version", TORCHTITAN_VERSIONS[0]))
