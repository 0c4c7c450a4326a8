"""Compare what a training plan's ranks measured with what the Plan predicts of them: the
collectives of every rank, kind by kind, in count and bytes, the model state each rank
holds (parameters, gradients, optimizer state, from its local shards) and the bytes it
saves for backward in each micro-batch of each of its pipeline chunks.

The Plan predicts per stage and step (`Stage.communication`, plus `communication_once` in
the first step), per rank of a stage (`Stage.memory`) and per micro-batch of each chunk
(`Stage.saved_activation_bytes`, for plans of Tessel's runtime); every rank of a stage
issues the same collectives and holds the same bytes (up to dim-0 padding of uneven
shards, which the 1% memory tolerance absorbs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from planner.plan import Plan, Stage

MEMORY_TOLERANCE = 0.01
"""Largest relative difference between a rank's held bytes and the Plan's prediction."""
ACTIVATION_TOLERANCE = 0.02
"""Largest relative difference between the bytes a rank saves for backward in a
micro-batch and the Plan's prediction."""


def relative_error(measured: int, predicted: int) -> float:
    """|measured - predicted| over predicted (over 1 byte where nothing is predicted)."""
    return abs(measured - predicted) / max(predicted, 1)


@dataclass(frozen=True)
class MemoryRow:
    rank: int
    kind: str
    """parameters, gradients or optimizer."""
    measured: int
    predicted: int
    note: str = ""
    """Why the row is not compared, if it is not."""

    @property
    def relative_error(self) -> float:
        return relative_error(self.measured, self.predicted)


@dataclass(frozen=True)
class ActivationRow:
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

    @property
    def relative_error(self) -> float:
        return relative_error(self.measured, self.predicted)


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
    for rank, (coords, measured) in enumerate(zip(coordinates, collectives, strict=True)):
        stage = plan.stages[coords["pp"]]
        predicted = predicted_collectives(stage, steps)
        result.predicted.append(predicted)
        for kind in sorted(set(measured) | set(predicted)):
            got = measured.get(kind, {"count": 0, "bytes": 0})
            want = predicted.get(kind, {"count": 0, "bytes": 0})
            if got != want:
                result.mismatches.append(
                    f"rank {rank} {kind}: measured {got['count']} x, {got['bytes']:,} B; "
                    f"predicted {want['count']} x, {want['bytes']:,} B"
                )
        if stage.memory is not None and held[rank]:
            result.memory += _memory_rows(rank, stage, held[rank], zero)
        if saved is not None and stage.saved_activation_bytes:
            result.activations += _activation_rows(rank, coords["pp"], len(plan.stages),
                                                   stage, saved[rank], saved_note)
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
