"""Every published run of `../shared/calibration/` that Tessel predicts, with its kind
(engine x model family x GPU generation) and two predictions: the one the shipped presets
make and one from a fit that did not see the run.

How each file is held out, by what its fit can afford:
- vTrain's single-node A100 runs fit `dgx-a100-80g`'s 10 parameters on 1,440 rows; one row
  more or less moves them by its leverage, about 10 / 1,440 = 0.7%, so its in-fit error is
  its leave-one-out error to within that (the fit is minutes long; 1,440 refits are not run).
  vTrain's multi-node runs are never fitted: their errors are held out as they stand.
- Megatron-Core's H100 table and NeMo's Llama 3 tables: leave-one-out, every preset
  refitted without the run (`cost_models.preset_calibration.fit_presets`).
- The MoE runs (Megatron-Bridge's table and the two recipe lines): leave-one-out of the MoE
  parameters' fit (`cost_models.moe_calibration.leave_one_out`).
- TorchTitan's runs: leave-one-out of their fit (`cost_models.published_memory`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models import moe_calibration, published_memory
from cost_models.efficiency_fit import predict_all, read_measurements, vtrain_cluster
from cost_models.preset_calibration import fit_presets, predicted_seconds, published_runs
from planner.megatron.recipe_runs import read_recipe_runs
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.evidence import family_of, generation_of

CALIBRATION = Path(__file__).resolve().parents[3] / "shared" / "calibration"
"""`../shared/calibration/`, beside the repository (read-only)."""


ONE_ROW_FIT = "left out of its preset's one-row fit (predicted from what it started from)"
"""How a row is held out whose preset was fitted to it alone: its band is drawn around 1
(`bands.draw_band`'s either_side)."""


@dataclass(frozen=True)
class EvidenceRow:
    """One published run: its kind and its measured over predicted step time."""

    engine: str
    family: str
    generation: str
    source: str
    """The file and line it was read from."""
    label: str
    shipped: float
    """Measured over predicted step time, predicted with the presets as they ship."""
    held_out: float
    """Measured over predicted step time, predicted by a fit that did not see the row."""
    how: str
    """How it was held out, in words."""


def vtrain_rows(folder: Path = CALIBRATION, hold_out: bool = True) -> list[EvidenceRow]:
    """vTrain's A100 runs (Megatron-LM, dense GPT); `hold_out` changes nothing (none is
    refitted)."""
    cluster = vtrain_cluster(Cluster.load("dgx-a100-80g"))
    rows = []
    for name, how in (("vtrain_a100_single_node.csv", "single-node runs in a fit of "
                       "1,440 (leverage 0.7%)"),
                      ("vtrain_a100_multi_node.csv", "multi-node runs never fitted")):
        steps = read_measurements(folder / name)
        ratios = np.array([s.seconds for s in steps]) / predict_all(steps, cluster)
        rows += [EvidenceRow("megatron", "dense", "ampere", f"{name} line {s.line}", s.label,
                             float(r), float(r), how) for s, r in zip(steps, ratios)]
    return rows


def published_table_rows(folder: Path = CALIBRATION, hold_out: bool = True
                         ) -> list[EvidenceRow]:
    """Megatron-Core's H100 table and NeMo's Llama 3 tables (Megatron-LM, dense), each run
    held out of every preset's fit in turn (`hold_out`; else the held-out ratio is the
    shipped one)."""
    runs, _ = published_runs(folder)
    measured = np.array([r.step.seconds for r in runs])
    shipped = measured / predicted_seconds(runs)
    held_out = shipped.copy()
    for i in range(len(runs)) if hold_out else ():
        fitted = fit_presets(runs[:i] + runs[i + 1:])
        held_out[i] = measured[i] / predicted_seconds([runs[i]], fitted)[0]
    files = {"megatron-core": "megatron_core_h100_weak_scaling.csv",
             "nemo": "nemo_llama3_pretrain.csv"}
    return [EvidenceRow("megatron", "dense", _generation(r.preset),
                        f"{files[r.source]} line {r.step.line}",
                        f"{r.model_name} {r.preset} {r.precision}", float(s), float(h),
                        "each left out of the presets' fit")
            for r, s, h in zip(runs, shipped, held_out)]


def moe_rows(folder: Path = CALIBRATION, hold_out: bool = True) -> list[EvidenceRow]:
    """Megatron-Bridge's MoE runs and the two recipe lines (Megatron-LM, MoE and MLA),
    each left out of the MoE parameters' fit (`hold_out`)."""
    runs = (moe_calibration.read_moe_runs(folder / moe_calibration.MOE_RUNS)
            + read_recipe_runs(folder / "moe_recipes.csv"))
    measured = np.array([r.tokens_per_gpu_s for r in runs])
    shipped = moe_calibration.predicted_throughput(runs)
    held_out = moe_calibration.leave_one_out(runs) if hold_out else shipped
    # Throughput over throughput is predicted over measured step time.
    return [EvidenceRow("megatron", family_of(r.step.model), _generation(r.preset),
                        f"{_file_of(r)} line {r.step.line}", r.step.label,
                        float(s / m), float(h / m), "each left out of the MoE fit")
            for r, m, s, h in zip(runs, measured, shipped, held_out)]


def torchtitan_rows(folder: Path = CALIBRATION, hold_out: bool = True) -> list[EvidenceRow]:
    """TorchTitan's own runs (dense Llama 3.1 8B), each left out of their fit
    (`hold_out`)."""
    return [EvidenceRow("torchtitan", family_of(speed.run.model),
                        generation_of(speed.run.cluster.device.name),
                        f"{published_memory.TORCHTITAN_RUNS.name} line {speed.line}",
                        speed.run.name, float(shipped / speed.tokens_per_s_per_gpu),
                        float(held / speed.tokens_per_s_per_gpu),
                        "each left out of the fit")
            for speed, shipped, held in published_memory.speed_leave_one_out(hold_out)]


def accelerator_rows(folder: Path = CALIBRATION, hold_out: bool = True) -> list[EvidenceRow]:
    """The TPU, GB300 and Trainium runs (`cost_models.published_accelerators`), priced under
    Megatron-LM's rules as Tessel prices plans on those presets: each TPU row left out of
    the TPU presets' matmul fit, each GB300 and Trainium row left out of its preset's
    one-row fit (what the preset starts from without it). Throughput over throughput is
    measured over predicted step time."""
    from cost_models import published_accelerators as accelerators

    runs, _ = accelerators.read_runs(folder / accelerators.CSV.name)
    left_out = accelerators.held_out(runs) if hold_out else {}
    rows = []
    for run in runs:
        shipped = 1 + accelerators.predict(run).error
        if not hold_out:
            held, how = shipped, "as shipped"
        elif run.tpu:
            held = 1 + accelerators.predict(run, left_out[run.line]).error
            how = "each row left out of the TPU presets' matmul fit"
        else:
            held = 1 + accelerators.predict_scaled(run, 1.0).error
            how = ONE_ROW_FIT
        rows.append(EvidenceRow("megatron", family_of(run.model),
                                generation_of(run.cluster.device.name),
                                f"{accelerators.CSV.name} line {run.line}", run.name,
                                float(shipped), float(held), how))
    return rows


COLLECTORS: tuple[Callable[[Path, bool], list[EvidenceRow]], ...] = (
    vtrain_rows, published_table_rows, moe_rows, torchtitan_rows, accelerator_rows)


def every_row(folder: Path = CALIBRATION, hold_out: bool = True) -> list[EvidenceRow]:
    """Every calibration row Tessel predicts: with `hold_out`, minutes (the held-out fits
    run); without, seconds (each row's held-out ratio is then its shipped one)."""
    return [row for collect in COLLECTORS for row in collect(folder, hold_out)]


def _generation(preset: str) -> str:
    return generation_of(Cluster.load(preset).device.name)


def _file_of(run: moe_calibration.MoeRun) -> str:
    return "moe_recipes.csv" if run.notes.startswith("recipe flag line") \
        else moe_calibration.MOE_RUNS
