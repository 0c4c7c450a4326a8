"""Calibration: reading measured runs, the optimizer, rank correlation, and a fit that
recovers efficiency parameters from step times they generated."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_models.calibrate import (
    fit_efficiency,
    mape,
    nelder_mead,
    predict_all,
    read_measurements,
    spearman,
    vtrain_cluster,
)
from cost_models.efficiency import Efficiency
from planner.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
SINGLE = next(
    (p for p in (REPO.parent / "shared", Path("/work/shared"))
     if (p / "calibration" / "vtrain_a100_single_node.csv").is_file()),
    None,
)


def test_nelder_mead_finds_the_minimum_of_a_shifted_bowl() -> None:
    target = np.array([1.5, -2.0, 0.25])
    found = nelder_mead(lambda x: float(np.sum((x - target) ** 2)), np.zeros(3),
                        iterations=500, tolerance=1e-14)
    assert found == pytest.approx(target, abs=1e-4)


def test_spearman_ranks() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, a**3) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # Ties share their average rank: ranks (1.5, 1.5, 3, 4) against (1, 2, 3, 4).
    assert spearman(np.array([1.0, 1.0, 2.0, 3.0]), a) == pytest.approx(0.9486832980505138)


@pytest.mark.skipif(SINGLE is None, reason="no shared calibration data beside the checkout")
def test_measurements_become_megatron_configurations() -> None:
    steps = read_measurements(SINGLE / "calibration" / "vtrain_a100_single_node.csv")
    assert len(steps) == 1440
    first = steps[0]  # 2 GPUs: h 1024, 16 heads, 24 layers, s 1024, t1 d1 p2, mb 8, gbs 16
    assert (first.model.hidden_size, first.model.num_layers, first.model.seq_length) == (
        1024, 24, 1024
    )
    q = first.parallel
    assert (q.tensor, q.data, q.pipeline, q.micro_batch_size, q.global_batch_size) == (
        1, 1, 2, 8, 16
    )
    assert first.seconds == pytest.approx(0.372160408)
    # GPT-2's 50257 tokens padded to a multiple of 128 x tensor parallel, as Megatron does:
    # 393 x 128 = 50304 at t = 1, 50 x 1024 = 51200 at t = 8.
    assert {s.model.vocab_size for s in steps if s.parallel.tensor == 1} == {50304}
    assert {s.model.vocab_size for s in steps if s.parallel.tensor == 8} == {51200}


@pytest.mark.skipif(SINGLE is None, reason="no shared calibration data beside the checkout")
def test_fit_recovers_the_efficiency_that_made_the_times() -> None:
    steps = read_measurements(SINGLE / "calibration" / "vtrain_a100_single_node.csv")[::36]
    cluster = vtrain_cluster(Cluster.load("dgx-a100-80g"))
    truth = Efficiency(matmul=0.55, memory=0.6, kernel_overhead_us=20.0)
    made = predict_all(steps, cluster, truth)
    synthetic = [replace(step, seconds=float(t)) for step, t in zip(steps, made)]
    start = Efficiency(matmul=0.7, memory=0.8, kernel_overhead_us=5.0)
    fitted, error = fit_efficiency(
        synthetic, cluster.with_efficiency(start),
        fields=("matmul", "memory", "kernel_overhead_us"), iterations=400,
    )
    assert error < 2e-3
    assert fitted.matmul == pytest.approx(0.55, rel=0.02)
    assert fitted.kernel_overhead_us == pytest.approx(20.0, rel=0.05)
    assert mape(predict_all(synthetic, cluster, fitted), made) < 2e-3


@pytest.mark.skipif(SINGLE is None, reason="no shared calibration data beside the checkout")
def test_plan_calibrate_prints_the_fitted_block(tmp_path: Path, capsys) -> None:
    from planner import cli

    rows = (SINGLE / "calibration" / "vtrain_a100_single_node.csv").read_text().splitlines()
    small = tmp_path / "runs.csv"
    small.write_text("\n".join(rows[:25]) + "\n")
    code = cli.main(["calibrate", str(small), "--fields", "kernel_overhead_us",
                     "--iterations", "40"])
    out = capsys.readouterr().out
    assert code == 0
    assert "over 24 runs" in out and "efficiency:" in out and "kernel_overhead_us:" in out
