import pytest

from cost_models.memory import MemoryBreakdown, model_state_bytes
from cost_models.pipeline_memory import stage_memories, uniform_stages
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig

GB = 1e9
GIB = 2**30

T = 8


# --- model state: ZeRO Table 1 (Psi = 7.5B, K = 12) ------------------------------------


@pytest.mark.parametrize(
    "stage, dp, expected_gb",
    [
        # DP 1: 16 bytes per parameter at every stage.
        (0, 1, 120),
        (1, 1, 120),
        (2, 1, 120),
        (3, 1, 120),
        (1, 4, 52.5),
        (2, 4, 41.3),
        (3, 4, 30),
        (1, 16, 35.6),
        (2, 16, 21.6),
        (3, 16, 7.5),
        (0, 64, 120),
        (1, 64, 31.4),
        (2, 64, 16.6),
        (3, 64, 1.88),
        (1, 256, 30.4),
        (2, 256, 15.4),
        (3, 256, 0.47),
        (1, 1024, 30.1),
        (2, 1024, 15.1),
        # The paper prints 0.12 (rounded); 16 B x 7.5e9 / 1024 is 0.117.
        (3, 1024, 0.117),
    ],
)
def test_zero_table1(stage: int, dp: int, expected_gb: float) -> None:
    state = model_state_bytes(7.5e9, data_parallel=dp, zero_stage=stage)
    assert state.total / GB == pytest.approx(expected_gb, rel=0.02)


def test_zero_stage_breakdown() -> None:
    psi, nd = 1e9, 8
    s2 = model_state_bytes(psi, nd, zero_stage=2)
    assert (s2.weights, s2.gradients, s2.optimizer) == (2 * psi, 2 * psi / nd, 12 * psi / nd)
    s3 = model_state_bytes(psi, nd, zero_stage=3)
    assert s3.weights == 2 * psi / nd
    assert s3.total == pytest.approx(16 * psi / nd)


def test_megatron_accounting_with_fp32_grads() -> None:
    # Megatron's theoretical_memory_usage.py: 18 bytes/param, or 6 + 12/d with the
    # distributed optimizer.
    psi, d = 1e9, 16
    plain = model_state_bytes(psi, d, zero_stage=0, grads_bytes=4)
    assert plain.total == pytest.approx(18 * psi)
    dist = model_state_bytes(psi, d, zero_stage=0, distributed_optimizer=True, grads_bytes=4)
    assert dist.total == pytest.approx((6 + 12 / d) * psi)
    assert dist == model_state_bytes(psi, d, zero_stage=1, grads_bytes=4)


def test_model_state_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="0, 1, 2, 3"):
        model_state_bytes(1e9, 8, zero_stage=4)
    with pytest.raises(ValueError, match="stage 1"):
        model_state_bytes(1e9, 8, zero_stage=3, distributed_optimizer=True)
    with pytest.raises(ValueError, match="data_parallel"):
        model_state_bytes(1e9, 0, zero_stage=0)


# Micro-batches in flight: tests/cost_models/test_pipeline_schedule.py (`in_flight`).


# --- peak memory and feasibility ---------------------------------------------------------


def _gpt3_stages(pipeline: int) -> list[MemoryBreakdown]:
    """GPT-3 175B, t = 8, selective recompute + sequence parallelism, 1F1B, ZeRO off, 64
    micro-batches, local attention (the scores written, then recomputed)."""
    model = get_preset("gpt3-175b")
    parallel = ParallelConfig.of(tensor=T, pipeline=pipeline, data=1, micro_batch_size=1,
                              global_batch_size=64, recompute="selective",
                              sequence_parallel=True, attention_backend="local")
    cluster = Cluster.load("dgx-a100-80g").with_devices(T * pipeline)
    stages = uniform_stages(model, parallel, None)
    return stage_memories(model, cluster, parallel, stages)


def test_plan_that_does_not_fit() -> None:
    # t = 8, no pipeline: 21.9e9 parameters per GPU x 18 bytes (Megatron-LM's fp32 main
    # gradients) > 80 GiB.
    (peak,) = _gpt3_stages(pipeline=1)
    assert peak.weights + peak.gradients + peak.optimizer == pytest.approx(
        get_preset("gpt3-175b").num_parameters() / 8 * 18, rel=1e-3)
    assert not peak.fits(80 * GIB)


def test_megatron_gpt3_layout_fits() -> None:
    # t = 8, p = 8: the first stage keeps 12 layers x 8 micro-batches x 34 s b h / t
    # (Korthikanti et al., Table 2, selective with sequence parallelism).
    stages = _gpt3_stages(pipeline=8)
    first = stages[0]
    layers = dict(first.activation_kinds)
    assert sum(layers.values()) == pytest.approx(12 * 8 * 2048 * 12288 * 34 / 8)
    parts = (first.weights, first.gradients, first.optimizer, first.activations,
             first.transient, first.reserve)
    assert first.total == pytest.approx(sum(parts))
    assert first.fits(80 * GIB)
    assert not first.fits(first.total - 1)
    assert stages[-1].activations < first.activations


def test_interleaving_needs_whole_rounds_under_megatron_only() -> None:
    # Megatron-LM refuses m not a multiple of p; torch's Interleaved1F1B (TorchTitan) runs
    # it in rounds, and its memory is walked off the schedule.
    knobs = dict(pipeline=4, data=1, schedule="interleaved", virtual_pipeline=2,
                 global_batch_size=6)
    with pytest.raises(ValueError, match="multiple of pipeline"):
        ParallelConfig.of(**knobs).resolve(4)
    assert ParallelConfig.of(engine="torchtitan", **knobs).resolve(4).num_micro_batches == 6
