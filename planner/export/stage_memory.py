"""What one GPU of each pipeline stage holds at its peak, by kind, for drawing a Plan
against the device: read from the Plan (`Stage.peak_memory_gib`, as the predictor priced
each stage: `cost_models.pipeline_memory.stage_memories`)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.vocabulary.plan import Plan

GIB = 2**30


@dataclass(frozen=True)
class StagePeak:
    """Bytes one GPU of a stage holds at its peak, by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    working: float
    """Gathered weights, unsharded gradients, the loss's logits, a layer's gradients."""
    reserve: float
    """Outside the caching allocator: the CUDA context, communicator buffers."""
    reserved: float
    """What the caching allocator holds at the peak, and the memory outside it."""

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.working + self.reserve)


def stage_peaks(plan: Plan) -> list[StagePeak]:
    """The peak of one GPU of each of `plan`'s stages, as the plan records them."""
    if any(not stage.peak_memory_gib for stage in plan.stages):
        raise ValueError("the plan records no memory per stage (a training plan made by an "
                         "older Tessel, or an operator-level plan); plan it again")
    return [StagePeak(
        weights=m["weights"] * GIB, gradients=m["gradients"] * GIB,
        optimizer=m["optimizer"] * GIB, activations=m["activations"] * GIB,
        working=m["working buffers"] * GIB, reserve=m["outside the allocator"] * GIB,
        reserved=m["reserved"] * GIB,
    ) for m in (stage.peak_memory_gib for stage in plan.stages)]
