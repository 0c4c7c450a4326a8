"""Published peak memory per GPU as runs Tessel can predict: the rows of
`../shared/calibration/published_memory.csv`, each in Tessel's vocabulary and on the
device it ran on, with what the row measured (TorchTitan logs the caching allocator's peak
reserved bytes, Megatron-LM its peak allocated bytes).

What a row does not say is set as its engine's published configuration sets it (each
setting below cites where). Multi-latent attention and experts (shared, routed, dense
layers first) are read from the rows' model and notes columns; a row naming only its
model takes the description of an earlier row of the same model.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from cost_models.step_time import predict_step
from planner.vocabulary.cluster import Cluster, DeviceSpec
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.vocabulary.parallel import ParallelConfig

# The shared calibration folder beside the checkout (a clone elsewhere finds the
# workplace's copy, as the calibration tests do).
CALIBRATION = next(
    (folder / "calibration" for folder in (Path(__file__).resolve().parents[2] / "shared",
                                            Path("/work/shared"))
     if (folder / "calibration").is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "calibration",
)
CSV = CALIBRATION / "published_memory.csv"
TORCHTITAN_RUNS = CALIBRATION / "published_torchtitan_runs.csv"


@dataclass(frozen=True)
class MemoryRun:
    """One published run, in Tessel's vocabulary."""

    line: int
    name: str
    model: TransformerConfig
    parallel: ParallelConfig
    cluster: Cluster
    measured_gib: float | None
    kind: str
    """'allocated' or 'reserved', as the row measured."""
    oom: bool
    fragmentation: bool
    """The row ran out of memory through fragmentation, not its allocated peak."""


def _number(text: str) -> float:
    return float(text.strip().rstrip("~").lstrip("~"))


def _cluster(gpu: str, num_gpus: int) -> Cluster:
    cluster = Cluster.load("dgx-h100").with_devices(num_gpus)
    if "96GB" in gpu:
        # TorchTitan's benchmark machines (benchmarks/llama3_h100_202412_torchtitan.md,
        # "Hardware"; all its table 1 rows ran on them): Grand Teton hosts of 8 H100 SXM
        # "equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (95.0 GiB
        # usable), run at "the default 500W power limit" of their 700 W TDP.
        device = DeviceSpec.model_validate({
            **cluster.device.model_dump(), "name": "H100-SXM5-96GB-HBM2e",
            "memory_gib": 95.0, "memory_bandwidth_gbs": 2400, "rated_power_w": 700,
            "power_limit_w": 500})
        return cluster.model_copy(update={"device": device})
    # H100 and H800 80 GB: 79.1 GiB as torch.cuda reports it.
    return cluster.model_copy(update={"device": cluster.device.model_copy(
        update={"memory_gib": 79.1})})


def read_runs(path: Path = CSV) -> tuple[list[MemoryRun], list[tuple[int, str, str]]]:
    """The rows Tessel can describe, and (line, model, why) for the rest."""
    runs, skipped = [], []
    with path.open() as handle:
        described: dict[str, str] = {}
        for line, row in enumerate(csv.DictReader(handle), start=2):
            name = row["model"].split(" ")[0]
            if "(" in row["model"]:
                described.setdefault(name, row["model"])
            runs.append(_run(line, {**row, "model": described.get(name, row["model"])}))
    return runs, skipped


def _attention_and_experts(row: dict[str, str]) -> dict:
    """The row's grouped-query or multi-latent attention and its experts, as its model and
    notes columns state them: DeepSeek-V3-architecture rows (TorchTitan's 16B flavor,
    Moonlight-16B) give the kv latent rank, the q latent rank (0: none), the dense layers
    first and the shared experts (each of the routed experts' width), and take
    DeepSeek-V2-Lite's head widths (128 + 64 rotary, values 128; both configs)."""
    text = f"{row['model']} {row['notes']}"
    out: dict = {}
    if "MLA" in row["kv_heads"]:
        q_lora = re.search(r"q_lora (\d+)", text)
        out |= dict(multi_latent_attention=True,
                    kv_lora_rank=int(re.search(r"kv_lora (\d+)", text).group(1)),
                    q_lora_rank=int(q_lora.group(1)) or None if q_lora else None,
                    qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
    else:
        out["num_query_groups"] = int(row["kv_heads"])
    if row["experts"].strip():
        layers = int(row["layers"])
        dense = re.search(r"(\d+) dense", text)
        shared = re.search(r"(\d+) shared experts", text)
        moe_ffn = int(_number(row["moe_ffn"]))
        out |= dict(num_experts=int(row["experts"]), moe_top_k=int(row["topk"]),
                    moe_ffn_hidden_size=moe_ffn)
        if dense:
            first = int(dense.group(1))
            out["moe_layer_freq"] = [0] * first + [1] * (layers - first)
        if shared:
            out["moe_shared_expert_intermediate_size"] = int(shared.group(1)) * moe_ffn
    return out


def _run(line: int, row: dict[str, str]) -> MemoryRun:
    source, model_name = row["source"], row["model"]
    torchtitan = "torchtitan" in source.lower()
    megatron_gpt = "GPTModel" in model_name
    form = dict(FAMILIES["gpt" if megatron_gpt else "llama"])
    if megatron_gpt:
        # get_training_info's GPTModel: learned positions, biases, LayerNorm, SwiGLU and a
        # tied embedding (its parameter count, 6,642,245,632, has one vocabulary matrix).
        form |= {"activation": "swiglu"}
    model = TransformerConfig(
        num_layers=int(row["layers"]), hidden_size=int(row["hidden"]),
        num_attention_heads=int(row["heads"]),
        ffn_hidden_size=int(_number(row["ffn"])), vocab_size=int(_number(row["vocab"])),
        seq_length=int(_number(row["seq"])), **form, **_attention_and_experts(row),
    )
    precision = row["precision"].lower()
    recompute = row["recompute"].lower()
    tensor = int(row["tp"])
    expert = int(row["ep"]) if row["ep"].strip() else 1
    knobs: dict = dict(
        tensor=tensor, pipeline=int(row["pp"]), data=int(row["dp"]), expert=expert,
        # TorchTitan's and Megatron-Bridge's MoE rows keep experts whole on one rank (ETP1).
        expert_tensor=1 if model.is_moe else None,
        moe_token_dispatcher="alltoall" if expert > 1 else "allgather",
        context=int(row["cp"] or 1), micro_batch_size=int(_number(row["micro_batch"])),
        global_batch_size=int(_number(row["global_batch"])),
        engine="torchtitan" if torchtitan else "megatron",
        precision="fp8" if ("fp8" in precision or "float8" in precision) else "bf16",
        # "on": TorchTitan of December 2024 compiled the blocks alone; "loss only": its
        # DeepSeek-V3 16B config of October 2025 (compile.components = ["loss"]).
        compile=row["compile"].startswith("on") and torchtitan,
        compile_loss=row["compile"].startswith("loss") and torchtitan,
        attention_backend="flash",
    )
    if knobs["precision"] == "fp8":
        knobs["fp8_recipe"] = "tensorwise"
        # TorchTitan's float8 rows ran as its docs/float8.md @9dec370 launches float8:
        # --float8.enable_fsdp_float8_all_gather (fp8 weights gathered) and
        # --float8.precompute_float8_dynamic_scale_for_fsdp; the benchmark does not say.
        knobs["fp8_param_gather"] = torchtitan
    if torchtitan:
        knobs |= dict(zero_stage=3 if "fsdp" in row["zero_or_fsdp"].lower() else 0,
                      recompute="selective" if recompute.startswith("selective") else
                      ("full" if recompute.startswith("full") else "none"),
                      sequence_parallel=tensor > 1)
    else:
        knobs |= dict(zero_stage=1 if "distributed optimizer" in row["zero_or_fsdp"] else 0,
                      recompute="selective" if "core_attn" in recompute else "none",
                      sequence_parallel="SP on" in row["notes"])
        if row["vp"]:
            knobs |= dict(schedule="interleaved", virtual_pipeline=int(row["vp"]))
        knobs |= _cuda_graphs(row["compile"])
        if "precision-aware" in row["zero_or_fsdp"]:
            # --use-precision-aware-optimizer with bf16 gradients and Adam moments.
            knobs |= dict(main_grads_dtype="bf16", exp_avg_dtype="bf16")
        if "Megatron-Bridge" in source:
            # Bridge's performance recipes reduce gradients in bf16
            # (ddp.grad_reduce_in_fp32 = False), and its fp8 current-scaling recipe
            # (bf16_with_fp8_current_scaling_mixed) gathers fp8 parameters.
            knobs["main_grads_dtype"] = "bf16"
            knobs["fp8_param_gather"] = knobs["precision"] == "fp8"
    parallel = ParallelConfig.of(**knobs)
    kind = "reserved" if "reserved" in row["memory_kind"] else "allocated"
    measured = _number(row["memory_gib"]) if row["memory_gib"].strip() else None
    return MemoryRun(
        line=line, name=f"{model_name.split(' ')[0]} {row['gpu'].split(' ')[0]}",
        model=model, parallel=parallel,
        cluster=_cluster(row["gpu"], int(row["num_gpus"])), measured_gib=measured,
        kind=kind, oom=row["oom"].strip() == "yes",
        fragmentation="fragmentation" in row["notes"],
    )


def _cuda_graphs(compile_column: str) -> dict:
    """The CUDA graphs a Megatron row's compile column names: "TE CUDA graph scope mlp"
    graphs the modules named, another mention whole layers, "no CUDA graph" none."""
    if "CUDA graph" not in compile_column or "no CUDA graph" in compile_column:
        return {}
    if "scope" in compile_column:
        scope = compile_column.split("scope", 1)[1].strip(" )").split()
        return {"cuda_graph_scope": tuple(scope)}
    return {"cuda_graphs": True}


@dataclass(frozen=True)
class MemoryResult:
    run: MemoryRun
    allocated_gib: float
    reserved_gib: float
    fits: bool
    reserved_fits: bool

    @property
    def predicted_gib(self) -> float:
        return self.reserved_gib if self.run.kind == "reserved" else self.allocated_gib

    @property
    def error(self) -> float | None:
        if self.run.measured_gib is None:
            return None
        return self.predicted_gib / self.run.measured_gib - 1

    @property
    def verdict_ok(self) -> bool:
        """A run that ran is predicted to fit; one that ran out of memory is not (through
        its reserved estimate where fragmentation ran it out)."""
        if not self.run.oom:
            return self.fits
        return (not self.reserved_fits) if self.run.fragmentation else not self.fits


def predict(run: MemoryRun) -> MemoryResult:
    p = predict_step(run.model, run.cluster, run.parallel)
    # Allocated and reserved as torch.cuda reports them: without the memory outside the
    # caching allocator, which predict_step's totals include.
    outside = p.memory_breakdown_gib["outside the allocator"]
    return MemoryResult(run, p.memory_gib_per_gpu - outside, p.reserved_gib_per_gpu - outside,
                        p.fits, p.reserved_fits)




@dataclass(frozen=True)
class SpeedRun:
    """One published run's throughput: TorchTitan's tokens per second per GPU."""

    line: int
    run: MemoryRun
    tokens_per_s_per_gpu: float


def read_speed_runs(path: Path = TORCHTITAN_RUNS) -> list[SpeedRun]:
    """TorchTitan's published runs (`published_torchtitan_runs.csv`), in Tessel's
    vocabulary as `read_runs` reads a memory row (its compile and fp8 from the notes)."""
    runs = []
    with path.open() as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            compiled = "+torch.compile" in row["notes"]
            fields = {**row, "compile": "on" if compiled else "off", "memory_gib": "",
                      "memory_kind": "", "oom": "no"}
            runs.append(SpeedRun(line, _run(line, fields), _number(row["value"])))
    return runs


def predicted_tokens_per_s_per_gpu(speed: SpeedRun) -> float:
    """Tessel's tokens per second per GPU for the run."""
    run = speed.run
    return predict_step(run.model, run.cluster, run.parallel).tokens_per_s \
        / run.cluster.num_devices


SPEED_FITTED: tuple[str, ...] = ()
"""What is fitted to TorchTitan's throughput rows: nothing. Its step is priced by mechanism
from sources (the GPU's bandwidth and power cap, eager and compiled kernels, PyTorch's
attention kernel, FSDP2's overlap, float8's casts: `cost_models.power`,
`transformer_ops.torchtitan_layer_ops`, `data_parallel.fsdp2_comm`) on the dgx-h100
preset's efficiency, which was fitted to Megatron-LM's runs; the two rows only check it."""


def speed_leave_one_out(hold_out: bool = True) -> list[tuple[SpeedRun, float, float]]:
    """(row, shipped prediction, prediction from a fit that did not see the row) of each
    TorchTitan throughput row, in tokens/s per GPU. With nothing fitted to these rows
    (`SPEED_FITTED`), the fit without a row is the shipped model: both are the same, and
    each row is a held-out test of it (`hold_out` False asks for no refit: the same)."""
    out = []
    for speed in read_speed_runs():
        shipped = predicted_tokens_per_s_per_gpu(speed)
        out.append((speed, shipped, shipped))
    return out


def fragmentation_rows(results: list[MemoryResult]) -> list[MemoryResult]:
    """The rows `engine_memory.FRAGMENTATION['torchtitan']` is fitted to: TorchTitan's dense
    runs that logged their reserved peak."""
    return [r for r in results if r.run.parallel.execution.engine == "torchtitan"
            and r.run.kind == "reserved" and r.run.measured_gib is not None
            and not r.run.model.is_moe]


def fragmentation_fit(results: list[MemoryResult]) -> float:
    """TorchTitan's reserved over allocated at the peak, less one: the mean of measured
    reserved over predicted allocated on `results` (`engine_memory.FRAGMENTATION` ships it
    fitted on all of `fragmentation_rows`)."""
    ratios = [r.run.measured_gib / r.allocated_gib for r in results]
    return sum(ratios) / len(ratios) - 1


def fragmentation_leave_one_out() -> list[tuple[MemoryRun, float, float]]:
    """(row, shipped predicted reserved GiB, reserved GiB predicted with the fragmentation
    refitted on the other rows) of each row `FRAGMENTATION['torchtitan']` is fitted to."""
    rows = fragmentation_rows([predict(run) for run in read_runs()[0]])
    out = []
    for row in rows:
        refit = fragmentation_fit([other for other in rows if other is not row])
        out.append((row.run, row.reserved_gib, row.allocated_gib * (1 + refit)))
    return out
