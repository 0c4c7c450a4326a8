"""How good the planner's choices are, against measurements and across the zoo.

1. Regret on measured runs: for each model size of vTrain's multi-node file, the planner
   ranks that size's measured configurations by predicted step time (the search space
   restricted to what was measured); the regret is the measured time of its pick over the
   fastest measured one, minus 1. Target: <= 5% for every size.
2. For every GPT-3 and Llama 3 preset on 8 to 4096 GPUs of A100 and H100 clusters: the
   predicted MFU of the best plan (Alpa's space) and its degrees.

    .venv/bin/python benchmarks/plan_quality.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.efficiency_fit import predict_all, read_measurements, vtrain_cluster  # noqa: E402
from planner.vocabulary.cluster import Cluster  # noqa: E402
from planner.models.presets import PRESETS  # noqa: E402
from planner.search import search  # noqa: E402
from planner.search.megatron_space import Candidate  # noqa: E402

MULTI = ROOT.parent / "shared" / "calibration" / "vtrain_a100_multi_node.csv"
REGRET_TARGET = 0.05
CLUSTERS = ("dgx-a100-80g", "dgx-h100")
GPU_COUNTS = (8, 64, 512, 4096)
# Sequences per step: Megatron-LM's GPT-3 runs use 512-1536; enough for 4096 GPUs.
GLOBAL_BATCH = 4096


def regret() -> bool:
    steps = read_measurements(MULTI)
    predicted = predict_all(steps, vtrain_cluster(Cluster.load("dgx-a100-80g")))
    ok = True
    print(f"{'size':<6} {'configs':>7} {'picked (t, p, d, mb)':<22} {'measured s':>10} "
          f"{'best s':>7} {'regret':>7}")
    for label in dict.fromkeys(s.label for s in steps):
        rows = [i for i, s in enumerate(steps) if s.label == label]
        pick = min(rows, key=lambda i: predicted[i])
        best = min(rows, key=lambda i: steps[i].seconds)
        loss = steps[pick].seconds / steps[best].seconds - 1
        ok &= loss <= REGRET_TARGET
        q = steps[pick].parallel
        picked = str((q.dims.tensor, q.dims.pipeline, q.dims.data, q.batch.micro_batch_size))
        print(f"{label:<6} {len(rows):>7} {picked:<22} "
              f"{steps[pick].seconds:>10.2f} {steps[best].seconds:>7.2f} {loss:>7.1%}")
    return ok


def zoo(quick: bool) -> None:
    names = [n for n in PRESETS if n.startswith(("gpt3", "llama3"))]
    counts = GPU_COUNTS[:2] if quick else GPU_COUNTS
    print(f"\n{'model':<11} {'cluster':<13} {'GPUs':>5} {'MFU':>6} {'step s':>8}  best plan "
          f"(search s)")
    for name in names:
        for cluster_name in CLUSTERS:
            for n in counts:
                cluster = Cluster.load(cluster_name).with_devices(n)
                start = time.perf_counter()
                result = search(PRESETS[name], cluster, GLOBAL_BATCH, {}, "auto")
                elapsed = time.perf_counter() - start
                if not result.ranked:
                    print(f"{name:<11} {cluster_name:<13} {n:>5} {'-':>6} {'-':>8}  no plan fits")
                    continue
                candidate, prediction = result.ranked[0]
                print(f"{name:<11} {cluster_name:<13} {n:>5} {prediction.mfu:>6.1%} "
                      f"{prediction.step_time_s:>8.2f}  {describe(candidate)} ({elapsed:.1f})")


def describe(candidate: Candidate) -> str:
    q = candidate.parallel
    d, micro, recompute = q.dims, q.batch.micro_batch_size, q.recomputation.recompute
    if candidate.stages:
        meshes = " ".join(f"{s.layers}L@{s.data}x{s.tensor}" for s in candidate.stages)
        return f"stages {meshes}, micro-batch {micro}, {recompute}"
    v = q.pipelining.virtual_pipeline
    extra = f" v{v}" if v > 1 else ""
    return (f"t{d.tensor} p{d.pipeline} d{d.data} cp{d.context} mb{micro} {recompute} "
            f"sp={int(q.sharding.sequence_parallel)} zero{q.sharding.zero_stage} "
            f"{q.pipelining.schedule}{extra}")


def main(argv: list[str]) -> int:
    ok = regret()
    print(f"regret target <= {REGRET_TARGET:.0%}: {'met' if ok else 'MISSED'}")
    zoo("--quick" in argv)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
