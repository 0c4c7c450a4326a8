"""Wall time of `plan` commands in this tree against another revision, side by side.

A change that restructures the search (a refactor, a new knob) must not slow it: this
checks out REV into a temporary git worktree, runs each command in both trees in turn
(fresh processes, alternating, so both see the same machine load) and prints the median
seconds of each and their ratio (this tree / REV).

    .venv/bin/python benchmarks/speed_vs_revision.py --rev HEAD~1 [--repeats 3] [--traced]
        [--json PATH]

`--traced` adds planner_speed.py's traced rows (a graph plan of 200 distinct layers, and
Alpa's GPT 39B under the intra-op ILP; tens of seconds each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The zoo rows of planner_speed.py and its MoE rows (issue 30), one command each.
COMMANDS = {
    "gpt3-175b 1024 A100": ("gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
                            "--global-batch-size", "1536"),
    "gpt-1t 3072 A100": ("gpt-1t", "--cluster", "dgx-a100-80g", "--gpus", "3072",
                         "--global-batch-size", "3072"),
    "gpt3-13b 512 A100 megatron": ("gpt3-13b", "--cluster", "dgx-a100-80g", "--gpus", "512",
                                   "--global-batch-size", "3072", "--space", "megatron"),
    "deepseek-v3 1024 H100": ("deepseek-v3", "--seq-length", "4096", "--cluster", "dgx-h100",
                              "--gpus", "1024", "--global-batch-size", "8192"),
    "deepseek-v3 256 GB200": ("deepseek-v3", "--seq-length", "4096", "--cluster",
                              "gb200-nvl72", "--gpus", "256", "--global-batch-size", "8192"),
}
TRACED = {
    "distinct-1b 64 V100 (graph)": ("benchmarks/distinct_layers.py:distinct_layers",
                                    "--cluster", "aws-p3.16xlarge", "--gpus", "64",
                                    "--global-batch-size", "1024"),
    "gpt-39b 64 V100 intra-op ilp": ("gpt", "--num-layers", "48", "--hidden-size", "8192",
                                     "--num-attention-heads", "64", "--seq-length", "1024",
                                     "--vocab-size", "51200", "--cluster", "aws-p3.16xlarge",
                                     "--gpus", "64", "--global-batch-size", "1024",
                                     "--intra-op", "ilp"),
}


def seconds(tree: Path, command: tuple[str, ...]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner", *command], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"plan {' '.join(command)} failed in {tree}: {done.stdout[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the revision to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--traced", action="store_true", help="add the traced rows")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        other = Path(scratch) / "rev"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.rev],
                       cwd=ROOT, check=True)
        try:
            print(f"{'command':<28} {args.rev:>10} {'this':>8} {'ratio':>6}")
            for name, command in {**COMMANDS, **(TRACED if args.traced else {})}.items():
                runs: dict[str, list[float]] = {"rev": [], "this": []}
                for _ in range(args.repeats):
                    runs["rev"].append(seconds(other, command))
                    runs["this"].append(seconds(ROOT, command))
                before, after = (statistics.median(runs[k]) for k in ("rev", "this"))
                rows.append({"command": name, "rev_s": before, "this_s": after,
                             "ratio": after / before, "runs_s": runs})
                print(f"{name:<28} {before:>9.2f}s {after:>7.2f}s {after / before:>6.2f}",
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT)
    print(f"median ratio {statistics.median(r['ratio'] for r in rows):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rev": args.rev, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
