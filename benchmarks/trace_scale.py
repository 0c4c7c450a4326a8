"""Trace + layer detection at full model scale, on the meta device.

For GPT-3 1.3B, 13B, 175B and the 1T model, each in a fresh process (so peak memory is
that model's alone): the wall time of `trace_model` (trace two blocks, find layers and
templates, expand to full depth) and the peak resident memory of the whole process,
torch import included. Targets on a 2-core machine: 175B and 1T each under 5 s and
under 2 GiB.

    .venv/bin/python benchmarks/trace_scale.py [MODEL ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["gpt3-1.3b", "gpt3-13b", "gpt3-175b", "gpt-1t"]
TARGET_S, TARGET_GIB = 5.0, 2.0
TARGETED = {"gpt3-175b", "gpt-1t"}

# Runs in the child: one model, one JSON line out.
_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from planner.models.sources import load_model
from passes.model_graph import trace_model
loaded = load_model({name!r})
start = time.perf_counter()
graph = trace_model(loaded.build, loaded.num_layers)
wall = time.perf_counter() - start
print(json.dumps(dict(
    wall_s=wall, trace_s=graph.trace_s, layers_s=graph.layers_s,
    peak_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    layers=len(graph.layers), templates=len(graph.templates),
    parameters=graph.num_parameters, on_meta=loaded.on_meta,
)))
"""


def measure(name: str) -> dict:
    script = _CHILD.format(root=str(ROOT), name=name)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(names: list[str]) -> int:
    print(f"{'model':<11} {'params':>9} {'layers':>6} {'templ':>5} {'trace+layers s':>14} "
          f"{'peak GiB':>8}  target")
    failed = False
    for name in names:
        r = measure(name)
        verdict = "-"
        if name in TARGETED:
            ok = r["wall_s"] < TARGET_S and r["peak_gib"] < TARGET_GIB and r["on_meta"]
            verdict = "ok" if ok else "MISSED"
            failed |= not ok
        print(f"{name:<11} {r['parameters'] / 1e9:>8.1f}B {r['layers']:>6} {r['templates']:>5} "
              f"{r['wall_s']:>14.2f} {r['peak_gib']:>8.2f}  {verdict}")
    print(f"targets: {', '.join(sorted(TARGETED))} under {TARGET_S:g} s and {TARGET_GIB:g} GiB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or MODELS))
