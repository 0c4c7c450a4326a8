"""The search on a mixed cluster (`planner.search.pool_space`): the layer balance is exact
against brute force, the whole search finds what an exhaustive one finds on a small mixed
cluster, and on a pool too small for the model alone the pipeline across pools wins."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from cost_models.pipeline_memory import StageLayout
from cost_models.step_time import predict_stages
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES, zoo_config
from planner.search import search
from planner.search.alpa_space import MAX_STAGES, shared_knob_groups
from planner.search.megatron_space import rank_key
from planner.search.pool_space import _pool_meshes, balance_layers, search_pools
from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.pools import PooledCluster, load_any

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TINY = TransformerConfig(**FAMILIES["llama"], num_layers=8, hidden_size=256,
                         num_attention_heads=4, vocab_size=256, seq_length=64)
SLOW_CPU = {"name": "slow-cpu", "device": {"name": "slow-cpu", "peak_tflops": {"fp32": 0.06},
                                           "memory_gib": 24, "memory_bandwidth_gbs": 12},
            "devices_per_node": 8, "intra_node": {"bandwidth_gbs": 0.5, "latency_us": 200},
            "inter_node": {"bandwidth_gbs": 1, "latency_us": 100}}


def _cpus(slow_memory_gib: float = 24) -> PooledCluster:
    """Two CPU ranks of the `cpu` preset beside two 0.6x as fast, as `plan check` runs them."""
    slow = {**SLOW_CPU, "device": {**SLOW_CPU["device"], "memory_gib": slow_memory_gib}}
    return PooledCluster.model_validate({
        "name": "fast-slow", "pools": [{"name": "fast", "cluster": "cpu", "devices": 2},
                                       {"name": "slow", "cluster": slow, "devices": 2}],
        "between_pools": {"bandwidth_gbs": 0.5, "latency_us": 200}})


def _brute_balance(slopes, offsets, caps, layers, paced):
    best = None
    for split in itertools.product(*(range(1, min(c, layers) + 1) for c in caps)):
        if sum(split) != layers:
            continue
        times = [a * n + f for a, n, f in zip(slopes, split, offsets)]
        total = sum(times) + paced * max(times)
        if best is None or total < best - 1e-12:
            best = total
    return best


def test_layer_balance_is_brute_force_s_optimum() -> None:
    rng = random.Random(0)
    for _ in range(300):
        p = rng.randint(1, 4)
        layers = rng.randint(p, 10)
        slopes = [rng.choice([0.7, 1.0, 1.5, 2.0, 3.0]) for _ in range(p)]
        offsets = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(p)]
        caps = [rng.randint(1, layers) for _ in range(p)]
        paced = rng.randint(0, 8)
        expected = _brute_balance(slopes, offsets, caps, layers, paced)
        split = balance_layers(slopes, offsets, caps, layers, paced)
        if expected is None:
            assert split is None
            continue
        assert split is not None and sum(split) == layers
        assert all(1 <= n <= c for n, c in zip(split, caps))
        times = [a * n + f for a, n, f in zip(slopes, split, offsets)]
        assert sum(times) + paced * max(times) == pytest.approx(expected, rel=1e-12)


def test_a_faster_stage_takes_more_layers_and_caps_are_kept() -> None:
    # Twice as fast: twice the layers; capped at 4, the rest goes to the slower stage.
    assert balance_layers([1.0, 2.0], [0.0, 0.0], [12, 12], 12, 10) == (8, 4)
    assert balance_layers([1.0, 2.0], [0.0, 0.0], [4, 12], 12, 10) == (4, 8)
    assert balance_layers([1.0, 2.0], [0.0, 0.0], [4, 7], 12, 10) is None


@pytest.mark.parametrize("slow_memory_gib", [24.0, 1.06])
def test_search_finds_the_exhaustive_optimum_on_a_small_mixed_cluster(
        slow_memory_gib: float) -> None:
    """Every pool order, every mesh of each pool and every split of the 8 layers, priced
    whole, under the knob settings the search tries (the first that fits of each
    micro-batch size): the search's best plan is that optimum, step for step. At 1.06 GiB
    the slow pool's memory caps its stage below what its speed would give it."""
    pooled = _cpus(slow_memory_gib)
    fixed = FixedKnobs({"engine": "tessel", "precision": "fp32", "context": 1})
    found, _ = search_pools(TINY, pooled, 32, fixed)
    best = None
    for index in range(2):
        ranked = search(TINY, pooled.pool(index), 32, fixed).ranked
        if ranked and (best is None or rank_key(ranked[0][1]) < rank_key(best)):
            best = ranked[0][1]
    for group in shared_knob_groups(TINY, pooled.pool(1), 32, fixed):
        for shared in group:
            fitted = False
            for order in itertools.permutations(range(2)):
                meshes = [_pool_meshes(TINY, pooled.pool(i), shared, fixed) for i in order]
                for chosen in itertools.product(*meshes):
                    pools = [i for i, (_, _, k) in zip(order, chosen) for _ in range(k)]
                    shapes = [(t, d) for t, d, k in chosen for _ in range(k)]
                    if len(pools) > min(MAX_STAGES, TINY.num_layers,
                                        32 // shared.batch.micro_batch_size):
                        continue
                    for split in itertools.product(range(1, 9), repeat=len(pools)):
                        if sum(split) != TINY.num_layers:
                            continue
                        stages = [StageLayout(n, t, d, i)
                                  for n, (t, d), i in zip(split, shapes, pools)]
                        knobs = shared.but(sequence_parallel=False, tp_comm_overlap=False) \
                            if all(t == 1 for t, _ in shapes) else shared
                        prediction = predict_stages(TINY, pooled, knobs, stages)
                        if prediction.fits:
                            fitted = True
                            if rank_key(prediction) < rank_key(best):
                                best = prediction
            if fitted:
                break
    assert found[0].prediction.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    # Across both pools, the faster pool's stage holding more layers.
    stages = found[0].candidate.stages
    assert found[0].pool is None and {s.pool for s in stages} == {0, 1}
    fast = sum(s.layers for s in stages if s.pool == 0)
    assert fast > TINY.num_layers - fast


def test_a_model_one_pool_cannot_hold_runs_faster_across_both() -> None:
    """Llama 3 70B on a DGX H100 beside a DGX A100 (tests/fixtures/h100-a100.yaml): its
    weights and Adam state (1.1 TB) do not fit in either node's 640 GB, so either alone
    needs its state on the host; the pipeline across both is predicted faster than the
    best single node, its H100 stages holding more layers than its A100 stages."""
    pooled = load_any(str(FIXTURES / "h100-a100.yaml"))
    model = zoo_config("llama3-70b", {})
    found, _ = search_pools(model, pooled, 64, FixedKnobs())
    alone = [plan for plan in found if plan.pool is not None]
    assert len(alone) == 2 and all(plan.candidate.parallel.offload.offload_optimizer != "none"
                                   for plan in alone)
    best = found[0]
    assert best.pool is None and best.prediction.fits
    assert best.prediction.step_time_s < min(plan.prediction.step_time_s for plan in alone)
    stages = best.candidate.stages
    assert sum(s.devices * best.candidate.parallel.dims.context for s in stages) == 16
    per_stage = {pool: [s.layers for s in stages if s.pool == pool] for pool in (0, 1)}
    assert min(per_stage[0]) > max(per_stage[1])
