import pytest

from cost_models.memory import (
    FRAMEWORK_RESERVE_BYTES,
    MemoryBreakdown,
    activation_bytes_per_layer,
    in_flight_micro_batches,
    model_state_bytes,
    output_layer_activation_bytes,
    peak_memory_bytes,
)

GB = 1e9
GIB = 2**30

# GPT-3 175B as in Korthikanti et al. 2022: s = 2048, b = 1, h = 12288, a = 96, t = 8.
GPT3 = {"seq_length": 2048, "micro_batch_size": 1, "hidden_size": 12288, "num_attention_heads": 96}
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


# --- activations: Korthikanti et al. 2022, Table 2 --------------------------------------


def test_activations_no_parallelism() -> None:
    # s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes
    expected = 2048 * 1 * 12288 * (34 + 5 * 96 * 2048 / 12288)
    assert expected == 2_868_903_936
    got = activation_bytes_per_layer(**GPT3, flash_attention=False)
    assert got == pytest.approx(expected, rel=0.05)


def test_activations_tensor_parallel() -> None:
    # s b h (10 + 24/t + 5 a s / (h t)) = 2048 * 12288 * (10 + 3 + 10) = 578,813,952 bytes
    expected = 2048 * 12288 * (10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8))
    assert expected == 578_813_952
    got = activation_bytes_per_layer(**GPT3, tensor_parallel=T, flash_attention=False)
    assert got == pytest.approx(expected, rel=0.05)


def test_activations_tensor_sequence_parallel() -> None:
    # s b h (34/t + 5 a s / (h t)) = 2048 * 12288 * (4.25 + 10)
    expected = 2048 * 12288 * (34 / 8 + 5 * 96 * 2048 / (12288 * 8))
    got = activation_bytes_per_layer(
        **GPT3, tensor_parallel=T, sequence_parallel=True, flash_attention=False
    )
    assert got == pytest.approx(expected, rel=0.05)


def test_activations_selective_recompute() -> None:
    # With sequence parallelism: s b h 34/t = 106,954,752 bytes; without: s b h (10 + 24/t).
    kw = {"tensor_parallel": T, "recompute": "selective", "flash_attention": False}
    with_sp = activation_bytes_per_layer(**GPT3, sequence_parallel=True, **kw)
    assert with_sp == pytest.approx(2048 * 12288 * 34 / 8, rel=0.05)
    assert with_sp == pytest.approx(106_954_752, rel=0.05)
    without_sp = activation_bytes_per_layer(**GPT3, **kw)
    assert without_sp == pytest.approx(2048 * 12288 * (10 + 24 / 8), rel=0.05)


def test_activations_full_recompute() -> None:
    # Only the layer input: 2 s b h = 50,331,648 bytes, / t with sequence parallelism.
    kw = {"tensor_parallel": T, "recompute": "full", "flash_attention": False}
    assert activation_bytes_per_layer(**GPT3, **kw) == pytest.approx(2 * 2048 * 12288, rel=0.05)
    with_sp = activation_bytes_per_layer(**GPT3, sequence_parallel=True, **kw)
    assert with_sp == pytest.approx(2 * 2048 * 12288 / 8, rel=0.05)


def test_flash_attention_stores_no_scores() -> None:
    kw = {"tensor_parallel": T, "sequence_parallel": True}
    none = activation_bytes_per_layer(**GPT3, recompute="none", **kw)
    assert none == activation_bytes_per_layer(**GPT3, recompute="selective", **kw)
    assert none == pytest.approx(2048 * 12288 * 34 / 8)


def test_unknown_recompute_mode() -> None:
    with pytest.raises(ValueError, match="'none', 'selective', 'full'"):
        activation_bytes_per_layer(**GPT3, recompute="block")


def test_output_layer_activations() -> None:
    # 4 s b h (1 + v / h) / t with v = 51200: 4 * 2048 * (12288 + 51200) / 8 bytes
    got = output_layer_activation_bytes(2048, 1, 12288, 51200, tensor_parallel=8)
    assert got == pytest.approx(4 * 2048 * (12288 + 51200) / 8)


# --- micro-batches in flight -------------------------------------------------------------


def test_1f1b_first_stage_holds_p_last_holds_one() -> None:
    p, m = 8, 64
    held = [in_flight_micro_batches("1f1b", p, i, m) for i in range(p)]
    assert held == [8, 7, 6, 5, 4, 3, 2, 1]
    # Fewer micro-batches than stages: nobody holds more than m.
    assert in_flight_micro_batches("1f1b", p, 0, num_micro_batches=3) == 3


def test_gpipe_holds_every_micro_batch() -> None:
    for i in range(4):
        assert in_flight_micro_batches("gpipe", 4, i, num_micro_batches=32) == 32


def test_interleaved_factor() -> None:
    p, v, m = 4, 2, 64
    first = in_flight_micro_batches("interleaved", p, 0, m, virtual_stages=v)
    assert first == pytest.approx(p * (1 + (p - 1) / (p * v)))  # 5.5
    assert first == 5.5
    # Last stage: Megatron warms up (v - 1) p = 4 chunk-micro-batches, holds 5 halves.
    assert in_flight_micro_batches("interleaved", p, p - 1, m, virtual_stages=v) == 2.5
    # Capped by the m * v chunk-micro-batches that exist.
    assert in_flight_micro_batches("interleaved", p, 0, 4, virtual_stages=v) == 4
    # One chunk per stage is plain 1F1B.
    assert in_flight_micro_batches("interleaved", p, 1, m) == in_flight_micro_batches(
        "1f1b", p, 1, m
    )


def test_in_flight_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="'gpipe', '1f1b', 'interleaved'"):
        in_flight_micro_batches("zero_bubble", 4, 0, 8)
    with pytest.raises(ValueError, match="stage_index"):
        in_flight_micro_batches("1f1b", 4, 4, 8)
    with pytest.raises(ValueError, match="interleaved"):
        in_flight_micro_batches("1f1b", 4, 0, 8, virtual_stages=2)


# --- peak memory and feasibility ---------------------------------------------------------


def _gpt3_stage_peak(pipeline_parallel: int, stage_index: int) -> MemoryBreakdown:
    """GPT-3 175B, t = 8, selective recompute + sequence parallelism, 1F1B, ZeRO off."""
    params_per_rank = 175e9 / (T * pipeline_parallel)
    layer = activation_bytes_per_layer(
        **GPT3, tensor_parallel=T, sequence_parallel=True, recompute="selective"
    )
    return peak_memory_bytes(
        model_state_bytes(params_per_rank, data_parallel=1, zero_stage=0),
        layer_activation_bytes=layer,
        layers_in_stage=96 // pipeline_parallel,
        micro_batches_in_flight=in_flight_micro_batches("1f1b", pipeline_parallel, stage_index, 64),
    )


def test_plan_that_does_not_fit() -> None:
    # t = 8, no pipeline: 21.9e9 parameters per GPU x 16 bytes = 350 GB > 80 GiB.
    peak = _gpt3_stage_peak(pipeline_parallel=1, stage_index=0)
    assert peak.weights + peak.gradients + peak.optimizer == pytest.approx(175e9 / 8 * 16)
    assert not peak.fits(80 * GIB)


def test_megatron_gpt3_layout_fits() -> None:
    # t = 8, p = 8: 2.73e9 parameters x 16 B = 43.75 GB, plus 12 layers x 8 micro-batches
    # x 107 MB = 10.3 GB of activations, plus the reserve.
    first = _gpt3_stage_peak(pipeline_parallel=8, stage_index=0)
    assert first.activations == pytest.approx(12 * 8 * 2048 * 12288 * 34 / 8)
    assert first.reserve == FRAMEWORK_RESERVE_BYTES
    parts = (first.weights, first.gradients, first.optimizer, first.activations, first.reserve)
    assert first.total == pytest.approx(sum(parts))
    assert first.weights + first.gradients + first.optimizer == pytest.approx(
        16 * (first.weights / 2)
    )
    assert first.fits(80 * GIB)
    assert not first.fits(first.total - 1)
    last = _gpt3_stage_peak(pipeline_parallel=8, stage_index=7)
    assert last.total < first.total
