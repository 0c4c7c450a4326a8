"""One report for every `plan check`, `PlanCheckReport` (pydantic; `plan check --json`
writes it): an operator-level plan on a mesh (``mesh``), a training plan of a transformer
(``training``) and a graph plan of any model (``graph``) are written with the same
top-level keys (`REPORT_KEYS`), so that a script reads any of them alike; what only one
kind measures goes under ``details``. Every field is described in docs/plan-schema.md
("The plan check report"), whose tables `tests/planner/checks/test_check_report.py` keeps
equal to these models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.checks.operator import CheckReport
from planner.vocabulary.plan import Plan
from planner.checks.training_check import PlanComparison, TrainingCheck


class _Model(BaseModel):
    # Losses and errors may be NaN or infinite (a diverged run): written as JSON's NaN and
    # Infinity, as Python's json module writes them, not turned into null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class CollectiveCount(_Model):
    """Collectives of one kind: how many, and their bytes."""

    count: int = Field(description="Collectives of this kind.")
    bytes: int = Field(description="Their summed payload bytes on this rank.")


class RankCollectives(_Model):
    """One rank's collectives over the checked steps, measured beside predicted."""

    measured: dict[str, CollectiveCount] = Field(
        description="Collectives the rank issued, by kind (send and recv counted per side).")
    predicted: dict[str, CollectiveCount] = Field(
        description="Collectives the Plan predicts for the rank over as many steps.")


class HeldBytes(_Model):
    """The model state one rank holds, measured beside predicted."""

    measured: dict[str, int] = Field(
        description="Bytes held by kind: parameters, gradients, optimizer (training plans; "
        "empty otherwise).")
    predicted: dict[str, int] = Field(description="The Plan's bytes of the same kinds.")


class RankReport(_Model):
    """One rank: where it sits on the mesh, what it issued and what it held."""

    rank: int = Field(description="Global rank.")
    coordinates: dict[str, int] = Field(
        description="Its index on each mesh axis (training plans; empty otherwise).")
    collectives: RankCollectives = Field(description="Its collectives (below).")
    held_bytes: HeldBytes = Field(description="Its model state (below).")


class CheckErrors(_Model):
    """How far the ranks' run is from one process's."""

    max_abs: float = Field(
        description="Largest absolute difference over the losses and the final parameters.")
    max_rel: float = Field(
        description="Largest relative difference: per step, the loss's difference over the "
        "reference loss; over the final parameters, the norm of their difference over the "
        "reference's norm.")


class OperatorCheckDetails(_Model):
    """What the check of an operator-level (mesh) or graph plan measured
    (`planner.checks.operator.CheckReport`)."""

    passed: bool = Field(description="Losses, parameters and collectives as predicted.")
    steps: int = Field(description="Steps trained.")
    max_abs_error: float = Field(description="As `errors.max_abs`.")
    max_rel_error: float = Field(description="As `errors.max_rel`.")
    losses: list[float] = Field(description="Per step: the sharded run's loss.")
    reference_losses: list[float] = Field(description="Per step: one process's loss.")
    measured_communication: dict[str, CollectiveCount] = Field(
        description="Collectives rank 0 issued in its first step, by kind.")
    predicted_communication: dict[str, CollectiveCount] = Field(
        description="Collectives the Plan predicts for rank 0 in one step, by kind.")
    communication_matches: bool = Field(
        description="Every rank issued its prediction in every step.")
    mismatches: list[str] = Field(description="One line per step and rank that differed.")
    rank_communication: list[RankCollectives] = Field(
        description="Per rank: its collectives over all steps, measured and predicted.")


class GroupCollectives(_Model):
    """Collectives of one kind on one process group."""

    kind: str = Field(description="Collective kind.")
    ranks: list[int] | None = Field(
        description="The group's global ranks (None where they could not be read).")
    count: int = Field(description="Collectives of this kind on this group.")
    bytes: int = Field(description="Their summed payload bytes on this rank.")


class TrainingRunDetails(_Model):
    """A training plan trained on local ranks beside one process
    (`planner.checks.training_check.TrainingCheck`)."""

    world_size: int = Field(description="Ranks trained on.")
    losses: list[float | None] = Field(
        description="Per batch: the loss (None: a batch skipped on divergence).")
    reference_losses: list[float | None] = Field(description="Per batch: one process's loss.")
    loss_max_abs_error: float = Field(description="Largest absolute loss difference.")
    loss_max_rel_error: float = Field(description="Largest relative loss difference.")
    parameter_max_abs_error: float = Field(
        description="Largest absolute difference of a final parameter.")
    parameter_rel_error: float = Field(
        description="Norm of the difference of all parameters over the reference's norm.")
    collectives: list[dict[str, CollectiveCount]] = Field(
        description="Per rank: collectives by kind over the steps the last attempt ran.")
    collectives_by_group: list[list[GroupCollectives]] = Field(
        description="Per rank: the same by kind and process group (which axis each ran on).")
    collectives_per_step: list[list[dict[str, CollectiveCount]]] = Field(
        description="Per rank, per step: collectives by kind.")
    local_bytes: list[dict[str, int]] = Field(
        description="Per rank: bytes of parameters, gradients and optimizer state held.")
    saved_activations: list[dict[int, list[int]]] = Field(
        description="Per rank: stage index -> bytes saved for backward by each micro-batch "
        "of the last step.")
    coordinates: list[dict[str, int]] = Field(description="Per rank: its index on each axis.")
    steps_run: int = Field(description="Steps the last attempt ran.")
    attempt: int = Field(description="The attempt that finished (0: the first).")
    resumed_from: int | None = Field(
        description="The checkpoint's step that attempt resumed from (None: the start).")
    skipped: list[int] = Field(description="Batches skipped or rolled back over on divergence.")
    stragglers: dict[int, float] = Field(
        description="Ranks named slower than their peers: rank -> times their median.")


class MemoryRowReport(_Model):
    """One kind of model state on one rank, measured beside predicted."""

    rank: int = Field(description="Global rank.")
    kind: str = Field(description="parameters, gradients or optimizer.")
    measured: int = Field(description="Bytes the rank held.")
    predicted: int = Field(description="Bytes the Plan predicts.")
    note: str = Field(description="Why the row is not compared, if it is not.")


class ActivationRowReport(_Model):
    """What one rank saved for backward in one micro-batch of one pipeline chunk."""

    rank: int = Field(description="Global rank.")
    stage: int = Field(description="The chunk's index in the pipeline.")
    micro_batch: int = Field(description="The micro-batch, in the order the rank ran them.")
    measured: int = Field(description="Bytes saved for backward.")
    predicted: int = Field(description="Bytes the Plan predicts.")
    note: str = Field(description="Why the row is not compared, if it is not.")


class ComparisonDetails(_Model):
    """A training plan's measurements beside its predictions, rank by rank
    (`planner.checks.training_check.PlanComparison`)."""

    measured: list[dict[str, CollectiveCount]] = Field(
        description="Per rank: collectives by kind over the whole check.")
    predicted: list[dict[str, CollectiveCount]] = Field(
        description="Per rank: the Plan's collectives by kind over as many steps.")
    memory: list[MemoryRowReport] = Field(description="Model state held, per rank and kind.")
    activations: list[ActivationRowReport] = Field(
        description="Bytes saved for backward, per rank, chunk and micro-batch.")
    mismatches: list[str] = Field(description="One line per measurement off its prediction.")
    passed: bool = Field(description="No mismatch.")


class TrainingCheckDetails(_Model):
    """What the check of a training plan measured."""

    check: TrainingRunDetails = Field(description="The run beside one process.")
    comparison: ComparisonDetails = Field(description="The run beside the Plan.")


class PlanCheckReport(_Model):
    """The report of one `plan check` (`--json`), of any kind of plan."""

    kind: Literal["mesh", "training", "graph"] = Field(
        description="The plan checked: an operator-level plan on a mesh, a training plan of "
        "a transformer, or a graph plan of any model.")
    plan: Plan = Field(description="The Plan checked (its JSON, as `plan --json` writes it).")
    passed: bool = Field(
        description="Losses and parameters within tolerance of one process, and every "
        "measured collective and held byte as predicted.")
    steps: int = Field(description="Steps trained.")
    losses: list[float | None] = Field(
        description="Per step: the ranks' loss (None for a batch skipped on divergence).")
    reference_losses: list[float | None] = Field(
        description="Per step: one process's loss on the same batch.")
    errors: CheckErrors = Field(description="Over the losses and the final parameters.")
    ranks: list[RankReport] = Field(description="Per rank, in rank order.")
    mismatches: list[str] = Field(
        description="One line per measurement that differs from its prediction.")
    details: OperatorCheckDetails | TrainingCheckDetails = Field(
        description="What only this kind measures: `OperatorCheckDetails` for mesh and "
        "graph plans, `TrainingCheckDetails` for training plans.")

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as `plan check --json` writes it (2-space indent, NaN and Infinity as
        Python's json module writes them), also written to `path` if given."""
        text = json.dumps(self.model_dump(mode="json"), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> PlanCheckReport:
        """Read and validate a report from JSON text or a file path."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.model_validate(json.loads(text))


REPORT_KEYS = tuple(PlanCheckReport.model_fields)
"""The report's top-level keys, in the order they are written."""


def operator_report(kind: Literal["mesh", "graph"], plan: Plan,
                    report: CheckReport) -> PlanCheckReport:
    """The report of a mesh or graph plan's check."""
    return PlanCheckReport(
        kind=kind, plan=plan, passed=report.passed, steps=report.steps,
        losses=report.losses, reference_losses=report.reference_losses,
        errors=CheckErrors(max_abs=report.max_abs_error, max_rel=report.max_rel_error),
        ranks=[RankReport(rank=rank, coordinates={}, collectives=collectives,
                          held_bytes=HeldBytes(measured={}, predicted={}))
               for rank, collectives in enumerate(report.rank_communication)],
        mismatches=list(report.mismatches),
        details=OperatorCheckDetails.model_validate(report.to_dict()),
    )


def training_report(plan: Plan, check: TrainingCheck, comparison: PlanComparison,
                    passed: bool) -> PlanCheckReport:
    """The report of a training plan's check."""
    ranks = []
    for rank, coordinates in enumerate(check.coordinates):
        rows = [row for row in comparison.memory if row.rank == rank]
        ranks.append(RankReport(
            rank=rank, coordinates=coordinates,
            collectives=RankCollectives(measured=comparison.measured[rank],
                                        predicted=comparison.predicted[rank]),
            held_bytes=HeldBytes(measured={row.kind: row.measured for row in rows},
                                 predicted={row.kind: row.predicted for row in rows}),
        ))
    return PlanCheckReport(
        kind="training", plan=plan, passed=passed,
        steps=len(check.losses), losses=check.losses,
        reference_losses=check.reference_losses,
        errors=CheckErrors(
            max_abs=max(check.loss_max_abs_error, check.parameter_max_abs_error),
            max_rel=max(check.loss_max_rel_error, check.parameter_rel_error)),
        ranks=ranks, mismatches=list(comparison.mismatches),
        details=TrainingCheckDetails(check=TrainingRunDetails.model_validate(check.to_dict()),
                                     comparison=ComparisonDetails.model_validate(
                                         comparison.to_dict())),
    )
