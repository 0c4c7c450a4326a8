"""What a TorchTitan 0.2 job config runs, in Tessel's vocabulary: `torchtitan_job`.

The file is read with tomllib and checked key by key against TorchTitan's job config
(`keys`); the model is the Llama 3 preset of its flavor at the file's sequence length, and
the parallel configuration is TorchTitan's (`parallel_config`), its engine "torchtitan".
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.keys import RELEASE, flatten, shown
from planner.torchtitan.parallel_config import MOST, parallel_config
from planner.user_files import UserFileError, parse_nested, read_user_file

if TYPE_CHECKING:
    from planner.models.config import TransformerConfig
    from planner.vocabulary.parallel import ParallelConfig

# TorchTitan 0.2's Llama 3 flavors Tessel predicts -> the zoo's presets of the same shape
# (torchtitan/models/llama3/__init__.py: llama3_args; tests check the shapes agree).
FLAVORS = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}
# Its other flavors: debug shapes, and attention kernels Tessel does not price.
OTHER_FLAVORS = ("debugmodel", "debugmodel_flex_attn", "debugmodel_varlen_attn", "8B_flex",
                 "8B_varlen")


@dataclass(frozen=True)
class TorchTitanJob:
    """What a job config runs, in Tessel's vocabulary."""

    flavor: str
    """TorchTitan's model flavor (8B, 70B, 405B)."""
    model: TransformerConfig
    """The Llama 3 preset of the flavor, at the job's sequence length."""
    parallel: ParallelConfig
    """The configuration, resolved for the world size, engine "torchtitan"."""
    layers_per_stage: list[int] | None
    """Blocks of each pipeline stage where they differ; None: an even split."""
    chunk_layers: list[int] | None
    """Blocks of each model part in model order (part c on rank c % pipeline) where an
    interleaved schedule's parts differ; None: parts of equal size."""
    num_gpus: int
    """The world size: the degrees' product."""
    steps: int
    """training.steps: optimizer steps of the run."""
    notes: list[str]
    """Defaults worth saying out loud (TorchTitan's own, where the file is silent)."""
    ignored: list[str]
    """The keys given that change neither time nor memory, by their dotted names."""
    model_name: str | None = None
    """The plan's name of the model where it is not the flavor's Llama 3 preset."""
    release: str = RELEASE
    """The TorchTitan release whose config was read: "0.2" (TOML) or "0.3" (Python)."""

    @property
    def preset(self) -> str:
        """The model's name in plans: its zoo preset (llama3-8b, deepseek-v3, ...)."""
        return self.model_name or FLAVORS[self.flavor]


def read_named_file(path: str, what: str) -> str:
    """The text of the file --torchtitan names (`path` as typed); JobConfigError, in one
    line naming it and `what` it should be, when it is not a regular file, over
    `planner.user_files.MAX_BYTES` or cannot be read."""
    try:
        return read_user_file(path, f"--torchtitan {path!r}", what)
    except UserFileError as error:
        raise JobConfigError(str(error)) from None


def load_job_config(path: str) -> dict[str, Any]:
    """The TOML tables of the file at `path` (as typed); JobConfigError, in one line, when
    it cannot be read or is not TOML."""
    text = read_named_file(path, "the job config TorchTitan reads (--job.config_file)")
    try:
        return parse_nested(tomllib.loads, text, f"--torchtitan {path!r}")
    except UserFileError as error:
        raise JobConfigError(str(error)) from None
    except tomllib.TOMLDecodeError as error:
        raise JobConfigError(f"--torchtitan {path!r} is not TOML ({error}); give the job "
                             "config TorchTitan reads (--job.config_file)") from None


def torchtitan_job(tables: dict[str, Any], gpus: int | None, source: str) -> TorchTitanJob:
    """What TorchTitan runs for the job config `tables` (read from `source`, named in
    every error) on `gpus` GPUs (None: the degrees give the count). JobConfigError, naming
    the key, for what TorchTitan refuses or Tessel cannot price."""
    keys = flatten(tables, source)
    notes: list[str] = []
    flavor, model = _model(keys.values, keys.given, source, notes)
    parallel, layers, chunks = parallel_config(keys, model, gpus, source, notes)
    steps = training_steps(keys.values["training.steps"], source)
    dims = parallel.dims
    return TorchTitanJob(flavor, model, parallel, layers, chunks,
                         dims.model_parallel * dims.data, steps, notes, keys.ignored)


def _model(
    values: dict[str, Any], given: frozenset[str], source: str, notes: list[str]
) -> tuple[str, TransformerConfig]:
    """The flavor and its preset at training.seq_len."""
    from planner.models.presets import zoo_config

    name, flavor = values["model.name"], values["model.flavor"]
    if name != "llama3":
        raise JobConfigError(f"{source}: model.name = {shown(name)}: Tessel predicts "
                             f'TorchTitan\'s Llama 3 (name = "llama3"), flavors '
                             f"{', '.join(FLAVORS)}")
    if flavor not in FLAVORS:
        what = ("runs another attention kernel or is a debug model, which Tessel does not "
                "price" if flavor in OTHER_FLAVORS else
                f"is not a Llama 3 flavor of TorchTitan {RELEASE}")
        default = " (TorchTitan's default)" if "model.flavor" not in given else ""
        raise JobConfigError(f"{source}: model.flavor = {shown(flavor)}{default} {what}; use "
                             f"{', '.join(FLAVORS)}")
    seq = values["training.seq_len"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise JobConfigError(f"{source}: training.seq_len = {shown(seq)} must be a whole "
                             "number >= 1")
    if "training.seq_len" not in given:
        notes.append(f"training.seq_len {seq} (TorchTitan's default)")
    # TorchTitan's Llama 3 takes its vocabulary (128256) and shape from the flavor, and
    # its positions (RoPE, no table) from the sequence length.
    return flavor, zoo_config(FLAVORS[flavor], {"seq_length": seq})


def training_steps(steps: Any, source: str) -> int:
    """training.steps as a run's optimizer steps: a whole number from 1 to `MOST`;
    JobConfigError, naming `source`, for any other value."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MOST:
        raise JobConfigError(f"{source}: training.steps = {shown(steps)} must be a whole "
                             f"number from 1 to {MOST:,}")
    return steps
