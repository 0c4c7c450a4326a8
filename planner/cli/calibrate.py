"""`plan calibrate CSV --cluster PRESET`: fit a preset's efficiency to measured runs.

Reads step times in vTrain's CSV layout (model shape, GPUs, batch sizes, tensor / data /
pipeline degrees, iteration time in ms; full recomputation), fits the `Efficiency`
parameters that minimize the mean absolute percentage error of the step-time model, and
prints the error before and after and the YAML block to put under the preset's `device:`.
"""

from __future__ import annotations

import argparse
import math
import time


from cost_models.efficiency_fit import (
    FITTED,
    MAX_ITERATIONS,
    check_fit_settings,
    fit_efficiency,
    mape,
    predict_all,
    read_measurements,
)
from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.parsing import whole
from planner.vocabulary.cluster import Cluster


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("measurements", help="CSV of measured step times (vTrain's columns)")
    parser.add_argument("--cluster", default="dgx-a100-80g", help="preset or file to fit")
    parser.add_argument(
        "--fields", default=",".join(FITTED),
        help=f"efficiency parameters to fit, comma-separated (default {','.join(FITTED)})",
    )
    parser.add_argument(
        "--iterations", type=whole(1, MAX_ITERATIONS), default=300,
        help=f"Nelder-Mead iterations, 1 to {MAX_ITERATIONS} (default 300)",
    )
    parser.add_argument(
        "--flash-attention", action="store_true",
        help="the runs used flash attention (default: Megatron's fused softmax, as vTrain's)",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    fields = _fields(args.fields)
    path = Path(args.measurements)
    if not path.is_file():
        what = "is a folder, not" if path.is_dir() else "does not exist; give"
        raise ValueError(f"measurements file {args.measurements!r} {what} a CSV file.")
    steps = read_measurements(args.measurements)
    cluster = Cluster.load(args.cluster)
    for step in steps:
        try:
            cluster.with_devices(step.num_gpus)
        except ValueError as error:
            raise ValueError(f"{args.measurements} {step.where}: {error}") from None
    measured = [s.seconds for s in steps]

    flash = args.flash_attention
    before = mape(predict_all(steps, cluster, flash_attention=flash), np.array(measured))
    if not math.isfinite(before):
        raise ValueError(
            f"the {args.cluster} cluster predicts a step time that is not a finite number "
            f"for {args.measurements}, so there is nothing to fit; check its numbers."
        )
    with console.status(f"fitting {len(fields)} parameters to {len(steps)} runs"):
        start = time.perf_counter()
        efficiency, after = fit_efficiency(steps, cluster, fields, args.iterations, flash)
    console.print(f"MAPE {before:.1%} -> {after:.1%} over {len(steps)} runs "
                  f"({time.perf_counter() - start:.0f} s); put under device: in the preset:")
    console.print("  efficiency:", highlight=False)
    for field, value in efficiency.model_dump().items():
        console.print(f"    {field}: {value:.4g}", highlight=False)
    return 0


def _fields(text: str) -> tuple[str, ...]:
    """`--fields` as parameter names: at least one, each fittable, none twice."""
    fields = tuple(f.strip() for f in text.split(",") if f.strip())
    try:
        check_fit_settings(fields, iterations=1)
    except ValueError as error:
        raise UsageError(f"--fields {text!r}: {error}") from None
    return fields
