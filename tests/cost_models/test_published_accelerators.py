"""Every row of ../shared/calibration/published_accelerators.csv predicted with its published
configuration (`cost_models.published_accelerators`), as benchmarks/accelerator_accuracy.py
prints it: every row within 15% of its measured tokens per second per chip, the TPU presets'
matmul efficiency the fit of the TPU rows (each TPU row within 15% when the fit does not see
it), GB300's and Trainium 1's presets their one row's fit, and those rows as far off as they
are without it (their held-out errors, which the evidence's bands carry)."""

from __future__ import annotations

import csv

import pytest

from cost_models.published_accelerators import (
    CSV,
    TARGET,
    TPU_PRESETS,
    SCALED,
    AcceleratorRun,
    fit_scale,
    fit_tpu_matmul,
    held_out,
    maxtext_default_decoder,
    maxtext_flops_per_token,
    maxtext_recompute,
    predict,
    predict_scaled,
    read_runs,
    scaled,
)
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster

# (CSV line, chips) -> predicted over measured tokens/s per chip, less one, as the
# benchmark prints it today (the shipped presets; TPU matmul 0.735, GB300 x 1.39, trn1 x 0.415).
ERRORS = {
    (2, 64): +0.004,     # Llama 3.1 70B, 64 TPU7x chips
    (3, 256): +0.058,    # Llama 3.1 70B, v6e-256
    (4, 256): +0.099,    # Llama 3.1 8B, v6e-256
    (5, 64): -0.070,     # MaxText 32B decoder, v5p-128
    (5, 128): -0.052,    # the same on 2x v5p-128 over DCN
    (6, 64): -0.001,     # Llama 3 70B fp8, 64 GB300 (its preset's one-row fit)
    (7, 512): -0.001,    # Llama 3.1 8B, 512 Trainium 1 chips (its preset's one-row fit)
}
HELD_OUT = {6: -0.219, 7: +0.775}
"""The one-row fits' rows predicted from what their presets start from (GB200's fit,
typical values)."""


@pytest.fixture(scope="module")
def runs() -> list[AcceleratorRun]:
    runs, unpriced = read_runs()
    assert unpriced == []  # every row is described; none dropped
    return runs


def test_every_row_is_read(runs: list[AcceleratorRun]) -> None:
    with CSV.open(encoding="utf-8") as handle:
        lines = set(range(2, 2 + sum(1 for _ in csv.DictReader(handle))))
    assert {run.line for run in runs} == lines
    assert {(run.line, run.chips) for run in runs} == set(ERRORS)


def test_each_prediction_is_the_benchmarks(runs: list[AcceleratorRun]) -> None:
    for run in runs:
        error = predict(run).error
        assert error == pytest.approx(ERRORS[run.line, run.chips], abs=0.01), run.name
        assert abs(error) <= TARGET, run.name


def test_the_tpu_presets_ship_the_fit_and_each_row_holds_out(
        runs: list[AcceleratorRun]) -> None:
    fitted = fit_tpu_matmul(runs)
    assert {Cluster.load(p).device.efficiency.matmul for p in TPU_PRESETS} == {fitted}
    left_out = held_out(runs)
    assert set(left_out) == {2, 3, 4, 5}  # the TPU rows
    for run in runs:
        if run.tpu:
            assert abs(predict(run, left_out[run.line]).error) <= TARGET, run.name


def test_gb300_and_trainium_ship_their_rows_fit_and_say_how_far_off_it_held_out(
        runs: list[AcceleratorRun]) -> None:
    for preset in SCALED:
        scale = fit_scale(runs, preset)
        shipped = Cluster.load(preset).device.efficiency
        for field in SCALED[preset][1]:
            assert getattr(shipped, field) == pytest.approx(getattr(scaled(preset, scale),
                                                                    field), abs=1e-4)
        assert Cluster.load(preset).device.calibration is not None
    for run in runs:
        if run.line in HELD_OUT:
            assert predict_scaled(run, 1.0).error == pytest.approx(HELD_OUT[run.line],
                                                                   abs=0.01), run.name


def test_maxtexts_flop_count_is_the_v6e_logs_ratio() -> None:
    # tpu-recipes-v0.1.4's v6e logs give TFLOP/s/device and tokens/s/device: their ratio
    # is MaxText's count of a token's FLOPs then, attention not halved for causality.
    with CSV.open(encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if "v6e" in row["hardware"]]
    for row in rows:
        measures = dict(zip(row["metric"].split(";"), map(float, row["value"].split(";")),
                            strict=True))
        ratio = measures["TFLOP/s/device"] * 1e12 / measures["tokens/s/device"]
        model = zoo_config("llama3-70b" if "70B" in row["model"] else "llama3-8b")
        assert maxtext_flops_per_token(model) == pytest.approx(ratio, rel=2e-4)
        assert maxtext_flops_per_token(model, causal=True) < ratio


def test_maxtexts_default_decoder_at_scale_32() -> None:
    model = maxtext_default_decoder(32, 2048)
    assert (model.num_layers, model.hidden_size, model.num_attention_heads,
            model.num_kv_heads, model.ffn_hidden_size, model.vocab_size) == (
        32, 8192, 64, 64, 28672, 32000)
    assert model.num_parameters() == pytest.approx(31.66e9, rel=1e-3)  # "32B"
    with pytest.raises(ValueError, match="power of 2"):
        maxtext_default_decoder(24, 2048)


def test_remat_policies_map_to_the_nearest_recomputation() -> None:
    assert maxtext_recompute("full") == {"recompute": "full"}
    assert maxtext_recompute("minimal")["recompute_modules"] == ("core_attn", "layernorm")
    # Ironwood's 70B recipe keeps the attention context: its core is not replayed.
    assert maxtext_recompute("custom", frozenset({"decoder_layer_input", "context"}))[
        "recompute_modules"] == ("mlp", "layernorm")
    assert maxtext_recompute("custom", frozenset({"query_proj"}))["recompute_modules"] == (
        "core_attn", "mlp", "layernorm")
    with pytest.raises(ValueError, match="save_qkv_proj"):
        maxtext_recompute("save_qkv_proj")


def test_rows_are_put_in_chips(runs: list[AcceleratorRun]) -> None:
    by_key = {(run.line, run.chips): run for run in runs}
    ironwood = by_key[2, 64]  # 2 sequences per JAX device, 2 devices a chip
    assert ironwood.parallel.batch.global_batch_size == 2 * 2 * 64 == 256
    assert ironwood.parallel.sharding.zero_stage == 3 and ironwood.parallel.dims.data == 64
    one, two = by_key[5, 64], by_key[5, 128]  # v5p-128 = 64 chips; 2 slices over DCN
    assert (one.parallel.dims.tensor, one.parallel.dims.data) == (4, 16)
    assert one.parallel.batch.micro_batch_size == 6 * 64 // 16
    assert (two.cluster.devices_per_node, two.cluster.num_nodes) == (64, 2)
    trainium = by_key[7, 512]  # TP=32 NeuronCores = 16 chips
    assert (trainium.parallel.dims.tensor, trainium.parallel.dims.data) == (16, 32)
    assert trainium.tokens_per_s_per_chip == pytest.approx(47.95 * 8192 / 512)
