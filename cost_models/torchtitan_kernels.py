"""The kernels of a transformer block where TorchTitan runs them otherwise than Megatron-LM:
the same matmuls and attention (`transformer_ops.layer_ops`), with its memory-bound kernels
as eager PyTorch runs them or as torch.compile fuses them per block, PyTorch's SDPA in place
of cuDNN's attention, its eager loss, and float8's per-forward weight casts.
"""

from __future__ import annotations

from cost_models.transformer_ops import (
    FP8_EXEMPT,
    ExpertSplit,
    Matmul,
    Memory,
    Op,
    layer_ops,
    projections,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.efficiency import Efficiency

# TorchTitan's memory-bound kernels, as its December 2024 release ran them (pytorch/torchtitan
# @9dec370, the release of its published Llama 3.1 runs: torchtitan/models/norms.py,
# torchtitan/models/llama/model.py), each as (kernel, bytes read and written per element of
# the tensor it runs over). RMSNorm.forward: `self._norm(x.float()).type_as(x) * self.weight`
# with `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`: eager PyTorch runs
# each as a kernel over the whole hidden state (the eps add and rsqrt run over one value per
# row, 0 bytes here).
EAGER_RMSNORM = (("fp32 cast", 2 + 4), ("square", 4 + 4), ("mean", 4), ("eps", 0),
                 ("rsqrt", 0), ("normalize", 4 + 4), ("bf16 cast", 4 + 2), ("weight", 2 + 2))
# apply_rotary_emb: `view_as_complex(xq.float()...)`, times the complex frequencies,
# `view_as_real(...).type_as(xq)`: per element of q and of k.
EAGER_ROTARY = (("fp32 cast", 2 + 4), ("complex multiply", 4 + 4), ("bf16 cast", 4 + 2))
# FeedForward.forward `w2(F.silu(w1(x)) * w3(x))`: silu reads and writes the gate, the product
# reads both inputs and writes one; per element of one of them. Transformer Engine's fused
# SwiGLU (what `_dense_mlp_ops` prices) reads both and writes one: 6 bytes.
EAGER_SWIGLU = (("silu", 2 + 2), ("gate multiply", 2 + 2 + 2))
TE_FUSED = ("input norm", "post-attention norm", "residual add", "qk norm")
"""Memory kernels of `layer_ops` TorchTitan runs as its own (`torchtitan_layer_ops`)."""
SDPA_FLASH_OVER_CUDNN = 0.62
"""Speed of the FlashAttention-2 kernel PyTorch's scaled_dot_product_attention runs over that
of cuDNN's fused attention, which Transformer Engine runs on Hopper (and which the presets'
`attention` efficiency was fitted to through Megatron-LM's runs): FlashAttention-3 (Shah et
al. 2024, arXiv 2407.08608) Figs. 5-6 on H100 SXM5, head dim 128, 8k tokens: causal forward
333 against 529 TFLOP/s (0.63), backward 318 against 518 (0.61); 0.62 weighs them as a layer
spends its time (the backward does 2.5x the forward's work). PyTorch's SDPA picks
FlashAttention-2 over cuDNN on H100 since cuDNN's was made opt-in (pytorch/pytorch #138522);
on the December 2024 nightly TorchTitan ran (2.6.0.dev), SDPA measured 329 TFLOP/s where
cuDNN's reached 631 on the same H100 shape (pytorch/pytorch #142132)."""


def torchtitan_layer_ops(
    config: TransformerConfig,
    micro_batch: int,
    seq: int,
    tensor: int,
    sequence_parallel: bool,
    attention: str = "flash",
    context: int = 1,
    experts: ExpertSplit | None = None,
    compiled: bool = False,
) -> list[Op]:
    """Forward kernels of one block as TorchTitan runs it: `layer_ops`' matmuls and
    attention, with TorchTitan's own memory-bound kernels in place of Transformer Engine's
    fused ones: eager PyTorch's, or (`compiled`) those torch.compile makes of each block
    (TorchTitan's apply_compile compiles every TransformerBlock on its own, fullgraph).

    TorchTitan runs wq, wk, wv (and w1, w3) as separate GEMMs of one input; they stay one
    GEMM of their joint width here (at Llama shapes the efficiency differs by under 1% of a
    block's time), which also casts their input to fp8 once, as AOTAutograd's common
    subexpression elimination does under torch.compile (TorchTitan's float8 runs compiled).
    Multi-latent attention's own memory kernels are priced as `layer_ops` prices them."""
    ops = layer_ops(config, micro_batch, seq, tensor, sequence_parallel, attention, context,
                    experts)
    h, tokens = config.hidden_size, micro_batch * seq
    norm_elements = (tokens / tensor if sequence_parallel else tokens) * h
    kept: list[Op] = []
    for op in ops:
        if isinstance(op, Memory) and op.name in TE_FUSED:
            continue
        if isinstance(op, Memory) and op.name.endswith("activation") and not compiled \
                and config.activation == "swiglu":
            # `_dense_mlp_ops`' 6 bytes per element become eager PyTorch's two kernels.
            kept += [Memory(f"{op.name}: {kernel}", op.bytes * moved / 6)
                     for kernel, moved in EAGER_SWIGLU]
            continue
        kept.append(op)
    if compiled:
        # Inductor fuses each chain between two matmuls (or SDPA) into one kernel: the
        # norm; the residual add with the next norm (reading both inputs, writing the sum
        # and its norm); the last residual add, which ends the compiled block.
        kept += [Memory("input norm", (2 + 2) * norm_elements),
                 Memory("residual add and norm", (2 + 2 + 2 + 2) * norm_elements),
                 Memory("residual add", (2 + 2 + 2) * norm_elements)]
    else:
        kept += [*rmsnorm_kernels("input norm", norm_elements, compiled),
                 Memory("residual add", (2 + 2 + 2) * norm_elements),
                 *rmsnorm_kernels("post-attention norm", norm_elements, compiled),
                 Memory("residual add", (2 + 2 + 2) * norm_elements)]
    if not config.multi_latent_attention:
        kept += _torchtitan_attention_kernels(config, tokens, tensor, compiled)
    return kept


def rmsnorm_kernels(name: str, elements: float, compiled: bool) -> list[Op]:
    """TorchTitan's RMSNorm over `elements` 16-bit values: one fused kernel compiled (read
    and write), else eager PyTorch's `EAGER_RMSNORM`."""
    if compiled:
        return [Memory(name, (2 + 2) * elements)]
    return [Memory(f"{name}: {kernel}", moved * elements) for kernel, moved in EAGER_RMSNORM]


def _torchtitan_attention_kernels(config: TransformerConfig, tokens: float, tensor: int,
                                  compiled: bool) -> list[Op]:
    """The rotary embedding of q and k, the grouped keys and values repeated to every query
    head (repeat_kv: expand, then a reshape that copies), and Qwen3's q and k norms, on one
    tensor-parallel rank. Compiled, the rotation of k and its repeat are one kernel."""
    d = config.head_dim
    q = tokens * config.num_attention_heads / tensor * d
    kv = tokens * config.num_kv_heads / tensor * d
    repeated = config.num_attention_heads > config.num_kv_heads
    ops: list[Op] = []
    if config.qk_layernorm:
        ops += rmsnorm_kernels("qk norm", q + kv, compiled)
    if compiled:
        ops.append(Memory("rotary q", (2 + 2) * q))
        ops.append(Memory("rotary k", 2 * kv + 2 * (q if repeated else kv)))
        if repeated:
            ops.append(Memory("repeat v", 2 * kv + 2 * q))
        return ops
    for name, elements in (("rotary q", q), ("rotary k", kv)):
        ops += [Memory(f"{name}: {kernel}", moved * elements) for kernel, moved in EAGER_ROTARY]
    if repeated:
        ops += [Memory("repeat k", 2 * kv + 2 * q), Memory("repeat v", 2 * kv + 2 * q)]
    return ops


def torchtitan_head_ops(config: TransformerConfig, micro_batch: int, seq: int, tensor: int,
                        compiled_loss: bool = False) -> list[Op]:
    """Forward kernels of TorchTitan's final norm, output layer and loss on one rank: the
    norm in eager PyTorch (outside the compiled blocks; over the sequence shard under tensor
    parallelism, TorchTitan's SequenceParallel norm); the logits (split over the vocabulary
    under loss parallelism); `cross_entropy(pred.flatten(0, 1).float(), labels)` (train.py
    @9dec370): an fp32 copy of the logits, then log-softmax over rows too long for shared
    memory (PyTorch's softmax kernel reads them three times, for the max, the sum and the
    output, and writes once), then the gather of the targets; or, with a compiled loss,
    Inductor's kernel reading the bf16 logits twice (max and sum) and writing no copy."""
    h, tokens = config.hidden_size, micro_batch * seq
    logits = tokens * config.vocab_size / tensor
    ops: list[Op] = [*rmsnorm_kernels("final norm", tokens / tensor * h, False),
                     Matmul("logits", tokens, config.vocab_size / tensor, h)]
    if compiled_loss:
        return ops + [Memory("cross entropy", 2 * 2 * logits)]
    return ops + [Memory("cross entropy: fp32 cast", (2 + 4) * logits),
                  Memory("cross entropy: log-softmax", (3 * 4 + 4) * logits),
                  Memory("cross entropy: nll", 4 * tokens)]


def fp8_weight_casts(ops: list[Op], shards: int, gathered_fp8: bool) -> list[Op]:
    """TorchTitan's cast of a block's projection weights to fp8 (torchao's Float8Linear,
    tensorwise dynamic scaling: an amax pass, then the scaled cast: 5 bytes per element)
    every forward: of the whole gathered weight, or with FSDP's float8 all-gather
    (`gathered_fp8`) of this rank's shard before the gather (1/`shards` of it). Priced as a
    memory kernel, its backward twice that: about the transposed copy of the fp8 weight the
    input gradient's GEMM reads (2 bytes per element) at the shard counts of 8 or fewer the
    published runs use. Transformer Engine keeps its fp8 weights across micro-batches
    (`fp8_casts` does not count them). Routed experts are left out: TorchTitan's float8
    of December 2024 converts nn.Linear modules only."""
    weights = sum(op.n * op.k * op.count for op in projections(ops)
                  if op.name not in FP8_EXEMPT and not op.name.startswith("expert"))
    return [Memory("weight fp8 cast", 5 * weights / (shards if gathered_fp8 else 1))]


def torchtitan_efficiency(efficiency: Efficiency, cudnn_attention: bool) -> Efficiency:
    """`efficiency` as TorchTitan's kernels reach it: attention at `SDPA_FLASH_OVER_CUDNN`
    of the fitted attention efficiency where Transformer Engine's runs cuDNN's kernel
    (`cudnn_attention`: Hopper and newer; on an A100 both run FlashAttention-2)."""
    if not cudnn_attention:
        return efficiency
    return efficiency.model_copy(
        update={"attention": efficiency.attention * SDPA_FLASH_OVER_CUDNN})
