"""The band a prediction carries: its kind's own where published runs measured it, else
the nearest measured kind's, widened, with words saying which."""

from __future__ import annotations

import pytest

from planner.models.presets import PRESETS
from planner.vocabulary.evidence import (
    UNCALIBRATED,
    Band,
    band_for,
    family_of,
    generation_of,
    prediction_band,
    shipped_bands,
)

BANDS = (
    Band(engine="megatron", family="dense", generation="hopper", low=0.9, high=1.1, rows=15,
         method="5th-95th percentile", held_out="each model left out of the fit"),
    Band(engine="megatron", family="moe", generation="blackwell", low=0.8, high=1.05, rows=2,
         method="90% interval, spread pooled", held_out="each left out of the MoE fit"),
    Band(engine="torchtitan", family="dense", generation="hopper", low=0.85, high=1.12,
         rows=2, method="90% interval, spread pooled", held_out="each left out of the fit"),
)


def test_families_and_generations_are_read_from_models_and_device_names() -> None:
    assert family_of(PRESETS["llama3-70b"]) == "dense"
    assert family_of(PRESETS["qwen3-235b-a22b"]) == "moe"
    assert family_of(PRESETS["deepseek-v3"]) == "mla"
    assert family_of(None) == "dense"
    assert [generation_of(n) for n in ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB",
                                       "GB200-Blackwell", "B200-180GB", "V100-SXM2-16GB")] \
        == ["ampere", "hopper", "hopper", "blackwell", "blackwell", "volta"]
    assert generation_of("MI300X-192GB") == "mi300x-192gb"
    assert generation_of("GB300-NVL72") == generation_of("B300") == "blackwell-ultra"


def test_a_measured_kind_gets_its_own_band() -> None:
    band = band_for("torchtitan", "dense", "hopper", BANDS)
    assert band == BANDS[2]
    assert band.words() == ("TorchTitan, dense on Hopper: 2 published runs, each left out of "
                            "the fit; -15%/+12% (90% interval, spread pooled)")


def test_a_kind_without_runs_borrows_the_nearest_and_is_wider() -> None:
    # MoE on B300 (Blackwell too) has no run: Megatron-LM's MoE on Blackwell is nearest.
    band = band_for("megatron", "mla", "blackwell", BANDS)
    assert band.rows == 0 and band.borrowed_from == "Megatron-LM, MoE on Blackwell"
    assert band.low == pytest.approx(0.8 ** 2) and band.high == pytest.approx(1.05 ** 2)
    assert band.words().startswith("Megatron-LM, MLA+MoE on Blackwell: no published run; "
                                   "-36%/+10%, the band of Megatron-LM, MoE on Blackwell "
                                   "(2 runs) widened 2x")
    # TorchTitan's MoE on Hopper: the same engine's dense runs on the same GPUs (distance 2)
    # before Megatron-LM's MoE runs a generation away (2 + 1).
    assert band_for("torchtitan", "moe", "hopper", BANDS).borrowed_from == \
        "TorchTitan, dense on Hopper"


def test_an_uncalibrated_device_spans_at_least_the_stated_band() -> None:
    band = prediction_band("megatron", PRESETS["llama3-8b"], "H100-SXM5-80GB",
                           calibrated=False, bands=BANDS)
    assert band.rows == 0
    assert (band.low, band.high) == UNCALIBRATED
    assert "typical values" in band.words()
    assert prediction_band("megatron", PRESETS["llama3-8b"], "H100-SXM5-80GB",
                           calibrated=True, bands=BANDS) == BANDS[0]


def test_every_kind_without_rows_prints_a_wider_band_than_its_source() -> None:
    shipped = shipped_bands()
    assert {(b.engine, b.family, b.generation) for b in shipped} >= {
        ("megatron", "dense", "ampere"), ("megatron", "dense", "hopper"),
        ("megatron", "dense", "blackwell")}
    measured = {b.kind: b for b in shipped}
    for engine in ("megatron", "torchtitan", "deepspeed", "tessel"):
        for family in ("dense", "moe", "mla"):
            for generation in ("ampere", "hopper", "blackwell", "blackwell-ultra", "volta",
                               "mi300x-192gb"):
                band = band_for(engine, family, generation)
                if band.rows:
                    continue
                source = measured[band.borrowed_from]
                assert band.low < source.low and band.high > source.high, band.kind


def test_offload_and_adapter_plans_span_the_finetune_runs_errors() -> None:
    """FINETUNE_OFFLOAD covers every published fine-tuning and offload run's measured over
    predicted step time and DeepSpeed's Figure 5 held out beside them
    (benchmarks/finetune_accuracy.py), and a plan that offloads or
    trains adapters gets at least it, saying why."""
    from cost_models.published_finetune import azure_175b_figure5, predict, read_runs
    from planner.vocabulary.evidence import FINETUNE_OFFLOAD, prediction_band

    runs, _ = read_runs()
    ratios = [1 + predict(run).speed_error for run in runs + azure_175b_figure5()]
    low, high = FINETUNE_OFFLOAD
    assert low <= min(ratios) and max(ratios) <= high
    assert min(ratios) - low < 0.02 and high - max(ratios) < 0.02  # not wider than they say
    band = prediction_band("megatron", None, "H100-SXM5-80GB", True, offload_or_adapters=True)
    assert band.low <= low and band.high == high
    assert "fine-tuning and offload runs span" in band.method
    plain = prediction_band("megatron", None, "H100-SXM5-80GB", True)
    assert plain.high < high
