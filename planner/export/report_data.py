"""What a plan report draws, as plain JSON-able data: the best plan's schedule of one step
(`schedule_timeline`), its memory per stage against the device (`stage_memory`), its
step-time breakdown, the top plans' step time against memory, and their whole-run totals
when they were asked for. The page itself is `planner/export/html_report.py`."""

from __future__ import annotations

from typing import Any, Callable

from planner.vocabulary.cluster import Cluster
from planner.export.schedule_timeline import BAR_KINDS, pipeline_timeline
from planner.export.stage_memory import stage_peaks
from planner.export.stage_times import stage_times
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan

GIB = 2**30
TAIL_KINDS = ("data-parallel communication", "optimizer", "offload")
"""What every stage runs after the pipeline drains: the exposed gradient reduction (and
parameter gathering), the optimizer update, then what offload adds (the CPU's step, NVMe
swaps and the copies compute does not hide, drawn after the step as a whole)."""
TIMELINE_KINDS = (*BAR_KINDS, *TAIL_KINDS)
MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "working", "reserve")
BREAKDOWN = (
    ("compute_s", "compute"), ("tensor_parallel_comm_s", "tensor/context communication"),
    ("pipeline_comm_s", "pipeline communication"), ("bubble_s", "pipeline bubble"),
    ("data_parallel_comm_s", "data-parallel communication"), ("optimizer_s", "optimizer"),
    ("offload_s", "offload"),
)
"""The step-time breakdown's fields, in the order a step spends them, and their names."""

Label = Callable[[Plan], str]


def _round(seconds: float) -> float:
    """Microseconds are finer than any bar: shorter numbers, a smaller file."""
    return round(seconds, 6)


def timeline_data(plan: Plan) -> dict[str, Any]:
    """One step of `plan`: its pipeline's bars as [stage, start, end, kind, micro-batch,
    chunk] (kind indexes `kinds`), then data-parallel communication and the optimizer."""
    times = stage_times(plan)
    schedule = plan.schedule or "1f1b"
    virtual = plan.parallel.virtual_pipeline if plan.parallel else 1
    timeline = pipeline_timeline(times.phases, plan.num_micro_batches, schedule, virtual)
    kind = {name: index for index, name in enumerate(TIMELINE_KINDS)}
    bars = [[b.stage, _round(b.start), _round(b.end), kind[b.kind], b.micro_batch, b.chunk]
            for b in timeline.bars]
    breakdown = plan.predicted.breakdown
    assert breakdown is not None  # stage_times refused a plan without one
    t = timeline.length
    for name, seconds in zip(TAIL_KINDS, (breakdown.data_parallel_comm_s,
                                          breakdown.optimizer_s, breakdown.offload_s)):
        if seconds > 0:
            bars += [[s, _round(t), _round(t + seconds), kind[name], -1, 0]
                     for s in range(timeline.num_stages)]
            t += seconds
    return {
        "kinds": list(TIMELINE_KINDS), "bars": bars, "stages": timeline.num_stages,
        "pipeline_s": timeline.length, "predicted_pipeline_s": times.pipeline_s,
        "step_s": t, "schedule": schedule, "virtual": virtual,
        "micro_batches": plan.num_micro_batches,
        "stage_seconds": [_round(p.total) for p in times.phases],
    }


def memory_data(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    """GiB one GPU of each stage holds at its peak, by kind, and the device's capacity."""
    peaks = stage_peaks(plan)
    return {
        "kinds": list(MEMORY_KINDS),
        "stages": [[round(getattr(peak, k) / GIB, 4) for k in MEMORY_KINDS] for peak in peaks],
        "reserved_gib": [round(peak.reserved / GIB, 4) for peak in peaks],
        "capacity_gib": cluster.device.memory_gib, "device": cluster.device.name,
        "predicted_peak_gib": plan.predicted.memory_gib_per_gpu,
    }


def breakdown_data(plan: Plan) -> list[list[Any]]:
    """[name, seconds] of each part of the step, in the order the step spends them."""
    b = plan.predicted.breakdown
    assert b is not None
    return [[name, getattr(b, field)] for field, name in BREAKDOWN]


def plans_data(plans: list[Plan], label: Label) -> list[dict[str, Any]]:
    """Each plan's step time, memory per GPU and throughput, best first."""
    return [{
        "rank": rank, "label": label(plan), "gpus": plan.num_gpus,
        "step_s": plan.predicted.step_time_s, "memory_gib": plan.predicted.memory_gib_per_gpu,
        "fits": plan.predicted.fits, "mfu": plan.predicted.mfu,
        "tokens_per_s": plan.predicted.tokens_per_s, "recompute": plan.recompute,
    } for rank, plan in enumerate(plans, 1)]


def totals_data(plans: list[Plan], label: Label) -> list[dict[str, Any]] | None:
    """Each plan's whole-run totals, or None when they were not asked for."""
    if not any(plan.training for plan in plans):
        return None
    return [{"rank": rank, "label": label(plan), "gpus": plan.num_gpus,
             **plan.training.model_dump()}
            for rank, plan in enumerate(plans, 1) if plan.training is not None]


def report_data(plans: list[Plan], model: TransformerConfig, cluster: Cluster,
                label: Label) -> dict[str, Any]:
    """Everything the report draws, for `plans` (best first) of `model` on `cluster`'s
    kind of device; `label` names a plan's layout (e.g. 't8 p8 d16 mb1')."""
    best = plans[0]
    here = cluster.with_devices(best.num_gpus)
    return {
        "timeline": timeline_data(best),
        "memory": memory_data(best, here),
        "breakdown": breakdown_data(best),
        "plans": plans_data(plans, label),
        "totals": totals_data(plans, label),
        "network": [sweep.model_dump() for sweep in best.network] or None,
    }
