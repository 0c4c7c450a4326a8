"""Alpa's GPT-3 weak-scaling setting, planned end to end by Tessel.

What it measures: for each model size and GPU count of Alpa's GPT end-to-end evaluation
(Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", OSDI'22, §8.1 and Table 4: 350M on 1 GPU up to 39B on 64 GPUs of AWS
p3.16xlarge, sequence 1024, global batch 1024, fp16), Tessel's training-plan search
(Alpa's space, as `plan MODEL --cluster aws-p3.16xlarge --gpus N --global-batch-size 1024
--precision fp16` runs it) picks a plan; printed are the plan (degrees, micro-batch,
recomputation, ZeRO), its predicted step time and TFLOP/s per GPU, how long planning took,
and next to them the throughputs Alpa published for Megatron-LM and for Alpa, the plan
Alpa measured and Tessel's predicted step time for that plan (a check of the cost model
against Alpa's measured step time, as far as one uncalibrated preset allows).

Sources:

- Model shapes (seq, hidden, layers, heads, vocab): alpa-projects/alpa,
  benchmark/alpa/suite_manual_gpt.py `gpt_specs` (the same table as the OSDI'22 artifact's
  benchmark/alpa/suite_paper_manual_gpt.py, whose sizes the paper's Table 4 lists). Alpa's 1.3B has
  32 heads (GPT-3's has 16) and its 15B and 39B are not GPT-3 sizes at all.
- Published throughputs: alpa-projects/alpa, branch osdi22_artifact,
  osdi22_artifact/results_e2e_ref.tsv, rows `e2e p3.16 ... gpt megatron` and
  `... gpt parax.auto` (parax was Alpa's working name). These are the reference numbers the
  artifact's plot_e2e.py draws as the paper's GPT weak-scaling figure (Figure 7 (a) of the
  OSDI'22 paper; the artifact README, written for the submission, calls it Figure 8). The
  figure shows PFLOPS = TFLOP/s per GPU x GPUs / 1000; the file holds TFLOP/s per GPU,
  printed here as is (the bars of the PDF were not read off). Both are computed with
  Alpa's `compute_gpt_tflops(..., checkpoint_activations=True)` (benchmark/util.py of that
  branch): 96 B s h^2 L (1 + s/6h) + 6 B s h V FLOPs per step, i.e. counting a recomputed
  forward for every layer whatever recomputation actually ran. So Tessel's predicted step
  time is converted with the same formula ("Alpa-formula TFLOP/s" below) for a like-for-like
  comparison; Tessel's own model TFLOP/s (no recomputation counted) is printed too.
- Alpa's plans: alpa-projects/alpa, benchmark/alpa/suite_auto_gpt.py `perf_test_suite`
  ("search solutions found for p3.16xlarge"; the artifact's suite_artifact_e2e_gpt.py has
  the same up to 32 GPUs), written in Tessel's notation: `NL:dxt` is a stage of N layers on a
  data x tensor mesh (Alpa's logical mesh, its first axis forced to the batch), mb the
  sequences per micro-batch per replica of the first stage (global batch / Alpa's
  micro-batches / data degree). The 2.6B plan's last two stages are not forced to data
  parallelism: Alpa's ILP chose what their 2- and 4-way axis splits. Alpa recomputes every
  layer (use_remat) and schedules GPipe-style with reduce-scatter of gradients.

Caveats: the aws-p3.16xlarge preset's efficiencies were never calibrated on a V100 (see
the preset), and V100 cannot run FlashAttention, so attention is priced unfused (as
Megatron-LM and Alpa ran it in 2021) unless --flash-attention is given.

With `--intra-op ilp`, each size is also planned as `plan gpt ... --intra-op ilp` plans it
(a whole command, timed): from its traced graph, as any model is (four blocks traced and
described at full depth, every layer's operators sharded by the intra-op ILP on every
logical mesh, the stage DP; fp16 with loss scaling, micro-batch one sequence), its plan,
predicted step and TFLOP/s printed in a second table beside the same published numbers.

Run:

    .venv/bin/python benchmarks/alpa_e2e.py [--json PATH] [--flash-attention]
        [--intra-op ilp]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.pipeline_memory import StageLayout  # noqa: E402
from cost_models.step_time import predict_stages  # noqa: E402
from planner.cli.graph import describe  # noqa: E402
from planner.cli.train import layout  # noqa: E402
from planner.vocabulary.cluster import Cluster  # noqa: E402
from planner.search.knobs import check_knobs, default_precision  # noqa: E402
from planner.models.config import TransformerConfig  # noqa: E402
from planner.models.presets import FAMILIES  # noqa: E402
from planner.vocabulary.parallel import ParallelConfig  # noqa: E402
from planner.vocabulary.plan import Plan  # noqa: E402
from planner.search import search  # noqa: E402
from planner.plans.transformer_plan import training_plan  # noqa: E402

CLUSTER = "aws-p3.16xlarge"
SEQ = 1024
GLOBAL_BATCH = 1024
VOCAB = 51200
PRECISION = "fp16"


class Case(NamedTuple):
    size: str
    gpus: int
    hidden: int
    layers: int
    heads: int
    megatron_tflops: float
    """Megatron-LM, TFLOP/s per GPU (results_e2e_ref.tsv, recomputation counted)."""
    alpa_tflops: float
    """Alpa (parax.auto), TFLOP/s per GPU, same file and formula."""
    alpa_stages: tuple[tuple[int, int, int], ...]
    """The plan Alpa's search found and measured: (layers, data, tensor) per stage."""
    alpa_micro_batches: int
    """Micro-batches per step in that plan."""


# Shapes: suite_manual_gpt.py gpt_specs; throughputs: results_e2e_ref.tsv; Alpa's plans:
# suite_auto_gpt.py perf_test_suite (module docstring).
CASES = (
    Case("350M", 1, 1024, 24, 16, 47.53, 45.07, ((24, 1, 1),), 512),
    Case("1.3B", 4, 2048, 24, 32, 55.89, 58.21, ((12, 2, 1),) * 2, 128),
    Case("2.6B", 8, 2560, 32, 32, 50.44, 61.61, ((8, 2, 1), (8, 2, 1), (16, 4, 1)), 128),
    Case("6.7B", 16, 4096, 32, 32, 56.59, 60.0, ((16, 2, 4),) * 2, 64),
    Case("15B", 32, 5120, 48, 40, 58.24, 59.9, ((12, 2, 4),) * 4, 128),
    Case("39B", 64, 8192, 48, 64, 57.84, 57.0, ((3, 1, 4),) * 16, 1024),
)


def alpa_layout(case: Case) -> str:
    """Alpa's plan in the notation of `plan`'s table (planner/cli/train.py `layout`)."""
    stages = case.alpa_stages
    mb = GLOBAL_BATCH // case.alpa_micro_batches // stages[0][1]
    if len(set(stages)) == 1:
        _, d, t = stages[0]
        return f"t{t} p{len(stages)} d{d} mb{mb}"
    return "stages " + "+".join(f"{n}L:{d}x{t}" for n, d, t in stages) + f" mb{mb}"


def predict_alpa_plan(case: Case, flash_attention: bool) -> float:
    """Tessel's predicted step time of the plan Alpa measured: its stages and meshes, full
    recomputation (use_remat), a GPipe schedule, gradients reduce-scattered and parameters
    all-gathered (prefer_reduce_scatter: ZeRO-1, Megatron's distributed optimizer)."""
    cluster = Cluster.load(CLUSTER).with_devices(case.gpus)
    shared = ParallelConfig.of(
        data=1, micro_batch_size=GLOBAL_BATCH // case.alpa_micro_batches,
        global_batch_size=GLOBAL_BATCH, recompute="full", zero_stage=1,
        schedule="gpipe" if len(case.alpa_stages) > 1 else "1f1b", overlap_grad_reduce=True,
        precision=PRECISION)
    stages = [StageLayout(n, tensor=t, data=d) for n, d, t in case.alpa_stages]
    return predict_stages(gpt(case), cluster, shared, stages, flash_attention).step_time_s


def gpt(case: Case) -> TransformerConfig:
    """Alpa's GPT: GPT-2/3 architecture (learned positions, LayerNorm, GeLU, tied
    embeddings, 4h MLP), vocabulary 51200, sequence 1024."""
    return TransformerConfig(
        **FAMILIES["gpt"], num_layers=case.layers, hidden_size=case.hidden,
        num_attention_heads=case.heads, vocab_size=VOCAB, seq_length=SEQ,
        max_position_embeddings=SEQ,
    )


def alpa_step_flops(case: Case) -> float:
    """FLOPs of one step as Alpa counts them (compute_gpt_tflops with
    checkpoint_activations=True): 96 B s h^2 L (1 + s/6h) + 6 B s h V."""
    b, s, h, n, v = GLOBAL_BATCH, SEQ, case.hidden, case.layers, VOCAB
    return 96 * b * s * h**2 * n * (1 + s / (6 * h)) + 6 * b * s * h * v


def plan_case(case: Case, flash_attention: bool) -> tuple[Plan | None, float, int]:
    """The best plan for one case, the wall seconds planning took (knob checks, search and
    packaging the plan, as `plan` does), and the configurations evaluated."""
    start = time.perf_counter()
    model = gpt(case)
    cluster = Cluster.load(CLUSTER).with_devices(case.gpus)
    knobs = {"precision": PRECISION}
    check_knobs(knobs, model, cluster, GLOBAL_BATCH, "auto")
    result = search(model, cluster, GLOBAL_BATCH, knobs, "auto",
                    flash_attention=flash_attention)
    if not result.ranked:
        return None, time.perf_counter() - start, result.evaluated
    candidate, prediction = result.ranked[0]
    plan = training_plan(f"alpa-gpt-{case.size}", model, cluster, candidate.parallel,
                         list(candidate.layers_per_stage), candidate.stages,
                         prediction=prediction)
    return plan, time.perf_counter() - start, result.evaluated


def row(
    case: Case, plan: Plan | None, seconds: float, evaluated: int, flash_attention: bool
) -> dict:
    out = {"size": case.size, "gpus": case.gpus, "hidden": case.hidden,
           "layers": case.layers, "heads": case.heads, "plan_s": seconds,
           "evaluated": evaluated, "published_megatron_tflops": case.megatron_tflops,
           "published_alpa_tflops": case.alpa_tflops, "alpa_plan": alpa_layout(case),
           "predicted_alpa_plan_step_s": predict_alpa_plan(case, flash_attention),
           "published_alpa_step_s": alpa_step_flops(case) / (
               case.alpa_tflops * 1e12 * case.gpus)}
    if plan is None:
        return {**out, "plan": None}
    q, p = plan.parallel, plan.predicted
    return {**out, "plan": layout(plan), "data": q.data, "tensor": q.tensor,
            "pipeline": q.pipeline, "micro_batch": plan.micro_batch_size,
            "recompute": plan.recompute, "zero_stage": q.zero_stage,
            "schedule": plan.schedule, "precision": plan.precision,
            "step_s": p.step_time_s, "memory_gib": p.memory_gib_per_gpu,
            "model_tflops": p.model_tflops_per_gpu,
            "alpa_formula_tflops": alpa_step_flops(case) / (p.step_time_s * 1e12 * case.gpus),
            "megatron_flags": plan.megatron_flags}


def plan_graph_case(case: Case) -> tuple[Plan | None, float]:
    """`plan gpt ... --intra-op ilp` for one case, as a user runs it: the best graph plan
    (None if none fits) and the whole command's wall seconds."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.json"
        command = [sys.executable, "-m", "planner", "gpt", "--num-layers", str(case.layers),
                   "--hidden-size", str(case.hidden), "--num-attention-heads", str(case.heads),
                   "--seq-length", str(SEQ), "--vocab-size", str(VOCAB), "--cluster", CLUSTER,
                   "--gpus", str(case.gpus), "--global-batch-size", str(GLOBAL_BATCH),
                   "--intra-op", "ilp", "--json", str(out)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            return None, seconds
        return Plan.from_json(out), seconds


def graph_rows() -> list[dict]:
    print("\n--intra-op ilp: planned from the traced graph (stages: layers:logical mesh)")
    print(f"{'size':>5} {'GPUs':>4}  {'plan':<40} {'step s':>8} {'GiB':>5} {'model':>6} "
          f"{'Alpa-f':>6} | {'Megatron':>8} {'Alpa':>5} | {'plan s':>6}")
    rows = []
    for case in CASES:
        plan, seconds = plan_graph_case(case)
        out = {"size": case.size, "gpus": case.gpus, "command_s": seconds,
               "published_megatron_tflops": case.megatron_tflops,
               "published_alpa_tflops": case.alpa_tflops}
        published = f"{case.megatron_tflops:>8.2f} {case.alpa_tflops:>5.2f}"
        if plan is None:
            rows.append({**out, "plan": None})
            print(f"{case.size:>5} {case.gpus:>4}  {'no plan fits':<40} {'-':>8} {'-':>5} "
                  f"{'-':>6} {'-':>6} | {published} | {seconds:>6.1f}")
            continue
        p = plan.predicted
        alpa_formula = alpa_step_flops(case) / (p.step_time_s * 1e12 * case.gpus)
        rows.append({**out, "plan": describe(plan), "step_s": p.step_time_s,
                     "memory_gib": p.memory_gib_per_gpu, "precision": plan.precision,
                     "model_tflops": p.model_tflops_per_gpu,
                     "alpa_formula_tflops": alpa_formula})
        text = describe(plan)
        text = text if len(text) <= 40 else text[:37] + "..."
        print(f"{case.size:>5} {case.gpus:>4}  {text:<40} {p.step_time_s:>8.2f} "
              f"{p.memory_gib_per_gpu:>5.1f} {p.model_tflops_per_gpu:>6.1f} "
              f"{alpa_formula:>6.1f} | {published} | {seconds:>6.1f}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--flash-attention", action="store_true",
                        help="price attention as FlashAttention (V100 cannot run it)")
    parser.add_argument("--intra-op", choices=("analytic", "ilp"), default="analytic",
                        help="ilp: also plan each size from its traced graph")
    args = parser.parse_args()
    cluster = Cluster.load(CLUSTER)
    assert default_precision(cluster) == PRECISION  # Volta: no bf16, so fp16 by default

    print(f"Alpa's GPT weak scaling on {CLUSTER} ({cluster.device.name}), seq {SEQ}, "
          f"global batch {GLOBAL_BATCH}, {PRECISION}, "
          f"{'flash' if args.flash_attention else 'unfused'} attention")
    print("TFLOP/s per GPU. Alpa formula: recomputation counted for every layer, as Alpa's "
          "published numbers are; model: Tessel's, no recomputation counted.")
    header = (f"{'size':>5} {'GPUs':>4}  {'plan':<34} {'recompute':<9} {'step s':>7} "
              f"{'GiB':>5} {'model':>6} {'Alpa-f':>6} | {'Megatron':>8} {'Alpa':>5} "
              f"{'Alpa s':>7} {'Alpa plan':<33} {'pred s':>6} | {'plan s':>6}")
    print(header)
    rows = []
    for case in CASES:
        plan, seconds, evaluated = plan_case(case, args.flash_attention)
        r = row(case, plan, seconds, evaluated, args.flash_attention)
        rows.append(r)
        published = (f"{case.megatron_tflops:>8.2f} {case.alpa_tflops:>5.2f} "
                     f"{r['published_alpa_step_s']:>7.2f} {r['alpa_plan']:<33} "
                     f"{r['predicted_alpa_plan_step_s']:>6.2f}")
        if plan is None:
            print(f"{case.size:>5} {case.gpus:>4}  {'no plan fits':<34} {'':<9} {'-':>7} "
                  f"{'-':>5} {'-':>6} {'-':>6} | {published} | {seconds:>6.1f}")
            continue
        print(f"{case.size:>5} {case.gpus:>4}  {r['plan']:<34} {r['recompute']:<9} "
              f"{r['step_s']:>7.2f} {r['memory_gib']:>5.1f} {r['model_tflops']:>6.1f} "
              f"{r['alpa_formula_tflops']:>6.1f} | {published} | {seconds:>6.1f}")
    print("Megatron, Alpa: published TFLOP/s per GPU (alpa osdi22_artifact "
          "results_e2e_ref.tsv; x GPUs / 1000 = the paper's PFLOPS); Alpa s: the step time "
          "those imply; Alpa plan: what its search found; pred s: Tessel's step time for it.")
    if args.intra_op == "ilp":
        rows = {"analytic": rows, "graph": graph_rows()}
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"rows written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
