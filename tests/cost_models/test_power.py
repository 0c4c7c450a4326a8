"""A power cap a cluster file states, priced through the clock it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cost_models.compute import op_time
from cost_models.kernel_time import kernel_seconds
from cost_models.power import clock_fraction
from cost_models.transformer_ops import Attention, Matmul, Memory
from planner.vocabulary.cluster import Cluster, DeviceSpec


def _capped(limit: float | None) -> DeviceSpec:
    device = Cluster.load("dgx-h100").device
    return DeviceSpec.model_validate({**device.model_dump(), "rated_power_w": 700,
                                      "power_limit_w": limit})


def test_no_cap_keeps_the_quoted_peaks() -> None:
    assert clock_fraction(Cluster.load("dgx-h100").device) == 1.0
    assert clock_fraction(_capped(None)) == 1.0
    assert clock_fraction(_capped(700)) == 1.0


def test_the_cube_root_lands_near_the_datasheets_h100_nvl() -> None:
    # H100 NVL at 400 W: 1,671 bf16 TFLOP/s (sparse) against the SXM's 1,979 at 700 W.
    assert clock_fraction(_capped(400)) == pytest.approx(1671 / 1979, rel=0.02)
    # TorchTitan's 500 W H100s: between the NVL's peak and the SXM's (its footnote 2).
    assert 1671 / 1979 < clock_fraction(_capped(500)) < 1.0
    assert clock_fraction(_capped(500)) == pytest.approx((500 / 700) ** (1 / 3))


def test_a_cap_slows_compute_bound_kernels_and_not_memory_bound_ones() -> None:
    full, capped = Cluster.load("dgx-h100").device, _capped(500)
    eff = full.efficiency.model_copy(update={"kernel_overhead_us": 0.0})
    clock = clock_fraction(capped)
    matmul = Matmul("mlp input", 16384, 28672, 4096)
    attention = Attention("attention", 1e15)
    for op in (matmul, attention):
        assert kernel_seconds(op, capped, eff) == pytest.approx(
            kernel_seconds(op, full, eff) / clock)
    assert kernel_seconds(matmul, capped, eff, "fp8") == pytest.approx(
        kernel_seconds(matmul, full, eff, "fp8") / clock)
    memory = Memory("residual add", 1e9)
    assert kernel_seconds(memory, capped, eff) == kernel_seconds(memory, full, eff)
    assert op_time(1e15, 0, capped, "bf16") == pytest.approx(op_time(1e15, 0, full, "bf16")
                                                            / clock)


def test_a_cluster_file_states_the_cap(tmp_path: Path) -> None:
    preset = Path(__file__).resolve().parents[2] / "planner" / "presets" / "dgx-h100.yaml"
    data = yaml.safe_load(preset.read_text())
    data["device"] |= {"rated_power_w": 700, "power_limit_w": 500}
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(data))
    assert Cluster.load(str(path)).device.power_limit_w == 500


@pytest.mark.parametrize("fields, message", [
    ({"power_limit_w": 500}, "needs rated_power_w"),
    ({"power_limit_w": 800, "rated_power_w": 700}, "must not exceed"),
    ({"power_limit_w": 0, "rated_power_w": 700}, "greater than 0"),
])
def test_a_cap_without_its_rated_power_or_above_it_is_refused(fields: dict,
                                                              message: str) -> None:
    device = Cluster.load("dgx-h100").device.model_dump()
    with pytest.raises(ValidationError, match=message):
        DeviceSpec.model_validate({**device, **fields})
