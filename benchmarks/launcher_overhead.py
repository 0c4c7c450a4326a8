"""Start-up cost of Tessel's two local launchers, side by side in one run.

`runtime.local_ranks.run_on_ranks` forks ranks that meet through a FileStore; `runtime.elastic
.launch` goes through torch's elastic agent (what torchrun runs). Both run the same
function: join the gloo group and all-reduce 1 MiB ten times. Each size is measured in
alternating rounds so that machine noise hits both alike; the table gives the median
seconds of a whole launch and the ratio elastic / fork (issue 11: the fork launcher stays
only if it is much faster for tests).

    .venv/bin/python benchmarks/launcher_overhead.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runtime.elastic import launch  # noqa: E402
from runtime.local_ranks import run_on_ranks  # noqa: E402

RANKS = (2, 4, 8)


def _all_reduces(rank: int, world: int) -> float:
    buffer = torch.ones(256 * 1024)  # 1 MiB of fp32
    for _ in range(10):
        dist.all_reduce(buffer)
    return float(buffer[0])


def _seconds(start_ranks, world: int) -> float:
    start = time.perf_counter()
    results = start_ranks(_all_reduces, world)
    assert results == [float(world**10)] * world
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'ranks':>5} {'fork s':>7} {'elastic s':>9} {'ratio':>6}")
    for world in RANKS:
        fork, elastic = [], []
        for _ in range(args.rounds):
            fork.append(_seconds(run_on_ranks, world))
            elastic.append(_seconds(launch, world))
        row = {"ranks": world, "fork_s": statistics.median(fork),
               "elastic_s": statistics.median(elastic)}
        row["ratio"] = row["elastic_s"] / row["fork_s"]
        rows.append(row)
        print(f"{world:>5} {row['fork_s']:>7.2f} {row['elastic_s']:>9.2f} {row['ratio']:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
