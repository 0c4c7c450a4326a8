"""How long Alpa's stage DP (`planner.search.inter_op.stage_dp`) takes at GPT-3's depth:
L = 96 layers, 8 submeshes (1-8 devices, 2-16 nodes of 8), 128 devices, 16 positions,
B = 64 micro-batches; the instance the tests check the plan of
(`tests/planner/search/test_inter_op.py::synthetic_instance`). Wall time is noisy on
shared CPUs, so it is measured here (median of 3) and never asserted in a test.

    .venv/bin/python benchmarks/stage_dp_speed.py
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.search.inter_op import stage_dp  # noqa: E402


def _synthetic_instance():
    path = ROOT / "tests" / "planner" / "search" / "test_inter_op.py"
    spec = importlib.util.spec_from_file_location("test_inter_op", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_instance


def main() -> int:
    instance = _synthetic_instance()()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        plan = stage_dp(**instance)
        times.append(time.perf_counter() - start)
    print(f"stage_dp L=96 S=8 D=128 K=16 B=64: median {statistics.median(times):.2f} s "
          f"(runs {', '.join(f'{t:.2f}' for t in times)}); {len(plan.stages)} stages, "
          f"t_max {plan.t_max:.4f}, total {plan.total_latency:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
