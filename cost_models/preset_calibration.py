"""How each preset's efficiency is fitted to published runs, and the band its fit leaves.

- `dgx-h100`: Megatron-Core's weak-scaling table (9 GPT runs, bf16) and NeMo's Llama 3
  runs on DGX H100 (fp8): the compute, attention and link parameters.
- `gb200-nvl72`: NeMo's Llama 3 runs on GB200 (fp8 and MXFP8), starting from the H100 fit
  (same software, no bf16 rows to see): the fp8 matmul, memory and per-kernel parameters
  that Blackwell changes. Its rows are three layouts of two models, so only three
  parameters move. Their fp8 matmuls sustain under half the datasheet's fp8 peak (and
  GB200's 8B run is 3% faster than B200's, not the 11% their peaks differ by): Blackwell's
  datasheet peaks are not what its GEMMs sustain.
- `dgx-b200` borrows GB200's sustained rates (`borrowed`: the fractions of peak scaled by
  GB200's peaks over B200's, the same GPU; the one NeMo B200 run, which only checks the
  fit, chose rates over fractions), `dgx-h200` H100's efficiency (the same SM; more and
  faster HBM is in its datasheet numbers).
- `dgx-a100-80g` is fitted to vTrain's single-node measurements (`cost_models.efficiency_fit`).

NeMo's GB200 runs with Megatron-FSDP offload activations to the Grace CPU instead of
recomputing them (`published_runs`). A fit moves few parameters on few rows, within
`calibrate.BOUNDS`; `leave_one_model_out` says how it does on a model it did not see,
`leave_one_out` on each Blackwell run it did not see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    """Presets that ship this fit's efficiency as their own (`borrowed`)."""

    def determined(self, runs: int) -> tuple[str, ...]:
        """The fields `runs` runs can determine: one per run, in `fields`' order (most
        determined first), the rest kept at their start (one run cannot tell a per-kernel
        cost from a GEMM efficiency)."""
        return self.fields[:max(1, runs)]


FITS = (
    PresetFit("dgx-h100", ("matmul", "fp8_matmul", "matmul_half_dim", "attention", "memory",
                           "kernel_overhead_us", "dispatch_us", "collective_overhead_us",
                           "intra_node_bandwidth", "inter_node_bandwidth"),
              borrowers=("dgx-h200",)),
    PresetFit("gb200-nvl72", ("fp8_matmul", "memory", "kernel_overhead_us"),
              start_from="dgx-h100", borrowers=("dgx-b200",)),
)
RATE_FIELDS = {"matmul": "bf16", "attention": "bf16", "fp8_matmul": "fp8"}
"""Fractions of a compute peak, by the peak (`borrowed` keeps their rates)."""
OFFLOADED = ("gb200-nvl72",)
"""Presets whose NeMo Megatron-FSDP runs offload activations instead of recomputing them:
Megatron-Bridge's GB200 Llama 3 70B FSDP recipes set cpu_offloading_num_layers (40 in
FP8, 20 in BF16) and no recomputation (v0.2.0, the 25.11 release:
scripts/performance/configs/llama3/workload_base_configs.py,
LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG; @067f987d: src/megatron/bridge/perf_recipes/llama/
gb200/llama3.py, llama3_70b_pretrain_64gpu_gb200_fp8cs_config): each layer's activations
leave for the Grace CPU over NVLink-C2C beside the compute. Tessel has no activation
offload, so those runs are priced without recomputation (their memory is not checked)."""


def published_runs(folder: str | Path) -> tuple[list[PublishedRun], list[SkippedRow]]:
    """Every row of both published tables Tessel can predict, and the rows it cannot;
    NeMo's Megatron-FSDP runs on `OFFLOADED` presets without recomputation."""
    folder = Path(folder)
    nemo, skipped = read_nemo(folder / NEMO)
    nemo = [_offloaded(run) if run.preset in OFFLOADED and run.step.parallel.sharding
            .zero_stage == 3 else run for run in nemo]
    return read_megatron_core(folder / MEGATRON_CORE) + nemo, skipped


def _offloaded(run: PublishedRun) -> PublishedRun:
    """`run` as its recipe ran it: activations offloaded, nothing recomputed."""
    step = replace(run.step, parallel=run.step.parallel.but(recompute="none"))
    return replace(run, step=step)


def borrowed(efficiency: Efficiency, lender: str, borrower: str) -> Efficiency:
    """`lender`'s fitted `efficiency` for `borrower`, the same GPU at other datasheet peaks:
    the same sustained rates (each fraction of a compute peak scaled by the lender's peak
    over the borrower's, at most 1; memory by their bandwidths)."""
    lent, got = Cluster.load(lender).device, Cluster.load(borrower).device
    update = {field: min(1.0, getattr(efficiency, field) * lent.peak_tflops[peak]
                         / got.peak_tflops[peak])
              for field, peak in RATE_FIELDS.items()}
    update["memory"] = min(1.0, efficiency.memory * lent.memory_bandwidth_gbs
                           / got.memory_bandwidth_gbs)
    return efficiency.model_copy(update=update)


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
        fitted[fit.preset], _ = fit_efficiency(steps, cluster, fit.determined(len(steps)),
                                               iterations, flash_attention=True)
        for borrower in fit.borrowers:
            fitted[borrower] = borrowed(fitted[fit.preset], fit.preset, borrower)
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


def leave_one_out(runs: list[PublishedRun], fit: PresetFit,
                  iterations: int = ITERATIONS) -> np.ndarray:
    """Each NeMo run of `fit.preset` and its borrowers: its predicted step time from a fit of
    `fit` (from its start preset as shipped) on the preset's other runs. A borrower's runs
    are never fitted, so each is predicted from the fit on all of `fit.preset`'s runs."""
    start = Cluster.load(fit.preset)
    if fit.start_from is not None:
        start = start.with_efficiency(Cluster.load(fit.start_from).device.efficiency)
    own = runs_of(runs, fit.preset)
    out = []
    for run in held_out_runs(runs, fit):
        seen = [r.step for r in own if r is not run]
        efficiency, _ = fit_efficiency(seen, start, fit.determined(len(seen)), iterations,
                                       flash_attention=True)
        if run.preset != fit.preset:
            efficiency = borrowed(efficiency, fit.preset, run.preset)
        out.append(predicted_seconds([run], {run.preset: efficiency})[0])
    return np.array(out)


def held_out_runs(runs: list[PublishedRun], fit: PresetFit) -> list[PublishedRun]:
    """The NeMo runs `leave_one_out` predicts for `fit`, in file order."""
    presets = (fit.preset, *fit.borrowers)
    return [r for r in runs if r.source == "nemo" and r.preset in presets]

