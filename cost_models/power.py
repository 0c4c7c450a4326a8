"""What a power cap costs: the clock a GPU sustains under a board power limit below the
power its peaks are quoted at, and so the share of its compute peaks it keeps.

A GPU running large matmuls draws its whole power limit, and its firmware lowers the SM
clock until it holds it (DVFS). Dynamic power goes as C V^2 f and the voltage falls with
the clock across the DVFS range, so power goes roughly as f^3 and the clock a limit
sustains as the cube root of the power: f(P_limit) / f(P_rated) = (P_limit / P_rated)^(1/3).

Sources and a check:

- NVIDIA's H100 product page (Technical Specifications, H100 SXM against H100 NVL) quotes
  the same 132-SM Hopper die at 1,979 bf16 TFLOP/s with sparsity (989.5 dense) as an SXM
  board at up to 700 W and 1,671 as an NVL board at 350-400 W: 0.844 of the SXM's peak,
  where the cube root gives (400/700)^(1/3) = 0.830 (an exponent of 0.30 would give the
  datasheet's exactly).
- TorchTitan's own H100s (benchmarks/llama3_h100_202412_torchtitan.md @820504e2, its
  footnote 2): 96 GB HBM2e boards at "the default 500W power limit", whose "actual peak
  TFLOPs number is between SXM and NVL": the cube root puts it at 0.894 of the SXM's
  peak, 885 TFLOP/s, between the two.
- Ujeniya et al., "Architectural Trade-offs in the Energy-Efficient Era: A Comparative Study
  of power-capping NVIDIA H100 and H200" (arXiv 2604.11391) cap the same H100 HBM2e board
  from 200 to 700 W and find the cap acting through the SM clock on compute-bound DGEMM.
  Tessel lowers the compute peaks only; memory-bound kernels keep the HBM's bandwidth (an
  assumption: the HBM clock is not what the firmware lowers first).

Uncertainty: the exponent is the physics' 1/3, checked on one datasheet pair to 2%; the
clock a board sustains also depends on its cooling and on how much of the limit its HBM
draws (HBM2e draws less than HBM3), so read the fraction as +-5%.
"""

from __future__ import annotations

from planner.vocabulary.cluster import DeviceSpec

CLOCK_POWER_EXPONENT = 1 / 3
"""Sustained clock over rated clock as (power limit / rated power) to this power: the
cube root of dynamic power's C V^2 f with V falling with f (see the module's sources)."""


def clock_fraction(device: DeviceSpec) -> float:
    """Share of its quoted compute peaks `device` sustains at its power limit: 1.0 without
    one, else (power_limit_w / rated_power_w) ** CLOCK_POWER_EXPONENT."""
    if device.power_limit_w is None or device.rated_power_w is None:
        return 1.0
    return (device.power_limit_w / device.rated_power_w) ** CLOCK_POWER_EXPONENT
