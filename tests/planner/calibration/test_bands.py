"""A kind's band from its rows' held-out errors: percentiles with many rows, a pooled 90%
interval with few, each checked against the numbers worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.calibration import bands_of
from planner.calibration.bands import MANY_ROWS, draw_band, pooled_spread
from planner.calibration.evidence_rows import EvidenceRow


def row(kind: tuple[str, str, str], held_out: float) -> EvidenceRow:
    return EvidenceRow(*kind, source="x.csv line 2", label="run", shipped=held_out,
                       held_out=held_out, how="each left out")


def test_many_rows_give_their_5th_and_95th_percentiles() -> None:
    ratios = np.linspace(0.8, 1.2, 21)  # 0.80, 0.82, ..., 1.20
    low, high, how = draw_band(ratios, spread=0.5)
    # numpy's linear percentiles of 21 evenly spaced points: index 1 and 19.
    assert (low, high) == pytest.approx((0.82, 1.18))
    assert how == "5th-95th percentile"


def test_few_rows_pool_their_spread_with_every_rows() -> None:
    ratios = np.array([0.9, 1.1])
    low, high, how = draw_band(ratios, spread=0.05)
    logs = [math.log(0.9), math.log(1.1)]
    mean = sum(logs) / 2
    own = sum((x - mean) ** 2 for x in logs)
    # (own squared deviations + 2 pseudo-rows of 0.05^2) over (n - 1 + 2) degrees.
    sigma = math.sqrt((own + 2 * 0.05 ** 2) / 3)
    half = 1.6449 * sigma * math.sqrt(1 + 1 / 2)
    assert (low, high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))
    assert how == "90% interval, spread pooled"


def test_one_row_is_its_error_give_or_take_the_pooled_spread() -> None:
    low, high, _ = draw_band(np.array([1.2]), spread=0.1)
    half = 1.6449 * 0.1 * math.sqrt(2)
    assert (low, high) == pytest.approx((1.2 * math.exp(-half), 1.2 * math.exp(half)))
    assert low < 1.2 < high


def test_the_pooled_spread_is_around_each_kinds_own_mean() -> None:
    # Two kinds off by +10% and -10% but each tight: the spread is their own, not 10%.
    spread = pooled_spread([np.log([1.09, 1.11]), np.log([0.89, 0.91])])
    # Each kind's two rows sit +-d around its mean: 2 d1^2 + 2 d2^2 over 1 + 1 degrees.
    d1, d2 = math.log(1.11 / 1.09) / 2, math.log(0.91 / 0.89) / 2
    assert spread == pytest.approx(math.sqrt(d1 ** 2 + d2 ** 2))
    assert spread < 0.02


def test_bands_are_drawn_per_kind_and_count_their_rows() -> None:
    wide = [row(("megatron", "dense", "hopper"), r) for r in np.linspace(0.9, 1.1, MANY_ROWS)]
    few = [row(("torchtitan", "dense", "hopper"), r) for r in (0.95, 1.05)]
    bands = {b.kind: b for b in bands_of(wide + few)}
    assert bands["Megatron-LM, dense on Hopper"].rows == MANY_ROWS
    assert bands["Megatron-LM, dense on Hopper"].method == "5th-95th percentile"
    assert bands["TorchTitan, dense on Hopper"].rows == 2
    assert bands["TorchTitan, dense on Hopper"].method == "90% interval, spread pooled"
    assert bands["TorchTitan, dense on Hopper"].held_out == "each left out"


def test_one_row_fits_errors_are_scatter_around_one() -> None:
    """A preset fitted to its one row predicts it exactly; the row's error without the fit
    (0.78: GB300 from GB200's fit) says how far a new run may fall, on either side."""
    low, high, how = draw_band(np.array([0.78]), spread=0.1, either_side=True)
    sigma = math.sqrt((math.log(0.78) ** 2 + 2 * 0.1 ** 2) / 3)
    half = 1.6449 * sigma * math.sqrt(2)
    assert (low, high) == pytest.approx((math.exp(-half), math.exp(half)))
    assert low < 0.78 < 1 < high and how == "90% interval around 1, spread pooled"
