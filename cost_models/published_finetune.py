"""Published fine-tuning and offload runs as runs Tessel can predict: the rows of
`../shared/calibration/published_finetune_offload.csv`, each in Tessel's vocabulary on the
machine it ran on, with what it measured.

The rows name their recipe; what a row does not say is set as the recipe's published
config sets it, each setting citing where:

- torchtune's single-device and distributed recipes (pytorch/torchtune @bd2a0fc7,
  recipes/configs/llama3_1/8B_lora_single_device.yaml, 8B_qlora_single_device.yaml,
  8B_full_single_device.yaml, 70B_full.yaml): the model in bf16 throughout (no fp32
  master weights: `dtype: bf16`), the loss projected and scored in 8 chunks
  (LinearCrossEntropyLoss), LoRA rank 8 on q, v, the attention's output and the MLP, and
  the single-device full fine-tune stepping bitsandbytes' PagedAdamW8bit inside the
  backward (optimizer_in_bwd); the README's table ran them at batch 2 of packed 2048-token
  sequences with torch.compile. Its RTX 4090 rows state no more, and only one setting of
  torchtune's memory flags explains both numbers of its LoRA rows: activation offloading
  (`enable_activation_offloading`: every saved activation to the host in forward, back in
  backward, on side streams) without activation checkpointing. With checkpointing, LoRA's
  3,083 tokens/s would be 90% of the 4090's bf16 peak (forward, replay and input
  gradients); without it, 60%; and without checkpointing the activations (about 11 GiB)
  fit beside the 15 GiB base in 24 GiB only off the GPU. The full fine-tune's row is read
  with the same flags. (Its A6000 rows, which the calibration set holds out, fit without
  either: 48 GB holds the activations.) The 70B full fine-tune's recipe sets
  checkpointing and FSDP's CPU offload, as the row says.
- Megatron-Bridge's performance recipes (NVIDIA-NeMo/Megatron-Bridge,
  src/megatron/bridge/perf_recipes/llama/h100/llama3.py, llama3_70b_sft_32gpu_h100_fp8cs
  and the 70B LoRA on 8 H100 with fp8 current scaling): the row's degrees (VP is virtual
  stages per rank), MBS 1, 4096-token sequences, fp8 with current scaling, the distributed
  optimizer, bf16 gradient reduction (grad_reduce_in_fp32 False), sequence parallelism
  with TP communication overlap, no recomputation; the SFT recipe captures each layer's
  MLP in CUDA graphs (cuda_graph_scope ["mlp"]); the LoRA recipe adapts linear_qkv alone
  (peft.target_modules) at LoRA's default rank 32 (src/megatron/bridge/peft/lora.py).
- DeepSpeed's Azure post (docs/_posts/2022-07-26-deepspeed-azure.md): ZeRO-3 with the
  optimizer's state and the activation checkpoints on the CPU, GPT-3 175B at 16 sequences
  of 1024 tokens per GPU on 1,024 A100, as its recipe runs it
  (Megatron-DeepSpeed's examples_deepspeed/azure/run-175b.sh: fp16, TP1 PP1, ZeRO-3 with
  overlap_comm and reduce buckets of 9e7 elements, --checkpoint-activations under
  --deepspeed-activation-checkpointing; Megatron's own attention, a fused
  scale-mask-softmax: `attention_backend` local) on DeepSpeed 0.6.2, whose copies to the
  host block (`offload_copies`: its reductions run one bucket at a time). The recipe file
  leaves offload off (its comments turn it on for larger models); the row and the post's
  text say these runs kept the optimizer's state and the activations in host memory. Its
  TFLOP/s are the post's formula, 96 B s l h^2 (1 + s/6h + V/16lh): the recomputed
  forward counted, so it is compared with the executed TFLOP/s. The measurement is
  `azure_175b_tflops`, the post's figure of the row's two batches, not its 150.

A row Tessel cannot describe is kept with the reason (`Unpriced`), never dropped.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from cost_models.engine_memory import NON_ALLOCATOR_BYTES
from cost_models.published_memory import CALIBRATION
from cost_models.step_time import StepPrediction, predict_step
from planner.models.config import TransformerConfig
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster, HostSpec
from planner.vocabulary.parallel import ParallelConfig

CSV = CALIBRATION / "published_finetune_offload.csv"
TORCHTUNE_LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""torchtune's q, v and output projections with the MLP: Tessel's targets adapt k too,
a rank-8 adapter of 4096 + 1024 per layer more (0.01% of the model)."""
TORCHTUNE_LOSS_CHUNKS = 8
"""LinearCrossEntropyLoss's num_output_chunks, which the recipes leave at its default
(torchtune/modules/loss/cross_entropy_loss.py)."""


@dataclass(frozen=True)
class FinetuneRun:
    """One published row, in Tessel's vocabulary."""

    line: int
    name: str
    model: TransformerConfig
    parallel: ParallelConfig
    cluster: Cluster
    memory_gib: float | None
    """Peak memory per GPU as measured (torch.cuda.max_memory_allocated), or None."""
    tokens_per_s: float | None
    """Tokens per second over the whole job, as measured, or None."""
    tflops_per_gpu: float | None
    """TFLOP/s per GPU as the row counts them, or None."""
    tflops_count: str = "model"
    """'model' (Megatron-Bridge's model FLOPs) or 'executed' (recomputation counted)."""


@dataclass(frozen=True)
class Unpriced:
    """A row Tessel cannot describe, and why."""

    line: int
    name: str
    why: str


@dataclass(frozen=True)
class FinetuneResult:
    """A row's prediction beside its measurement."""

    run: FinetuneRun
    prediction: StepPrediction

    @property
    def allocated_gib(self) -> float:
        """The predicted peak allocated (what torch.cuda.max_memory_allocated reports, which
        the rows log): the peak less the memory outside the caching allocator."""
        return self.prediction.memory_gib_per_gpu - NON_ALLOCATOR_BYTES / 2**30

    @property
    def memory_error(self) -> float | None:
        if self.run.memory_gib is None:
            return None
        return self.allocated_gib / self.run.memory_gib - 1

    @property
    def speed_error(self) -> float | None:
        """Predicted over measured throughput, less one (tokens/s, or TFLOP/s per GPU)."""
        p, run = self.prediction, self.run
        if run.tokens_per_s is not None:
            return p.tokens_per_s / run.tokens_per_s - 1
        if run.tflops_per_gpu is not None:
            predicted = p.model_tflops_per_gpu if run.tflops_count == "model" \
                else p.hardware_tflops_per_gpu
            return predicted / run.tflops_per_gpu - 1
        return None


def _workstation(preset: str, gpus: int) -> Cluster:
    return Cluster.load(preset).with_devices(gpus)


def azure_ndm_a100_v4(gpus: int) -> Cluster:
    """Azure's NDm A100 v4 (the row's own words: 8x A100 80GB, 1.7 TB of host memory, 200
    Gb/s HDR InfiniBand per GPU): the DGX A100 80 GB preset with that host memory."""
    cluster = Cluster.load("dgx-a100-80g").with_devices(gpus)
    assert cluster.host is not None
    host = HostSpec.model_validate({**cluster.host.model_dump(), "memory_gib": 1700 * 1e9
                                    / 2**30, "source": "Azure NDm A100 v4: 1.7 TB (the row)"})
    return cluster.model_copy(update={"host": host})


AZURE_175B_FIGURE5 = {
    (1024, 128): (94.4, 129.0, 169.8, 180.9, 193.2),
    (1024, 256): (82.1, 116.7, 162.3, 178.4, 201.9),
    (1024, 512): (72.2, 109.3, 153.7, 177.2, 195.7),
    (1024, 1024): (48.8, 82.1, 134.0, 166.0, 190.7),
    (512, 128): (53.7, 95.7, 129.0, 169.8, 185.8),
    (512, 256): (43.8, 80.9, 117.9, 163.6, 179.6, 203.1),
    (512, 512): (38.9, 71.0, 109.3, 156.2, 178.4, 199.4),
}
"""Every bar of the post's Figure 5: DeepSpeed's 175B, TFLOP/s per GPU at 1, 2, 4, ... 32
sequences a GPU, keyed by (sequence length, GPUs). Read from the figure
(docs/assets/images/175b-trend.png, unchanged since 2022-07-25 at the row's commit
edaa7221), each bar's top against the axis's grid lines: 0 to 250 TFLOP/s over 202 pixels,
so to about 1 TFLOP/s (the same reading gives 203.1 for the bar the post's text gives as
204.49). Figure 3 agrees: 195 PFLOP/s over 1,024 GPUs at 16 a GPU.

The row's two batches on 1,024 GPUs are its measurements (`azure_175b_tflops`); the row's
"150 vs 81 headline" is the announcement's comparison with FSDP's 81 TFLOP/s for a 1T model
on AWS, not a measurement of either. All 37 bars, none fitted, judge how the prediction
moves with the batch a GPU and the GPUs (benchmarks/finetune_accuracy.py)."""


def azure_175b_tflops(per_gpu: int) -> float:
    """Figure 5's TFLOP/s per GPU of the row's run at `per_gpu` sequences of 1024 tokens a
    GPU on 1,024 A100: 190.7 at 16 (the row's GPU sweep; Figure 3(b)), 166.0 at 8 (its size
    sweep, which the row gives as ">157")."""
    return AZURE_175B_FIGURE5[(1024, 1024)][per_gpu.bit_length() - 1]


RECIPE_REDUCE_BUCKET = 90_000_000
"""The recipe's zero_optimization.reduce_bucket_size (run-175b.sh), in elements."""


def azure_175b_figure5() -> list[FinetuneRun]:
    """Figure 5's bars (`AZURE_175B_FIGURE5`) as runs of the row's recipe, held out."""
    runs = []
    for (seq, gpus), measured in AZURE_175B_FIGURE5.items():
        model = zoo_config("gpt3-175b", {"seq_length": seq})
        for i, value in enumerate(measured):
            runs.append(FinetuneRun(
                2, f"Figure 5: seq {seq}, {gpus} GPUs, {2**i}/GPU", model,
                azure_175b_parallel(2**i, gpus), azure_ndm_a100_v4(gpus), memory_gib=None,
                tokens_per_s=None, tflops_per_gpu=value, tflops_count="executed"))
    return runs


def azure_175b_parallel(per_gpu: int, gpus: int) -> ParallelConfig:
    """DeepSpeed's 175B recipe (this module's docstring) at `per_gpu` sequences a GPU, one
    micro-batch a step, on `gpus` GPUs."""
    return ParallelConfig.of(
        global_batch_size=per_gpu * gpus, micro_batch_size=per_gpu, recompute="full",
        zero_stage=3, engine="tessel", precision="fp16", attention_backend="local",
        offload_optimizer="cpu", offload_checkpoints=True, offload_copies="blocking",
        overlap_grad_reduce=True, ddp_bucket_size=RECIPE_REDUCE_BUCKET)


def _torchtune(finetune: str, layers: int) -> ParallelConfig:
    """torchtune's single-device settings on the RTX 4090 (this module's docstring): batch
    2 of 2048 tokens, bf16 throughout, every layer's activations offloaded to the host and
    none recomputed, torch.compile of the blocks and a chunked loss that keeps the bf16
    logits (as a compiled loss does), under torch's own modules (the torchtitan engine's
    rules). The full fine-tune's recipe (8B_full_single_device.yaml) steps bitsandbytes'
    PagedAdamW8bit inside the backward (optimizer_in_bwd)."""
    full = finetune == "full"
    return ParallelConfig.of(
        global_batch_size=2, micro_batch_size=2, recompute="none",
        offload_activation_layers=layers, engine="torchtitan", compile=True,
        compile_loss=True, loss_chunks=TORCHTUNE_LOSS_CHUNKS, finetune=finetune,
        lora_rank=8, lora_alpha=16.0,
        lora_targets=TORCHTUNE_LORA_TARGETS, main_grads_dtype="bf16", exp_avg_dtype="bf16",
        optimizer="paged_adam8bit" if full else "adam", optimizer_in_backward=full)


def read_runs(path: Path = CSV) -> tuple[list[FinetuneRun], list[Unpriced]]:
    """The rows of the CSV Tessel describes, and those it cannot (with why). Each row is
    recognised by its method, model and hardware columns; a row of another kind is
    refused by name, so a new row is never silently skipped."""
    runs: list[FinetuneRun] = []
    unpriced: list[Unpriced] = []
    with path.open() as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            method, model, hardware = row["method"], row["model"], row["hardware"]
            name = f"{model} {method}"
            values = [part.strip() for part in row["value"].split(";")]
            if "torchtune" in row["source"] and hardware.startswith("RTX 4090"):
                finetune = {"Full finetune": "full", "LoRA": "lora", "QLoRA": "qlora"}[method]
                llama = zoo_config("llama3-8b", {"seq_length": 2048})
                runs.append(FinetuneRun(
                    line, name, llama, _torchtune(finetune, llama.num_layers),
                    _workstation("rtx-4090", 1),
                    memory_gib=float(values[0]), tokens_per_s=float(values[1]),
                    tflops_per_gpu=None))
            elif "torchtune" in row["source"] and "70B" in model:
                # fsdp_cpu_offload: FSDP2's CPUOffloadPolicy (parameters, gradients and the
                # optimizer's step on the CPU), over the 8 GPUs; 1,568 tokens/s can only be
                # the job's (16 x 2048 tokens a step in 10.4 s). The recipe shards
                # tok_embeddings and output as units of their own (custom_sharded_layers),
                # every unit resharded after forward, and its bf16 model under FSDP2 with no
                # mixed-precision policy reduces bf16 gradients.
                runs.append(FinetuneRun(
                    line, name, zoo_config("llama3-70b", {"seq_length": 2048}),
                    ParallelConfig.of(global_batch_size=16, micro_batch_size=2,
                                      recompute="full", engine="torchtitan", zero_stage=3,
                                      fsdp_reshard_after_forward="always",
                                      main_grads_dtype="bf16", exp_avg_dtype="bf16",
                                      offload_optimizer="cpu", offload_params="cpu",
                                      finetune="full", compile=True, compile_loss=True,
                                      loss_chunks=TORCHTUNE_LOSS_CHUNKS),
                    _workstation("dgx-a100-80g", 8), memory_gib=float(values[0]),
                    tokens_per_s=float(values[1]), tflops_per_gpu=None))
            elif "Megatron-Bridge" in row["source"]:
                lora = method == "LoRA"
                gpus = int(row["num_gpus"])
                tensor, pipeline = int(row["tp"]), int(row["pp"].split()[0])
                virtual = int(row["pp"].split("VP")[1].strip(" )"))
                parallel = ParallelConfig.of(
                    tensor=tensor, pipeline=pipeline, global_batch_size=32,
                    micro_batch_size=1, schedule="interleaved", virtual_pipeline=virtual,
                    sequence_parallel=True, precision="fp8", fp8_recipe="tensorwise",
                    zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True,
                    tp_comm_overlap=True, main_grads_dtype="bf16",
                    cuda_graph_scope=() if lora else ("mlp",),
                    finetune="lora" if lora else "full", lora_rank=32, lora_alpha=32.0,
                    lora_targets=("linear_qkv",))
                runs.append(FinetuneRun(
                    line, name, zoo_config("llama3-70b", {"seq_length": 4096}), parallel,
                    Cluster.load("dgx-h100").with_devices(gpus), memory_gib=None,
                    tokens_per_s=float(values[0]) * gpus, tflops_per_gpu=None))
            elif "deepspeed" in row["source"].lower():
                model_ = zoo_config("gpt3-175b", {"seq_length": 1024})
                for per_gpu, sweep in ((16, "GPU sweep"), (8, "size sweep")):
                    runs.append(FinetuneRun(
                        line, f"gpt3-175b ZeRO-3 offload, {per_gpu}/GPU ({sweep})", model_,
                        azure_175b_parallel(per_gpu, 1024), azure_ndm_a100_v4(1024),
                        memory_gib=None, tokens_per_s=None,
                        tflops_per_gpu=azure_175b_tflops(per_gpu), tflops_count="executed"))
            else:
                raise ValueError(f"{path}:{line}: a row Tessel does not know ({name} on "
                                 f"{hardware}); describe it in cost_models/published_finetune")
    return runs, unpriced


def predict(run: FinetuneRun) -> FinetuneResult:
    """The row's prediction with its published configuration."""
    return FinetuneResult(run, predict_step(run.model, run.cluster, run.parallel))
