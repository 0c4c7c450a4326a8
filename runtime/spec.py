"""What the runtime needs to know of a training plan, as one small frozen value.

`RunSpec` holds the degrees, the layers of every pipeline chunk, the micro-batching, the
schedule, ZeRO and recomputation: the fields of a training Plan
(`planner.vocabulary.plan.Plan`) the runtime reads. `from_training_plan` is the one place
that reads a Plan, so the runtime does not follow that schema's changes field by field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.vocabulary.parallel import FINETUNES, LORA_TARGETS, RECOMPUTE, Finetuning, Recompute
from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.schedules import (
    MULTI_CHUNK,
    RUNTIME_SCHEDULES,
    V_SHAPED,
    RuntimeSchedule,
)


@dataclass(frozen=True)
class RunSpec:
    """How one step of a training plan runs."""

    degrees: ParallelDims
    """The plan's degrees: the mesh (pp x dp x cp x tp) and the expert degree, carved out
    of the data-parallel ranks here (see `runtime.experts`)."""
    chunks: tuple[tuple[int, int], ...]
    """Transformer layers [first, last) of every pipeline chunk, in model order; pp x
    virtual chunks. Chunk c runs on pipeline rank c % pp (Megatron's interleaved order), or
    for ZBV and DualPipeV in V order: rank c for c < pp, then back, rank 2pp - 1 - c."""
    micro_batch_size: int
    num_micro_batches: int
    schedule: RuntimeSchedule = "1f1b"
    """The plan's four schedules and torch's two zero-bubble ones (Qi et al. 2024),
    interleaved zero bubble (loop order) and ZBV (two chunks per rank in V order, as
    DualPipeV's): `planner.vocabulary.schedules`."""
    virtual_pipeline: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    recompute: Recompute = "none"
    expert_dispatcher: Literal["allgather", "alltoall"] = "allgather"
    """Token dispatch of expert parallelism: allgather or alltoall (Megatron's
    --moe-token-dispatcher-type)."""
    force_balance: bool = False
    """Forced load balancing of the routers (--moe-router-force-load-balancing): every
    expert gets the same tokens (`planner.models.transformer.forced_experts`)."""
    finetuning: Finetuning = Finetuning()
    """What is trained, in the planner's vocabulary: none and full train every weight; lora
    trains rank-`lora_rank` adapters beside the `lora_targets` linears over a frozen base
    (`runtime.adapters`). qlora's 4-bit NF4 base is not run (`runtime.model_parts`
    refuses it)."""

    def __post_init__(self) -> None:
        d = self.degrees
        problems = []
        if self.schedule not in RUNTIME_SCHEDULES:
            problems.append(f"schedule must be one of {', '.join(RUNTIME_SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            problems.append(f"recompute must be one of {', '.join(RECOMPUTE)}")
        if not 0 <= self.zero_stage <= 3:
            problems.append(f"zero_stage must be 0-3, got {self.zero_stage}")
        if len(self.chunks) != d.pp * self.virtual_pipeline:
            problems.append(
                f"{len(self.chunks)} chunks for pipeline {d.pp} x virtual "
                f"{self.virtual_pipeline}"
            )
        if self.virtual_pipeline > 1 and self.schedule not in MULTI_CHUNK:
            problems.append("virtual stages need an interleaved, zbv or dualpipev schedule")
        if self.schedule in V_SHAPED and self.virtual_pipeline != 2:
            problems.append(f"{self.schedule} runs exactly 2 chunks per pipeline rank "
                            "(virtual 2)")
        if self.schedule == "dualpipev" and self.num_micro_batches < 2 * d.pp:
            # torch's ScheduleDualPipeV: "at least as many microbatches as stages".
            problems.append(
                f"DualPipeV needs at least as many micro-batches ({self.num_micro_batches}) "
                f"as stages ({2 * d.pp})"
            )
        if self.schedule == "1f1b" and d.pp > 1 and self.num_micro_batches < d.pp:
            problems.append(
                f"1F1B needs at least as many micro-batches ({self.num_micro_batches}) "
                f"as stages ({d.pp})"
            )
        if self.schedule.startswith("interleaved") and self.num_micro_batches % d.pp:
            problems.append(
                f"interleaved 1F1B needs micro-batches ({self.num_micro_batches}) in "
                f"multiples of the pipeline degree ({d.pp})"
            )
        if self.sequence_parallel and d.tp == 1:
            problems.append("sequence parallelism needs a tensor-parallel degree above 1")
        if d.dp % self.expert:
            problems.append(
                f"expert parallelism ({self.expert}) must divide data parallelism ({d.dp})"
            )
        if self.expert_dispatcher not in ("allgather", "alltoall"):
            problems.append("expert_dispatcher must be allgather or alltoall")
        if d.cp > 1 and self.expert > 1:
            problems.append("expert parallelism with context parallelism is not run yet")
        tuning = self.finetuning
        if tuning.finetune not in FINETUNES:
            problems.append(f"finetune must be one of {', '.join(FINETUNES)}")
        if tuning.lora_rank < 1:
            problems.append(f"lora_rank must be at least 1, got {tuning.lora_rank}")
        unknown = [t for t in tuning.lora_targets if t not in LORA_TARGETS]
        if unknown or (tuning.adapters and not tuning.lora_targets):
            problems.append(f"lora_targets must be among {', '.join(LORA_TARGETS)} (at "
                            f"least one), got {', '.join(tuning.lora_targets) or 'none'}")
        if d.cp > 1 and self.force_balance:
            problems.append("forced load balancing routes by sequence position, which a "
                            "context shard does not see whole; not run with context "
                            "parallelism")
        if problems:
            raise ValueError("; ".join(problems) + ".")

    @property
    def expert(self) -> int:
        """Expert-parallel degree (Megatron's --expert-model-parallel-size)."""
        return self.degrees.expert

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.num_micro_batches * self.degrees.dp

    @property
    def num_stages(self) -> int:
        """Pipeline stages torch's schedules see: pp x virtual."""
        return len(self.chunks)

    def stage_rank(self, index: int) -> int:
        """The pipeline rank that runs stage (chunk) `index`."""
        return next(r for r in range(self.degrees.pp) if index in self.stage_indices(r))

    def stage_indices(self, pp_rank: int) -> list[int]:
        """The pipeline stages (chunks) pipeline rank `pp_rank` runs, in order."""
        if self.schedule in V_SHAPED:
            return [pp_rank, 2 * self.degrees.pp - 1 - pp_rank]
        return list(range(pp_rank, self.num_stages, self.degrees.pp))


def even_chunks(num_layers: int, num_chunks: int) -> tuple[tuple[int, int], ...]:
    """`num_layers` split into `num_chunks` contiguous ranges, the first ones one longer
    when they do not divide."""
    if num_chunks > num_layers:
        raise ValueError(f"{num_chunks} pipeline chunks for {num_layers} layers")
    base, extra = divmod(num_layers, num_chunks)
    chunks, first = [], 0
    for c in range(num_chunks):
        size = base + (c < extra)
        chunks.append((first, first + size))
        first += size
    return tuple(chunks)


def from_training_plan(plan) -> RunSpec:
    """The RunSpec of a training `planner.vocabulary.plan.Plan`.

    A plan's stages are its physical pipeline stages, and each lists the layer ranges of
    the model chunks it holds (`Stage.chunks`; with `virtual_pipeline` v > 1, Megatron's
    order: pp x v equal chunks, chunk c on pipeline rank c % pp). A plan without chunk
    lists (a stub) is read from its stages' layers the same way. An operator-level plan
    (no ``parallel``) is refused: `runtime.trainer.ShardedTrainer` runs those.
    """
    p = getattr(plan, "parallel", None)
    if p is None:
        raise ValueError(
            "this plan has no parallel degrees (an operator-level --mesh plan); "
            "runtime.trainer.ShardedTrainer runs it"
        )
    degrees = ParallelDims(pipeline=p.pipeline, data=p.data, context=p.context,
                           tensor=p.tensor, expert=p.expert)
    # Every stage on the same data x (context x) tensor mesh: what this runtime runs.
    shapes = [list(getattr(stage, "mesh_shape", None) or []) for stage in plan.stages]
    sizes = {p.data * p.tensor, p.data * p.tensor * p.context}
    for i, shape in enumerate(shapes):
        if shape and (shape != shapes[0] or math.prod(shape) not in sizes):
            raise ValueError(
                f"stage {i} runs on a {'x'.join(map(str, shape))} mesh, stage 0 on "
                f"{'x'.join(map(str, shapes[0]))} and the plan's degrees are data {p.data} x "
                f"tensor {p.tensor}; stages of different shapes are not run yet"
            )
    stages = [tuple(stage.layers) for stage in plan.stages]
    listed = [tuple(chunk) for stage in plan.stages for chunk in getattr(stage, "chunks", [])]
    if listed:
        chunks = tuple(sorted(listed))  # model order: chunk c on stage c % pp
    elif p.virtual_pipeline == 1:
        chunks = tuple(stages)
    else:
        num_layers = stages[-1][1] - stages[0][0]
        chunks = even_chunks(num_layers, p.pipeline * p.virtual_pipeline)
        per_rank = num_layers // p.pipeline
        if any(last - first != per_rank for first, last in stages):
            raise ValueError(
                "interleaved stages must hold equal layer counts; got "
                + ", ".join(f"{last - first}" for first, last in stages)
            )
    expert_tensor = getattr(p, "expert_tensor", None)
    if p.expert > 1 and p.tensor > 1 and expert_tensor not in (None, p.tensor):
        raise ValueError(
            f"expert tensor parallelism {expert_tensor} apart from tensor {p.tensor}: the "
            "runtime splits each expert over the tensor ranks (Megatron's default) only"
        )
    spec = RunSpec(
        degrees=degrees,
        chunks=chunks,
        micro_batch_size=plan.micro_batch_size or 1,
        num_micro_batches=plan.num_micro_batches,
        schedule=plan.schedule or "1f1b",
        virtual_pipeline=p.virtual_pipeline,
        sequence_parallel=p.sequence_parallel,
        zero_stage=p.zero_stage,
        recompute=plan.recompute,
        # DeepEP's flex dispatcher moves what all-to-all does; torch runs the all-to-all.
        expert_dispatcher=_dispatcher(getattr(plan, "run", None)),
        force_balance=bool(getattr(getattr(plan, "run", None),
                                   "moe_router_force_load_balancing", False)),
        finetuning=_finetuning(getattr(plan, "run", None)),
    )
    planned = getattr(plan, "global_batch_size", None)
    if planned is not None and planned != spec.global_batch_size:
        raise ValueError(
            f"the plan's global batch ({planned}) is not micro-batch ({spec.micro_batch_size})"
            f" x micro-batches ({spec.num_micro_batches}) x data ({degrees.dp})"
        )
    return spec


def _finetuning(run: object) -> Finetuning:
    """The fine-tuning knobs of a plan's run settings (their defaults where a plan has
    none)."""
    defaults = Finetuning()
    return Finetuning(
        finetune=getattr(run, "finetune", defaults.finetune),
        lora_rank=getattr(run, "lora_rank", defaults.lora_rank),
        lora_alpha=getattr(run, "lora_alpha", defaults.lora_alpha),
        lora_targets=tuple(getattr(run, "lora_targets", defaults.lora_targets)))


def _dispatcher(run: object) -> str:
    """The token dispatcher the runtime runs for a plan's settings."""
    return runtime_dispatcher(getattr(run, "moe_token_dispatcher", "allgather"))


def runtime_dispatcher(chosen: str) -> str:
    """The token dispatcher the runtime runs for the plan's `chosen` one (Megatron-LM's
    --moe-token-dispatcher-type): DeepEP's flex moves what all-to-all does, and torch runs
    the all-to-all."""
    return "alltoall" if chosen in ("alltoall", "flex") else "allgather"
