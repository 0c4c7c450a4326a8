"""LoRA and QLoRA: which linears get adapters, the adapters' parameters, and the 4-bit base.

- LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022, Sec. 4):
  a frozen linear W (out x in) gains y += (alpha / r) x A^T B^T with A (r x in) and B
  (out x r) trained, r (in + out) parameters. Only A and B have gradients and optimizer
  state; W keeps its 16-bit copy and no gradient.
- Tensor parallelism (Megatron-Bridge's `ParallelLinearAdapter`, src/megatron/bridge/peft/
  utils.py): beside a column-parallel W (split by output rows) A is whole on every tensor
  rank and B split like W; beside a row-parallel W (split by input columns) A is split
  like W and B whole, the adapter's partial sums joining W's before its all-reduce.
- QLoRA (Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs", NeurIPS 2023,
  Sec. 3): the base of each adapted linear stored as 4-bit NormalFloat in blocks of 64,
  each block's absmax quantized to 8 bits with one fp32 constant per 256 blocks ("double
  quantization"): 4 + 8/64 + 32/(64 x 256) = 4.127 bits a weight. Every use of the weight
  (forward, and backward's input gradient) dequantizes it to bf16 first: in one fused
  kernel (bitsandbytes' `dequantize_4bit`), or in torchao's ten eager kernels under the
  torch-native engine (`TORCHAO_DEQUANTIZE`: TorchTitan's stack, where torchtune runs it).

Adapters sit on the layers' linears only (not the embedding or the head), the experts'
included, as Megatron-Bridge's and torchtune's default targets do.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from cost_models.identity_memo import IdentityMemo
from cost_models.stage_parameters import ParameterLayout, layer_parameter_layouts, local_shape
from cost_models.transformer_ops import Matmul, Memory, Op
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig

TARGET_LINEARS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj", "q_down_proj", "q_up_proj", "kv_down_proj",
                   "kv_up_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj", "fc1"),
    "linear_fc2": ("down_proj", "fc2"),
}
"""Each LoRA target (Megatron-Bridge's module names) -> the zoo transformer's linears it
names (`planner.models.transformer`; multi-latent attention's projections under qkv)."""

NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
"""Bits a QLoRA base weight takes: 4-bit NF4, an 8-bit absmax per block of 64, an fp32
constant per 256 blocks (Dettmers et al. 2023, Sec. 3, "Double Quantization")."""
NF4_BYTES = NF4_BITS / 8
FUSED_DEQUANTIZE = (NF4_BYTES + 2, 1)
"""(bytes a weight, kernels a linear) of one dequantization in one fused kernel, as
bitsandbytes' `dequantize_4bit` runs it: the NF4 codes and scales read, bf16 written."""
TORCHAO_DEQUANTIZE = (1 + 4.5 + 1 + 4.5 + 5 + 5 + 2 + 2 + 4 + 4, 10)
"""The same as torchao's NF4Tensor.get_original_weight runs it (torchao/dtypes/
nf4tensor.py), eagerly even under torch.compile (its __torch_dispatch__ is wrapped in
torch._dynamo.disable), per weight: the high and low nibbles shifted out of the packed
bytes (read and write half a byte each) and widened to int64 (8 bytes each, for half the
weights), each half looked up in the NF4 table (the int64 index read, bf16 written),
scaled by its block's absmax (read and write), then stacked and reshaped into the
weight's layout (two copies of the bf16 weight): ten kernels, 33 bytes a weight."""
ADAPTER_TIME_SCALE = 0.0
"""The adapters' kernels' time over what the roofline of `cost_models.kernel_time` prices
for them (each a small GEMM re-reading its linear's input, plus the per-kernel cost: 30-60
us each on an H100). Fitted (benchmarks/finetune_accuracy.py) to the three published
adapter runs, torchtune's LoRA and QLoRA on an RTX 4090 and Megatron-Bridge's 70B LoRA on
8 H100: each is best predicted with the adapters costing nothing beside the frozen base
(their runs compile or overlap them), and each held out of the fit still takes 0. The
base's own saving, no weight gradients, is priced whatever the scale."""


def adapted(param: ParameterLayout, targets: tuple[str, ...]) -> bool:
    """Whether `param` is the weight of a linear one of `targets` names."""
    parts = param.name.split(".")
    if len(parts) < 2 or parts[-1] != "weight":
        return False
    return any(parts[-2] in TARGET_LINEARS[target] for target in targets)


def adapter_layouts(param: ParameterLayout, rank: int) -> list[ParameterLayout]:
    """The LoRA factors of the adapted linear weight `param` (out x in): ``lora_a``
    (rank x in) and ``lora_b`` (out x rank), split over the tensor ranks as Megatron-Bridge
    splits them: beside a column-parallel weight A whole and B by rows, beside a
    row-parallel one A by columns and B whole, beside a replicated one both whole; in the
    linear's ZeRO group and expert."""
    base = param.name.removesuffix(".weight")
    out, inputs = param.shape
    # Column-parallel (rows split): B split as W, A whole; row-parallel (columns split):
    # A split as W, B whole; a linear whole on every tensor rank: both whole.
    a_dim = 1 if param.tensor_dim == 1 else None
    b_dim = 0 if param.tensor_dim == 0 else None
    return [
        ParameterLayout(f"{base}.lora_a.weight", (rank, inputs), a_dim, param.group,
                        param.expert),
        ParameterLayout(f"{base}.lora_b.weight", (out, rank), b_dim, param.group,
                        param.expert),
    ]


def trained_parameters(model: TransformerConfig, parallel: ParallelConfig, params: float,
                       layers: int) -> float:
    """Of the `params` one GPU of a stage of `layers` layers holds, those trained: all, or
    under LoRA and QLoRA the adapters alone."""
    if not parallel.finetuning.adapters:
        return params
    _, adapters, _, expert_adapters = layer_split(model, parallel)
    return layers * (adapters + expert_adapters)


def adapted_linears(model: TransformerConfig, targets: tuple[str, ...]
                    ) -> Iterator[tuple[float, ParameterLayout]]:
    """(share of the layers, weight) of each linear `targets` adapts in one mean layer:
    each kind of layer's adapted weights, weighted by the share of the layers of that kind
    (dense and MoE layers apart)."""
    kinds = model.layer_kinds()
    for kind in set(kinds):
        share = kinds.count(kind) / len(kinds)
        for param in layer_parameter_layouts(model, kind):
            if adapted(param, targets):
                yield share, param


_LAYER_SPLITS: IdentityMemo[tuple[float, float, float, float]] = IdentityMemo(4096)


def layer_split(model: TransformerConfig, parallel: ParallelConfig
                ) -> tuple[float, float, float, float]:
    """(adapted, adapters, expert adapted, expert adapters): of one mean layer on one GPU
    of `parallel`'s stage, the parameters of the adapted linears' weights and of their
    adapters, apart from the routed experts' (each expert whole on its rank: split over
    the expert ranks, and by the expert-tensor degree)."""
    tuning, t = parallel.finetuning, parallel.dims.tensor
    experts = max(parallel.dims.expert, 1) * (parallel.dims.expert_tensor or t)
    key = (tuning.lora_targets, tuning.lora_rank, t, experts)
    return _LAYER_SPLITS.get((model,), key, lambda: _layer_split(model, *key))


def _layer_split(model: TransformerConfig, targets: tuple[str, ...], rank: int, t: int,
                 expert_shards: int) -> tuple[float, float, float, float]:
    totals = [0.0, 0.0, 0.0, 0.0]
    for share, param in adapted_linears(model, targets):
        factors = adapter_layouts(param, rank)
        if param.expert is not None:
            # Each routed expert whole on one rank of its group (`layer_parameters`).
            totals[2] += share * math.prod(param.shape) / expert_shards
            totals[3] += share * sum(math.prod(a.shape) for a in factors) / expert_shards
        else:
            totals[0] += share * math.prod(local_shape(param, t, 1, 0))
            totals[1] += share * sum(math.prod(local_shape(a, t, 1, 0)) for a in factors)
    return totals[0], totals[1], totals[2], totals[3]


@dataclass(frozen=True)
class AdapterOps:
    """The kernels adapters add to one layer's micro-batch."""

    matmuls: list[Op]
    """The adapters' two matmuls per adapted linear (their backward: input and weight
    gradients, as any linear's)."""
    dequantize: list[Op]
    """Under QLoRA, the base weights' dequantization, run before the forward's matmuls
    and again before the backward's input gradients."""


def adapter_ops(model: TransformerConfig, parallel: ParallelConfig, seq: float) -> AdapterOps:
    """The kernels of one mean layer's adapters on one GPU for a micro-batch of
    `seq`-token sequences: x A^T then (x A^T) B^T for each adapted linear (a routed
    expert's on its share of the tokens), and QLoRA's dequantization of the adapted
    weights (reading NF4, writing bf16) before each use."""
    tuning, t, r = parallel.finetuning, parallel.dims.tensor, parallel.finetuning.lora_rank
    tokens = parallel.batch.micro_batch_size * seq
    matmuls: list[Op] = []
    for share, param in adapted_linears(model, tuning.lora_targets):
        if param.expert is None:
            (rows, cols), m, count = local_shape(param, t, 1, 0), tokens, share
        else:
            # Each routed expert sees top-k / experts of the tokens; this GPU holds
            # experts / expert-degree of them.
            rows, cols = param.shape
            m = tokens * (model.moe_top_k or 1) / (model.num_experts or 1)
            count = share / max(parallel.dims.expert, 1)
        matmuls += [Matmul(f"{param.name} lora_a", m, r, cols, count),
                    Matmul(f"{param.name} lora_b", m, rows, r, count)]
    dequantize: list[Op] = []
    if tuning.finetune == "qlora":
        adapted_weights, _, expert_weights, _ = layer_split(model, parallel)
        torch_native = parallel.execution.engine == "torchtitan"
        per_weight, kernels = (TORCHAO_DEQUANTIZE if torch_native else FUSED_DEQUANTIZE)
        linears = sum(1 for param in layer_parameter_layouts(model, model.layer_kinds()[0])
                      if adapted(param, tuning.lora_targets))
        dequantize.append(Memory("nf4 dequantize", (adapted_weights + expert_weights)
                                 * per_weight, launches=kernels * linears))
    return AdapterOps(matmuls, dequantize)
