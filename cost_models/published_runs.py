"""Published throughput tables as measured steps: Megatron-Core's H100 weak-scaling table
and NeMo Megatron-Bridge's Llama 3 pre-training tables (`../shared/calibration/`).

Each row gives a model, its parallel degrees and batch, and a measured throughput; what it
does not give is set as those teams publish their runs (their READMEs and performance
configs): bf16 or the row's fp8 recipe, Transformer Engine's fused attention, sequence
parallelism wherever tensors are split, the distributed optimizer with gradient reduction
and weight gathering overlapped, tensor-parallel communication overlap where the device
runs it, one micro-batch unless the row says, and the least recomputation that fits. A
row's step time is its batch's tokens over its throughput (NeMo), or its model FLOPs over
its model TFLOP/s (Megatron-Core, which reports no tokens) in the count the table was
published with (July 2024, before Megatron-LM halved the causal attention term): the full
score matrix, 72 B s l h^2 (1 + s / 6h + V / 12 h l) per step
(`model_flops.megatron_flops_per_token(model, causal=False)`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from cost_models.efficiency_fit import MeasuredStep
from cost_models.model_flops import megatron_flops_per_token
from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import RECOMPUTE, ParallelConfig

# Llama 3's block (Dubey et al. 2024): what the NeMo table's columns do not say.
LLAMA = dict(norm="rmsnorm", activation="swiglu", position_embedding="rope",
             tie_embeddings=False, bias=False)
# NeMo's system names -> Tessel's presets (GB300 has none yet).
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200", "DGX-GB200": "gb200-nvl72"}
# NeMo's precision names -> (precision, fp8 recipe). Its plain "FP8" rows (releases 26.x)
# run current scaling, NeMo's default fp8 recipe since 25.x; NVFP4 needs fp4 matmuls,
# which Tessel does not price.
PRECISIONS = {"FP8": ("fp8", "tensorwise"), "FP8-CS": ("fp8", "tensorwise"),
              "MXFP8": ("fp8", "mxfp8"), "FP8-MX": ("fp8", "mxfp8"), "BF16": ("bf16", "delayed")}


@dataclass(frozen=True)
class PublishedRun:
    """One row of a published table, as a measured step on one preset."""

    source: str
    """The table's short name: 'megatron-core' or 'nemo'."""
    preset: str
    """The cluster preset the row ran on."""
    precision: str
    """As the table names it (BF16, FP8, FP8-CS, MXFP8)."""
    model_name: str
    """The model as the table names it (1.7B, llama3-70b)."""
    step: MeasuredStep


@dataclass(frozen=True)
class SkippedRow:
    """A row no preset or precision of Tessel's can predict, and why."""

    line: int
    reason: str


def read_megatron_core(path: str | Path) -> list[PublishedRun]:
    """Megatron-Core's H100 table: GPT models (GeLU, learned positions, tied embeddings),
    bf16, vocabulary 131072, sequence 4096, one micro-batch, DGX H100."""
    cluster = Cluster.load("dgx-h100")
    runs = []
    for line, row in _rows(path):
        model = TransformerConfig(
            num_layers=int(row["layers"]), hidden_size=int(row["hidden"]),
            num_attention_heads=int(row["heads"]), seq_length=4096, vocab_size=131072,
            max_position_embeddings=4096)
        t, p, d = int(row["tp"]), int(row["pp"]), int(row["dp"])
        gpus = int(row["gpus"])
        parallel = _published(ParallelConfig.of(
            tensor=t, pipeline=p, data=d, micro_batch_size=1,
            global_batch_size=int(row["global_batch"]), precision="bf16", zero_stage=1),
            cluster)
        parallel = least_recompute(model, cluster.with_devices(gpus), parallel)
        flops = published_flops(model, parallel)
        seconds = flops / (float(row["tflops_per_gpu"]) * 1e12 * gpus)
        step = MeasuredStep(model, parallel, gpus, seconds, row["size"], line)
        runs.append(PublishedRun("megatron-core", "dgx-h100", "BF16", row["size"], step))
    return runs


def read_nemo(path: str | Path) -> tuple[list[PublishedRun], list[SkippedRow]]:
    """NeMo's Llama 3 table: the rows of systems and precisions Tessel has, and the others
    with the reason they are left out."""
    runs, skipped = [], []
    for line, row in _rows(path):
        system, precision = row["system"], row["precision"]
        if system not in SYSTEMS:
            skipped.append(SkippedRow(line, f"{system}: no cluster preset"))
            continue
        if precision not in PRECISIONS:
            skipped.append(SkippedRow(line, f"{precision}: fp4 matmuls are not priced"))
            continue
        cluster = Cluster.load(SYSTEMS[system])
        model = TransformerConfig(
            **LLAMA, num_layers=int(row["layers"]),
            hidden_size=int(row["hidden"]), num_attention_heads=int(row["heads"]),
            num_query_groups=int(row["query_groups"]),
            ffn_hidden_size=int(row["ffn_hidden"]), vocab_size=int(row["vocab"]),
            seq_length=int(row["seq_length"]), max_position_embeddings=int(row["seq_length"]),
            rotary_base=500000)
        gpus = int(row["gpus"])
        t, p, c = int(row["tp"]), int(row["pp"]), int(row["cp"])
        vp = 1 if row["vp"] in ("n/a", "1") else int(row["vp"])
        kind, recipe = PRECISIONS[precision]
        parallel = _published(ParallelConfig.of(
            tensor=t, pipeline=p, context=c, micro_batch_size=int(row["micro_batch"]),
            global_batch_size=int(row["global_batch"]), precision=kind, fp8_recipe=recipe,
            zero_stage=3 if int(row["fsdp"]) else 1,
            schedule="interleaved" if vp > 1 else "1f1b", virtual_pipeline=vp), cluster)
        sized = cluster.with_devices(gpus)
        parallel = least_recompute(model, sized, parallel.resolve(gpus))
        tokens = parallel.batch.global_batch_size * model.seq_length
        seconds = tokens / (float(row["tokens_per_s_per_gpu"]) * gpus)
        step = MeasuredStep(model, parallel, gpus, seconds, row["model"], line)
        runs.append(PublishedRun("nemo", SYSTEMS[system], precision, row["model"], step))
    return runs, skipped


def _published(parallel: ParallelConfig, cluster: Cluster) -> ParallelConfig:
    """The settings published runs share (see the module docstring)."""
    split = parallel.dims.tensor > 1
    return parallel.but(sequence_parallel=split, overlap_grad_reduce=True,
                        overlap_param_gather=True, attention_backend="fused",
                        tp_comm_overlap=split and cluster.device.tp_comm_overlap)


def least_recompute(model: TransformerConfig, cluster: Cluster,
                    parallel: ParallelConfig) -> ParallelConfig:
    """`parallel` with the least recomputation under which it fits (full if none does)."""
    for recompute in RECOMPUTE:
        candidate = parallel.but(recompute=recompute)
        if predict_step(model, cluster, candidate).fits:
            return candidate
    return parallel.but(recompute="full")


def published_flops(model: TransformerConfig, parallel: ParallelConfig) -> float:
    """Model FLOPs of one step as Megatron-Core's table counts them: Megatron-LM's count
    before its causal halving (commit 8873b55d6a, March 2025), the full score matrix."""
    tokens = parallel.batch.global_batch_size * model.seq_length
    return tokens * megatron_flops_per_token(model, causal=False)


def _rows(path: str | Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV whose leading '#' lines are comments."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    first = next(i for i, text in enumerate(lines) if not text.startswith("#"))
    reader = csv.DictReader(lines[first:])
    return [(first + 2 + k, row) for k, row in enumerate(reader)]
