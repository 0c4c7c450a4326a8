"""Calibration: reading measured runs, the optimizer, rank correlation, and a fit that
recovers efficiency parameters from step times they generated."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_models.efficiency_fit import (
    MAX_ITERATIONS,
    fit_efficiency,
    mape,
    nelder_mead,
    predict_all,
    read_measurements,
    spearman,
    vtrain_cluster,
)
from planner.vocabulary.efficiency import Efficiency
from planner.vocabulary.cluster import Cluster

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
    q, d = first.parallel, first.parallel.dims
    assert (d.tensor, d.data, d.pipeline, q.batch.micro_batch_size, q.batch.global_batch_size) == (
        1, 1, 2, 8, 16
    )
    assert first.seconds == pytest.approx(0.372160408)
    # GPT-2's 50257 tokens padded to a multiple of 128 x tensor parallel, as Megatron does:
    # 393 x 128 = 50304 at t = 1, 50 x 1024 = 51200 at t = 8.
    assert {s.model.vocab_size for s in steps if s.parallel.dims.tensor == 1} == {50304}
    assert {s.model.vocab_size for s in steps if s.parallel.dims.tensor == 8} == {51200}


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


# --- Garbage refused (issue 10, family 6): every bad input is one sentence naming it. ---

HEADER = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
)
GOOD_ROW = "2,16,8,1024,16,24,1024,1,1,2,372.16"


def _csv(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_good_row_is_read_with_its_line(tmp_path: Path) -> None:
    (step,) = read_measurements(_csv(tmp_path, GOOD_ROW))
    assert (step.num_gpus, step.line, step.label) == (2, 2, "h1024 L24")
    assert step.seconds == pytest.approx(0.37216)
    d = step.parallel.dims
    assert (d.tensor, d.pipeline, d.data) == (1, 2, 1)


def test_empty_csv_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty.csv is empty; give a CSV whose header"):
        read_measurements(empty)
    with pytest.raises(ValueError, match=r"runs.csv has a header but no measurements"):
        read_measurements(_csv(tmp_path))


def test_missing_columns_are_named(tmp_path: Path) -> None:
    header = HEADER.removesuffix(",iteration time (ms)")
    with pytest.raises(ValueError) as error:
        read_measurements(_csv(tmp_path, "2,16,8,1024,16,24,1024,1,1,2", header=header))
    message = str(error.value)
    assert "runs.csv lacks the column 'iteration time (ms)'" in message
    assert "'pipeline parallelism'" in message  # the header it has
    assert "\n" not in message


@pytest.mark.parametrize(
    "row, fragment",
    [
        # A row short of a value, or with one too many.
        ("2,16,8,1024,16,24,1024,1,1,2", "line 3 has no value in column 'iteration time (ms)'"),
        ("2,16,8,1024,16,24,1024,1,1,2,372,9", "line 3 has 12 values for the header's 11"),
        ("2,16,8,abc,16,24,1024,1,1,2,372", "line 3, column 'hidden size': 'abc' is not a "
         "positive whole number"),
        ("2,16,8,1024,16,24,1024,1.5,1,2,372", "column 'tensor parallelism': '1.5'"),
        # Zero or negative degrees.
        ("2,16,8,1024,16,24,1024,0,1,2,372", "column 'tensor parallelism': '0' is not a "
         "positive whole number"),
        ("2,16,8,1024,16,24,1024,1,-1,2,372", "column 'data parallelism': '-1'"),
        ("0,16,8,1024,16,24,1024,1,1,2,372", "column '# GPUs': '0'"),
        ("2,16,8,1024,16,24,1024,1,1,nan,372", "column 'pipeline parallelism': 'nan'"),
        # Zero, negative, NaN, infinite or unparseable times.
        ("2,16,8,1024,16,24,1024,1,1,2,0", "column 'iteration time (ms)': '0' is not a "
         "measured time (a positive, finite number of milliseconds)"),
        ("2,16,8,1024,16,24,1024,1,1,2,-94", "'iteration time (ms)': '-94'"),
        ("2,16,8,1024,16,24,1024,1,1,2,nan", "'iteration time (ms)': 'nan'"),
        ("2,16,8,1024,16,24,1024,1,1,2,inf", "'iteration time (ms)': 'inf'"),
        ("2,16,8,1024,16,24,1024,1,1,2,1e999", "'iteration time (ms)': '1e999'"),
        ("2,16,8,1024,16,24,1024,1,1,2,fast", "'iteration time (ms)': 'fast'"),
        # Degrees that do not fit the row's GPUs, shapes no model has.
        ("4,16,8,1024,16,24,1024,1,1,2,372", "line 3 is not a run Tessel can predict: tensor "
         "(1) x pipeline (2) x context (1) x data (1) must multiply to the 4 GPUs"),
        ("2,12,8,1024,16,24,1024,1,1,2,372", "global batch (12) must be a multiple of micro "
         "batch (8)"),
        ("2,16,8,1000,16,24,1024,1,1,2,372", "hidden_size (1000) must be divisible by "
         "num_attention_heads (16)"),
        ("2,16,8,1024,16,1,1024,1,1,2,372", "pipeline parallelism 2 is more stages than the 1"),
    ],
)
def test_bad_rows_are_named_by_line_column_and_value(
    tmp_path: Path, row: str, fragment: str
) -> None:
    with pytest.raises(ValueError) as error:
        read_measurements(_csv(tmp_path, GOOD_ROW, row))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'runs.csv'} line 3")
    assert fragment in message
    assert "\n" not in message


def test_a_file_that_is_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ValueError, match="runs.csv is not a text CSV file"):
        read_measurements(path)


def test_fit_refuses_bad_times_and_settings(tmp_path: Path) -> None:
    (step,) = read_measurements(_csv(tmp_path, GOOD_ROW))
    cluster = Cluster.load("dgx-a100-80g")
    for seconds in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=rf"line 2 has measured time {seconds!r} s"):
            fit_efficiency([replace(step, seconds=seconds)], cluster, ("matmul",), 1)
    with pytest.raises(ValueError, match="no measured runs to fit to"):
        fit_efficiency([], cluster)
    with pytest.raises(ValueError, match="no parameters to fit"):
        fit_efficiency([step], cluster, (), 1)
    with pytest.raises(ValueError, match="cannot fit bogus; choose parameters from matmul"):
        fit_efficiency([step], cluster, ("bogus",), 1)
    with pytest.raises(ValueError, match="matmul is named more than once"):
        fit_efficiency([step], cluster, ("matmul", "matmul"), 1)
    for iterations in (0, -3, MAX_ITERATIONS + 1):
        with pytest.raises(ValueError, match=rf"iterations {iterations} is out of range; "
                           rf"give 1 to {MAX_ITERATIONS}"):
            fit_efficiency([step], cluster, ("matmul",), iterations)


def test_a_fit_with_a_non_finite_error_fits_nothing(tmp_path: Path, monkeypatch) -> None:
    import cost_models.efficiency_fit as calibrate

    steps = read_measurements(_csv(tmp_path, GOOD_ROW))
    monkeypatch.setattr(calibrate, "predict_all", lambda *a, **k: np.array([math.nan]))
    with pytest.raises(ValueError, match="error of nan, so it fitted nothing"):
        fit_efficiency(steps, Cluster.load("dgx-a100-80g"), ("matmul",), 3)


def _plan(argv: list[str], capsys) -> tuple[int, str]:
    from planner import cli

    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(
    "rows, extra, fragments",
    [
        ((), [], ["has a header but no measurements"]),
        ((GOOD_ROW, "2,16,8,1024,16,24,1024,1,1,2,0"), [], ["line 3", "'0'"]),
        ((GOOD_ROW, "2,16,8,1024,16,24,1024,1,1,2,-94"), [], ["line 3", "'-94'"]),
        ((GOOD_ROW, "2,16,8,1024,16,24,1024,1,1,2,nan"), [], ["line 3", "'nan'"]),
        ((GOOD_ROW, "2,16,8,1024,16,24,1024,1,1,2"), [], ["line 3", "no value"]),
        (("12,12,1,1024,16,24,1024,1,12,1,372",), [],
         ["line 2", "8 devices per node", "12 devices"]),
        ((GOOD_ROW,), ["--iterations", "0"], ["--iterations 0 must be from 1"]),
        ((GOOD_ROW,), ["--iterations", "100000000"], ["--iterations 100000000", "1 to 100,000"]),
        ((GOOD_ROW,), ["--fields", ""], ["--fields '': no parameters to fit"]),
        ((GOOD_ROW,), ["--fields", " , "], ["--fields ' , ': no parameters to fit"]),
        ((GOOD_ROW,), ["--fields", "matmul,matmul"],
         ["--fields 'matmul,matmul': matmul is named more than once"]),
        ((GOOD_ROW,), ["--fields", "bogus"], ["--fields 'bogus': cannot fit bogus"]),
    ],
)
def test_plan_calibrate_refuses_garbage_in_one_line(
    tmp_path: Path, capsys, piped_width, rows, extra, fragments
) -> None:
    path = _csv(tmp_path, *rows)
    code, output = _plan(["calibrate", str(path), *extra], capsys)
    assert code == 2
    assert "Traceback" not in output and "fitted" not in output and "MAPE" not in output
    assert len(output.strip().splitlines()) == 1, output
    for fragment in fragments:
        assert fragment in output


def test_plan_calibrate_refuses_an_empty_file_and_a_folder(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    code, output = _plan(["calibrate", str(empty)], capsys)
    assert code == 2 and "empty.csv is empty" in output
    code, output = _plan(["calibrate", str(tmp_path)], capsys)
    assert code == 2 and "is a folder, not a CSV file" in output
