"""`plan calibrate CSV --cluster PRESET`: fit a preset's efficiency to measured runs.

Reads step times in vTrain's CSV layout (model shape, GPUs, batch sizes, tensor / data /
pipeline degrees, iteration time in ms; full recomputation), fits the `Efficiency`
parameters that minimize the mean absolute percentage error of the step-time model, and
prints the error before and after and the YAML block to put under the preset's `device:`.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from cost_models.calibrate import FITTED, fit_efficiency, mape, predict_all, read_measurements
from planner.cluster import Cluster


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("measurements", help="CSV of measured step times (vTrain's columns)")
    parser.add_argument("--cluster", default="dgx-a100-80g", help="preset or file to fit")
    parser.add_argument(
        "--fields", default=",".join(FITTED),
        help=f"efficiency parameters to fit, comma-separated (default {','.join(FITTED)})",
    )
    parser.add_argument("--iterations", type=int, default=300, help="Nelder-Mead iterations")
    parser.add_argument(
        "--flash-attention", action="store_true",
        help="the runs used flash attention (default: Megatron's fused softmax, as vTrain's)",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run_calibrate(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    if not Path(args.measurements).is_file():
        raise ValueError(f"measurements file {args.measurements!r} does not exist.")
    try:
        steps = read_measurements(args.measurements)
    except (KeyError, ValueError) as error:
        raise ValueError(
            f"{args.measurements} is not in vTrain's CSV layout ({error}); see "
            "cost_models/calibrate.py for the columns."
        ) from None
    cluster = Cluster.load(args.cluster)
    fields = tuple(f.strip() for f in args.fields.split(",") if f.strip())
    unknown = [f for f in fields if f not in type(cluster.device.efficiency).model_fields]
    if unknown:
        raise ValueError(f"--fields {', '.join(unknown)} are not efficiency parameters.")
    measured = [s.seconds for s in steps]
    import numpy as np

    flash = args.flash_attention
    before = mape(predict_all(steps, cluster, flash_attention=flash), np.array(measured))
    with console.status(f"fitting {len(fields)} parameters to {len(steps)} runs"):
        start = time.perf_counter()
        efficiency, after = fit_efficiency(steps, cluster, fields, args.iterations, flash)
    console.print(f"MAPE {before:.1%} -> {after:.1%} over {len(steps)} runs "
                  f"({time.perf_counter() - start:.0f} s); put under device: in the preset:")
    console.print("  efficiency:", highlight=False)
    for field, value in efficiency.model_dump().items():
        console.print(f"    {field}: {value:.4g}", highlight=False)
    return 0
