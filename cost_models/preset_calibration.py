"""How each preset's efficiency is fitted to published runs, and the band its fit leaves.

- `dgx-h100`: Megatron-Core's weak-scaling table (9 GPT runs, bf16) and NeMo's Llama 3
  runs on DGX H100 (fp8): the compute, attention and link parameters.
- `gb200-nvl72`: NeMo's Llama 3 runs on GB200 (fp8 and MXFP8), starting from the H100 fit
  (same software, no bf16 rows to see): the fp8 matmul, memory and per-layer parameters
  that Blackwell changes. Its rows are three layouts of two models, so only three
  parameters move; `layer_overhead_us` is the time those runs lose per layer that the
  model does not explain (a residual, not a measured cost). Fitted per kernel it ended at
  its bound and charged MoE and MLA layers, of many small kernels, for it many times.
- `dgx-b200` borrows GB200's fit (the same GPU at a lower clock is in its peaks; its one
  NeMo row only checks it), `dgx-h200` H100's (the same SM; more and faster HBM is in its
  datasheet numbers).
- `dgx-a100-80g` is fitted to vTrain's single-node measurements (`cost_models.efficiency_fit`).

A fit moves few parameters on few rows, within `calibrate.BOUNDS`; `leave_one_model_out`
says how it does on a model it did not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.efficiency_fit import fit_efficiency, predict_all
from planner.vocabulary.efficiency import Efficiency
from cost_models.published_runs import PublishedRun, SkippedRow, read_megatron_core, read_nemo
from planner.vocabulary.cluster import Cluster

MEGATRON_CORE = "megatron_core_h100_weak_scaling.csv"
NEMO = "nemo_llama3_pretrain.csv"
ITERATIONS = 300


@dataclass(frozen=True)
class PresetFit:
    """Which parameters of a preset are fitted, on its own runs, from which start."""

    preset: str
    fields: tuple[str, ...]
    start_from: str | None = None
    """A preset whose fitted efficiency the fit starts from (its other values kept)."""
    borrowers: tuple[str, ...] = ()
    """Presets that ship this fit's efficiency as their own."""


FITS = (
    PresetFit("dgx-h100", ("matmul", "fp8_matmul", "matmul_half_dim", "attention", "memory",
                           "kernel_overhead_us", "dispatch_us", "collective_overhead_us",
                           "intra_node_bandwidth", "inter_node_bandwidth"),
              borrowers=("dgx-h200",)),
    PresetFit("gb200-nvl72", ("fp8_matmul", "memory", "layer_overhead_us"),
              start_from="dgx-h100", borrowers=("dgx-b200",)),
)


def published_runs(folder: str | Path) -> tuple[list[PublishedRun], list[SkippedRow]]:
    """Every row of both published tables Tessel can predict, and the rows it cannot."""
    folder = Path(folder)
    nemo, skipped = read_nemo(folder / NEMO)
    return read_megatron_core(folder / MEGATRON_CORE) + nemo, skipped


def runs_of(runs: list[PublishedRun], preset: str, without: str | None = None
            ) -> list[PublishedRun]:
    """The runs on `preset`, less those of the model named `without`."""
    return [r for r in runs if r.preset == preset and r.model_name != without]


def fit_presets(runs: list[PublishedRun], iterations: int = ITERATIONS,
                without: str | None = None) -> dict[str, Efficiency]:
    """Each fitted preset's efficiency (and its borrowers'), fitted in `FITS` order on
    its runs less the model `without`."""
    fitted: dict[str, Efficiency] = {}
    for fit in FITS:
        cluster = Cluster.load(fit.preset)
        if fit.start_from is not None:
            cluster = cluster.with_efficiency(fitted[fit.start_from])
        steps = [r.step for r in runs_of(runs, fit.preset, without)]
        fitted[fit.preset], _ = fit_efficiency(steps, cluster, fit.fields, iterations,
                                               flash_attention=True)
        for borrower in fit.borrowers:
            fitted[borrower] = fitted[fit.preset]
    return fitted


def predicted_seconds(runs: list[PublishedRun],
                      efficiencies: dict[str, Efficiency] | None = None) -> np.ndarray:
    """Each run's predicted step time on its preset (with `efficiencies`' where given)."""
    out = []
    for run in runs:
        cluster = Cluster.load(run.preset)
        if efficiencies and run.preset in efficiencies:
            cluster = cluster.with_efficiency(efficiencies[run.preset])
        out.append(predict_all([run.step], cluster, flash_attention=True)[0])
    return np.array(out)


def leave_one_model_out(runs: list[PublishedRun], preset: str,
                        iterations: int = ITERATIONS) -> dict[str, np.ndarray]:
    """Per model of `preset`'s NeMo runs: its runs' predicted step times from a fit of
    every preset that did not see that model."""
    out = {}
    for model in sorted({r.model_name for r in runs_of(runs, preset) if r.source == "nemo"}):
        fitted = fit_presets(runs, iterations, without=model)
        out[model] = predicted_seconds(
            [r for r in runs_of(runs, preset) if r.model_name == model], fitted)
    return out


def step_time_ratio(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """10th and 90th percentile of measured over predicted: the band of a prediction."""
    ratio = np.asarray(measured) / np.asarray(predicted)
    return float(np.quantile(ratio, 0.1)), float(np.quantile(ratio, 0.9))
