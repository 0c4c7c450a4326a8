"""Sharded checkpoints of a trainer's model and optimizer with `torch.distributed.checkpoint`
(DCP), reshardable between plans, and the bookkeeping that makes a resumed run exact.

A checkpoint is a folder ``ROOT/step-00000008``: DCP's files (one per rank and a
``.metadata``), plus ``tessel-checkpoint.json``, which rank 0 writes right after DCP's
``.metadata``, itself written only once every rank's part is on disk;
`latest_checkpoint(ROOT)` returns the newest folder that has it, so a save cut short by a
dying rank is never resumed from (`cut_short(ROOT)` names such folders).

What a checkpoint holds, all under the model's own parameter names (``layers.3.mlp.fc1.
weight``, whatever pipeline stage, tensor or data-parallel shard holds it), so loading it
onto another plan (other degrees, another ZeRO stage, another world size) reshards it:

- ``model``: every parameter (DTensors: each rank writes its shard, DCP keeps one copy of
  what several ranks hold alike);
- ``optimizer``: torch's flattened optimizer state (``state.NAME.exp_avg``,
  ``param_groups.NAME.lr``), keyed per parameter so a pipeline rank holding half the model
  neither writes nor reads the other half's entries;
- ``step``: the number of optimizer steps taken, which is also where the data resumes (a
  batch is a function of its step index);
- ``loss_scale``: an fp16 graph-plan trainer's loss scale and its steps without overflow
  (`runtime.loss_scale`), the same on every rank;
- ``rankN``: rank N's own state (its CPU generator, to which dropout would owe its masks,
  and the caller's notes): given back only when the checkpoint is loaded by as many ranks
  as wrote it, since another world's rank N is another process's role.

A trainer offers its state as a `TrainerState`: `state_dict()` (the ``model`` and
``optimizer`` entries, tensors aliasing its live ones, so DCP loads in place) and
`load_state_dict(state)` (applies a loaded one): `ModulesState` for modules torch's
`get_state_dict` reads (the training-plan runtime's FSDP2 / tensor-parallel stages),
`ShardsState` for local shards of known DTensor layouts (the graph-plan and operator-level
trainers). `Checkpointing` gives a trainer `save`, `load` and `wait_for_checkpoint`.

`save` writes synchronously on the training process group; `AsyncCheckpointer` writes
with DCP's `async_save` on a gloo group of its own (on the training group it deadlocks
against the training's collectives: trap 4 of the gloo notes), from a copy DCP stages
before `async_save` returns, so training goes on while the copy is written.

Loading unpickles what the checkpoint's folder holds (DCP's metadata and non-tensor
entries): load only checkpoints you wrote.
"""

from __future__ import annotations

import base64
import json
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from runtime.loss_scale import LossScale

# torch.distributed.checkpoint is imported where it is used: its import is slow, and every
# trainer (so `planner.api`) imports this module, most runs never checkpointing.

LOSS_SCALE_ENTRY = "loss_scale"
"""A checkpoint's entry for an fp16 trainer's loss scale (`runtime.loss_scale`)."""
MARKER = "tessel-checkpoint.json"
"""Written in a checkpoint's folder once every rank's part of it is on disk."""
STEP_PREFIX = "step-"


class TrainerState(Protocol):
    """What a trainer hands to `save` and `load`."""

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}`` keyed by the model's parameter names,
        tensors aliasing the live ones."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Apply a state `state_dict` returned (the last one) and DCP loaded into."""


def _to_save(trainer: TrainerState) -> dict[str, Any]:
    """What this rank writes: its state, less the copies another rank writes (a trainer
    holding such copies says which with `saved_elsewhere`)."""
    state = trainer.state_dict()
    others = getattr(trainer, "saved_elsewhere", frozenset())
    if others:
        state["model"] = {k: v for k, v in state["model"].items() if k not in others}
        state["optimizer"] = {k: v for k, v in state["optimizer"].items()
                              if not any(k.startswith(f"state.{name}.") for name in others)}
    return state


@dataclass
class Resumed:
    """What `load` found."""

    path: Path
    step: int
    notes: dict[str, Any] = field(default_factory=dict)
    """This rank's notes from the save (empty when the world size changed)."""
    same_world: bool = True
    saved_by: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Every saving rank's notes, by its rank, when the world size changed (empty
    otherwise): what the job knew, for a rank of another plan to take up."""


def step_directory(root: str | Path, step: int) -> Path:
    """Where the checkpoint of step `step` goes under `root`."""
    return Path(root) / f"{STEP_PREFIX}{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root` (one whose marker was written), or
    None."""
    best: tuple[int, Path] | None = None
    folder = Path(root)
    if not folder.is_dir():
        return None
    for path in folder.glob(f"{STEP_PREFIX}*"):
        marker = path / MARKER
        if not marker.is_file():
            continue  # cut short: a rank died (or is still writing)
        try:
            step = int(json.loads(marker.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue
        if best is None or step > best[0]:
            best = (step, path)
    return None if best is None else best[1]


def cut_short(root: str | Path) -> list[Path]:
    """Checkpoint folders under `root` newer than its latest complete one that were never
    completed: saves a dying rank cut short (or still being written), oldest first."""
    latest = latest_checkpoint(root)
    newest = -1 if latest is None else step_of(latest)
    folders = Path(root).glob(f"{STEP_PREFIX}*") if Path(root).is_dir() else []
    return sorted((path for path in folders if not (path / MARKER).is_file()
                   and step_of(path) > newest), key=step_of)


def step_of(folder: Path) -> int:
    """The step a checkpoint's ``step-N`` folder name says (-1 for another name)."""
    digits = folder.name.removeprefix(STEP_PREFIX)
    return int(digits) if digits.isdigit() else -1


def _rank_entry(notes: dict[str, Any] | None) -> str:
    """This rank's own state as JSON text (DCP stores it as one opaque entry)."""
    rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    return json.dumps({"rng": rng, "notes": notes or {}})


def _checkpoint_state(trainer: TrainerState, step: int, notes: dict[str, Any] | None
                      ) -> dict[str, Any]:
    state = _to_save(trainer)
    state["step"] = step
    state[f"rank{dist.get_rank()}"] = _rank_entry(notes)
    return state


def _write_marker(directory: Path, step: int, world_size: int) -> None:
    """Written to a temporary name and renamed, so a reader never sees half of it."""
    text = json.dumps({"step": step, "world_size": world_size, "time": time.time()})
    partial = directory / f".{MARKER}.partial"
    partial.write_text(text + "\n")
    os.replace(partial, directory / MARKER)


def _writer(directory: Path, step: int):
    """DCP's writer of `directory`, which marks the checkpoint complete as soon as DCP's
    own ``.metadata`` is written: by the coordinator (rank 0), once every rank's part is
    on disk. Marked there, not when the save returns: DCP then still sends the outcome
    to every rank, which fails where a peer has just died, and a save complete on disk
    would be left unmarked ("none yet" beside a folder holding every shard). A folder
    left by a save that a dying rank cut short (no marker) is written over."""
    from torch.distributed.checkpoint import FileSystemWriter

    world_size = dist.get_world_size()

    class MarkingWriter(FileSystemWriter):
        def finish(self, metadata, results) -> None:
            super().finish(metadata, results)
            _write_marker(directory, step, world_size)

    return MarkingWriter(str(directory), overwrite=True)


def save(
    trainer: TrainerState, root: str | Path, step: int, notes: dict[str, Any] | None = None,
) -> Path:
    """Write `trainer`'s state after `step` steps to ``root/step-N`` and mark it complete
    (collective: call on every rank). `notes`: this rank's own JSON-able data, given back
    by `load` in a world of the same size."""
    import torch.distributed.checkpoint as dcp

    directory = step_directory(root, step)
    dcp.save(_checkpoint_state(trainer, step, notes), storage_writer=_writer(directory, step))
    dist.barrier()  # nobody looks for the marker before it is there
    return directory


class AsyncCheckpointer:
    """Saves in the background with DCP's `async_save`, one save at a time, on a gloo
    group of its own (created at the first save: every rank must save at the same steps)."""

    def __init__(self) -> None:
        self.group: dist.ProcessGroup | None = None
        self.pending: Future | None = None
        self.last: Path | None = None
        """The newest checkpoint this checkpointer saw complete."""
        self._writing: Path | None = None

    def save(
        self, trainer: TrainerState, root: str | Path, step: int,
        notes: dict[str, Any] | None = None,
    ) -> Path:
        """Start writing `trainer`'s state after `step` steps; returns once DCP has copied
        it (training may go on). Waits for the previous save first."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        if self.group is None:
            from runtime.faults import bound_timeouts

            self.group = dist.new_group(backend="gloo")
            bound_timeouts([self.group])  # else 30 minutes, and a stuck writer holds exit
        directory = step_directory(root, step)
        state = _checkpoint_state(trainer, step, notes)
        future = dcp.async_save(state, storage_writer=_writer(directory, step),
                                process_group=self.group)
        if not isinstance(future, Future):  # torch's newer zero-overhead response
            future = future.upload_completion
        self.pending, self._writing = future, directory
        return directory

    def wait(self) -> Path | None:
        """Block until the save in flight is written (raising its error, if any); the newest
        complete checkpoint of this checkpointer."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()
            self.last = self._writing
        return self.last


def load(trainer: TrainerState, path: str | Path) -> Resumed:
    """Load the checkpoint in `path` (a ``step-N`` folder, or a root: its latest complete
    checkpoint) into `trainer`, resharding onto its plan (collective: call on every rank).
    Restores this rank's CPU generator when the checkpoint was written by as many ranks."""
    import torch.distributed.checkpoint as dcp

    folder = Path(path)
    if not (folder / MARKER).is_file():
        latest = latest_checkpoint(folder)
        if latest is None:
            raise FileNotFoundError(f"no complete checkpoint in {str(folder)!r}")
        folder = latest
    marker = json.loads((folder / MARKER).read_text())
    same_world = int(marker["world_size"]) == dist.get_world_size()
    state = trainer.state_dict()
    state["step"] = 0
    if LOSS_SCALE_ENTRY in state and not _holds(folder, LOSS_SCALE_ENTRY):
        del state[LOSS_SCALE_ENTRY]  # saved by a plan without loss scaling
    entry = f"rank{dist.get_rank()}"
    # This rank's own entry; on another world size, every saving rank's notes.
    entries = [entry] if same_world else [f"rank{r}" for r in range(int(marker["world_size"]))]
    for name in entries:
        state[name] = ""
    dcp.load(state, checkpoint_id=str(folder))
    trainer.load_state_dict(state)
    notes: dict[str, Any] = {}
    saved_by: dict[int, dict[str, Any]] = {}
    if same_world:
        mine = json.loads(state[entry])
        rng = base64.b64decode(mine["rng"])
        torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
        notes = mine["notes"]
    else:
        saved_by = {int(name.removeprefix("rank")): json.loads(state[name])["notes"]
                    for name in entries}
    return Resumed(folder, int(state["step"]), notes, same_world, saved_by)


def _holds(folder: Path, entry: str) -> bool:
    """Whether the checkpoint in `folder` has a top-level `entry`."""
    from torch.distributed.checkpoint import FileSystemReader

    stored = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return any(key == entry or key.startswith(f"{entry}.") for key in stored)


class Checkpointing:
    """`save`, `load` and `wait_for_checkpoint` for a trainer: mixed into one that defines
    `checkpoint_state()` and counts its optimizer steps in `steps_done`."""

    steps_done: int = 0
    """Optimizer steps taken (restored by `load`): the index of the next batch."""

    def checkpoint_state(self) -> TrainerState:
        raise NotImplementedError

    def _checkpointer(self) -> AsyncCheckpointer:
        if "_async_checkpointer" not in self.__dict__:
            self._async_checkpointer = AsyncCheckpointer()
        return self._async_checkpointer

    def save(
        self, root: str | Path, asynchronous: bool = False, notes: dict[str, Any] | None = None,
    ) -> Path:
        """Checkpoint the model and optimizer after `steps_done` steps to ``root/step-N``
        (collective: every rank, at the same step). `asynchronous`: return once the state
        is copied and write it while training goes on (`wait_for_checkpoint` blocks until
        it is written). `notes`: this rank's own JSON-able data, given back by `load` in a
        world of the same size."""
        if asynchronous:
            return self._checkpointer().save(self.checkpoint_state(), root, self.steps_done,
                                             notes)
        self._checkpointer().wait()
        return save(self.checkpoint_state(), root, self.steps_done, notes)

    def wait_for_checkpoint(self) -> Path | None:
        """Block until an asynchronous save in flight is written; the newest checkpoint
        this trainer completed asynchronously."""
        return self._checkpointer().wait()

    def load(self, path: str | Path) -> Resumed:
        """Resume from a checkpoint (a ``step-N`` folder, or a root: its latest complete
        one), saved by this plan or another (it reshards); `steps_done` becomes its step."""
        resumed = load(self.checkpoint_state(), path)
        self.steps_done = resumed.step
        return resumed


# -- the two kinds of trainer state ------------------------------------------------------


_OPTIMIZER_SECTIONS = ("state.", "param_groups.")


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Per-parameter optimizer entries: a pipeline rank reads and writes only its
    # parameters'.
    return StateDictOptions(flatten_optimizer_state_dict=True)


class ModulesState:
    """The state of modules (pipeline stages: each under the full model's parameter names)
    and one optimizer over all their parameters, through torch's `get_state_dict` /
    `set_state_dict` (FSDP2, tensor parallel, plain modules alike).

    Two stages of one rank may hold the same name (a tied embedding's copy on the last
    stage, ZBV's V order putting both on one rank): they hold equal values, written once
    and loaded into both."""

    def __init__(self, modules: dict[int, nn.Module], optimizer: torch.optim.Optimizer) -> None:
        # Keyed by the stage index for torch's APIs (one module), stripped for the file.
        self.container = nn.ModuleDict({str(i): m for i, m in modules.items()})
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.container, self.optimizer, options=_options())
        self._keys = (list(model), list(optimizer))  # torch's names, for load_state_dict
        return {"model": _strip_stage(model, ""), "optimizer": _strip_stage(optimizer, None)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        model_keys, optimizer_keys = self._keys
        set_state_dict(
            self.container, self.optimizer,
            model_state_dict=_restage(state["model"], model_keys, ""),
            optim_state_dict=_restage(state["optimizer"], optimizer_keys, None),
            options=_options(),
        )


def _restage(state: dict[str, Any], keys: list[str], section: str | None) -> dict[str, Any]:
    """`state` under torch's names `keys` again. A second copy of a name gets its own
    tensors: the optimizer keeps what it is given, and two parameters sharing one
    moment tensor would update it twice a step."""
    out, seen = {}, set()
    for key in keys:
        name = _unstage(key, section)
        value = state[name]
        if name in seen and isinstance(value, torch.Tensor):
            value = value.detach().clone()
        seen.add(name)
        out[key] = value
    return out


def _unstage(key: str, section: str | None) -> str:
    """``0.layers.1.w`` -> ``layers.1.w``; in an optimizer key (``section`` None) the stage
    index follows ``state.`` or ``param_groups.``."""
    if section is None:
        section = next(s for s in _OPTIMIZER_SECTIONS if key.startswith(s))
    rest = key[len(section):]
    return section + rest.split(".", 1)[1]


def _strip_stage(state: dict[str, Any], section: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        out.setdefault(_unstage(key, section), value)  # equal copies: the first one
    return out


class ShardsState:
    """The state of a trainer that keeps its parameter shards as plain local tensors
    (`runtime.trainer.ShardedTrainer`, `runtime.graph_pipeline.StagedTrainer`): `locals[name]` is
    the local shard of the DTensor `layouts[name]` describes, and a torch optimizer steps
    the local tensors. The checkpoint holds them as DTensors of those layouts, so it
    reshards onto another plan's."""

    def __init__(
        self, layouts: dict[str, DTensor], locals_: dict[str, torch.Tensor],
        optimizer: torch.optim.Optimizer, saved_elsewhere: frozenset[str] = frozenset(),
        loss_scale: LossScale | None = None,
    ) -> None:
        self.layouts, self.locals, self.optimizer = layouts, locals_, optimizer
        self.saved_elsewhere = saved_elsewhere
        """Parameters this rank loads but leaves to another stage's ranks to write: its
        copies of weights tied across stages, which the first stage holding them writes."""
        self.loss_scale = loss_scale
        """An fp16 trainer's loss scale, checkpointed as ``loss_scale`` (one copy: every
        rank holds the same); a checkpoint of a plan without one leaves it as it is."""

    def _wrap(self, name: str, local: torch.Tensor) -> torch.Tensor:
        if local.dim() == 0:
            return local  # AdamW's step count: one per parameter, the same on every rank
        p = self.layouts[name]
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())

    def state_dict(self) -> dict[str, Any]:
        _init_optimizer_state(self.optimizer)
        model = {name: self._wrap(name, t) for name, t in self.locals.items()}
        optimizer: dict[str, Any] = {}
        for name, local in self.locals.items():
            for key, value in self.optimizer.state.get(local, {}).items():
                wrapped = self._wrap(name, value) if isinstance(value, torch.Tensor) else value
                optimizer[f"state.{name}.{key}"] = wrapped
        state = {"model": model, "optimizer": optimizer}
        if self.loss_scale is not None:
            state[LOSS_SCALE_ENTRY] = self.loss_scale.as_tensor()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # DCP loaded the tensors in place (the DTensors alias the local shards and the
        # optimizer's state); only non-tensor entries need putting back.
        for name, local in self.locals.items():
            slots = self.optimizer.state.get(local, {})
            for key in list(slots):
                value = state["optimizer"][f"state.{name}.{key}"]
                if not isinstance(value, torch.Tensor):
                    slots[key] = value
        if self.loss_scale is not None and LOSS_SCALE_ENTRY in state:
            self.loss_scale.load(state[LOSS_SCALE_ENTRY])


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state (one step on zero gradients at learning rate 0,
    what torch's `get_state_dict` does), so a checkpoint has slots to load into."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p.grad is not None for p in params):
        return
    rates = [group["lr"] for group in optimizer.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
