"""A whole run's totals: time, GPU-hours, money and energy, and what failures take
(Young/Daly checkpoint interval, ETTR), against values computed by hand."""

from __future__ import annotations

import math

import pytest

from cost_models.economics import (
    HOST_COPY_GBS,
    IDLE_POWER_FRACTION,
    RunAssumptions,
    checkpoint_interval,
    ettr,
    mttf_hours,
    training_totals,
)
from planner.vocabulary.cluster import RunCosts

COSTS = RunCosts(gpu_hour_usd=(2.0, 4.0), price_source="test", failure_rate_per_gpu_hour=2e-5,
                 failure_source="test", gpu_power_w=700, system_power_w=10200,
                 devices_per_system=8, power_source="test")
SETTINGS = RunAssumptions(gpu_hour_usd=3.0, failure_rate_per_gpu_hour=2e-5,
                       checkpoint_write_gbps=5.0, restart_minutes=10.0)


def test_mttf_falls_as_one_over_the_gpus() -> None:
    assert mttf_hours(2e-5, 1000) == pytest.approx(50.0)
    assert mttf_hours(2e-5, 16384) == pytest.approx(50.0 * 1000 / 16384)
    # Llama 3: 419 interruptions in 54 days on 16,384 H100s, one every ~3 hours.
    assert mttf_hours(419 / (54 * 24 * 16384), 16384) == pytest.approx(54 * 24 / 419)


def test_checkpoint_interval_is_dalys_closed_form_and_youngs_to_first_order() -> None:
    delta, m = 60.0, 3600.0 * 24
    young = math.sqrt(2 * delta * m)
    r = delta / (2 * m)
    daly = young * (1 + math.sqrt(r) / 3 + r / 9) - delta
    assert checkpoint_interval(delta, m) == pytest.approx(daly, rel=1e-12)
    assert checkpoint_interval(delta, m) == pytest.approx(young, rel=0.05)
    # A checkpoint longer than twice the MTTF: checkpoint every MTTF.
    assert checkpoint_interval(3 * m, m) == m


def test_ettr_is_useful_time_over_dalys_expected_segment_time() -> None:
    tau, delta, restart, m = 600.0, 5.0, 600.0, 36000.0
    expected = m * math.exp(restart / m) * (math.exp((tau + delta) / m) - 1)
    assert ettr(tau, delta, restart, m) == pytest.approx(tau / expected)
    # No failures in sight: only the checkpoints cost time.
    assert ettr(tau, delta, 0.0, 1e12) == pytest.approx(tau / (tau + delta), rel=1e-6)


@pytest.mark.parametrize("asynchronous", [True, False])
def test_totals_of_two_plans_by_hand(asynchronous: bool) -> None:
    """1,024 GPUs for 100,000 steps of 12 s, busy computing 80% of the time; 1 TB of
    checkpoint, 8 GB per rank."""
    settings = RunAssumptions(3.0, 2e-5, 5.0, 10.0, asynchronous_checkpoints=asynchronous)
    t = training_totals(steps=100_000, step_time_s=12.0, compute_fraction=0.8, gpus=1024,
                        checkpoint_bytes=1e12, rank_checkpoint_bytes=8e9, devices_per_host=8,
                        costs=COSTS, settings=settings)
    seconds = 1.2e6
    assert t.days == pytest.approx(seconds / 86400)
    assert t.gpu_hours == pytest.approx(seconds / 3600 * 1024)
    assert t.cost_usd == pytest.approx(t.gpu_hours * 3.0)
    assert t.mttf_hours == pytest.approx(1 / (2e-5 * 1024))
    delta = 8e9 / (HOST_COPY_GBS * 1e9) if asynchronous else 8 * 8e9 / 5e9
    assert t.checkpoint_blocking_s == pytest.approx(delta)
    m = t.mttf_hours * 3600
    tau = checkpoint_interval(delta, m)
    assert t.checkpoint_interval_s == pytest.approx(tau)
    assert t.ettr == pytest.approx(ettr(tau, delta, 600.0, m))
    assert t.expected_days == pytest.approx(t.days / t.ettr)
    assert t.expected_cost_usd == pytest.approx(t.cost_usd / t.ettr)
    # GPUs at idle + 80% of the rest of 700 W, plus (10,200 - 8 x 700) / 8 W of host each.
    watts = 700 * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * 0.8) + 4600 / 8
    assert t.energy_kwh == pytest.approx(watts * 1024 * seconds / 3.6e6 * settings.pue)


def test_a_slower_checkpoint_write_means_a_longer_interval_and_a_lower_ettr() -> None:
    common = dict(steps=10_000, step_time_s=10.0, compute_fraction=0.9, gpus=4096,
                  checkpoint_bytes=1e12, rank_checkpoint_bytes=4e9, devices_per_host=8,
                  costs=COSTS)
    fast = training_totals(**common, settings=RunAssumptions(3.0, 2e-5, 20.0, 10.0, False))
    slow = training_totals(**common, settings=RunAssumptions(3.0, 2e-5, 2.0, 10.0, False))
    assert slow.checkpoint_blocking_s == pytest.approx(10 * fast.checkpoint_blocking_s)
    assert slow.checkpoint_interval_s > fast.checkpoint_interval_s
    assert slow.ettr < fast.ettr
    assert slow.expected_cost_usd > fast.expected_cost_usd
    # Asynchronous saves block only for the copy to host memory.
    quick = training_totals(**common, settings=RunAssumptions(3.0, 2e-5, 2.0, 10.0, True))
    assert quick.ettr > slow.ettr
