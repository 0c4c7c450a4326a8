"""What offload buys and costs: Llama 3 70B and 405B on 8 and 32 H100 (DGX H100 hosts: 2 TB of
DDR5, PCIe Gen5 x16 per GPU, eight U.2 NVMe drives), each kind of offload fixed in turn and
the rest searched, beside the GPUs each needs without offload.

Rows: none; the optimizer's state to the CPU (ZeRO-Offload) or NVMe (ZeRO-Infinity); the
parameters too (ZeRO-3, to the CPU or NVMe); and Megatron-LM's activation offload (one
stage, no recomputation). Each row: the best plan's step time, tokens/s, the offload's share
of the step, host memory and NVMe traffic per host, or why nothing fits. Every number is
the planner's prediction (`cost_models.offload`): no run of these was measured here, and
the offload mechanisms are priced from the preset's host figures with estimated
efficiencies (PCIe 80% of the link, 50% of the host's memory bandwidth for CPU-Adam).

    .venv/bin/python benchmarks/offload.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.models.presets import zoo_config  # noqa: E402
from planner.search import search  # noqa: E402
from planner.search.megatron_space import devices_needed  # noqa: E402
from planner.vocabulary.cluster import Cluster  # noqa: E402
from planner.vocabulary.parallel import FixedKnobs  # noqa: E402

CASES = (("llama3-70b", 8, 32), ("llama3-70b", 32, 64), ("llama3-405b", 8, 16),
         ("llama3-405b", 32, 16))
"""(model, GPUs, global batch): sequences of 8192 tokens."""
SEQUENCE = 8192
OFFLOADS: dict[str, dict] = {
    "none": {},
    "optimizer cpu": {"offload_optimizer": "cpu"},
    "optimizer nvme": {"offload_optimizer": "nvme"},
    "opt+params cpu": {"offload_optimizer": "cpu", "offload_params": "cpu", "zero_stage": 3},
    "opt cpu, params nvme": {"offload_optimizer": "cpu", "offload_params": "nvme",
                             "zero_stage": 3},
    "opt+params nvme": {"offload_optimizer": "nvme", "offload_params": "nvme",
                        "zero_stage": 3},
    "activations 8 layers": {"offload_activation_layers": 8, "pipeline": 1,
                             "recompute": "none"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args()
    cluster = Cluster.load("dgx-h100")
    rows = []
    print(f"{'model':<12} {'GPUs':>4} {'offload':<21} {'step s':>8} {'tok/s':>8} "
          f"{'offload':>8} {'host GiB':>9} {'NVMe GB':>8}  layout / note")
    for name, gpus, batch in CASES:
        model = zoo_config(name, {"seq_length": SEQUENCE})
        here = cluster.with_devices(gpus)
        needed = devices_needed(model, here, batch, FixedKnobs()) \
            if not search(model, here, batch, FixedKnobs(offload_optimizer="none"),
                          "auto").ranked else gpus
        for label, knobs in OFFLOADS.items():
            start = time.perf_counter()
            fixed = FixedKnobs({"offload_optimizer": "none", **knobs})
            result = search(model, here, batch, fixed, "auto")
            seconds = time.perf_counter() - start
            row = {"model": name, "gpus": gpus, "global_batch": batch, "offload": label,
                   "gpus_needed_without_offload": needed, "search_s": seconds}
            if not result.ranked:
                row["fits"] = False
                print(f"{name:<12} {gpus:>4} {label:<21} {'-':>8} {'-':>8} {'-':>8} "
                      f"{'-':>9} {'-':>8}  does not fit")
            else:
                candidate, p = result.ranked[0]
                d = candidate.parallel.dims
                layout = (f"t{d.tensor} p{d.pipeline} c{d.context} d{d.data} "
                          f"zero{candidate.parallel.sharding.zero_stage} "
                          f"{candidate.parallel.recomputation.recompute}")
                row |= {"fits": True, "step_s": p.step_time_s, "tokens_per_s": p.tokens_per_s,
                        "offload_s": p.offload_s, "host_gib_per_host":
                        p.host_memory_gib_per_host, "nvme_gb_per_step": p.nvme_gb_per_step,
                        "pcie_gb_per_step": p.pcie_gb_per_step,
                        "memory_gib_per_gpu": p.memory_gib_per_gpu, "layout": layout}
                print(f"{name:<12} {gpus:>4} {label:<21} {p.step_time_s:>8.2f} "
                      f"{p.tokens_per_s:>8,.0f} {p.offload_s:>8.2f} "
                      f"{p.host_memory_gib_per_host:>9.0f} {p.nvme_gb_per_step:>8.0f}  {layout}")
            rows.append(row)
        print(f"{'':<12} {'':>4} without offload {name} needs at least {needed} GPUs "
              f"at global batch {batch}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
