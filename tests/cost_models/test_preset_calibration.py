"""The shipped presets against the published runs they were fitted to, the rows those
tables hold that Tessel cannot price, and the error band every plan carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cost_models.preset_calibration import predicted_seconds, published_runs, step_time_ratio
from planner.vocabulary.cluster import UNCALIBRATED_STEP_TIME_RATIO, Cluster, step_time_band
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


def test_the_band_is_the_calibration_percentiles_or_the_stated_one() -> None:
    ratio = step_time_ratio(np.ones(11), np.linspace(0.9, 1.1, 11))
    assert ratio == pytest.approx((0.92, 1.08))
    h100, mi300x = Cluster.load("dgx-h100"), Cluster.load("mi300x")
    assert step_time_band(h100.device) == h100.device.calibration.step_time_ratio
    assert step_time_band(mi300x.device) == UNCALIBRATED_STEP_TIME_RATIO


@pytest.mark.parametrize(("cluster", "calibrated"), [("dgx-h100", True), ("mi300x", False)])
def test_every_plan_carries_its_band_and_says_what_it_was_calibrated_on(
        cluster: str, calibrated: bool) -> None:
    sized = Cluster.load(cluster).with_devices(64)
    config = ParallelConfig.of(tensor=8, pipeline=1, micro_batch_size=1, global_batch_size=256,
                            sequence_parallel=True, recompute="full").resolve(64)
    plan = training_plan("gpt3-13b", get_preset("gpt3-13b"), sized, config, [40])
    low, high = step_time_band(sized.device)
    p = plan.predicted
    assert p.step_time_band_s == pytest.approx((p.step_time_s * low, p.step_time_s * high))
    assert p.tokens_per_s_band == pytest.approx((p.tokens_per_s / high, p.tokens_per_s / low))
    assert plan.provenance.calibration.startswith("uncalibrated") != calibrated
    if calibrated:
        assert "Megatron-Core" in plan.provenance.calibration
