"""Train a training plan (`RunSpec`) on local ranks and the same steps in one process, and
compare them: `train_on_rank` is one rank's loop (`runtime.pipeline_trainer.
PipelineTrainer` per step, collectives counted, checkpoints, injected faults, the flight
record of collectives, the straggler monitor and the divergence guard), `check_training`
launches it on every rank and trains the reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from planner.models.config import TransformerConfig
from runtime.comm_counter import CommCounter
from runtime.divergence import Diverged, DivergenceGuard
from runtime.elastic import launch
from runtime.experts import EXPERT_MARK
from runtime.faults import FaultWatch, collective_timeout
from runtime.flight_recorder import FlightRecorder
from runtime.model_parts import model_parts
from runtime.pipeline_trainer import PipelineTrainer, _optimizer, lm_loss
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
    rolled_back: list[int] = []
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
                trainer.poisoned = resilience.poisons(index) and index not in rolled_back
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
                rolled_back.append(index)
                continue
            losses.append(loss)
            if resilience is not None:
                with watch.step(index):  # a save's collectives meet a lost peer too
                    resilience.after_step(trainer, {"losses": losses, "skipped": skipped,
                                                    "last_stage": trainer.is_last})
        with watch.step(steps):
            trainer.wait_for_checkpoint()
    recorder.close()
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
        "collectives": _add_counts(per_step),
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


def _add_counts(steps: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for step in steps:
        for kind, c in step.items():
            entry = total.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += c["count"]
            entry["bytes"] += c["bytes"]
    return dict(sorted(total.items()))


def train_reference(
    config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0, optimizer: str = "sgd",
    hf_config: dict[str, Any] | None = None, skipped: frozenset[int] = frozenset(),
) -> tuple[list[float | None], dict[str, torch.Tensor]]:
    """The same steps in one process: whole model (the zoo's, or with `hf_config`
    transformers' own causal LM), whole batch, never seeing the batches `skipped` (their
    losses None). Returns the losses and the final parameters."""
    parts = model_parts(config, hf_config)
    model = parts.reference(seed, spec.force_balance)
    opt = _optimizer(list(model.parameters()), optimizer)
    losses: list[float | None] = []
    for index, (tokens, targets) in enumerate(batches(config, spec, steps, seed)):
        if index in skipped:
            losses.append(None)
            continue
        loss = lm_loss(parts.logits(model, tokens, targets), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def merge_results(
    results: list[dict[str, Any]],
) -> tuple[list[float | None], dict[str, torch.Tensor]]:
    """Losses (mean over the last stage's data-parallel ranks; None for a skipped batch)
    and every parameter, from every rank's `train_on_rank` result."""
    last = [r["losses"] for r in results if r.get("last_stage", r["losses"] and
                                                      r["losses"][0] is not None)]
    losses = [None if None in step else sum(step) / len(step) for step in zip(*last)]
    params: dict[str, torch.Tensor] = {}
    for r in results:
        params.update(r["parameters"])
    return losses, params


def relative_errors(
    losses: list[float], params: dict[str, torch.Tensor], ref_losses: list[float],
    ref_params: dict[str, torch.Tensor],
) -> tuple[float, float]:
    """Largest relative error of the losses, and relative error of the parameters as one
    vector (norm of the difference over the norm of the reference)."""
    if set(params) != set(ref_params):
        raise ValueError(f"parameters differ: {sorted(set(params) ^ set(ref_params))}")
    if [x is None for x in losses] != [x is None for x in ref_losses]:
        raise ValueError("the run and the reference skipped different batches")
    loss_err = max((abs(a - b) / max(abs(b), 1e-12)
                    for a, b in zip(losses, ref_losses, strict=True) if b is not None),
                   default=0.0)
    names = sorted(ref_params)
    got = torch.cat([params[n].flatten() for n in names])
    want = torch.cat([ref_params[n].flatten() for n in names])
    # The whole parameter vector: Adam turns rounding noise in gradients that are zero in
    # exact arithmetic (a key bias under softmax) into updates of size lr, which no
    # per-tensor measure of a partly-noise tensor can tell from a bug.
    return loss_err, float((got - want).norm() / max(float(want.norm()), 1e-12))


@dataclass
class TrainingCheck:
    """A plan trained on local ranks next to the same steps in one process."""

    world_size: int
    losses: list[float | None]
    """Per batch: the loss (the mean over the last stage's data-parallel ranks); None for a
    batch whose update was skipped (`skipped`)."""
    reference_losses: list[float | None]
    loss_max_abs_error: float
    loss_max_rel_error: float
    parameter_max_abs_error: float
    parameter_rel_error: float
    """Norm of the difference of all parameters over the reference's norm."""
    collectives: list[dict[str, dict[str, int]]]
    """Per rank: kind -> count and bytes, over all steps (point-to-point as send/recv)."""
    collectives_by_group: list[list[dict[str, Any]]]
    """Per rank: count and bytes per kind and process group (global ranks), over all
    steps: which axis each collective ran on."""
    collectives_per_step: list[list[dict[str, dict[str, int]]]]
    """Per rank, per step: the same. The first step of a pipelined plan also carries the
    schedule's one-time agreement on static shapes: one 4-byte int32 send and receive per
    stage boundary each way."""
    local_bytes: list[dict[str, int]]
    """Per rank: bytes of parameters, gradients and optimizer state held locally."""
    saved_activations: list[dict[int, list[int]]]
    """Per rank: stage index -> bytes saved for backward by each micro-batch of the last
    step (`PipelineTrainer.saved_activation_bytes`)."""
    coordinates: list[dict[str, int]]
    """Per rank: its index on each mesh axis."""
    steps_run: int = 0
    """Steps the last attempt ran: the collectives above are over these."""
    attempt: int = 0
    """The attempt that finished (0: the first; above it, the job was restarted)."""
    resumed_from: int | None = None
    """The checkpoint's step that attempt resumed from (None: from the start)."""
    skipped: list[int] = field(default_factory=list)
    """Batches that diverged and were skipped or rolled back over (`--on-divergence`)."""
    stragglers: dict[int, float] = field(default_factory=dict)
    """Ranks named slower than their peers: rank -> how many times their median."""

    def passed(self, tolerance: float = 1e-4) -> bool:
        return self.loss_max_rel_error < tolerance and self.parameter_rel_error < tolerance

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_training(
    config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0,
    optimizer: str = "sgd", hf_config: dict[str, Any] | None = None,
    resilience: Resilience | None = None, max_restarts: int = 0,
    stage_seconds: tuple[float, ...] | None = None, collective_timeout_s: float = 120.0,
) -> TrainingCheck:
    """Train `spec` for `steps` on `spec.degrees.world_size` local gloo ranks (started by
    torch's elastic launcher) and in one process; compare losses and final parameters.
    With `hf_config` (a Hugging Face config's ``to_dict()``; `config` its
    `planner.models.huggingface.to_transformer_config`) both run that model's own
    transformers modules. `resilience` (checkpoints, injected faults, divergence),
    `max_restarts` (the elastic agent's) and `stage_seconds` (stragglers): see
    `train_on_rank`; every step's loss is compared, those before a restart's checkpoint
    included, and the reference skips the batches the run skipped."""
    results = launch(
        train_on_rank, spec.degrees.world_size, config, spec, steps, seed, optimizer,
        hf_config, resilience, stage_seconds, max_restarts=max_restarts,
        collective_timeout_s=collective_timeout_s,
        checkpoint_root=resilience.checkpoint_dir if resilience is not None else None,
    )
    losses, params = merge_results(results)
    skipped = sorted({i for r in results for i in r.get("skipped", [])})
    ref_losses, ref_params = train_reference(config, spec, steps, seed, optimizer, hf_config,
                                             frozenset(skipped))
    loss_rel, param_rel = relative_errors(losses, params, ref_losses, ref_params)
    return TrainingCheck(
        world_size=spec.degrees.world_size,
        losses=losses,
        reference_losses=ref_losses,
        loss_max_abs_error=max((abs(a - b) for a, b in zip(losses, ref_losses)
                                if a is not None and b is not None), default=0.0),
        loss_max_rel_error=loss_rel,
        parameter_max_abs_error=max(
            float((params[n] - ref_params[n]).abs().max()) for n in ref_params
        ),
        parameter_rel_error=param_rel,
        collectives=[r["collectives"] for r in results],
        collectives_per_step=[r["collectives_per_step"] for r in results],
        collectives_by_group=[r["collectives_by_group"] for r in results],
        local_bytes=[r["local_bytes"] for r in results],
        saved_activations=[r["saved_activations"] for r in results],
        coordinates=[r["coords"] for r in results],
        steps_run=results[0]["steps_run"],
        attempt=results[0]["attempt"],
        resumed_from=results[0]["resumed_from"],
        skipped=skipped,
        stragglers={int(k): v for r in results for k, v in r.get("stragglers", {}).items()},
    )
