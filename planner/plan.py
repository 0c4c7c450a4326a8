"""The Plan: the one artifact every step after the search reads (lowering, runtime, export).

A pydantic model with a JSON round trip, validated on load: placements must parse, have one
entry per mesh axis, and collectives must be of a known kind. Placements use DTensor's
short form (`S(0)`, `R`, `P`, one per mesh axis: `S(0)R`).
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_models.comm import COLLECTIVE_KINDS
from passes.dtensor_rules import parse_placements

PHASES = ("forward", "backward", "gradient_sync")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectiveStats(_Model):
    count: int = Field(ge=0, description="Number of collectives of this kind in one step.")
    bytes: int = Field(ge=0, description="Summed payload bytes per rank (the larger of each "
                       "collective's local input and output buffers).")


class NodeSharding(_Model):
    """The strategy chosen for one graph node."""

    op: str = Field(description="The aten op, e.g. 'aten.addmm.default'.")
    module: str = Field(default="", description="Module path the node came from.")
    phase: str = Field(default="forward", description="'forward' or 'backward'.")
    inputs: list[str] = Field(description="Placement each tensor input is moved to.")
    outputs: list[str | None] = Field(description="Placement of each output.")
    produced: str | None = Field(
        default=None,
        description="Placement the op itself produces (a partial sum) when the node "
        "reduces its output at once to outputs[0].",
    )


class GradientBucket(_Model):
    """Gradients (and possibly the loss) all-reduced together in one flat buffer."""

    members: list[str] = Field(description="Parameter FQNs, or 'loss'.")
    mesh_dims: list[list[int]] = Field(description="One all-reduce per entry, over these axes.")
    dtype: str = Field(description="Element type of the flat buffer.")
    nbytes: int = Field(ge=0, description="Bytes of the flat buffer.")
    placements_before: list[str] = Field(description="Each member's placement before.")
    placements_after: list[str] = Field(description="Each member's placement after.")


class FallbackOp(_Model):
    node: str = Field(description="Graph node name.")
    op: str = Field(description="The aten op that has no sharding rule.")
    module: str = Field(default="", description="Module path the node came from.")


class Predicted(_Model):
    step_time_s: float = Field(ge=0, description="Predicted time of one training step.")
    compute_s: float = Field(ge=0, description="Summed compute time of the step's ops.")
    communication_s: float = Field(ge=0, description="Summed time of the step's collectives.")
    memory_bytes_per_device: float = Field(
        ge=0, description="Parameters, gradients, optimizer state and saved activations."
    )

    @property
    def memory_gib_per_device(self) -> float:
        return self.memory_bytes_per_device / 2**30


class SolverReport(_Model):
    backend: str = Field(description="OR-Tools backend that solved the ILP.")
    status: str = Field(
        description="'OPTIMAL', 'FEASIBLE' (time limit hit) or 'GREEDY' (time limit hit "
        "before the ILP had a solution: the greedy incumbent, gap unknown, reported as 1)."
    )
    gap: float = Field(ge=0, description="Relative optimality gap (0 when optimal).")
    solve_time_s: float = Field(ge=0, description="Wall time of the solve.")
    num_variables: int = Field(ge=0, description="Variables in the ILP.")


class Plan(_Model):
    """How to shard one model's training step over a device mesh."""

    version: int = Field(default=1, description="Schema version.")
    model: str = Field(description="What was planned (a model spec or class name).")
    cluster: str = Field(description="Cluster preset or file the costs come from.")
    mesh_shape: list[int] = Field(description="Logical device mesh, e.g. [2, 2].")
    graph_fingerprint: str = Field(
        description="Hash of the traced graph; a plan only applies to the graph it was made for."
    )
    parameters: dict[str, str] = Field(description="Parameter FQN -> placement.")
    inputs: dict[str, str] = Field(description="Input name -> placement.")
    nodes: dict[str, NodeSharding] = Field(description="Graph node -> chosen strategy.")
    gradient_buckets: list[GradientBucket] = Field(default_factory=list)
    communication: dict[str, CollectiveStats] = Field(
        description="Collectives of one training step, by kind."
    )
    communication_by_phase: dict[str, dict[str, CollectiveStats]] = Field(
        description="The same, split into forward, backward and gradient_sync."
    )
    predicted: Predicted
    fallback_ops: list[FallbackOp] = Field(
        default_factory=list, description="Ops with no sharding rule, run replicated."
    )
    solver: SolverReport
    cost_source: str = Field(
        default="analytical",
        description="Where op and collective times came from: 'analytical' (the cluster's "
        "roofline and alpha-beta models) or 'profile:PATH' (a `plan profile` database, "
        "analytical where it has no measurement).",
    )

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape)

    @field_validator("mesh_shape")
    @classmethod
    def _positive_mesh(cls, shape: list[int]) -> list[int]:
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"mesh_shape must be non-empty positive sizes, got {shape}")
        return shape

    @model_validator(mode="after")
    def _check_placements(self) -> Plan:
        ndim = len(self.mesh_shape)
        where = list(self.parameters.items()) + list(self.inputs.items())
        for node, sharding in self.nodes.items():
            where += [(f"{node} input", p) for p in sharding.inputs]
            where += [(f"{node} output", p) for p in sharding.outputs if p is not None]
        for name, text in where:
            try:
                placements = parse_placements(text)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
            if len(placements) != ndim:
                raise ValueError(
                    f"{name}: placement {text!r} has {len(placements)} entries, the mesh "
                    f"{self.mesh_shape} has {ndim} axes"
                )
        tables = [self.communication, *self.communication_by_phase.values()]
        for kind in (k for table in tables for k in table):
            if kind not in COLLECTIVE_KINDS:
                raise ValueError(f"unknown collective kind {kind!r}; known: {COLLECTIVE_KINDS}")
        return self

    def to_json(self, path: str | Path | None = None) -> str:
        text = self.model_dump_json(indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Plan:
        """Load and validate a plan from JSON text or a file path."""
        path = Path(text_or_path)
        if not str(text_or_path).lstrip().startswith("{") and path.exists():
            return cls.model_validate_json(path.read_text())
        return cls.model_validate_json(str(text_or_path))
