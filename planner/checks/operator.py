"""`plan check`: train a plan on real gloo ranks and compare with one process.

Both runs start from the same parameters and see the same synthetic batches; the sharded
run must reproduce the single-process losses and final parameters, and the collectives it
issues must be exactly the ones the plan predicted.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from passes.lower import RankProgram
from passes.program import TracedProgram
from passes.stage_graph import PRECISION_DTYPES, floating_in
from passes.trace import TrainingObjective
from planner.vocabulary.plan import Plan
from runtime.comm_counter import CommCounter, add_counts
from runtime.local_ranks import run_on_ranks
from runtime.loss_scale import LossScale
from runtime.trainer import DEFAULT_OPTIMIZER, ShardedTrainer, training_state
from planner.checks.training_check import relative_errors

# fp32 training on both sides: only summation order differs.
RELATIVE_TOLERANCE = 1e-4
# bf16 programs on both sides (fp32 master weights): summation order differs in bf16, whose
# 8-bit mantissa rounds at 4e-3 per op. A sharding error is off by far more.
RELATIVE_TOLERANCE_BF16 = 3e-2


@dataclass
class CheckReport:
    passed: bool
    steps: int
    max_abs_error: float
    """Largest elementwise difference over the losses and the final parameters."""
    max_rel_error: float
    """Largest relative difference: |loss - ref| / |ref| per step, and ||theta - ref|| /
    ||ref|| for the final parameters taken as one vector."""
    losses: list[float]
    reference_losses: list[float]
    measured_communication: dict[str, dict[str, int]]
    """Collectives one rank issued in one step, by kind (count and bytes)."""
    predicted_communication: dict[str, dict[str, int]]
    communication_matches: bool
    mismatches: list[str] = field(default_factory=list)
    rank_communication: list[dict[str, dict[str, dict[str, int]]]] = field(
        default_factory=list)
    """Per rank: ``measured`` and ``predicted`` count and bytes per kind over all steps."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def synthetic_batches(example_inputs: tuple, steps: int, seed: int = 0) -> list[tuple]:
    """Batches shaped like the example inputs: normal floats, integers in the examples'
    range (so token ids stay valid)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        batch = []
        for x in example_inputs:
            if not isinstance(x, torch.Tensor):
                batch.append(x)
            elif x.is_floating_point():
                batch.append(torch.randn(x.shape, generator=generator, dtype=x.dtype))
            else:
                low, high = int(x.min()), int(x.max()) + 1
                batch.append(torch.randint(low, high, x.shape, generator=generator, dtype=x.dtype))
        batches.append(tuple(batch))
    return batches


def train_single_process(
    model: nn.Module, loss_fn: Callable | None, batches: list[tuple],
    precision: str = "fp32",
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The reference: the unmodified model trained with the same optimizer; in bf16 or
    fp16, a copy in that dtype runs each step from the fp32 master weights, whose gradients
    it becomes; fp16 scales its loss and skips a step whose gradients overflow, as
    `runtime.loss_scale` does."""
    half = PRECISION_DTYPES[precision] if precision != "fp32" else None
    master = copy.deepcopy(model).float() if half else copy.deepcopy(model)
    optimizer = torch.optim.AdamW(master.parameters(), **DEFAULT_OPTIMIZER)
    work = copy.deepcopy(master).to(half) if half else master
    objective = TrainingObjective(work, loss_fn)
    scaler = LossScale() if precision == "fp16" else None
    losses = []
    for batch in batches:
        if half:
            with torch.no_grad():
                for w, p in zip(work.parameters(), master.parameters()):
                    w.copy_(p)
            batch = tuple(floating_in(x, half) for x in batch)
        loss = objective(*batch)
        scale = scaler.scale if scaler else 1.0
        (loss * torch.tensor(scale) if scaler else loss).backward()
        if half:
            for w, p in zip(work.parameters(), master.parameters()):
                p.grad = w.grad.float() / scale
                w.grad = None
        if scaler is None or not scaler.overflowed(
                [p.grad for p in master.parameters() if p.grad is not None], across_ranks=False):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in master.named_parameters()}


def _train_rank(rank: int, world: int, program, plan, state, batches):
    mesh = init_device_mesh("cpu", tuple(plan.mesh_shape))
    trainer = ShardedTrainer(RankProgram(program, plan, mesh), state)
    losses, comms = counted_steps(trainer, batches)
    params = trainer.full_parameters()
    return losses, comms, params if rank == 0 else None


def counted_steps(trainer, batches: list[tuple]) -> tuple[list, list[dict]]:
    """Each step's loss and the collectives this rank issued in it, by kind."""
    losses, comms = [], []
    for batch in batches:
        with CommCounter() as counter:
            losses.append(trainer.step(*batch))
        comms.append(counter.by_kind())
    return losses, comms


def _errors(losses: list[float], params: dict[str, torch.Tensor],
            reference_losses: list[float], reference_params: dict[str, torch.Tensor],
            ) -> tuple[float, float]:
    """(largest absolute, largest relative) difference of the losses and final parameters
    from the one-process run's."""
    loss_rel, param_rel = relative_errors(losses, params, reference_losses, reference_params)
    abs_error = max(
        max(abs(got - want) for got, want in zip(losses, reference_losses)),
        max(float((params[n] - w).abs().max()) for n, w in reference_params.items()),
    )
    return abs_error, max(loss_rel, param_rel)


def check_plan(
    model: nn.Module,
    program: TracedProgram,
    plan: Plan,
    loss_fn: Callable | None = None,
    example_inputs: tuple = (),
    steps: int = 3,
) -> CheckReport:
    """Train `steps` steps on `plan.num_devices` gloo ranks and on one process; compare."""
    batches = synthetic_batches(tuple(example_inputs), steps)
    state = training_state(model)
    reference_losses, reference_params = train_single_process(model, loss_fn, batches)
    results = run_on_ranks(_train_rank, plan.num_devices, program, plan, state, batches)
    losses, comms, params = results[0]
    abs_error, rel_error = _errors(losses, params, reference_losses, reference_params)

    predicted = {k: v.model_dump() for k, v in plan.communication.items()}
    mismatches = []
    for step, measured in enumerate(comms):
        if measured != predicted:
            mismatches.append(f"step {step}: measured {measured}, predicted {predicted}")
    # Every rank runs the same program; rank 0 speaks for all of them.
    return CheckReport(
        passed=rel_error < RELATIVE_TOLERANCE and not mismatches and math.isfinite(abs_error),
        steps=steps,
        max_abs_error=abs_error,
        max_rel_error=rel_error,
        losses=losses,
        reference_losses=reference_losses,
        measured_communication=comms[0] if comms else {},
        predicted_communication=predicted,
        communication_matches=not mismatches,
        mismatches=mismatches,
        rank_communication=[_over_steps(rank_comms, predicted)
                            for _, rank_comms, _ in results],
    )


# -- graph plans: pipeline stages of any model ----------------------------------------------


def predicted_rank_communication(plan: Plan, rank: int) -> dict[str, dict[str, int]]:
    """What one rank of a graph plan issues in a step: its stage's prediction."""
    from runtime.graph_pipeline import stage_of

    stage = plan.stages[stage_of(plan, rank)]
    return {k: v.model_dump() for k, v in stage.communication.items()}


def _train_staged_rank(rank: int, world: int, plan, model, example_inputs, loss_fn, state,
                       batches):
    from runtime.graph_pipeline import StagedTrainer

    trainer = StagedTrainer(plan, model, example_inputs, loss_fn, state)
    losses, comms = counted_steps(trainer, batches)
    params = trainer.full_parameters()
    first = trainer.local_rank == 0
    return losses, comms, params if first else {}


def check_graph_plan(
    model: nn.Module, plan: Plan, loss_fn: Callable | None = None,
    example_inputs: tuple = (), steps: int = 3,
) -> CheckReport:
    """Train a graph plan (`--gpus` for a model of one's own) on `plan.num_devices` gloo
    ranks and on one process: losses and final parameters must agree, and every rank must
    issue exactly its stage's predicted collectives, sends and receives."""
    if plan.global_batch_size is None:
        raise ValueError("a graph plan records its global batch size; this one does not")
    examples = tuple(grown(x, plan.global_batch_size) for x in example_inputs)
    batches = synthetic_batches(examples, steps)
    state = training_state(model)
    reference_losses, reference_params = train_single_process(model, loss_fn, batches,
                                                              plan.precision)
    results = run_on_ranks(_train_staged_rank, plan.num_devices, plan, model,
                           tuple(example_inputs), loss_fn, state, batches)
    last = plan.stages[-1].first_device
    losses = results[last][0]
    params: dict[str, torch.Tensor] = {}
    for _, _, stage_params in results:
        params.update(stage_params)
    abs_error, rel_error = _errors(losses, params, reference_losses, reference_params)
    mismatches = []
    for rank, (_, comms, _) in enumerate(results):
        predicted = predicted_rank_communication(plan, rank)
        for step, measured in enumerate(comms):
            if measured != predicted:
                mismatches.append(f"rank {rank} step {step}: measured {measured}, "
                                  f"predicted {predicted}")
    tolerance = RELATIVE_TOLERANCE if plan.precision == "fp32" else RELATIVE_TOLERANCE_BF16
    return CheckReport(
        passed=rel_error < tolerance and not mismatches and math.isfinite(abs_error),
        steps=steps, max_abs_error=abs_error, max_rel_error=rel_error, losses=losses,
        reference_losses=reference_losses, measured_communication=results[0][1][0],
        predicted_communication=predicted_rank_communication(plan, 0),
        communication_matches=not mismatches, mismatches=mismatches,
        rank_communication=[_over_steps(comms, predicted_rank_communication(plan, rank))
                            for rank, (_, comms, _) in enumerate(results)],
    )


def _over_steps(per_step: list[dict[str, dict[str, int]]],
                predicted: dict[str, dict[str, int]]) -> dict[str, dict[str, dict[str, int]]]:
    """One rank's measured collectives summed over its steps, beside the prediction for as
    many steps."""
    steps = len(per_step)
    return {"measured": add_counts(per_step),
            "predicted": {k: {"count": v["count"] * steps, "bytes": v["bytes"] * steps}
                          for k, v in sorted(predicted.items())}}


def grown(example: Any, batch: int) -> Any:
    """An example input grown (or cut) to `batch` along dim 0, keeping its values' range."""
    if not isinstance(example, torch.Tensor) or example.dim() == 0:
        return example
    reps = -(-batch // example.shape[0])
    return example.repeat(reps, *([1] * (example.dim() - 1)))[:batch]
