"""Published runs on TPU, Trainium and GB300 as runs Tessel can predict: the rows of
`../shared/calibration/published_accelerators.csv`, each in Tessel's vocabulary on the
preset of the machine it ran on, with the tokens per second per chip it measured.

A device is one chip on every preset (`planner/presets/tpu-*.yaml`, `trn1.yaml`,
`gb300-nvl72.yaml`), so each row is put in chips:

- MaxText's runs (tpu-recipes' Ironwood and Trillium tables, MaxText's v5p table) shard
  parameters, gradients and optimizer state over `ici_fsdp_parallelism=-1`: ZeRO-3 with the
  data degree = the chips left by tensor parallelism, gathers and reductions overlapped
  (XLA's async collectives). Their batch is `per_device_batch_size` per JAX device: a v5p
  or v6e chip is one JAX device, an Ironwood chip two (its two chiplets), so a chip's
  batch is 2x the recipe's there; a "v5p-N" slice counts TensorCores, N/2 chips. The
  global batch is the per-chip batch x chips, and each data rank's micro-batch is the
  global batch over the data degree (one micro-batch a step: MaxText's
  gradient_accumulation_steps defaults to 1).
- MaxText's `remat_policy` is mapped to the nearest recomputation Tessel has
  (`maxtext_recompute`): `full` replays the layer (full); `minimal` saves every
  projection's output and replays the attention core and the elementwise ops (selective:
  core_attn, layernorm); `custom` saves or offloads the tensors its recipe names and
  replays the rest, so Tessel replays the modules whose outputs are neither kept nor
  offloaded: the attention core unless `context` is, the MLP unless its `mlpwi`/`mlpwo`
  outputs are, and always the norms. The q/k/v and output projections have no module of
  their own in Tessel's selective recomputation (Megatron-LM's --recompute-modules): they
  are never replayed, so a policy that remats the output projection (the Llama 3.1 70B
  recipes) is priced 8% of a layer's forward matmuls short. Tensors a policy offloads to
  the host are priced as kept (the copies overlap compute under XLA; Tessel's activation
  offload excludes recomputation), so predicted memory is not compared.
- Each run is priced under Tessel's Megatron-LM engine rules (fused kernels as Transformer
  Engine's, selective recomputation by module), bf16, flash attention (MaxText's splash
  kernels), with the presets' efficiency: XLA on TPU is not cuBLAS, so the TPU presets
  share one `matmul` efficiency fitted to the TPU rows (`fit_tpu_matmul`;
  benchmarks/accelerator_accuracy.py prints it with each row held out).
- MaxText's v5p table reports TFLOP/s per chip, not tokens: its tokens per second are the
  TFLOP/s over MaxText's count of a token's training FLOPs (`maxtext_flops_per_token`), as
  MaxText counted them then, without halving causal attention (tpu-recipes-v0.1.4's v6e
  logs give both figures, and their ratio is this count: 481.4 GFLOP a token for Llama 3.1
  70B, 57.9 for 8B). The row's 2-slice run ("2x v5p-128 (DCN DP)" in its notes) is
  priced on two scale-up domains of 64 chips joined by DCN (`Cluster.with_segments`),
  ZeRO-3 over all 128 chips: Tessel has no hybrid sharding (MaxText shards within a slice
  and replicates across), so its gathers are priced across DCN too, pessimistically.
- NeMo's GB300 row: Megatron-Bridge's LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG
  (scripts/performance/configs/llama3/workload_base_configs.py @750df3db, an earlier
  release with GBS 128; the row's 256 is kept): Megatron-FSDP over the 64 GPUs, MBS 2,
  `cpu_offloading_num_layers=20` (no recomputation), fp8 with current scaling (NeMo's
  plain "FP8" since 25.x, as `published_runs.PRECISIONS` reads it), gradients reduced in
  bf16 (`grad_reduce_in_fp32=False`, llama3_llm_pretrain.py's set_llama3_common_configs).
- The Neuron SDK's Trainium 1 row: TP=32 counts NeuronCores (2 per chip): tensor 16 chips
  (one trn1.32xlarge) x data 32, ZeRO-1, MBS 1, bf16 with fp32 optimizer state, sequence
  parallelism as NeuronX Distributed's Llama tutorials run it; recomputation is not
  stated, so the least that fits (`published_runs.least_recompute`). On trn1.32xlarge
  (800 Gb/s EFA; the row allows trn1n's 1,600).

A row Tessel cannot describe is kept with the reason (`Unpriced`), never dropped; a row of
a kind this module does not know is refused by name.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cost_models.published_finetune import Unpriced
from cost_models.published_memory import CALIBRATION
from cost_models.published_runs import PRECISIONS, least_recompute
from cost_models.step_time import StepPrediction, predict_step
from planner.models.config import TransformerConfig
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.efficiency import Efficiency
from planner.vocabulary.parallel import ParallelConfig

CSV = CALIBRATION / "published_accelerators.csv"
TARGET = 0.15
"""Tokens per second per chip within 15% of the measured (issue 47)."""
JAX_DEVICES_PER_CHIP = {"tpu-v5p": 1, "tpu-v6e": 1, "tpu-v7": 2}
"""JAX devices a chip shows: v5p's two TensorCores run as one (megacore), v6e has one,
an Ironwood chip's two chiplets are two devices (Google Cloud's TPU7x page)."""
TPU_PRESETS = tuple(JAX_DEVICES_PER_CHIP)
MATMUL_GRID = tuple(i / 200 for i in range(100, 201))
"""The TPU matmul efficiencies the fit tries: 0.5 to 1 in steps of 0.005."""
FSDP = dict(zero_stage=3, overlap_grad_reduce=True, overlap_param_gather=True)
"""MaxText's ici_fsdp_parallelism: ZeRO-3 with XLA's overlapped gathers and reductions."""

# MaxText's custom remat policies, as each recipe names the tensors it keeps on the device
# or offloads to the host (every other named tensor is rematerialized).
IRONWOOD_LLAMA_70B = frozenset({"decoder_layer_input", "context", "query_proj", "key_proj",
                                "value_proj"})
"""tpu-recipes training/ironwood/llama3.1-70b/8k-bf16-tpu7x-4x4x4/run_recipe.sh @bc90a992:
decoder_layer_input, context, query_proj, key_proj, value_proj = device."""
TRILLIUM_LLAMA_70B = frozenset({"decoder_layer_input", "query_proj", "key_proj",
                                "value_proj"})
"""tpu-recipes training/trillium/Llama3.1-70B-MaxText/v6e-256/README.md @3596002a: those =
offload (MaxText tpu-recipes-v0.1.4's llama3_1_70b_8192)."""
TRILLIUM_LLAMA_8B = TRILLIUM_LLAMA_70B | {"out_proj"}
"""tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-256/README.md @a9e09290: those and
out_proj = offload (llama3_1_8b_8192)."""



@dataclass(frozen=True)
class AcceleratorRun:
    """One measured run, in Tessel's vocabulary."""

    line: int
    name: str
    model: TransformerConfig
    parallel: ParallelConfig
    cluster: Cluster
    tokens_per_s_per_chip: float
    """Measured tokens per second per chip."""
    measured: str
    """How the row gave it ('2,686.98 tok/s/chip', '328 TFLOP/s/chip / 194.8 GFLOP')."""
    mapping: str
    """How its configuration was read (the knobs the row does not name, the remat map)."""

    @property
    def chips(self) -> int:
        return self.cluster.num_devices

    @property
    def tpu(self) -> bool:
        """Whether the TPU fit sees it."""
        return self.cluster.name in TPU_PRESETS


@dataclass(frozen=True)
class AcceleratorResult:
    """A run's prediction beside its measurement."""

    run: AcceleratorRun
    prediction: StepPrediction

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.prediction.tokens_per_s / self.run.chips

    @property
    def error(self) -> float:
        """Predicted over measured tokens per second per chip, less one."""
        return self.tokens_per_s_per_chip / self.run.tokens_per_s_per_chip - 1


def maxtext_default_decoder(scale: int, seq_length: int) -> TransformerConfig:
    """MaxText's default decoder (src/maxtext/configs/base.yml: base_emb_dim 2048,
    base_num_query_heads 16, base_num_kv_heads 16, base_mlp_dim 7168,
    base_num_decoder_layers 16, head_dim 128, mlp_activations silu x linear, vocabulary
    32,000, RMSNorm, rotary positions, untied logits) at `global_parameter_scale`: MaxText
    doubles heads and MLP width, then the width, then the depth, in turn
    (pyconfig.get_individual_scales), so scale 32 = 2^5 gives heads and MLP x4, width x4,
    depth x2: 32 layers of width 8,192, 64 heads, MLP 28,672 (31.7B parameters)."""
    log2 = int(math.log2(scale))
    if 2 ** log2 != scale:
        raise ValueError(f"global_parameter_scale must be a power of 2, got {scale}")
    base, rem = divmod(log2, 3)
    heads_scale = base + int(rem > 0)
    width_scale = base + int(rem > 1)
    heads = 16 * 2 ** heads_scale
    return zoo_config("llama", {
        "num_layers": 16 * 2 ** base, "hidden_size": 2048 * 2 ** width_scale,
        "num_attention_heads": heads, "num_query_groups": heads, "kv_channels": 128,
        "ffn_hidden_size": 7168 * 2 ** heads_scale, "vocab_size": 32000,
        "seq_length": seq_length, "max_position_embeddings": seq_length})


def maxtext_flops_per_token(model: TransformerConfig, causal: bool = False) -> float:
    """A token's training FLOPs as MaxText counts them (maxtext_utils.
    calculate_tflops_training_per_device over per_device_batch_size x max_target_length):
    3 x 2 x (MLP + q/k/v + output projection) per layer plus the logits, and attention's
    3 x 4 x seq x heads x head_dim per layer, halved for causal masks in releases since
    2025 (not in those that logged the v5p and tpu-recipes-v0.1.4 tables)."""
    h, d = model.hidden_size, model.head_dim
    heads, groups = model.num_attention_heads, model.num_kv_heads
    mlp = h * model.ffn_hidden_size * (3 if model.activation == "swiglu" else 2)
    layer = mlp + h * (heads + 2 * groups) * d + h * heads * d
    weights = 6 * (layer * model.num_layers + h * model.vocab_size)
    attention = 12 * model.seq_length * heads * d * model.num_layers
    return weights + (attention / 2 if causal else attention)


def maxtext_recompute(policy: str, kept: frozenset[str] = frozenset()) -> dict[str, object]:
    """The recomputation knobs nearest MaxText's `remat_policy` (module docstring);
    `kept`: the tensors a custom policy keeps on the device or offloads."""
    if policy == "full":
        return {"recompute": "full"}
    if policy == "minimal":
        return {"recompute": "selective", "recompute_modules": ("core_attn", "layernorm")}
    if policy == "custom":
        modules = [] if "context" in kept else ["core_attn"]
        if not {"mlpwi", "mlpwo"} <= kept and not {"mlpwi_0", "mlpwi_1", "mlpwo"} <= kept:
            modules.append("mlp")
        return {"recompute": "selective", "recompute_modules": (*modules, "layernorm")}
    raise ValueError(f"remat_policy {policy!r} has no nearest Tessel recomputation here")


def read_runs(path: Path = CSV) -> tuple[list[AcceleratorRun], list[Unpriced]]:
    """The rows of the CSV Tessel describes (the v5p row twice: one slice and two), and
    those it cannot, with why. A row of a kind not known here raises ValueError."""
    runs: list[AcceleratorRun] = []
    unpriced: list[Unpriced] = []
    with path.open(encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            hardware = row["hardware"]
            name = f"{row['model']} on {hardware}, {row['num_chips']} chips"
            try:
                if "Ironwood" in hardware or "TPU7x" in hardware:
                    runs.append(_ironwood(line, name, row))
                elif "v6e" in hardware:
                    runs.append(_trillium(line, name, row))
                elif "v5p" in hardware:
                    runs += _v5p(line, name, row)
                elif "GB300" in hardware:
                    runs.append(_gb300(line, name, row))
                elif "Trainium1" in hardware:
                    runs.append(_trainium1(line, name, row))
                else:
                    raise ValueError(f"{path}:{line}: a row Tessel does not know ({name}); "
                                     "describe it in cost_models/published_accelerators")
            except _Unpriceable as why:
                unpriced.append(Unpriced(line, name, str(why)))
    return runs, unpriced


class _Unpriceable(Exception):
    """A row whose configuration Tessel has no knob for."""


def predict(run: AcceleratorRun, tpu_matmul: float | None = None) -> AcceleratorResult:
    """The run's prediction with its published configuration; `tpu_matmul`: the TPU
    presets' matmul efficiency in place of the shipped one (TPU runs only)."""
    if tpu_matmul is None or not run.tpu:
        return _predicted(run, run.cluster.device.efficiency)
    return _predicted(run, run.cluster.device.efficiency.model_copy(
        update={"matmul": tpu_matmul}))


def _predicted(run: AcceleratorRun, efficiency: Efficiency) -> AcceleratorResult:
    """The run on its preset at `efficiency`."""
    cluster = run.cluster.with_efficiency(efficiency)
    return AcceleratorResult(run, predict_step(run.model, cluster, run.parallel))


def _least_squares(grid: tuple[float, ...], runs: list[AcceleratorRun],
                   predicted: Callable[[AcceleratorRun, float], AcceleratorResult]) -> float:
    """The value of `grid` whose log throughput errors over `runs` (each predicted at it)
    have the least squares."""
    return min(grid, key=lambda value: sum(math.log1p(predicted(run, value).error) ** 2
                                           for run in runs))


def fit_tpu_matmul(runs: list[AcceleratorRun]) -> float:
    """The TPU matmul efficiency (`MATMUL_GRID`) whose log errors of tokens per second per
    chip over the TPU runs in `runs` have the least squares."""
    tpu = [run for run in runs if run.tpu]
    if not tpu:
        raise ValueError("no TPU run to fit the TPU matmul efficiency to")
    return _least_squares(MATMUL_GRID, tpu, predict)


SCALED = {
    "gb300-nvl72": ("gb200-nvl72", ("fp8_matmul", "attention")),
    "trn1": (None, ("matmul", "attention")),
}
"""Presets whose compute efficiency is one row's fit: preset -> (the preset whose fitted
efficiency it starts from, None for typical values; the kernels' fractions of peak scaled
together by `fit_scale`). GB300 runs GB200's kernels at the same datasheet peaks and was
measured 24% faster in the same recipe (its row's notes): Blackwell Ultra sustains more of
them, a uniform scale of GB200's fit. Trainium 1 has no fit to start from."""
SCALE_GRID = tuple(i / 200 for i in range(40, 401))
"""The scales `fit_scale` tries: 0.2 to 2 in steps of 0.005."""


def prior_efficiency(preset: str) -> Efficiency:
    """What `preset`'s efficiency is without its row: the preset it starts from (`SCALED`),
    or typical values."""
    start, _ = SCALED[preset]
    return Cluster.load(start).device.efficiency if start else Efficiency()


def scaled(preset: str, scale: float) -> Efficiency:
    """`preset`'s prior efficiency with its kernels' fractions of peak times `scale`."""
    prior = prior_efficiency(preset)
    _, fields = SCALED[preset]
    return prior.model_copy(update={f: getattr(prior, f) * scale for f in fields})


def predict_scaled(run: AcceleratorRun, scale: float) -> AcceleratorResult:
    """The run on its preset with `scaled(preset, scale)` as its efficiency."""
    return _predicted(run, scaled(run.cluster.name, scale))


def fit_scale(runs: list[AcceleratorRun], preset: str) -> float:
    """The scale (`SCALE_GRID`) of `preset`'s prior efficiency whose log errors over its
    runs in `runs` have the least squares; 1 (the prior) where `runs` has none of them."""
    mine = [run for run in runs if run.cluster.name == preset]
    return _least_squares(SCALE_GRID, mine, predict_scaled) if mine else 1.0


def held_out(runs: list[AcceleratorRun]) -> dict[int, float]:
    """For each CSV line with TPU runs, the TPU matmul efficiency fitted without that line
    (its runs predicted with it are the line held out: leave-one-out by row; the v5p row's
    two runs leave together)."""
    return {line: fit_tpu_matmul([run for run in runs if run.line != line])
            for line in sorted({run.line for run in runs if run.tpu})}


def _measures(row: dict[str, str]) -> dict[str, float]:
    """The row's metrics by name ('tokens/s/chip' -> 2686.98)."""
    names = [name.strip() for name in row["metric"].split(";")]
    values = [float(value.strip().replace(",", "")) for value in row["value"].split(";")]
    return dict(zip(names, values, strict=True))


def _per_device_batch(row: dict[str, str]) -> int:
    found = re.search(r"pdb=(\d+)", row["micro_batch"])
    if not found:
        raise _Unpriceable(f"no per-device batch in {row['micro_batch']!r}")
    return int(found.group(1))


def _remat(row: dict[str, str]) -> str:
    found = re.search(r"remat_policy=(\w+)", row["recompute"])
    if not found:
        raise _Unpriceable(f"no remat policy in {row['recompute']!r}")
    return found.group(1)


def _maxtext(line: int, name: str, model: TransformerConfig, preset: str, chips: int,
             tensor: int, pdb: int, recompute: dict[str, object], tokens: float,
             measured: str, slices: int = 1) -> AcceleratorRun:
    """A MaxText FSDP run of `chips` chips (in `slices` ICI slices joined by DCN)."""
    cluster = Cluster.load(preset).with_devices(chips)
    if slices > 1:
        cluster = cluster.with_segments(chips // slices // cluster.devices_per_host)
    per_chip = pdb * JAX_DEVICES_PER_CHIP[preset]
    data = chips // tensor
    global_batch = per_chip * chips
    parallel = ParallelConfig.of(
        tensor=tensor, data=data, micro_batch_size=global_batch // data,
        global_batch_size=global_batch, sequence_parallel=tensor > 1, precision="bf16",
        **FSDP, **recompute)
    knobs = ", ".join(f"{k}={v}" for k, v in recompute.items())
    mapping = (f"FSDP (ZeRO-3) over {data} x tensor {tensor}; {per_chip} sequences per chip "
               f"({pdb} per JAX device x {JAX_DEVICES_PER_CHIP[preset]}); {knobs}"
               + (f"; {slices} slices over DCN" if slices > 1 else ""))
    return AcceleratorRun(line, name, model, parallel, cluster, tokens, measured, mapping)


def _ironwood(line: int, name: str, row: dict[str, str]) -> AcceleratorRun:
    if "70B" not in row["model"]:
        raise _Unpriceable("only the Llama 3.1 70B recipe's remat policy is read")
    model = zoo_config("llama3-70b", {"seq_length": int(row["seq_len"])})
    tokens = _measures(row)["tokens/s/chip"]
    return _maxtext(line, name, model, "tpu-v7", int(row["num_chips"]), int(row["tp"]),
                    _per_device_batch(row), maxtext_recompute(_remat(row), IRONWOOD_LLAMA_70B),
                    tokens, f"{tokens:,.2f} tok/s/chip")


def _trillium(line: int, name: str, row: dict[str, str]) -> AcceleratorRun:
    size = "70B" if "70B" in row["model"] else "8B" if "8B" in row["model"] else None
    if size is None:
        raise _Unpriceable("only the Llama 3.1 8B and 70B recipes' remat policies are read")
    model = zoo_config(f"llama3-{size.lower()}", {"seq_length": int(row["seq_len"])})
    kept = TRILLIUM_LLAMA_70B if size == "70B" else TRILLIUM_LLAMA_8B
    tokens = _measures(row)["tokens/s/device"]
    return _maxtext(line, name, model, "tpu-v6e", int(row["num_chips"]), int(row["tp"]),
                    _per_device_batch(row), maxtext_recompute(_remat(row), kept), tokens,
                    f"{tokens:,.2f} tok/s/chip")


def _v5p(line: int, name: str, row: dict[str, str]) -> list[AcceleratorRun]:
    scale = re.search(r"global_parameter_scale=(\d+)", row["model"])
    if not scale:
        raise _Unpriceable(f"no MaxText model scale in {row['model']!r}")
    model = maxtext_default_decoder(int(scale.group(1)), int(row["seq_len"]))
    per_token = maxtext_flops_per_token(model)
    chips, tensor, pdb = int(row["num_chips"]), int(row["tp"]), _per_device_batch(row)
    recompute = maxtext_recompute(_remat(row))
    tflops = _measures(row)["TFLOP/s/chip"]
    runs = [_maxtext(line, name, model, "tpu-v5p", chips, tensor, pdb, recompute,
                     tflops * 1e12 / per_token,
                     f"{tflops:g} TFLOP/s/chip / {per_token / 1e9:.1f} GFLOP a token")]
    # The notes' multislice run: "2x v5p-128 (DCN DP): 319 / 69.43%".
    for slices, cores, tflops_x in re.findall(r"(\d+)x v5p-(\d+) \(DCN DP\): ([\d.]+)",
                                              row["notes"]):
        n, per_slice = int(slices), int(cores) // 2
        runs.append(_maxtext(
            line, f"{row['model'].split(' (')[0]} on {n}x TPU v5p-{cores}, {n * per_slice} "
            "chips", model, "tpu-v5p", n * per_slice, tensor, pdb, recompute,
            float(tflops_x) * 1e12 / per_token,
            f"{float(tflops_x):g} TFLOP/s/chip / {per_token / 1e9:.1f} GFLOP a token",
            slices=n))
    return runs


def _gb300(line: int, name: str, row: dict[str, str]) -> AcceleratorRun:
    if row["precision"] not in PRECISIONS:
        raise _Unpriceable(f"{row['precision']}: not a precision Tessel prices")
    precision, recipe = PRECISIONS[row["precision"]]
    model = zoo_config("llama3-70b", {"seq_length": int(row["seq_len"])})
    gpus = int(row["num_chips"])
    found = re.search(r"MBS=(\d+)", row["micro_batch"])
    if not found:
        raise _Unpriceable(f"no micro-batch in {row['micro_batch']!r}")
    micro = int(found.group(1))
    parallel = ParallelConfig.of(
        tensor=int(row["tp"]), pipeline=int(row["pp"]), data=int(row["dp"]),
        micro_batch_size=micro, global_batch_size=int(row["global_batch"]),
        precision=precision, fp8_recipe=recipe, attention_backend="fused",
        main_grads_dtype="bf16", offload_activation_layers=20, **FSDP)
    tokens = _measures(row)["tokens/s/GPU"]
    return AcceleratorRun(
        line, name, model, parallel, Cluster.load("gb300-nvl72").with_devices(gpus), tokens,
        f"{tokens:,.0f} tok/s/GPU",
        "Megatron-FSDP over 64 GPUs, MBS 2, 20 layers' activations offloaded, fp8 "
        "current scaling, bf16 gradient reduction (Megatron-Bridge's GB300 FP8-CS config)")


def _trainium1(line: int, name: str, row: dict[str, str]) -> AcceleratorRun:
    if "8B" not in row["model"]:
        raise _Unpriceable("only the Llama 3.1 8B row is read")
    model = zoo_config("llama3-8b", {"seq_length": int(row["seq_len"])})
    chips = int(row["num_chips"])
    cores_per_chip = 2  # a Trainium chip is 2 NeuronCore-v2, one rank each
    tensor = int(row["tp"]) // cores_per_chip
    cluster = Cluster.load("trn1").with_devices(chips)
    parallel = ParallelConfig.of(
        tensor=tensor, data=chips // tensor, micro_batch_size=int(row["micro_batch"].split(
            "=")[-1]), global_batch_size=int(row["global_batch"]), sequence_parallel=True,
        precision="bf16", zero_stage=1, overlap_grad_reduce=True)
    parallel = least_recompute(model, cluster, parallel.resolve(chips))
    sequences = _measures(row)["seq/s (whole job)"]
    tokens = sequences * model.seq_length / chips
    return AcceleratorRun(
        line, name, model, parallel, cluster, tokens,
        f"{sequences:g} seq/s x {model.seq_length} / {chips} chips",
        f"TP {row['tp']} NeuronCores = tensor {tensor} chips x data {chips // tensor}, "
        f"ZeRO-1, MBS 1, recompute {parallel.recomputation.recompute} (least that fits)")
