"""The band of each kind of run, drawn from its rows' held-out errors: a pure function of
arrays, apart from how the rows are collected (`planner.calibration.evidence_rows`).

A row's held-out ratio is its measured step time over the step time predicted by a fit
that did not see it. With many rows a kind's band is the 5th to 95th percentile of those
ratios (nine runs in ten inside, no distribution assumed). With few, percentiles mean
nothing: the band is the 90% prediction interval of a log-normal error whose mean is the
rows' and whose spread is theirs pooled with `PSEUDO_ROWS` rows of the spread of every
held-out row (a shrinkage estimate, as in empirical Bayes: one or two runs that happened to
land close say little about the next one, Gelman et al., "Bayesian Data Analysis", 3rd ed.,
Sec. 5.5), times sqrt(1 + 1/n) for the uncertainty of the mean (the textbook prediction
interval of a new draw).
"""

from __future__ import annotations

import math

import numpy as np

MANY_ROWS = 10
"""Rows from which a band is the rows' own percentiles."""
PERCENTILES = (0.05, 0.95)
PSEUDO_ROWS = 2.0
"""Weight, in rows, of the spread of all held-out rows in a kind's pooled spread."""
Z_90 = 1.6449
"""The standard normal's 95th percentile: a two-sided 90% interval."""


def pooled_spread(log_ratios: list[np.ndarray]) -> float:
    """The spread (standard deviation) of held-out log ratios around each kind's own mean,
    over every kind: what a kind with few rows is pooled with."""
    deviations = np.concatenate([r - r.mean() for r in log_ratios if len(r) > 1])
    counted = sum(len(r) - 1 for r in log_ratios if len(r) > 1)
    return float(math.sqrt(float((deviations ** 2).sum()) / counted))


def draw_band(ratios: np.ndarray, spread: float,
              either_side: bool = False) -> tuple[float, float, str]:
    """(low, high, how) of a kind whose held-out measured/predicted ratios are `ratios`,
    `spread` being `pooled_spread` of all kinds. `either_side`: the held-out errors came
    from another fit than the shipped one (a preset fitted to its one row: without it,
    what the preset started from), so their mean is no bias of the shipped predictions;
    the errors count as scatter around 1 (no mean estimated: n degrees of freedom), and
    the band spans them on either side."""
    n = len(ratios)
    if n >= MANY_ROWS and not either_side:
        low, high = np.quantile(ratios, PERCENTILES)
        return float(low), float(high), "5th-95th percentile"
    logs = np.log(ratios)
    mean = 0.0 if either_side else float(logs.mean())
    own = float(((logs - mean) ** 2).sum())
    dof = n if either_side else n - 1
    pooled = math.sqrt((own + PSEUDO_ROWS * spread ** 2) / (dof + PSEUDO_ROWS))
    half = Z_90 * pooled * math.sqrt(1 + 1 / n)
    return (math.exp(mean - half), math.exp(mean + half),
            "90% interval around 1, spread pooled" if either_side
            else "90% interval, spread pooled")
