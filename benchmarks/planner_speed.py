"""Wall time of the whole `plan` command, by model size and GPU count.

Each run is a fresh `python -m planner MODEL ...` process, so imports and everything else
a user waits for count. Two groups of rows (`--rows`):

- `zoo`: `plan MODEL --cluster dgx-a100-80g --gpus N --global-batch-size B` for zoo
  transformers given by their shape. Targets on a 2-core machine: GPT-3 175B on 1024 GPUs
  under 10 s; the 1T model on 3072 GPUs under 30 s (Alpa took ~40 minutes for 39B on 64
  GPUs). A sweep over the number of layers of one GPT shape checks that time grows at most
  linearly with depth. Issue 15's rows: the same 175B command with global batch 1536 under
  1.5 s and the 1T model under 4 s, beside the 5 s and 15 s the issue measured before
  (zoo plans no longer import torch).
- `traced` (issue 12): models whose graph is traced, on 64 GPUs of aws-p3.16xlarge with
  global batch 1024. A ~1B-parameter model of 200 distinct layers
  (`benchmarks/distinct_layers.py`), planned by the graph path (traced, cut into at most 16
  layers, each layer's intra-op ILP on every 1-D logical mesh and on every 2-D one a plan
  reads, the others bounded, short of the whole cluster, whose one-stage layouts are
  bounded; the stage DP): under 60 s.
  Alpa's GPT 39B (its OSDI'22 shape, as `benchmarks/alpa_e2e.py` plans it) with
  `--intra-op ilp`, planned by the same graph path (four blocks traced and described at 48,
  the three layer templates solved on every logical mesh, stages run as their layers'
  programs, micro-batch 1): target under 10 s (Alpa: 2,393 s for 39B on 64 GPUs,
  profiling included). Each command gets at most
  `--timeout` seconds; the timings it prints (trace, ILPs, stage DP, search) are kept.

- `moe` (issue 30): DeepSeek-V3 at 8192 sequences of 4096 tokens on 1024 H100s and 256
  GB200s, each command under 5 s.
- `million` (issue 47): GPT-3 175B, the 1T GPT and DeepSeek-V3 on 2^20 H100s at the
  sequences per GPU of their 1,024-GPU rows beside them, each command under 5 s.
- `finetune` (issue 46): Llama 3 70B on 8 H100 at 32 sequences of 4096 tokens with
  `--finetune lora --lora-rank 16` and `--finetune qlora`, each under 2 s; and, beside them,
  the full fine-tune of the same model on the same GPUs, which the search must offload.

    .venv/bin/python benchmarks/planner_speed.py [--quick]
        [--rows all|zoo|traced|moe|finetune|million]
        [--timeout S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("gpt3-1.3b", "gpt3-13b", "gpt3-175b", "gpt-1t")
GPU_COUNTS = (8, 64, 512, 1024, 3072, 4096)
TARGETS = {("gpt3-175b", 1024): 10.0, ("gpt-1t", 3072): 30.0}
# Issue 15's whole-command targets (an instant CLI: zoo plans import no torch) and the
# times the issue measured before it: (model, GPUs, global batch) -> (target s, old s).
INSTANT = {("gpt3-175b", 1024, 1536): (1.5, 5.0), ("gpt-1t", 3072, 3072): (4.0, 15.0)}
# A Llama 3 8B config.json as the Hub has it (the fields of its shape), planned through
# `hf:` on 64 A100s: 5.7 s (median of three) before hf: plans stopped importing torch.
LLAMA3_8B_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32,
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}
HF_BEFORE_S = 5.7
DEPTHS = (24, 48, 96, 192)
# Issue 30: DeepSeek-V3 at 8192 x 4096 tokens, (cluster, GPUs, target s).
MOE_ROWS = (("dgx-h100", 1024, 5.0), ("gb200-nvl72", 256, 5.0))
# Issue 47: a million GPUs (2^20 H100s) beside 1,024, at the same sequences per GPU:
# (model and its flags, sequences per GPU); each command under 5 s at 2^20.
MILLION_GPUS = 1 << 20
MILLION_ROWS = ((("gpt3-175b",), 2), (("gpt-1t",), 2),
                (("deepseek-v3", "--seq-length", "4096"), 8))
FINETUNE_ROWS = ((("--finetune", "lora", "--lora-rank", "16"), 2.0),
                 (("--finetune", "qlora"), 2.0), (("--finetune", "full"), None))


class TracedRow(NamedTuple):
    name: str
    model: tuple[str, ...]
    """MODEL and its shape flags, as `plan` takes them."""
    gpus: int
    target_s: float
    extra: tuple[str, ...] = ()


TRACED_CLUSTER = "aws-p3.16xlarge"
TRACED_BATCH = 1024
# Alpa's GPT 39B: alpa_e2e.py CASES (hidden 8192, 48 layers, 64 heads, seq 1024, vocab 51200).
GPT_39B = ("gpt", "--num-layers", "48", "--hidden-size", "8192", "--num-attention-heads",
           "64", "--seq-length", "1024", "--vocab-size", "51200")
TRACED_ROWS = (
    TracedRow("distinct-1b", ("benchmarks/distinct_layers.py:distinct_layers",), 64, 60.0),
    TracedRow("gpt-39b ilp", GPT_39B, 64, 10.0, ("--intra-op", "ilp")),
)
TIMING = re.compile(r"([a-z_]+) ([\d.]+) s\b")
CONTINUED = re.compile(r"^\s*([\d.]+ s(, |$))?([a-z_]+ [\d.]+ s(, |$))*$")


def plan_seconds(*model: str, gpus: int, batch: int = 3072,
                 cluster: str = "dgx-a100-80g") -> tuple[float, bool]:
    command = [sys.executable, "-m", "planner", *model, "--cluster", cluster,
               "--gpus", str(gpus), "--global-batch-size", str(batch)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode == 0


def printed_timings(stdout: str) -> dict:
    """What the command said about its time: the graph path's 'N layers, K layer ILPs,
    B bounds, P layouts bounded out; trace ..., layer_ilps ..., ...' or the zoo path's
    'searched N configurations in ...'."""
    out: dict = {}
    # The console wraps the line at 80 columns: join a line with the timings that follow.
    lines = []
    for line in stdout.splitlines():
        if lines and line.strip() and CONTINUED.match(line):
            lines[-1] = lines[-1].rstrip() + " " + line.strip()
        else:
            lines.append(line)
    for line in lines:
        graph = re.match(r"\s*(\d+) layers, (\d+) layer ILPs, (\d+) bounds, (\d+) layouts "
                         r"bounded out; (.*)", line)
        zoo = re.match(r"\s*searched ([\d,]+) configurations in (.*)", line)
        if graph:
            out = {"layers": int(graph[1]), "layer_ilps": int(graph[2]),
                   "layer_bounds": int(graph[3]), "layouts_bounded": int(graph[4]),
                   "line": line.strip(),
                   "timings_s": {k: float(v) for k, v in TIMING.findall(graph[5])}}
        elif zoo:
            out = {"configurations": int(zoo[1].replace(",", "")), "line": line.strip(),
                   "timings_s": {k: float(v) for k, v in TIMING.findall(zoo[2])}}
    return out


def run_bounded(command: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """Run `command` in its own process group; past `timeout_s` kill the group (the
    command's forked ILP workers too). The exit status is None when it was killed."""
    env = {**os.environ, "COLUMNS": "1000"}  # rich wraps at 80 columns otherwise
    process = subprocess.Popen(command, cwd=ROOT, env=env, text=True, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return None, stdout, stderr
    return process.returncode, stdout, stderr


def run_traced(row: TracedRow, timeout_s: float) -> dict:
    """One traced row: the whole command, its wall time, what it printed and planned."""
    result = {"model": row.name, "gpus": row.gpus, "target_s": row.target_s}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        command = [sys.executable, "-m", "planner", *row.model, "--gpus", str(row.gpus),
                   "--cluster", TRACED_CLUSTER, "--global-batch-size", str(TRACED_BATCH),
                   *row.extra, "--json", str(out)]
        result["command"] = " ".join(["plan", *command[3:-2]])
        start = time.perf_counter()
        returncode, stdout, stderr = run_bounded(command, timeout_s)
        seconds = time.perf_counter() - start
        result.update(command_s=seconds, met=returncode == 0 and seconds < row.target_s,
                      **printed_timings(stdout))
        if returncode is None:
            return {**result, "error": f"timed out after {timeout_s:g} s"}
        if returncode != 0:
            lines = (stdout + stderr).strip().splitlines()
            return {**result, "error": lines[-1] if lines else f"exit {returncode}"}
        predicted = json.loads(out.read_text())["predicted"]
    return {**result, "step_time_s": predicted["step_time_s"],
            "memory_gib_per_gpu": predicted["memory_gib_per_gpu"]}


def traced_rows(timeout_s: float) -> list[dict]:
    print(f"{'model':<12} {'GPUs':>5} {'command s':>9} {'target':>7}  verdict  printed")
    rows = []
    for row in TRACED_ROWS:
        r = run_traced(row, timeout_s)
        rows.append(r)
        failed = "error" in r and not r["error"].startswith("timed out")
        verdict = "met" if r["met"] else ("FAILED" if failed else "MISSED")
        said = r.get("error") or r.get("line", "")
        if "error" in r and "line" in r:
            said = f"{r['line']}; {r['error']}"
        print(f"{r['model']:<12} {r['gpus']:>5} {r['command_s']:>9.1f} "
              f"{'< ' + format(row.target_s, 'g') + ' s':>7}  {verdict:<7}  {said}", flush=True)
    return rows


def zoo_rows(quick: bool) -> tuple[list[dict], bool]:
    """The zoo rows as before: sizes and GPU counts, the 175B ILP row, the depth sweep."""
    ok = True
    rows = []
    print(f"{'model':<10} {'GPUs':>5} {'plan s':>7}  target")
    runs = list(TARGETS) if quick else [(m, n) for m in MODELS for n in GPU_COUNTS]
    for model, gpus in runs:
        seconds, planned = plan_seconds(model, gpus=gpus)
        target = TARGETS.get((model, gpus))
        verdict = "-" if target is None else ("ok" if seconds < target else "MISSED")
        ok &= target is None or seconds < target
        rows.append({"model": model, "gpus": gpus, "command_s": seconds, "target_s": target,
                     "met": None if target is None else seconds < target, "planned": planned})
        print(f"{model:<10} {gpus:>5} {seconds:>7.1f}  {verdict}"
              + ("" if planned else "  (no plan fits)"), flush=True)
    print(f"\n{'instant CLI':<10} {'GPUs':>5} {'plan s':>7} {'before':>7}  target")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
        instant = {**INSTANT, (f"hf:{folder}", 64, 512): (None, HF_BEFORE_S)}
        for (model, gpus, batch), (target, before) in instant.items():
            # The median of three runs: a second's command is as noisy as it is short.
            runs = [plan_seconds(model, gpus=gpus, batch=batch) for _ in range(3)]
            seconds, planned = sorted(runs)[1][0], all(done for _, done in runs)
            met = planned and (target is None or seconds < target)
            ok &= met
            name = "hf:llama3-8b config" if model.startswith("hf:") else model
            rows.append({"model": name, "gpus": gpus, "global_batch": batch,
                         "command_s": seconds, "runs_s": [r for r, _ in runs],
                         "before_s": before, "target_s": target, "met": met,
                         "planned": planned})
            verdict = "-" if target is None else f"< {target:g} s: {'ok' if met else 'MISSED'}"
            print(f"{name:<10} {gpus:>5} {seconds:>7.2f} {before:>7.1f}  {verdict}")
    print()
    seconds, planned = plan_seconds("gpt3-175b", "--intra-op", "ilp", gpus=1024, batch=1536)
    rows.append({"model": "gpt3-175b", "gpus": 1024, "intra_op": "ilp", "command_s": seconds,
                 "planned": planned})
    print(f"{'gpt3-175b':<10} {1024:>5} {seconds:>7.1f}  (--intra-op ilp: the graph path)")
    print("\nscaling with depth: GPT h=4096, 32 heads, on 512 GPUs")
    print(f"{'layers':>6} {'plan s':>7} {'s per layer':>12}")
    per_layer = []
    for layers in DEPTHS:
        seconds, planned = plan_seconds(
            "gpt", "--num-layers", str(layers), "--hidden-size", "4096",
            "--num-attention-heads", "32", "--seq-length", "2048", "--vocab-size", "51200",
            gpus=512)
        per_layer.append(seconds / layers)
        rows.append({"model": "gpt h4096", "layers": layers, "gpus": 512,
                     "command_s": seconds, "planned": planned})
        print(f"{layers:>6} {seconds:>7.1f} {seconds / layers:>12.3f}")
    linear = per_layer[-1] <= per_layer[0] * 1.1
    print(f"time per layer does not grow with depth: {'yes' if linear else 'NO'}")
    return rows, ok and linear


def moe_rows() -> tuple[list[dict], bool]:
    """Issue 30's rows: `plan deepseek-v3 --global-batch-size 8192 --seq-length 4096` on
    1024 H100s and 256 GB200s, each under 5 s (the median of three commands)."""
    ok, rows = True, []
    print(f"{'MoE':<12} {'cluster':<12} {'GPUs':>5} {'plan s':>7}  target")
    for cluster, gpus, target in MOE_ROWS:
        runs = [plan_seconds("deepseek-v3", "--seq-length", "4096", gpus=gpus, batch=8192,
                             cluster=cluster) for _ in range(3)]
        seconds, planned = sorted(runs)[1][0], all(done for _, done in runs)
        met = planned and seconds < target
        ok &= met
        rows.append({"model": "deepseek-v3", "cluster": cluster, "gpus": gpus,
                     "command_s": seconds, "runs_s": [r for r, _ in runs],
                     "target_s": target, "met": met})
        print(f"{'deepseek-v3':<12} {cluster:<12} {gpus:>5} {seconds:>7.2f}  "
              f"< {target:g} s: {'ok' if met else 'MISSED'}", flush=True)
    return rows, ok


def million_rows() -> tuple[list[dict], bool]:
    """Issue 47's rows: GPT-3 175B, the 1T GPT and DeepSeek-V3 on 2^20 H100s, each command
    under 5 s, beside the same model on 1,024 (the median of three commands)."""
    ok, rows = True, []
    print(f"{'million':<12} {'GPUs':>9} {'batch':>9} {'plan s':>7}  target")
    for model, per_gpu in MILLION_ROWS:
        for gpus in (1024, MILLION_GPUS):
            runs = [plan_seconds(*model, gpus=gpus, batch=per_gpu * gpus,
                                 cluster="dgx-h100") for _ in range(3)]
            seconds, planned = sorted(runs)[1][0], all(done for _, done in runs)
            target = 5.0 if gpus == MILLION_GPUS else None
            met = planned and (target is None or seconds < target)
            ok &= met
            rows.append({"model": model[0], "gpus": gpus, "global_batch": per_gpu * gpus,
                         "command_s": seconds, "runs_s": [r for r, _ in runs],
                         "target_s": target, "met": met})
            verdict = "-" if target is None else f"< {target:g} s: {'ok' if met else 'MISSED'}"
            print(f"{model[0]:<12} {gpus:>9,} {per_gpu * gpus:>9,} {seconds:>7.2f}  {verdict}",
                  flush=True)
    return rows, ok


def finetune_rows() -> tuple[list[dict], bool]:
    """Issue 46's rows: Llama 3 70B fine-tuned on 8 H100 (the median of three commands)."""
    ok, rows = True, []
    print(f"{'fine-tune':<12} {'cluster':<12} {'GPUs':>5} {'plan s':>7}  target")
    for flags, target in FINETUNE_ROWS:
        runs = [plan_seconds("llama3-70b", "--seq-length", "4096", *flags, gpus=8, batch=32,
                             cluster="dgx-h100") for _ in range(3)]
        seconds, planned = sorted(runs)[1][0], all(done for _, done in runs)
        met = planned and (target is None or seconds < target)
        ok &= met
        rows.append({"model": "llama3-70b", "flags": list(flags), "gpus": 8,
                     "command_s": seconds, "runs_s": [r for r, _ in runs],
                     "target_s": target, "met": met})
        verdict = "-" if target is None else f"< {target:g} s: {'ok' if met else 'MISSED'}"
        print(f"{flags[1]:<12} {'dgx-h100':<12} {8:>5} {seconds:>7.2f}  {verdict}", flush=True)
    return rows, ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="zoo rows: only those with a target, and the sweep")
    parser.add_argument("--rows", choices=("all", "zoo", "traced", "moe", "finetune",
                                           "million"),
                        default="all")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds each traced row's command may run (default 900)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows: dict[str, list[dict]] = {}
    ok = True
    if args.rows in ("all", "zoo"):
        rows["zoo"], ok = zoo_rows(args.quick)
    if args.rows in ("all", "moe"):
        if rows:
            print()
        rows["moe"], moe_ok = moe_rows()
        ok &= moe_ok
    if args.rows in ("all", "finetune"):
        if rows:
            print()
        rows["finetune"], finetune_ok = finetune_rows()
        ok &= finetune_ok
    if args.rows in ("all", "million"):
        if rows:
            print()
        rows["million"], million_ok = million_rows()
        ok &= million_ok
    if args.rows in ("all", "traced"):
        if rows:
            print()
        rows["traced"] = traced_rows(args.timeout)
        ok &= all(r["met"] for r in rows["traced"])
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"rows written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
