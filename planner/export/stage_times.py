"""Each pipeline stage's forward, backward, recomputation and exposed communication per
micro-batch, for drawing a Plan's schedule: read from the Plan (`Stage.phases_s`, as the
step-time model priced them: `cost_models.step_time.stage_phases`). Nothing here prices
anything: the timeline runs these phases through the schedule's actions
(`schedule_timeline`), and the plan's own pipeline time is read from its breakdown
(`plan_pipeline_seconds`) to be shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.step_time import StagePhases
from planner.vocabulary.plan import Plan


@dataclass(frozen=True)
class StageTimes:
    """A plan's stages, one micro-batch each, and the plan's pipeline time."""

    phases: list[StagePhases]
    """Each stage's seconds per micro-batch by phase."""
    pipeline_s: float
    """The plan's predicted pipeline time: its step less data-parallel and optimizer."""


def plan_pipeline_seconds(plan: Plan) -> float:
    """Fill, steady state and drain of `plan`'s pipeline, as its breakdown records them."""
    b = plan.predicted.breakdown
    if b is None:
        raise ValueError("the plan has no step-time breakdown to draw")
    return b.compute_s + b.tensor_parallel_comm_s + b.pipeline_comm_s + b.bubble_s


def stage_times(plan: Plan) -> StageTimes:
    """The phases of `plan`'s stages, as the plan records them."""
    if any(not stage.phases_s for stage in plan.stages):
        raise ValueError("the plan records no stage phases (a training plan made by an "
                         "older Tessel, or an operator-level plan); plan it again")
    return StageTimes([StagePhases(**stage.phases_s) for stage in plan.stages],
                      plan_pipeline_seconds(plan))
