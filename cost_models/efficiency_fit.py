"""Fit a preset's efficiency parameters to measured step times.

The measurements are Megatron-LM GPT runs on A100 clusters released with vTrain (Bang et
al., MICRO 2024; `../shared/calibration/`). Every row gives a model shape, the parallel
degrees, batch sizes and the measured iteration time; the runs used full activation
recomputation, the 1F1B schedule and no gradient bucketing, so gradient reduction is
exposed. `fit_efficiency` searches the `Efficiency` parameters that minimize the mean
absolute percentage error of `predict_step` over the rows (Nelder-Mead on unbounded
transforms of the parameters); the fitted values go into the preset's YAML.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from planner.user_files import NotTextError, UserFileError, read_user_file
from planner.vocabulary.efficiency import Efficiency
from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig

# The runs' scale-out network, from the configurations published with the data: 800 Gb/s
# (100 GB/s) per 8-GPU node over InfiniBand, half a DGX A100's eight HDR links. Their
# "intra_node_bandwidth: 150" is read as NVLink3's 300 GB/s per direction counted per
# link pair, not as a slower NVLink: the A100 preset's NVLink is kept.
VTRAIN_INTER_NODE_GBS_PER_GPU = 100.0 / 8
# GPT-2's BPE vocabulary, which Megatron-LM pads to a multiple of 128 x tensor parallel.
GPT2_VOCAB = 50257
# The parameters a fit moves by default: the compute and scale-up ones single-node rows
# can tell apart (scale-out bandwidth never shows in single-node measurements).
FITTED = ("matmul", "matmul_half_dim", "memory", "kernel_overhead_us", "dispatch_us",
          "collective_overhead_us", "intra_node_bandwidth")
# Where a fitted parameter may go: what hardware has been measured to reach, so that a fit
# cannot buy accuracy on small models with a physically impossible value that then
# mispredicts large ones (e.g. matmuls at 100% of peak with huge launch costs). Upper
# bounds: cuBLAS bf16 GEMMs sustain ~80% of an A100's peak in training, STREAM-like
# kernels ~90% of HBM bandwidth, NCCL ~85% of NVLink bandwidth (nccl-tests bus bandwidth).
BOUNDS = {
    "matmul": (0.3, 0.8),
    "fp8_matmul": (0.3, 0.8),
    "matmul_half_dim": (1.0, 1024.0),
    "attention": (0.2, 0.8),
    "memory": (0.3, 0.9),
    "kernel_overhead_us": (1.0, 100.0),
    "expert_matmul": (0.2, 1.0),
    "sink_attention": (0.05, 1.0),
    "moe_sync_us": (0.0, 2000.0),
    "alltoall_bandwidth": (0.2, 1.0),
    "dispatch_us": (1.0, 300.0),
    "collective_overhead_us": (1.0, 200.0),
    "intra_node_bandwidth": (0.3, 0.85),
    "inter_node_bandwidth": (0.3, 0.95),
    "overlap_slowdown": (0.0, 0.5),
}


# Nelder-Mead iterations a fit may run: each evaluates the step-time model on every row,
# so more than this would run for days without improving a converged simplex.
MAX_ITERATIONS = 100_000
MEASUREMENTS_BYTES = 64 << 20
"""The most read of a measurements CSV (vTrain's 1,549 rows are 120 KiB)."""
# vTrain's columns: the whole numbers (shape, degrees, batch sizes) and the measured time.
WHOLE_COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads",
                 "# layers", "sequence length", "tensor parallelism", "data parallelism",
                 "pipeline parallelism")
TIME_COLUMN = "iteration time (ms)"
COLUMNS = (*WHOLE_COLUMNS, TIME_COLUMN)


@dataclass(frozen=True)
class MeasuredStep:
    """One measured training configuration."""

    model: TransformerConfig
    """The GPT that was trained."""
    parallel: ParallelConfig
    """Its parallel degrees and batch sizes."""
    num_gpus: int
    """GPUs the run used."""
    seconds: float
    """Measured iteration time."""
    label: str
    """Model size as the file names it ("3.6"), or a shape summary."""
    line: int = 0
    """Line of the CSV file the row was read from (0: not read from a file)."""

    @property
    def where(self) -> str:
        """'line 4' for a row read from a file, else the row's label."""
        return f"line {self.line}" if self.line else f"the run {self.label!r}"


def read_measurements(path: str | Path) -> list[MeasuredStep]:
    """The rows of a vTrain calibration CSV as model + parallel configurations.

    Raises ValueError, in one sentence naming the file, line, column and value, for an
    empty file, missing columns, values that are not positive whole numbers (or, for the
    time, a positive finite number), and rows whose degrees do not fit their GPUs.
    """
    try:
        # Bounded as every file a user names is (`planner.user_files`), at a size that
        # holds hundreds of thousands of rows (vTrain's 1,549 are 120 KiB).
        text = read_user_file(path, str(path), "a CSV of measured steps",
                              limit=MEASUREMENTS_BYTES).removeprefix("\ufeff")
    except NotTextError:
        raise ValueError(f"{path} is not a text CSV file (it is not UTF-8); export the "
                         "measurements as CSV.") from None
    except UserFileError as error:
        raise ValueError(str(error)) from None
    reader = csv.DictReader(text.splitlines(keepends=True))
    header = reader.fieldnames
    if not header:
        raise ValueError(
            f"{path} is empty; give a CSV whose header has vTrain's columns "
            f"({', '.join(COLUMNS)}) and one row per measured run."
        )
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{path} lacks the column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(c) for c in missing)} of vTrain's layout; its header is "
            f"{', '.join(repr(c) for c in header)}."
        )
    steps = []
    for row in reader:
        steps.append(_measured_step(row, f"{path} line {reader.line_num}", reader.line_num))
    if not steps:
        raise ValueError(
            f"{path} has a header but no measurements; add one row per measured run."
        )
    return steps


def _measured_step(row: dict, where: str, line: int) -> MeasuredStep:
    """One CSV row (`where` names it in errors) as a measured step."""
    if None in row:
        raise ValueError(
            f"{where} has {len(row) - 1 + len(row[None])} values for the header's "
            f"{len(row) - 1} columns; remove the extra values or fix the header."
        )
    values: dict[str, int] = {}
    for column in WHOLE_COLUMNS:
        text = _cell(row, column, where)
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1 or not text.isdigit():
            raise ValueError(
                f"{where}, column {column!r}: {text!r} is not a positive whole number; "
                "fix or delete the row."
            )
        values[column] = value
    text = _cell(row, TIME_COLUMN, where)
    try:
        milliseconds = float(text)
    except ValueError:
        milliseconds = math.nan
    if not (math.isfinite(milliseconds) and milliseconds > 0):
        raise ValueError(
            f"{where}, column {TIME_COLUMN!r}: {text!r} is not a measured time (a positive, "
            "finite number of milliseconds); fix or delete the row."
        )
    t, h, layers = (values[c] for c in ("tensor parallelism", "hidden size", "# layers"))
    padded = math.ceil(GPT2_VOCAB / (128 * t)) * 128 * t
    num_gpus = values["# GPUs"]
    try:
        model = TransformerConfig(
            num_layers=layers, hidden_size=h,
            num_attention_heads=values["attention heads"],
            seq_length=values["sequence length"], vocab_size=padded,
        )
        parallel = ParallelConfig.of(
            tensor=t, pipeline=values["pipeline parallelism"],
            data=values["data parallelism"],
            micro_batch_size=values["micro batch"],
            global_batch_size=values["global batch"], recompute="full",
        )
        parallel.resolve(num_gpus)
    except ValueError as error:
        reason = _first_reason(error).rstrip(".")
        raise ValueError(f"{where} is not a run Tessel can predict: {reason}.") from None
    if parallel.dims.pipeline > layers:
        raise ValueError(
            f"{where}: pipeline parallelism {parallel.dims.pipeline} is more stages than the "
            f"{layers} layers; fix or delete the row."
        )
    label = (row.get("Parameters (billion)") or "").strip() or f"h{h} L{layers}"
    return MeasuredStep(model, parallel, num_gpus, milliseconds / 1e3, label, line)


def _cell(row: dict, column: str, where: str) -> str:
    text = row.get(column)
    if text is None or not text.strip():
        raise ValueError(f"{where} has no value in column {column!r}; fill it in or delete "
                         "the row.")
    return text.strip()


def _first_reason(error: ValueError) -> str:
    """The message of a ValueError, or a pydantic ValidationError's first error's."""
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        return f"{field}: {message}" if field else message
    return str(error)


def check_measurements(steps: list[MeasuredStep]) -> None:
    """Raise ValueError, naming the run, unless every step can be fitted to: at least one
    step, and every measured time positive and finite."""
    if not steps:
        raise ValueError("there are no measured runs to fit to; give at least one.")
    for step in steps:
        if not (math.isfinite(step.seconds) and step.seconds > 0):
            raise ValueError(
                f"{step.where} has measured time {step.seconds!r} s; a measured time must be "
                "positive and finite."
            )


def vtrain_cluster(base: Cluster) -> Cluster:
    """`base` with the links of the cluster the measurements ran on."""
    return base.model_copy(update={
        "inter_node": base.inter_node.model_copy(
            update={"bandwidth_gbs": VTRAIN_INTER_NODE_GBS_PER_GPU}
        ),
    })


def predict_all(
    steps: list[MeasuredStep], cluster: Cluster, efficiency: Efficiency | None = None,
    flash_attention: bool = False,
) -> np.ndarray:
    """Predicted step seconds of every measurement (with `efficiency` if given)."""
    if efficiency is not None:
        cluster = cluster.with_efficiency(efficiency)
    sized: dict[int, Cluster] = {}
    predictions = []
    for step in steps:
        if step.num_gpus not in sized:
            sized[step.num_gpus] = cluster.with_devices(step.num_gpus)
        prediction = predict_step(step.model, sized[step.num_gpus], step.parallel,
                                  flash_attention=flash_attention)
        predictions.append(prediction.step_time_s)
    return np.array(predictions)


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction (NaN for no measurements)."""
    if len(measured) == 0:
        return math.nan
    return float(np.mean(np.abs(predicted - measured) / measured))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):  # ties share their average rank
            tied = x == value
            r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(np.asarray(a)), ranks(np.asarray(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def fit_efficiency(
    steps: list[MeasuredStep],
    cluster: Cluster,
    fields: tuple[str, ...] = FITTED,
    iterations: int = 300,
    flash_attention: bool = False,
) -> tuple[Efficiency, float]:
    """The efficiency minimizing MAPE over `steps`, and that MAPE.

    Raises ValueError for no steps or a bad measured time, `fields` empty, repeated or not
    fitted parameters (`BOUNDS`), `iterations` outside 1..`MAX_ITERATIONS`, and a fit whose
    error is not a finite number (a prediction that is infinite or NaN).
    """
    check_measurements(steps)
    check_fit_settings(fields, iterations)
    measured = np.array([s.seconds for s in steps])
    start = cluster.device.efficiency

    def efficiency_at(x: np.ndarray) -> Efficiency:
        values = {f: from_unbounded(f, v) for f, v in zip(fields, x)}
        return start.model_copy(update=values)

    def loss(x: np.ndarray) -> float:
        return mape(predict_all(steps, cluster, efficiency_at(x), flash_attention), measured)

    x0 = np.array([to_unbounded(f, getattr(start, f)) for f in fields])
    best = nelder_mead(loss, x0, step=0.5, iterations=iterations)
    error = loss(best)
    if not math.isfinite(error):
        raise ValueError(
            f"the fit ended with a mean absolute percentage error of {error}, so it fitted "
            "nothing; check that the cluster's numbers and the measured times are finite."
        )
    return efficiency_at(best), error


def check_fit_settings(fields: tuple[str, ...], iterations: int) -> None:
    """Raise ValueError unless `fields` are distinct fitted parameters and `iterations` is
    in 1..MAX_ITERATIONS."""
    if not fields:
        raise ValueError(
            f"no parameters to fit; name at least one of {', '.join(BOUNDS)}."
        )
    unknown = [f for f in fields if f not in BOUNDS]
    if unknown:
        raise ValueError(
            f"cannot fit {', '.join(unknown)}; choose parameters from {', '.join(BOUNDS)}."
        )
    repeated = sorted({f for f in fields if fields.count(f) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} is named more than once; name each once.")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or not (
        1 <= iterations <= MAX_ITERATIONS
    ):
        raise ValueError(
            f"iterations {iterations!r} is out of range; give 1 to {MAX_ITERATIONS}."
        )


def to_unbounded(field: str, value: float) -> float:
    """A bounded parameter as a real number the simplex can move freely (scaled logit)."""
    low, high = BOUNDS[field]
    # Kept off the bounds, where the logistic is flat and the simplex could not move.
    share = min(max((value - low) / (high - low), 0.05), 0.95)
    return math.log(share / (1 - share))


def from_unbounded(field: str, x: float) -> float:
    low, high = BOUNDS[field]
    return low + (high - low) / (1 + math.exp(-x))


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5,
    iterations: int = 300, tolerance: float = 1e-6,
) -> np.ndarray:
    """Minimize `f` from `x0` with the Nelder-Mead simplex (standard coefficients:
    reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]
