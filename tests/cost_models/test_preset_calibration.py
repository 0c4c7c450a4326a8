"""The shipped presets against the published runs they were fitted to, the rows those
tables hold that Tessel cannot price, and the error band every plan carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cost_models.preset_calibration import (
    FITS,
    RATE_FIELDS,
    borrowed,
    held_out_runs,
    leave_one_out,
    predicted_seconds,
    published_runs,
)
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.evidence import prediction_band
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan

REPO = Path(__file__).resolve().parents[2]
DATA = next((p / "calibration" for p in (REPO.parent / "shared", Path("/work/shared"))
             if (p / "calibration" / "nemo_llama3_pretrain.csv").is_file()), None)
needs_data = pytest.mark.skipif(DATA is None, reason="no shared calibration data beside "
                                "the checkout")


@pytest.fixture(scope="module")
def runs():
    return published_runs(DATA)


def _errors(runs, keep) -> np.ndarray:
    chosen = [r for r in runs if keep(r)]
    measured = np.array([r.step.seconds for r in chosen])
    return np.abs(predicted_seconds(chosen) / measured - 1)


@needs_data
def test_megatron_core_h100_table_within_10_percent(runs) -> None:
    rows, _ = runs
    errors = _errors(rows, lambda r: r.source == "megatron-core")
    assert len(errors) == 9
    assert errors.mean() <= 0.10


@needs_data
def test_nemo_rows_within_12_percent_per_system_and_precision(runs) -> None:
    rows, skipped = runs
    groups = {(r.preset, r.precision) for r in rows if r.source == "nemo"}
    assert groups == {("dgx-h100", "FP8"), ("dgx-h100", "FP8-CS"), ("gb200-nvl72", "FP8"),
                      ("gb200-nvl72", "FP8-CS"), ("gb200-nvl72", "MXFP8"),
                      ("dgx-b200", "FP8-CS")}
    for preset, precision in groups:
        errors = _errors(rows, lambda r: (r.preset, r.precision) == (preset, precision))
        assert errors.mean() <= 0.12, (preset, precision)
    # What no preset or pricing covers is listed with its reason, not dropped silently.
    reasons = {s.reason for s in skipped}
    assert reasons == {"DGX-GB300: no cluster preset", "NVFP4: fp4 matmuls are not priced"}
    assert len(rows) + len(skipped) == 9 + 35


@needs_data
def test_a_throughput_row_becomes_the_run_it_describes(runs) -> None:
    """NeMo's Llama 3 70B on 64 H100s, fp8: t4 p8 vp5, one micro-batch, batch 256 of 8192
    tokens at 1,664 tokens/s per GPU."""
    rows, _ = runs
    first = next(r for r in rows if r.preset == "dgx-h100" and r.precision == "FP8")
    q = first.step.parallel
    assert (q.dims.tensor, q.dims.pipeline, q.dims.data, q.pipelining.virtual_pipeline,
            q.pipelining.schedule) == (4, 8, 2, 5, "interleaved")
    assert (q.numerics.precision, q.numerics.fp8_recipe, q.execution.attention_backend,
            q.overlap.tp_comm_overlap) == ("fp8", "tensorwise", "fused", True)
    assert first.step.seconds == pytest.approx(256 * 8192 / (1664 * 64))


@needs_data
def test_gb200s_fsdp_runs_offload_rather_than_recompute(runs) -> None:
    """NeMo's GB200 Llama 3 70B FSDP recipes offload activations to the Grace CPU and
    recompute nothing; other presets' runs keep the least recomputation that fits."""
    rows, _ = runs
    fsdp = [r for r in rows if r.source == "nemo" and r.step.parallel.sharding.zero_stage == 3]
    on_gb200 = [r for r in fsdp if r.preset == "gb200-nvl72"]
    assert len(on_gb200) == 5
    assert {r.step.parallel.recomputation.recompute for r in on_gb200} == {"none"}


def test_b200_borrows_gb200s_sustained_rates() -> None:
    """The shipped dgx-b200 efficiency is gb200-nvl72's at the same sustained FLOP/s and
    bytes/s (`borrowed`): the same Blackwell GPU, its lower clock in its peaks."""
    gb200, b200 = Cluster.load("gb200-nvl72").device, Cluster.load("dgx-b200").device
    lent = borrowed(gb200.efficiency, "gb200-nvl72", "dgx-b200").model_dump()
    assert b200.efficiency.model_dump() == pytest.approx(lent, rel=1e-3)  # 4 digits shipped
    for field, peak in RATE_FIELDS.items():
        rate = getattr(b200.efficiency, field) * b200.peak_tflops[peak]
        assert rate == pytest.approx(getattr(gb200.efficiency, field) * gb200.peak_tflops[peak],
                                     rel=1e-3)
    assert b200.efficiency.memory == gb200.efficiency.memory  # both 8 TB/s of HBM3e


def test_a_fit_moves_no_more_parameters_than_it_has_runs() -> None:
    blackwell = next(f for f in FITS if f.preset == "gb200-nvl72")
    assert blackwell.determined(1) == ("fp8_matmul",)
    assert blackwell.determined(9) == blackwell.fields


@needs_data
def test_each_blackwell_run_left_out_of_the_fit_is_within_10_percent(runs) -> None:
    """Each NeMo GB200 run predicted by a fit of the other nine (and the B200 run, which
    no fit sees), short fits."""
    rows, _ = runs
    blackwell = next(f for f in FITS if f.preset == "gb200-nvl72")
    held = held_out_runs(rows, blackwell)
    assert [r.preset for r in held].count("dgx-b200") == 1 and len(held) == 11
    guessed = leave_one_out(rows, blackwell, iterations=60)
    measured = np.array([r.step.seconds for r in held])
    assert np.all(np.abs(guessed / measured - 1) <= 0.10)


@pytest.mark.parametrize(("cluster", "calibrated"), [("dgx-h100", True), ("mi300x", False)])
def test_every_plan_carries_its_band_and_says_what_it_was_calibrated_on(
        cluster: str, calibrated: bool) -> None:
    sized = Cluster.load(cluster).with_devices(64)
    config = ParallelConfig.of(tensor=8, pipeline=1, micro_batch_size=1, global_batch_size=256,
                            sequence_parallel=True, recompute="full").resolve(64)
    model = get_preset("gpt3-13b")
    plan = training_plan("gpt3-13b", model, sized, config, [40])
    # The band of the run's kind (planner.vocabulary.evidence), widened where uncalibrated.
    band = prediction_band("megatron", model, sized.device.name, calibrated)
    low, high = band.low, band.high
    p = plan.predicted
    assert p.step_time_band_s == pytest.approx((p.step_time_s * low, p.step_time_s * high))
    assert p.tokens_per_s_band == pytest.approx((p.tokens_per_s / high, p.tokens_per_s / low))
    assert plan.provenance.calibration.startswith("uncalibrated") != calibrated
    if calibrated:
        assert "Megatron-Core" in plan.provenance.calibration
