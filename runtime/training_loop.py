"""One rank's training loop of a training plan (`RunSpec`): `train_on_rank` runs
`runtime.pipeline_trainer.PipelineTrainer` step by step with the collectives counted,
checkpoints, injected faults, the flight record of collectives, the straggler monitor and
the divergence guard. `planner.checks.training_check.check_training` launches it on every rank
and compares it with one process.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from planner.models.config import TransformerConfig
from runtime.comm_counter import CommCounter, add_counts
from runtime.divergence import Diverged, DivergenceGuard
from runtime.experts import EXPERT_MARK
from runtime.faults import FaultWatch, collective_timeout
from runtime.flight_recorder import FlightRecorder
from runtime.pipeline_trainer import PipelineTrainer
from runtime.checkpoint import Resumed
from runtime.resilience import Resilience, restart_count
from runtime.spec import RunSpec
from runtime.stragglers import StragglerMonitor

def batches(config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0):
    """`steps` (tokens, targets) batches of the plan's global batch, the same on every
    rank."""
    generator = torch.Generator().manual_seed(seed + 12345)
    shape = (spec.global_batch_size, config.seq_length)
    return [
        (torch.randint(0, config.vocab_size, shape, generator=generator),
         torch.randint(0, config.vocab_size, shape, generator=generator))
        for _ in range(steps)
    ]


def train_on_rank(
    rank: int, world_size: int, config: TransformerConfig, spec: RunSpec, steps: int,
    seed: int = 0, optimizer: str = "sgd", hf_config: dict[str, Any] | None = None,
    resilience: Resilience | None = None, stage_seconds: tuple[float, ...] | None = None,
) -> dict[str, Any]:
    """K steps of the plan on this rank: its losses, its stages' final parameters (from
    the first rank of each stage's tp x dp group only), collectives counted per kind over
    the steps, and its local bytes. `hf_config`: see `PipelineTrainer`.

    Every collective is recorded for naming a hung rank (`runtime.flight_recorder`).
    With `resilience`, the run resumes from the newest complete checkpoint in its folder
    (the losses before it come from the checkpoint), checkpoints every K steps, may inject
    a fault (`runtime.resilience`) and judges each step for divergence
    (`runtime.divergence`); ``resumed_from`` says the step it resumed at, ``steps_run``
    how many steps this attempt ran (and counted collectives of), ``skipped`` the batches
    whose update was dropped. With `stage_seconds` (each pipeline rank's predicted time
    per micro-batch, all its chunks), rank 0 names stragglers (`runtime.stragglers`)."""
    trainer = PipelineTrainer(config, spec, seed, optimizer, hf_config=hf_config,
                              count_activations=True)
    data = batches(config, spec, steps, seed)
    losses: list[float | None] = []
    skipped: list[int] = []
    resumed = resilience.resume(trainer) if resilience is not None else None
    if resumed is not None:
        losses, skipped = resumed_losses(resumed)
    watch = FaultWatch.gather(resilience.last_checkpoint if resilience is not None else None)
    store = dist.distributed_c10d._get_default_store()
    guard = None
    if resilience is not None and resilience.divergence is not None:
        guard = DivergenceGuard(resilience.divergence, store, world_size, restart_count())
    monitor = None
    if stage_seconds is not None:
        timeout = collective_timeout()
        monitor = StragglerMonitor(rank, world_size, store,
                                   stage_seconds[trainer.coords["pp"]], restart_count(),
                                   wait_s=timeout.total_seconds() if timeout else 60.0)
    recorder = FlightRecorder(rank, stall=resilience.stall if resilience else None)
    per_step = []
    everything = CommCounter()
    with recorder:
        while len(losses) < steps:
            index = len(losses)
            if index in skipped:  # a batch a rollback dropped
                losses.append(None)
                trainer.steps_done += 1
                continue
            if resilience is not None:
                resilience.before_step(rank, index)
                # A diverged batch is in `skipped`: never poisoned twice.
                trainer.poisoned = resilience.poisons(index)
            recorder.step = index
            if monitor is not None:
                monitor.start_step()
            with watch.step(index), everything, CommCounter() as counter:
                loss = trainer.step(*data[index], judge=guard.judge if guard else None)
            per_step.append(counter.by_kind())
            if monitor is not None:
                monitor.end_step(index, resilience.slow if resilience else None)
            if trainer.diverged is not None:
                assert guard is not None and resilience is not None
                skipped.append(index)
                with watch.step(index):
                    losses = _on_divergence(trainer, resilience, index, losses, rank)
                continue
            losses.append(loss)
            if resilience is not None:
                with watch.step(index):  # a save's collectives meet a lost peer too
                    resilience.after_step(trainer, {"losses": losses, "skipped": skipped,
                                                    "last_stage": trainer.is_last})
        with watch.step(steps):
            trainer.wait_for_checkpoint()
    params = trainer.full_parameters()
    # One copy of each parameter: data rank 0 of each stage; experts from their ep ranks.
    if trainer.coords["tp"] != 0 or trainer.coords["cp"] != 0 or (
        trainer.coords["dp"] >= spec.expert
    ):
        params = {}
    elif trainer.coords["dp"] > 0:
        params = {n: p for n, p in params.items() if EXPERT_MARK in f".{n}"}
    return {
        "coords": trainer.coords,
        "last_stage": trainer.is_last,
        "losses": losses,
        "skipped": sorted(set(skipped)),
        "parameters": params,
        "collectives": add_counts(per_step),
        "collectives_per_step": per_step,
        "collectives_by_group": everything.by_group(),
        "local_bytes": trainer.local_bytes(),
        "saved_activations": trainer.saved_activation_bytes(),
        "resumed_from": None if resumed is None else resumed.step,
        "attempt": restart_count(),
        "steps_run": len(per_step),
        "stragglers": dict(monitor.named) if monitor is not None else {},
    }


def _on_divergence(trainer: PipelineTrainer, resilience: Resilience, index: int,
                   losses: list[float | None], rank: int) -> list[float | None]:
    """What `--on-divergence` does with step `index`, which diverged (every rank agreed):
    the losses to go on with."""
    policy = resilience.divergence
    assert policy is not None
    said = f"step {index}: {trainer.diverged}"
    if policy.action == "stop":
        raise Diverged(f"{said}; stopped (--on-divergence stop); last good checkpoint: "
                       f"{resilience.last_checkpoint()}")
    if policy.action == "skip":
        if rank == 0:
            print(f"{said}; its update skipped (--on-divergence skip)", flush=True)
        return [*losses, None]
    trainer.wait_for_checkpoint()
    resumed = resilience.resume(trainer)
    if resumed is None:
        raise Diverged(f"{said}; no checkpoint to roll back to yet (--on-divergence "
                       "rollback needs --checkpoint-every)")
    if rank == 0:
        print(f"{said}; rolled back to the checkpoint of step {resumed.step}, skipping "
              f"batch {index} (--on-divergence rollback)", flush=True)
    return resumed_losses(resumed)[0]


def resumed_losses(resumed: Resumed) -> tuple[list[float | None], list[int]]:
    """(losses per batch, batches skipped) up to a checkpoint: this rank's own notes, or
    on another world size (a re-planned job) the job's, the mean over the saving plan's
    last-stage ranks (each holds its data-parallel shard's losses)."""
    if resumed.same_world:
        return (list(resumed.notes.get("losses", [None] * resumed.step)),
                list(resumed.notes.get("skipped", [])))
    last = [n for n in resumed.saved_by.values() if n.get("last_stage")]
    per_batch = list(zip(*(n["losses"] for n in last))) if last else []
    losses = [None if None in step else sum(step) / len(step) for step in per_batch]
    skipped = sorted({i for n in resumed.saved_by.values() for i in n.get("skipped", [])})
    return losses or [None] * resumed.step, skipped
