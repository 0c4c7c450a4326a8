"""`plan check` of a training plan: `check_training` trains the plan on local gloo ranks
(`runtime.training_loop.train_on_rank`) and the same steps in one process, and compares losses
and final parameters; `compare` sets what the ranks measured beside what the Plan predicts
of them: the collectives of every rank, kind by kind, in count and bytes, the model state
each rank holds (parameters, gradients, optimizer state, from its local shards) and the
bytes it saves for backward in each micro-batch of each of its pipeline chunks.

The Plan predicts per stage and step (`Stage.communication`, plus `communication_once` in
the first step), per rank of a stage (`Stage.memory`) and per micro-batch of each chunk
(`Stage.saved_activation_bytes`, for plans of Tessel's runtime); every rank of a stage
issues the same collectives and holds the same bytes (up to dim-0 padding of uneven
shards, which the 1% memory tolerance absorbs).

Where the routing decides bytes (experts dispatched all-to-all without forced load
balancing, `routing_note`), the Plan's figure is the even routing's, and the comparison
stays exact where the routing cannot move it: every rank's count of every kind, and the
bytes of the all-to-alls and of the experts' tensor-parallel all-reduces summed over each
expert-parallel group. Every (token, expert) pair a group's ranks route is sent once to
its expert's rank and once back (`runtime.comm_counter` counts an all-to-all by what a
rank sends), and reaches exactly one of the group's experts, whatever the router chose.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan, Stage
from runtime.elastic import launch
from runtime.model_parts import model_parts
from runtime.pipeline_trainer import lm_loss, make_optimizer
from runtime.resilience import Resilience
from runtime.spec import RunSpec, runtime_dispatcher
from runtime.training_loop import batches, train_on_rank

MEMORY_TOLERANCE = 0.01
"""Largest relative difference between a rank's held bytes and the Plan's prediction."""
ACTIVATION_TOLERANCE = 0.02
"""Largest relative difference between the bytes a rank saves for backward in a
micro-batch and the Plan's prediction."""


def relative_error(measured: int, predicted: int) -> float:
    """|measured - predicted| over predicted (over 1 byte where nothing is predicted)."""
    return abs(measured - predicted) / max(predicted, 1)


class _MeasuredBytes:
    """A row's measured bytes beside the Plan's prediction (`measured`, `predicted`)."""

    measured: int
    predicted: int

    @property
    def relative_error(self) -> float:
        return relative_error(self.measured, self.predicted)


@dataclass(frozen=True)
class MemoryRow(_MeasuredBytes):
    rank: int
    kind: str
    """parameters, gradients or optimizer."""
    measured: int
    predicted: int
    note: str = ""
    """Why the row is not compared, if it is not."""


@dataclass(frozen=True)
class ActivationRow(_MeasuredBytes):
    """What one rank saved for backward in one micro-batch of one pipeline chunk."""

    rank: int
    stage: int
    """The chunk's index in the pipeline (the pipeline stage torch runs it as)."""
    micro_batch: int
    """The micro-batch, in the order the rank ran that chunk's forwards."""
    measured: int
    predicted: int
    note: str = ""
    """Why the row is not compared, if it is not."""


@dataclass
class PlanComparison:
    """Measured against predicted for every rank."""

    measured: list[dict[str, dict[str, int]]]
    """Per rank: kind -> count and bytes over the whole check."""
    predicted: list[dict[str, dict[str, int]]]
    memory: list[MemoryRow] = field(default_factory=list)
    activations: list[ActivationRow] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def predicted_collectives(stage: Stage, steps: int) -> dict[str, dict[str, int]]:
    """Count and bytes per kind one rank of `stage` issues over `steps` steps."""
    total: dict[str, dict[str, int]] = {}
    for table, times in ((stage.communication, steps), (stage.communication_once, 1)):
        for kind, stats in table.items():
            entry = total.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += stats.count * times
            entry["bytes"] += stats.bytes * times
    return dict(sorted(total.items()))


def compare(
    plan: Plan, coordinates: list[dict[str, int]], collectives: list[dict[str, dict[str, int]]],
    held: list[dict[str, int]], steps: int,
    saved: list[dict[int, list[int]]] | None = None, saved_note: str = "",
) -> PlanComparison:
    """Each rank's measured collectives (over `steps` steps), held bytes and, with
    `saved` (per rank: pipeline chunk -> bytes saved for backward per micro-batch), saved
    activations against its stage's predictions; one mismatch line per differing (rank,
    kind) and (rank, chunk, micro-batch). `saved_note` marks the activation rows not
    compared, and why."""
    zero = plan.parallel.zero_stage if plan.parallel else 0
    result = PlanComparison(measured=collectives, predicted=[])
    routed = _routed_kinds(plan)
    for rank, (coords, measured) in enumerate(zip(coordinates, collectives, strict=True)):
        stage = plan.stages[coords["pp"]]
        predicted = predicted_collectives(stage, steps)
        result.predicted.append(predicted)
        for kind in sorted(set(measured) | set(predicted)):
            got = measured.get(kind, {"count": 0, "bytes": 0})
            want = predicted.get(kind, {"count": 0, "bytes": 0})
            if got != want and not (kind in routed and got["count"] == want["count"]):
                result.mismatches.append(
                    f"rank {rank} {kind}: measured {got['count']} x, {got['bytes']:,} B; "
                    f"predicted {want['count']} x, {want['bytes']:,} B"
                )
        if stage.memory is not None and held[rank]:
            result.memory += _memory_rows(rank, stage, held[rank], zero)
        if saved is not None and stage.saved_activation_bytes:
            result.activations += _activation_rows(rank, coords["pp"], len(plan.stages),
                                                   stage, saved[rank], saved_note)
    if routed:
        result.mismatches += _routed_mismatches(plan, coordinates, result, routed)
    for row in result.memory:
        if not row.note and row.relative_error > MEMORY_TOLERANCE:
            result.mismatches.append(
                f"rank {row.rank} {row.kind}: holds {row.measured:,} B; predicted "
                f"{row.predicted:,} B ({row.relative_error:.1%} apart)"
            )
    for a in result.activations:
        if not a.note and a.relative_error > ACTIVATION_TOLERANCE:
            result.mismatches.append(
                f"rank {a.rank} stage {a.stage} micro-batch {a.micro_batch}: saved "
                f"{a.measured:,} B for backward; predicted {a.predicted:,} B "
                f"({a.relative_error:.1%} apart)"
            )
    return result


def routing_note(plan: Plan) -> str:
    """Where the routing decides some of `plan`'s bytes (experts dispatched all-to-all
    without forced load balancing), how `compare` compares them; '' elsewhere."""
    routed = _routed_kinds(plan)
    if not routed:
        return ""
    kinds = ("all-to-all and the experts' tensor-parallel all-reduce bytes"
             if "all_reduce" in routed else "all-to-all bytes")
    return (f"the routing decides each rank's {kinds} (--moe-router-force-load-balancing "
            "makes them exact per rank): counts are compared rank by rank, those bytes "
            "summed over each expert-parallel group")


def _routed_kinds(plan: Plan) -> tuple[str, ...]:
    """The kinds whose bytes the routing decides, compared summed over each
    expert-parallel group: those of an all-to-all expert dispatch without forced balance;
    empty otherwise."""
    model, p, run = plan.architecture, plan.parallel, plan.run
    if model is None or p is None or run is None or not model.num_experts or p.expert == 1:
        return ()
    if run.moe_router_force_load_balancing or \
            runtime_dispatcher(run.moe_token_dispatcher) != "alltoall":
        return ()
    # Under tensor parallelism each expert all-reduces the rows routed to it.
    return ("all_to_all", "all_reduce") if p.tensor > 1 else ("all_to_all",)


def _routed_mismatches(plan: Plan, coordinates: list[dict[str, int]],
                       result: PlanComparison, routed: tuple[str, ...]) -> list[str]:
    """The bytes of the `routed` kinds (`_routed_kinds`) of each expert-parallel group
    together, against the Plan's."""
    lines, ep = [], plan.parallel.expert
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, c in enumerate(coordinates):
        # Expert-parallel ranks: `ep` consecutive data-parallel ranks (runtime.experts).
        groups.setdefault((c["pp"], c.get("cp", 0), c["tp"], c["dp"] // ep), []).append(rank)
    zero = {"count": 0, "bytes": 0}
    for kind in routed:
        got = [m.get(kind, zero)["bytes"] for m in result.measured]
        want = [p.get(kind, zero)["bytes"] for p in result.predicted]
        for ranks in groups.values():
            measured, predicted = sum(got[r] for r in ranks), sum(want[r] for r in ranks)
            if measured != predicted:
                lines.append(f"ranks {', '.join(map(str, ranks))} {kind}: measured "
                             f"{measured:,} B together; predicted {predicted:,} B")
    return lines


def _activation_rows(
    rank: int, pipeline_rank: int, pipeline: int, stage: Stage, saved: dict[int, list[int]],
    note: str,
) -> list[ActivationRow]:
    """One row per micro-batch of each chunk the rank runs: chunk k of pipeline rank i is
    the pipeline's stage i + k p (Megatron-LM's interleaved order, the Plan's `chunks`).
    A chunk that measured nothing, or measured another count of micro-batches than the
    others, shows up as rows that differ."""
    rows = []
    counts = {len(runs) for runs in saved.values()} or {0}
    for k, predicted in enumerate(stage.saved_activation_bytes):
        index = pipeline_rank + k * pipeline
        runs = saved.get(index) or [0] * max(counts)
        rows += [ActivationRow(rank, index, mb, measured, predicted, note)
                 for mb, measured in enumerate(runs)]
    return rows


def _memory_rows(rank: int, stage: Stage, held: dict[str, int], zero: int) -> list[MemoryRow]:
    memory = stage.memory
    assert memory is not None
    # FSDP2 keeps parameters sharded at rest for ZeRO-1/2 too and gathers them from forward
    # to the last backward: the plan's figure is the gathered one.
    params = held["parameters"] if zero >= 3 else held["parameters_gathered"]
    note = ""
    if zero == 1:
        # FSDP2 cannot keep ZeRO-1's whole gradients (runtime/parallelize.py).
        note = "not compared: the runtime shards ZeRO-1 gradients"
    return [
        MemoryRow(rank, "parameters", params, memory.parameters_bytes),
        MemoryRow(rank, "gradients", held["gradients"], memory.gradients_bytes, note),
        MemoryRow(rank, "optimizer", held["optimizer"], memory.optimizer_bytes),
    ]


# -- the run: every rank, and one process ----------------------------------------------


def train_reference(
    config: TransformerConfig, spec: RunSpec, steps: int, seed: int = 0, optimizer: str = "sgd",
    hf_config: dict[str, Any] | None = None, skipped: frozenset[int] = frozenset(),
) -> tuple[list[float | None], dict[str, torch.Tensor]]:
    """The same steps in one process: whole model (the zoo's, or with `hf_config`
    transformers' own causal LM; under LoRA frozen, with the same adapters), whole batch,
    never seeing the batches `skipped` (their losses None). Returns the losses and the
    final parameters."""
    parts = model_parts(config, hf_config)
    model = parts.reference(seed, spec.force_balance)
    # LoRA: the same adapters, the base frozen.
    parts.fine_tune(model, spec, (0, config.num_layers), True, True, seed=seed)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], optimizer)
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
