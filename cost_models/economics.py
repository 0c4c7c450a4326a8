"""What a whole training run costs and what failures take from it.

From one step's prediction: wall-clock days, GPU-hours, dollars and energy of a run of
`steps` steps, and with failures (exponentially distributed, at a rate per GPU-hour):

- the job's mean time to failure M = 1 / (rate x GPUs): it falls as 1/GPUs;
- a checkpoint blocks training for delta = the state one rank writes over its share of
  the storage bandwidth (asynchronous saves block only for the copy to host memory);
- the checkpoint interval that maximises goodput is Daly's higher-order estimate
  (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
  dumps"), tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + delta / 18M] - delta for
  delta < 2M,
  else M; to first order Young's sqrt(2 delta M) (Young 1974);
- each segment of tau seconds of work plus its checkpoint takes, in expectation,
  M e^(R/M) (e^((tau + delta)/M) - 1) with restarts of R seconds (Daly 2006, eq. 20), so
  the effective training time ratio (ETTR: useful time over wall time) is tau over that.

Energy: each GPU draws its idle power plus the rest of its board power in proportion to
the time it computes; each also carries its share of the host's other power (CPUs, NICs,
fans: the system's rated power less its GPUs'); the facility adds PUE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.vocabulary.cluster import RunCosts
from planner.vocabulary.plan import TrainingTotals

SECONDS_PER_DAY = 86400.0
IDLE_POWER_FRACTION = 0.25
"""Power of an idle data-centre GPU as a fraction of its board power (H100 SXM idles at
~70-100 W of 700 W; A100 SXM at ~50-90 W of 400 W): a quarter, stated."""
DEFAULT_PUE = 1.2
"""Facility power over IT power: 1.1-1.2 for modern AI data centres (Uptime Institute's
2023 survey average is 1.58, hyperscalers report ~1.1): 1.2, stated."""
HOST_COPY_GBS = 25.0
"""GB/s one rank copies its state to host memory at, the part of an asynchronous save
that blocks training (PCIe Gen4 x16 is 32 GB/s per direction, ~25 reached)."""


@dataclass(frozen=True)
class RunAssumptions:
    """The assumptions a run's totals rest on, each overridable from the command line."""

    gpu_hour_usd: float
    failure_rate_per_gpu_hour: float
    checkpoint_write_gbps: float
    """Storage write bandwidth per host, GB/s (all hosts write their ranks' shards)."""
    restart_minutes: float
    asynchronous_checkpoints: bool = True
    pue: float = DEFAULT_PUE


def mttf_hours(failure_rate_per_gpu_hour: float, gpus: int) -> float:
    """Mean time between failures that stop a job of `gpus` GPUs."""
    return 1.0 / (failure_rate_per_gpu_hour * gpus)


def checkpoint_interval(delta_s: float, mttf_s: float) -> float:
    """Daly's optimum compute time between checkpoints that each block `delta_s`."""
    if delta_s >= 2 * mttf_s:
        return mttf_s
    ratio = delta_s / (2 * mttf_s)
    return math.sqrt(2 * delta_s * mttf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta_s


def ettr(interval_s: float, delta_s: float, restart_s: float, mttf_s: float) -> float:
    """Useful time over expected wall time, checkpointing every `interval_s` of work
    (Daly 2006, eq. 20, exponential failures)."""
    segment = mttf_s * math.exp(restart_s / mttf_s) * math.expm1((interval_s + delta_s) / mttf_s)
    return interval_s / segment


def training_totals(
    steps: int, step_time_s: float, compute_fraction: float, gpus: int,
    checkpoint_bytes: float, rank_checkpoint_bytes: float, devices_per_host: int,
    costs: RunCosts, settings: RunAssumptions,
) -> TrainingTotals:
    """Totals of `steps` steps of `step_time_s` on `gpus` GPUs busy computing
    `compute_fraction` of the time, whose ranks each checkpoint `rank_checkpoint_bytes`
    (`checkpoint_bytes` over all)."""
    seconds = steps * step_time_s
    gpu_hours = seconds / 3600 * gpus
    mttf_s = mttf_hours(settings.failure_rate_per_gpu_hour, gpus) * 3600
    if settings.asynchronous_checkpoints:
        delta = rank_checkpoint_bytes / (HOST_COPY_GBS * 1e9)
    else:
        delta = rank_checkpoint_bytes * devices_per_host / (settings.checkpoint_write_gbps * 1e9)
    interval = checkpoint_interval(delta, mttf_s)
    ratio = ettr(interval, delta, settings.restart_minutes * 60, mttf_s)
    busy = min(max(compute_fraction, 0.0), 1.0)
    gpu_w = costs.gpu_power_w * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * busy)
    overhead_w = max(costs.system_power_w - costs.devices_per_system * costs.gpu_power_w, 0.0)
    per_gpu_w = gpu_w + overhead_w / costs.devices_per_system
    energy_kwh = per_gpu_w * gpus * seconds / 3600 / 1000 * settings.pue
    cost = gpu_hours * settings.gpu_hour_usd
    return TrainingTotals(
        steps=steps, days=seconds / SECONDS_PER_DAY, gpu_hours=gpu_hours, cost_usd=cost,
        gpu_hour_usd=settings.gpu_hour_usd,
        energy_kwh=energy_kwh, mttf_hours=mttf_s / 3600, checkpoint_bytes=checkpoint_bytes,
        checkpoint_blocking_s=delta, checkpoint_interval_s=interval, ettr=ratio,
        expected_days=seconds / ratio / SECONDS_PER_DAY, expected_cost_usd=cost / ratio,
        expected_gpu_hours=gpu_hours / ratio,
    )
