"""The bandwidth per tier at which a plan's communication hides: on a pure data-parallel
plan it is the data-parallel rule (the gradients' all-reduce takes the layers' backward),
the step only falls as a link gets faster, and a tier the plan sends nothing over has no
such bandwidth."""

from __future__ import annotations

import pytest

from cost_models.bandwidth_sweep import FACTORS, tier_sweep
from cost_models.pipeline_memory import StageLayout
from cost_models.step_time import stage_phases
from planner.models.presets import get_preset
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

GPT = get_preset("gpt3-1.3b")
DATA = 64


def a100s(gpus: int, overlap_slowdown: float | None = None) -> Cluster:
    cluster = Cluster.load("dgx-a100-80g").with_devices(gpus)
    if overlap_slowdown is None:
        return cluster
    efficiency = cluster.device.efficiency.model_copy(
        update={"overlap_slowdown": overlap_slowdown})
    return cluster.model_copy(update={"device": cluster.device.model_copy(
        update={"efficiency": efficiency})})


def pure_data_parallel(**knobs: object) -> ParallelConfig:
    """GPT-3 1.3B on 64 A100s, data parallel only: one micro-batch of 4 per rank, Megatron's
    DDP reducing 1M-parameter buckets beside the backward."""
    return ParallelConfig.of(**{"data": DATA, "micro_batch_size": 4, "global_batch_size": 256,
                                "zero_stage": 0, "overlap_grad_reduce": True,
                                "ddp_bucket_size": 1_000_000, **knobs}).resolve(DATA)


def layers_backward(model, cluster: Cluster, parallel: ParallelConfig) -> float:
    """The transformer layers' backward of one micro-batch, in which the buckets reduce:
    the stage's backward less that of the same stage one layer short, times the layers."""
    def backward(layers: int) -> float:
        shorter = model.model_copy(update={"num_layers": layers})
        phase = stage_phases(shorter, cluster, parallel, [StageLayout(layers, 1, DATA)])[0]
        return phase.backward + phase.recompute
    return model.num_layers * (backward(model.num_layers) - backward(model.num_layers - 1))


def test_a_pure_data_parallel_plan_hides_its_gradients_at_the_data_parallel_rule() -> None:
    # No slowdown of the compute the all-reduce runs beside, and buckets small enough that
    # the last one (which no backward is left to hide) is a rounding error: what remains
    # is the rule, all-reduce time = backward time.
    cluster = a100s(DATA, overlap_slowdown=0.0)
    parallel = pure_data_parallel()
    sweep = tier_sweep(GPT, cluster, parallel, [StageLayout(GPT.num_layers, 1, DATA)],
                       "inter_node")
    gradient_bytes = GPT.num_parameters() * 4  # Megatron-LM's fp32 main gradients
    rule_bus = 2 * (DATA - 1) / DATA * gradient_bytes / layers_backward(GPT, cluster, parallel)
    # The ring crosses nodes on the 8 GPUs' 8 NICs, each at its achieved share.
    assert sweep.hides_at_gbs is not None
    found_bus = sweep.hides_at_gbs * 1e9 * 8 * cluster.device.efficiency.inter_node_bandwidth
    assert found_bus == pytest.approx(rule_bus, rel=0.03)


def test_the_step_falls_as_a_tier_gets_faster_down_to_its_unbounded_step() -> None:
    cluster = a100s(DATA)
    sweep = tier_sweep(GPT, cluster, pure_data_parallel(),
                       [StageLayout(GPT.num_layers, 1, DATA)], "inter_node")
    steps = [point.step_s for point in sweep.points]
    assert steps == sorted(steps, reverse=True)
    assert [p.bandwidth_gbs for p in sweep.points] == [25 * f for f in FACTORS]
    assert all(p.exposed_s == pytest.approx(p.step_s - sweep.unbounded_step_s)
               for p in sweep.points)
    assert sweep.points[0].exposed_s > 0.1 * sweep.points[0].step_s
    # With the compute slowed by what runs beside it, hiding takes more than the rule.
    unslowed = tier_sweep(GPT, a100s(DATA, overlap_slowdown=0.0), pure_data_parallel(),
                          [StageLayout(GPT.num_layers, 1, DATA)], "inter_node")
    assert sweep.hides_at_gbs is not None and unslowed.hides_at_gbs is not None
    assert sweep.hides_at_gbs > 1.5 * unslowed.hides_at_gbs


def test_a_tier_the_plan_sends_nothing_over_has_no_hiding_bandwidth() -> None:
    # One node: every collective stays on NVLink, so no scale-out bandwidth moves the step.
    cluster = a100s(8)
    parallel = ParallelConfig.of(data=8, micro_batch_size=4, global_batch_size=32,
                                 overlap_grad_reduce=True).resolve(8)
    sweep = tier_sweep(GPT, cluster, parallel, [StageLayout(GPT.num_layers, 1, 8)],
                       "inter_node")
    assert sweep.hides_at_gbs is None
    assert {p.step_s for p in sweep.points} == {sweep.unbounded_step_s}
    intra = tier_sweep(GPT, cluster, parallel, [StageLayout(GPT.num_layers, 1, 8)],
                       "intra_node")
    assert intra.hides_at_gbs is not None
