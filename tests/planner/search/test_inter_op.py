"""planner.search.inter_op: Alpa's stage-construction DP against brute force, hand-made plans, the
t_max search against a full sweep, and the runtime at GPT-3 depth.

Random instances are drawn from seeded numpy generators (one seed per test case) so a
failure names the instance that broke and reruns identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from cost_models.pipeline_timing import one_chunk_seconds
from planner.search.inter_op import StagePlan, stage_brute_force, stage_dp

SIZES = (1, 2, 4, 8, 16)


# -- instances -------------------------------------------------------------------------------


def model_costs(
    weights: list[float],
    sizes: list[int],
    positions: int,
    fits: Callable[[int, int, int], bool] = lambda layers, devices, after: True,
) -> np.ndarray:
    """costs[i, j, m, k]: the layers' summed weight / devices, or inf where
    `fits(layers, devices, k)` says the stage's memory does not fit."""
    num_layers = len(weights)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    costs = np.full((num_layers, num_layers + 1, len(sizes), positions), np.inf)
    for i in range(num_layers):
        for j in range(i + 1, num_layers + 1):
            for m, n in enumerate(sizes):
                for k in range(positions):
                    if fits(j - i, n, k):
                        costs[i, j, m, k] = (prefix[j] - prefix[i]) / n
    return costs


def random_instance(seed: int) -> dict:
    """4-8 layers, submeshes drawn from 1-16 devices, 1-64 micro-batches, 1-L positions.

    Latencies are work / devices with noise, rounded so that ties occur; a share of the
    stages (more for long stages and early positions, as memory would) is infeasible."""
    rng = np.random.default_rng(seed)
    num_layers = int(rng.integers(4, 9))
    sizes = sorted(rng.choice(SIZES, size=int(rng.integers(1, 5)), replace=False))
    num_devices = _devices_of_some_stages(rng, sizes, num_layers)
    positions = int(rng.integers(1, num_layers + 1))
    weights = rng.uniform(0.5, 3.0, size=num_layers)
    costs = model_costs(list(weights), [int(n) for n in sizes], positions)
    costs = (costs * rng.uniform(0.8, 1.2, size=costs.shape)).round(2)
    span = np.arange(num_layers + 1)[None, :] - np.arange(num_layers)[:, None]
    pressure = span[:, :, None, None] * (1 + np.arange(positions))[None, None, None, :]
    limit = rng.uniform(num_layers / 2, 3 * num_layers)
    costs[pressure > limit * rng.uniform(0.5, 1.5, size=costs.shape)] = np.inf
    costs[rng.random(costs.shape) < rng.uniform(0.0, 0.3)] = np.inf
    return {
        "costs": costs,
        "submesh_devices": np.array(sizes),
        "num_devices": num_devices,
        "num_micro_batches": int(rng.integers(1, 65)),
        "max_stages": None if rng.random() < 0.7 else int(rng.integers(1, num_layers + 1)),
    }


def _devices_of_some_stages(rng: np.random.Generator, sizes: list[int], num_layers: int) -> int:
    """Mostly the devices of a few stages' submeshes (at most 16), so that some plan can use
    them all; otherwise any count from 1 to 16."""
    if rng.random() < 0.2:
        return int(rng.integers(1, 17))
    total = 0
    for _ in range(int(rng.integers(1, num_layers + 1))):
        fitting = [n for n in sizes if total + n <= 16]
        if not fitting:
            break
        total += int(rng.choice(fitting))
    return max(total, 1)


def synthetic_instance(
    num_layers: int = 96, num_devices: int = 128, positions: int = 16, seed: int = 0
) -> dict:
    """A GPT-like stack on 16 nodes of 8 GPUs: submeshes of 1, 2, 4, 8 devices within a node
    and 2, 4, 8, 16 whole nodes. Latency is work / devices with a parallel-efficiency loss
    (more across nodes); memory holds sharded weights plus one micro-batch of activations
    per stage in flight, so early stages and small submeshes hold fewer layers."""
    rng = np.random.default_rng(seed)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    weights = rng.uniform(0.9, 1.1, size=num_layers)
    weights[-1] = 3.0  # the LM head

    def fits(layers: int, devices: int, after: int) -> bool:
        return (layers * 1.0 + (after + 1) * layers * 0.5) / devices <= 6.0

    costs = model_costs(list(weights), sizes, positions, fits)
    efficiency = np.array([1 + 0.05 * math.log2(n) + (0.1 if n > 8 else 0.0) for n in sizes])
    return {
        "costs": costs * efficiency[None, None, :, None],
        "submesh_devices": np.array(sizes),
        "num_devices": num_devices,
        "num_micro_batches": 64,
    }


# -- checks ----------------------------------------------------------------------------------


def assert_valid(plan: StagePlan, instance: dict) -> None:
    """Contiguous stages covering every layer, all devices used once, latencies read from
    `costs` at each stage's position, and the totals that follow from them."""
    costs, sizes = instance["costs"], instance["submesh_devices"]
    stages = plan.stages
    assert [s.first_layer for s in stages] == [0] + [s.last_layer for s in stages[:-1]]
    assert stages[-1].last_layer == costs.shape[0]
    assert all(s.first_layer < s.last_layer for s in stages)
    assert sum(int(sizes[s.submesh]) for s in stages) == instance["num_devices"]
    assert len(stages) <= min(costs.shape[3], instance.get("max_stages") or costs.shape[0])
    for after, s in enumerate(reversed(stages)):
        assert s.latency == costs[s.first_layer, s.last_layer, s.submesh, after]
        assert math.isfinite(s.latency)
    latencies = [s.latency for s in stages]
    assert plan.t_max == max(latencies)
    assert plan.total_latency == pytest.approx(
        one_chunk_seconds(latencies, instance["num_micro_batches"]), rel=1e-12
    )


def summed(plan: StagePlan) -> float:
    return sum(s.latency for s in plan.stages)


def layout(plan: StagePlan) -> list[tuple[int, int, int]]:
    return [(s.first_layer, s.last_layer, s.submesh) for s in plan.stages]


# -- DP == brute force -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_dp_matches_brute_force(seed: int) -> None:
    instance = random_instance(seed)
    expected = stage_brute_force(**instance)
    got = stage_dp(**instance)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert got.total_latency == pytest.approx(expected.total_latency, rel=1e-9)
    assert_valid(got, instance)
    assert_valid(expected, instance)


@pytest.mark.parametrize("seed", range(15))
def test_fixed_stage_count_matches_brute_force(seed: int) -> None:
    """A pipeline degree the user fixed: exactly that many stages, the best such plan."""
    instance = random_instance(seed)
    most = min(instance["costs"].shape[0], instance["costs"].shape[3])
    for count in range(1, most + 1):
        expected = stage_brute_force(**instance, num_stages=count)
        got = stage_dp(**instance, num_stages=count)
        if expected is None:
            assert got is None
            continue
        assert got is not None and len(got.stages) == count
        assert got.total_latency == pytest.approx(expected.total_latency, rel=1e-9)
        assert_valid(got, instance)


def test_random_instances_exercise_the_interesting_cases() -> None:
    """Guard on the generator: the property test above is only worth something if its
    instances include infeasible ones, optima of several stages on several submesh shapes,
    and optima that give up summed latency for a smaller t_max."""
    instances = [random_instance(seed) for seed in range(30)]
    plans = [stage_brute_force(**instance) for instance in instances]
    assert sum(p is None for p in plans) >= 3
    assert sum(p is not None and len(p.stages) >= 3 for p in plans) >= 5
    assert sum(p is not None and len({s.submesh for s in p.stages}) >= 2 for p in plans) >= 3
    traded = [
        summed(plan) > summed(stage_brute_force(**dict(instance, num_micro_batches=1))) + 1e-9
        for instance, plan in zip(instances, plans)
        if plan is not None
    ]
    assert sum(traded) >= 3


def test_no_sum_of_submeshes_equals_the_cluster() -> None:
    costs = model_costs([1.0, 1.0], [2, 4], positions=2)
    assert stage_dp(costs, np.array([2, 4]), 5, 4) is None
    assert stage_brute_force(costs, np.array([2, 4]), 5, 4) is None


def test_stages_narrower_than_the_cluster_needs_leave_no_plan() -> None:
    """Only 1- and 2-device stages fit, so 3 stages cover at most 6 of 8 devices."""
    costs = model_costs([1.0, 1.0, 1.0], [1, 2, 8], positions=3,
                        fits=lambda layers, devices, after: devices <= 2)
    assert stage_dp(costs, np.array([1, 2, 8]), 8, 4) is None
    assert stage_brute_force(costs, np.array([1, 2, 8]), 8, 4) is None


def test_only_the_widest_feasible_stages_add_up_to_the_cluster() -> None:
    """Stages of at most 2 devices on 8: only the 4-stage plans that put every stage on 2
    devices use them all, whatever a plan of fewer, wider stages would score."""
    weights = [1.0, 3.0, 1.0, 2.0, 1.0]
    costs = model_costs(weights, [1, 2, 4], positions=5,
                        fits=lambda layers, devices, after: devices <= 2)
    instance = dict(costs=costs, submesh_devices=np.array([1, 2, 4]), num_devices=8,
                    num_micro_batches=8)
    plan, expected = stage_dp(**instance), stage_brute_force(**instance)
    assert plan is not None and expected is not None
    assert [s.submesh for s in plan.stages] == [1, 1, 1, 1]
    assert plan.total_latency == pytest.approx(expected.total_latency, rel=1e-12)
    assert_valid(plan, instance)


def test_every_stage_infeasible() -> None:
    costs = np.full((3, 4, 2, 3), np.inf)
    assert stage_dp(costs, np.array([1, 2]), 2, 8) is None


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="L \\+ 1"):
        stage_dp(np.zeros((3, 3, 1, 1)), np.array([1]), 1, 1)
    with pytest.raises(ValueError, match="positive"):
        stage_dp(np.zeros((3, 4, 1, 1)), np.array([0]), 1, 1)
    with pytest.raises(ValueError, match="num_micro_batches"):
        stage_dp(np.ones((3, 4, 1, 1)), np.array([1]), 1, 0)


# -- hand-made plans -------------------------------------------------------------------------


def test_heavy_last_layer_gets_a_stage_of_its_own() -> None:
    """Two 1-device stages: cutting after layer 3 balances 3 + 3 where the even cut
    gives 2 + 4."""
    instance = {
        "costs": model_costs([1.0, 1.0, 1.0, 3.0], [1], positions=2),
        "submesh_devices": np.array([1]),
        "num_devices": 2,
        "num_micro_batches": 4,
    }
    plan = stage_dp(**instance)
    assert layout(plan) == [(0, 3, 0), (3, 4, 0)]
    assert plan.total_latency == pytest.approx(6 + 3 * 3)
    assert_valid(plan, instance)


def test_heavier_stage_gets_more_devices() -> None:
    instance = {
        "costs": model_costs([1.0, 2.0], [1, 2], positions=2),
        "submesh_devices": np.array([1, 2]),
        "num_devices": 3,
        "num_micro_batches": 4,
    }
    plan = stage_dp(**instance)
    assert layout(plan) == [(0, 1, 0), (1, 2, 1)]
    assert plan.total_latency == pytest.approx(2 + 3 * 1)


def test_memory_forces_more_stages_and_shorter_early_ones() -> None:
    """A stage with k stages after it keeps k + 1 micro-batches of activations: here
    layers * (k + 1) <= 3. One 4-device stage (total 1 + 7 * 1) no longer fits; the best
    two-stage plan must put one layer first (total 0.5 + 1.5 + 7 * 1.5); three stages of
    1, 1 and 2 layers on 1, 1 and 2 devices win (total 3 + 7 * 1)."""
    sizes = [1, 2, 4]
    instance = {
        "costs": model_costs([1.0] * 4, sizes, positions=4,
                          fits=lambda layers, devices, after: layers * (after + 1) <= 3),
        "submesh_devices": np.array(sizes),
        "num_devices": 4,
        "num_micro_batches": 8,
    }
    plan = stage_dp(**instance)
    assert layout(plan) == [(0, 1, 0), (1, 2, 0), (2, 4, 1)]
    assert plan.total_latency == pytest.approx(3 + 7 * 1)
    assert_valid(plan, instance)

    two = stage_dp(**instance, max_stages=2)
    assert layout(two) == [(0, 1, 1), (1, 4, 1)]
    assert two.total_latency == pytest.approx(2 + 7 * 1.5)

    unlimited = dict(instance, costs=model_costs([1.0] * 4, sizes, positions=4))
    assert layout(stage_dp(**unlimited)) == [(0, 4, 2)]
    assert stage_dp(**unlimited).total_latency == pytest.approx(1 + 7 * 1)


def test_one_micro_batch_minimises_the_summed_latency() -> None:
    # With B = 1 the bottleneck is free: the cheapest sum wins however unbalanced.
    costs = model_costs([1.0, 1.0, 1.0, 3.0], [1, 2], positions=4)
    costs[0, 4, 1, 0] = 2.5  # one 2-device stage is the cheapest sum, and the slowest stage
    plan = stage_dp(costs, np.array([1, 2]), 2, 1)
    assert layout(plan) == [(0, 4, 1)]
    assert plan.total_latency == pytest.approx(2.5)


# -- the t_max search ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_pruned_search_matches_the_full_sweep(seed: int) -> None:
    """Larger instances than brute force allows (up to 12 layers, 64 devices), many
    micro-batches: the bound-pruned search returns the full sweep's total."""
    rng = np.random.default_rng(1000 + seed)
    sizes = [1, 2, 4, 8, 16, 32, 64][: int(rng.integers(2, 8))]
    num_layers = int(rng.integers(6, 13))
    costs = model_costs(
        list(rng.uniform(0.5, 3.0, size=num_layers)), sizes, positions=num_layers,
        fits=lambda layers, devices, after: layers * (after + 1) <= 4 * devices,
    )
    costs = (costs * rng.uniform(0.7, 1.3, size=costs.shape)).round(3)
    instance = {
        "costs": costs,
        "submesh_devices": np.array(sizes),
        "num_devices": int(rng.choice([n for n in (4, 8, 16, 32, 64) if n >= sizes[-1] // 2])),
        "num_micro_batches": int(rng.choice([1, 2, 8, 64, 512])),
    }
    full = stage_dp(**instance, _prune=False)
    pruned = stage_dp(**instance)
    assert (full is None) == (pruned is None)
    if full is not None:
        assert pruned.total_latency == pytest.approx(full.total_latency, rel=1e-12)
        assert_valid(pruned, instance)


@pytest.mark.parametrize("tolerance", [0.01, 0.1])
def test_t_max_tolerance_stays_within_its_factor(tolerance: float) -> None:
    instance = synthetic_instance(num_layers=24, num_devices=32, positions=8)
    exact = stage_dp(**instance)
    rough = stage_dp(**instance, t_max_tolerance=tolerance)
    assert_valid(rough, instance)
    assert exact.total_latency <= rough.total_latency <= exact.total_latency * (1 + tolerance)


def test_gpt3_depth_on_128_devices_is_planned() -> None:
    """L = 96, 8 submeshes (1-8 devices, 2-16 nodes of 8), 128 devices, 16 positions,
    B = 64: a valid plan (its time is measured in benchmarks/stage_dp_speed.py)."""
    instance = synthetic_instance()
    plan = stage_dp(**instance)
    assert_valid(plan, instance)
