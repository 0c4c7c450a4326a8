"""MoE efficiency fitted to the MoE pre-training runs Megatron-Bridge published.

Six runs with every setting: `../shared/calibration/published_moe_runs.csv` gives
DeepSeek-V3 on 256 B200 (MXFP8, DeepEP), Qwen3-235B-A22B on 256 H100 (FP8 current scaling,
forced balance), GPT-OSS-120B on 64 H100 (bf16) and on 64 GB200 (MXFP8, CUDA graphs of the
whole iteration); `moe_recipes.csv` gives two exact Megatron-LM flag lines (Qwen3-235B-A22B on
256 GB200 in MXFP8, DeepSeek-V3 on 1,024 H100 in FP8), read by
`planner.megatron.recipe_runs` into the same `MoeRun`s. Dense efficiency stays each
preset's own (fitted on dense runs); the parameters of what MoE models add are fitted here,
shared by every device, each the price of one mechanism (`planner.vocabulary.efficiency`):

- `sink_attention`: attention with softmax offsets (GPT-OSS's sinks) against fused
  attention;
- `moe_sync_us`: host time exposed per local expert when the dispatcher waits for the
  token counts (eager runs only);
- `alltoall_bandwidth`: the bandwidth dispatch all-to-alls reach against ring collectives.

`expert_matmul` (the grouped GEMM against a dense GEMM of its shape) is not fitted: the runs
put it at its bound, 1, on Hopper and on Blackwell in MXFP8, so it stays at its default.

What a row does not give is set as Megatron-Bridge's performance recipes run it (the
launch lines of tests/planner/megatron/test_published_moe_runs.py cite each): the
distributed optimizer with gradient reduction and weight gathering overlapped, Transformer
Engine's fused attention, sequence parallelism where tensors are split, the interleaved
schedule where a row has virtual stages, expert tensor parallelism 1, forced load
balancing (every performance recipe benchmarks with it), the alltoall dispatcher unless
the notes name DeepEP, delayed weight gradients with the all-to-all overlap (Bridge's
scripts/performance/utils/overrides.py, _set_moe_a2a_overlap_overrides, sets both);
`RECIPE_EXTRAS` adds what a recipe sets beyond its row's notes. Every run is priced on the
GPUs as Bridge's launcher allocates them (`bridge_scale_up_domain`).
A row's step time is its batch's tokens over its throughput.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.efficiency_fit import MeasuredStep, from_unbounded, nelder_mead, to_unbounded
from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster
from planner.models.presets import PRESETS
from planner.vocabulary.parallel import ParallelConfig

MOE_RUNS = "published_moe_runs.csv"
FIELDS = ("sink_attention", "moe_sync_us", "alltoall_bandwidth")
"""The fitted MoE parameters."""
FITTED_PRESETS = ("dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72")
"""Presets that ship the fitted MoE parameters (H200 borrows H100's efficiency)."""
ITERATIONS = 200
"""Nelder-Mead iterations of one simplex of an MoE fit."""
RESTARTS = 3
"""Simplexes an MoE fit runs, each from where the last ended: a simplex of three
parameters on six runs can collapse before the minimum (about 10 s in all)."""
MODELS = {"DeepSeek-V3": "deepseek-v3", "Qwen3-235B-A22B": "qwen3-235b-a22b",
          "GPT-OSS-120B": "gpt-oss-120b"}
SYSTEMS = {"B200": "dgx-b200", "H100": "dgx-h100", "GB200": "gb200-nvl72"}
PRECISIONS = {"bf16": ("bf16", "delayed"), "FP8-CS": ("fp8", "tensorwise"),
              "MXFP8": ("fp8", "mxfp8")}
RECIPE_EXTRAS: dict[tuple[str, str], dict[str, object]] = {
    # GPT_OSS_120B_PRETRAIN_CONFIG_GB200 (Megatron-Bridge @c270efc50): HybridEP (flex)
    # and the all-to-all overlap (moe_a2a_overlap=True), which the row's notes omit; its
    # full-iteration CUDA graph gives HybridEP a static budget of 1.5 x each rank's even
    # share of routed rows (moe_expert_rank_capacity_factor = 1.5: the experts' buffers
    # are that size, the grouped GEMMs run the rows routed, as the Qwen3 recipe line of
    # moe_recipes.csv reads), keeps the experts' activations in a paged stash of 1.2 x
    # the expected tokens and runs the output layer in MXFP8 (the same settings at
    # @067f987d: src/megatron/bridge/perf_recipes/gpt_oss/common.py,
    # _apply_gpt_oss_120b_full_iter_fp8mx_configs).
    ("GPT-OSS-120B", "GB200"): {"moe_token_dispatcher": "flex",
                                "overlap_moe_expert_parallel_comm": True,
                                "delay_wgrad_compute": True,
                                "moe_expert_rank_capacity_factor": 1.5,
                                "moe_paged_stash": True, "moe_paged_stash_buffer_factor": 1.2,
                                "fp8_output_proj": True},
}
SEGMENT_TRAYS = 18
"""Compute trays of one GB200 NVL72 rack (4 GPUs each): the most nodes one Slurm segment
of Megatron-Bridge's launcher holds (`bridge_scale_up_domain`)."""
# The shape columns each row states, checked against the preset it is priced on.
SHAPE = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
         "vocab": "vocab_size", "experts": "num_experts", "topk": "moe_top_k"}


@dataclass(frozen=True)
class MoeRun:
    """One published MoE run, priced on a preset."""

    step: MeasuredStep
    """The run as a measured step: model, configuration, GPUs and step time."""
    preset: str
    """The cluster preset it ran on."""
    tokens_per_gpu_s: float
    """The published throughput."""
    notes: str
    """What its source says it turned on (a recipe line's start "recipe flag line")."""
    layers_per_stage: tuple[int, ...] | None = None
    """Layers of each pipeline stage where the run splits them unevenly (a recipe's
    --pipeline-model-parallel-layout); None: Megatron-LM's even split."""
    scale_up_domain: int | None = None
    """GPUs of one NVLink domain as the run's job got them, where fewer than the preset's
    (`bridge_scale_up_domain`); None: the preset's."""


def read_moe_runs(path: str | Path) -> list[MoeRun]:
    """Every row of the published MoE file as a run on a preset; ValueError naming the
    line where a row's model, system, precision or shape is not one Tessel prices."""
    runs = []
    with open(path, encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            runs.append(_run(row, line))
    return runs


def _run(row: dict[str, str], line: int) -> MoeRun:
    where = f"{MOE_RUNS} line {line}"
    if row["model"] not in MODELS or row["gpu"] not in SYSTEMS \
            or row["precision"] not in PRECISIONS:
        raise ValueError(f"{where}: {row['model']} on {row['gpu']} in {row['precision']} "
                         "has no preset; add it to moe_calibration's tables.")
    model = PRESETS[MODELS[row["model"]]]
    for column, field in SHAPE.items():
        if int(row[column]) != getattr(model, field):
            raise ValueError(f"{where}: {column} {row[column]} is not the preset's "
                             f"{field} {getattr(model, field)}.")
    precision, recipe = PRECISIONS[row["precision"]]
    notes = row["notes"]
    tensor, vp = int(row["tp"]), 1 if row["vp"] in ("-", "") else int(row["vp"])
    recompute, *modules = row["recompute"].split()
    parallel = ParallelConfig.of(
        tensor=tensor, pipeline=int(row["pp"]), data=int(row["dp"]),
        context=1 if row["cp"] in ("-", "") else int(row["cp"]), expert=int(row["ep"]),
        expert_tensor=1, sequence_parallel=tensor > 1,
        micro_batch_size=int(row["micro_batch"]), global_batch_size=int(row["global_batch"]),
        schedule="interleaved" if vp > 1 else "1f1b", virtual_pipeline=vp,
        recompute=recompute, recompute_modules=tuple(modules[0].split("+")) if modules
        else ("core_attn",),
        zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True,
        attention_backend="fused", precision=precision, fp8_recipe=recipe,
        moe_token_dispatcher="flex" if "DeepEP" in notes else "alltoall",
        overlap_moe_expert_parallel_comm="A2A overlap" in notes,
        delay_wgrad_compute="A2A overlap" in notes,
        moe_router_force_load_balancing=True,
        cuda_graphs="full-iteration CUDA graph" in notes,
        cuda_graph_scope=("attn", "moe_router", "moe_preprocess")
        if "cuda-graph attn/router/preproc" in notes else (),
    )
    parallel = parallel.but(**RECIPE_EXTRAS.get((row["model"], row["gpu"]), {}))
    gpus, throughput = int(row["num_gpus"]), float(row["value"])
    seconds = parallel.batch.global_batch_size * model.seq_length / (throughput * gpus)
    step = MeasuredStep(model=model, parallel=parallel, num_gpus=gpus, seconds=seconds,
                        label=f"{row['model']} {row['gpu']}", line=line)
    preset = SYSTEMS[row["gpu"]]
    return MoeRun(step=step, preset=preset, tokens_per_gpu_s=throughput, notes=notes,
                  scale_up_domain=bridge_scale_up_domain(preset, gpus))


def bridge_scale_up_domain(preset: str, num_gpus: int) -> int | None:
    """GPUs per NVLink domain of a job Megatron-Bridge's launcher runs on `num_gpus` GPUs
    of `preset`, where fewer than the preset's domain. On GB200 (hosts of 4 GPUs) it asks
    Slurm for a segment of up to 18 nodes (one NVL72 rack): all the nodes if they fit, else
    the largest divisor of the node count that does (scripts/performance/utils/executors.py,
    `segment`, Megatron-Bridge @067f987d) -- 256 GPUs run as four racks of 64, so an expert
    group of 32 never straddles two racks. None for other presets and single segments."""
    cluster = Cluster.load(preset)
    if cluster.devices_per_host != 4 or cluster.devices_per_node == cluster.devices_per_host:
        return None  # the launcher segments hosts of 4 GPUs in a rack-wide NVLink domain
    nodes = num_gpus // cluster.devices_per_host
    if nodes <= SEGMENT_TRAYS:
        return None  # one segment: the job is one (part-filled) domain already
    segment = next(n for n in range(SEGMENT_TRAYS, 0, -1) if nodes % n == 0)
    return segment * cluster.devices_per_host


def run_cluster(run: MoeRun, values: dict[str, float] | None = None) -> Cluster:
    """The cluster `run` ran on: its preset at its GPU count and NVLink domain, with the
    MoE parameters `values` over the preset's."""
    cluster = Cluster.load(run.preset).with_devices(run.step.num_gpus)
    if run.scale_up_domain is not None:
        cluster = cluster.with_segments(run.scale_up_domain // cluster.devices_per_host)
    if values:
        cluster = cluster.with_efficiency(cluster.device.efficiency.model_copy(update=values))
    return cluster


def predicted_throughput(runs: list[MoeRun], values: dict[str, float] | None = None
                         ) -> np.ndarray:
    """Each run's predicted tokens/s per GPU, with the MoE parameters `values` over its
    preset's (default: as the presets ship)."""
    out = []
    for run in runs:
        layers = list(run.layers_per_stage) if run.layers_per_stage else None
        prediction = predict_step(run.step.model, run_cluster(run, values), run.step.parallel,
                                  layers_per_stage=layers)
        out.append(prediction.tokens_per_s / run.step.num_gpus)
    return np.array(out)


def shipped_values(fields: tuple[str, ...] = FIELDS) -> dict[str, float]:
    """The MoE parameters `fields` as the presets ship them (the same on each)."""
    shipped = Cluster.load(FITTED_PRESETS[0]).device.efficiency
    return {f: getattr(shipped, f) for f in fields}


def fit_moe(runs: list[MoeRun], iterations: int = ITERATIONS,
            fields: tuple[str, ...] = FIELDS) -> dict[str, float]:
    """The MoE parameters `fields` that minimize the runs' mean absolute percentage error
    of throughput, shared by all presets (Nelder-Mead within `efficiency_fit.BOUNDS`,
    from the shipped values, restarted `RESTARTS` times)."""
    measured = np.array([r.tokens_per_gpu_s for r in runs])

    def values_at(x: np.ndarray) -> dict[str, float]:
        return {f: from_unbounded(f, v) for f, v in zip(fields, x)}

    def loss(x: np.ndarray) -> float:
        return float(np.mean(np.abs(predicted_throughput(runs, values_at(x)) / measured - 1)))

    x = np.array([to_unbounded(f, v) for f, v in shipped_values(fields).items()])
    for _ in range(RESTARTS):
        x = nelder_mead(loss, x, iterations=iterations)
    return values_at(x)


def leave_one_out(runs: list[MoeRun], iterations: int = ITERATIONS,
                  fields: tuple[str, ...] = FIELDS) -> np.ndarray:
    """Each run's tokens/s per GPU predicted by a fit of the MoE parameters on the other
    runs: what the fit says about a run it did not see."""
    return np.array([
        predicted_throughput([run], fit_moe(runs[:i] + runs[i + 1:], iterations, fields))[0]
        for i, run in enumerate(runs)])
