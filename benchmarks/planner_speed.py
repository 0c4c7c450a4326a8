"""Wall time of the whole `plan` command, by model size and GPU count.

Each run is a fresh `python -m planner MODEL --cluster dgx-a100-80g --gpus N
--global-batch-size B` process, so imports and everything else a user waits for count.
Targets on a 2-core machine: GPT-3 175B on 1024 GPUs under 10 s; the 1T model on 3072
GPUs under 30 s (Alpa took ~40 minutes for 39B on 64 GPUs). A sweep over the number of
layers of one GPT shape checks that time grows at most linearly with depth.

    .venv/bin/python benchmarks/planner_speed.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("gpt3-1.3b", "gpt3-13b", "gpt3-175b", "gpt-1t")
GPU_COUNTS = (8, 64, 512, 1024, 3072, 4096)
TARGETS = {("gpt3-175b", 1024): 10.0, ("gpt-1t", 3072): 30.0}
DEPTHS = (24, 48, 96, 192)


def plan_seconds(*model: str, gpus: int, batch: int = 3072) -> tuple[float, bool]:
    command = [sys.executable, "-m", "planner", *model, "--cluster", "dgx-a100-80g",
               "--gpus", str(gpus), "--global-batch-size", str(batch)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode == 0


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    ok = True
    print(f"{'model':<10} {'GPUs':>5} {'plan s':>7}  target")
    runs = list(TARGETS) if quick else [(m, n) for m in MODELS for n in GPU_COUNTS]
    for model, gpus in runs:
        seconds, planned = plan_seconds(model, gpus=gpus)
        target = TARGETS.get((model, gpus))
        verdict = "-" if target is None else ("ok" if seconds < target else "MISSED")
        ok &= target is None or seconds < target
        print(f"{model:<10} {gpus:>5} {seconds:>7.1f}  {verdict}"
              + ("" if planned else "  (no plan fits)"))
    seconds, _ = plan_seconds("gpt3-175b", "--intra-op", "ilp", gpus=1024, batch=1536)
    print(f"{'gpt3-175b':<10} {1024:>5} {seconds:>7.1f}  (--intra-op ilp: trace + 3 ILPs)")
    print("\nscaling with depth: GPT h=4096, 32 heads, on 512 GPUs")
    print(f"{'layers':>6} {'plan s':>7} {'s per layer':>12}")
    per_layer = []
    for layers in DEPTHS:
        seconds, _ = plan_seconds("gpt", "--num-layers", str(layers), "--hidden-size", "4096",
                                  "--num-attention-heads", "32", "--seq-length", "2048",
                                  "--vocab-size", "51200", gpus=512)
        per_layer.append(seconds / layers)
        print(f"{layers:>6} {seconds:>7.1f} {seconds / layers:>12.3f}")
    linear = per_layer[-1] <= per_layer[0] * 1.1
    print(f"time per layer does not grow with depth: {'yes' if linear else 'NO'}")
    return 0 if ok and linear else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
