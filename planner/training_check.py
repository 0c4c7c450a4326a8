"""Compare what a training plan's ranks measured with what the Plan predicts of them: the
collectives of every rank, kind by kind, in count and bytes, and the model state each
rank holds (parameters, gradients, optimizer state, from its local shards).

The Plan predicts per stage and step (`Stage.communication`, plus `communication_once` in
the first step) and per rank of a stage (`Stage.memory`); every rank of a stage issues
the same collectives and holds the same bytes (up to dim-0 padding of uneven shards,
which the 1% memory tolerance absorbs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from planner.plan import Plan, Stage

MEMORY_TOLERANCE = 0.01
"""Largest relative difference between a rank's held bytes and the Plan's prediction."""


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
        return abs(self.measured - self.predicted) / max(self.predicted, 1)


@dataclass
class PlanComparison:
    """Measured against predicted for every rank."""

    measured: list[dict[str, dict[str, int]]]
    """Per rank: kind -> count and bytes over the whole check."""
    predicted: list[dict[str, dict[str, int]]]
    memory: list[MemoryRow] = field(default_factory=list)
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
) -> PlanComparison:
    """Each rank's measured collectives (over `steps` steps) and held bytes against its
    stage's predictions; one mismatch line per differing (rank, kind)."""
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
    for row in result.memory:
        if not row.note and row.relative_error > MEMORY_TOLERANCE:
            result.mismatches.append(
                f"rank {row.rank} {row.kind}: holds {row.measured:,} B; predicted "
                f"{row.predicted:,} B ({row.relative_error:.1%} apart)"
            )
    return result


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
