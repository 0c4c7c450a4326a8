"""The kernels of one transformer layer on one GPU, as Megatron-LM runs them.

A layer is a list of matmuls (with their m, n, k on one tensor-parallel rank), fused
attention, and memory-bound kernels (norms, activations, residual adds, softmax) with the
bytes they move. Shapes follow Megatron-LM's tensor parallelism (Shoeybi et al. 2019):
the q/k/v and MLP input projections are split by output columns, the attention output
and MLP output projections by input rows, attention by heads. Mixture-of-experts layers
run each token through `moe_top_k` experts (Fedus et al. 2021; Jiang et al. 2024).

Activations are bf16/fp16 (2 bytes), as in mixed-precision training.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.models.config import TransformerConfig

ACTIVATION_BYTES = 2
SCORE_FREE_ATTENTION = ("flash", "fused")
"""Attention backends that never write the score matrix."""
# Bytes an fp8 matmul's cast moves per element of its activation input, by recipe: read
# 16 bits and write 8 (delayed scaling takes its scale from the amax history, found in
# the same pass); current (tensorwise) scaling reads the tensor once more for its amax
# first; block scaling (mxfp8, blockwise) writes a row-wise and a column-wise copy, the
# two layouts the forward and the weight-gradient matmuls read (Transformer Engine's
# recipes). Weights are cast once per step, not per micro-batch, and are not counted.
FP8_CAST_BYTES = {"delayed": 3, "tensorwise": 5, "mxfp8": 4, "blockwise": 4}


@dataclass(frozen=True)
class Matmul:
    """A (batched) matmul: `count` products of (m x k) @ (k x n)."""

    name: str
    m: float
    n: float
    k: float
    count: float = 1

    @property
    def flops(self) -> float:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Attention:
    """Fused (flash) attention over `heads` heads of one rank."""

    name: str
    flops: float
    """FLOPs of QK^T and AV over the full (unmasked) score matrix, as Megatron counts."""
    causal: bool = True


@dataclass(frozen=True)
class Memory:
    """A memory-bound kernel: its time is the bytes it reads and writes."""

    name: str
    bytes: float


Op = Matmul | Attention | Memory


def layer_ops(
    config: TransformerConfig,
    micro_batch: int,
    seq: int,
    tensor: int,
    sequence_parallel: bool,
    attention: str = "flash",
    context: int = 1,
) -> list[Op]:
    """Forward kernels of one transformer block on one rank, for `seq` tokens per
    sequence (the rank's share under context parallelism: its queries attend to all
    `seq x context` keys, gathered around the context group).

    `attention` is the backend (`ParallelConfig.attention_backend`, resolved): flash and
    fused run one fused kernel; local and unfused write the scores, run softmax and
    dropout over them and multiply again. Both of the latter fuse scale, mask and softmax
    into one kernel (Megatron's FusedScaleMaskSoftmax, Transformer Engine's
    scaled-masked-softmax), so they are priced alike."""
    h, d = config.hidden_size, config.head_dim
    heads, kv_heads = config.num_attention_heads / tensor, config.num_kv_heads / tensor
    tokens = micro_batch * seq
    # Norms, dropout and residual adds run on the whole hidden state, or on 1/t of the
    # tokens with sequence parallelism.
    norm_tokens = tokens / tensor if sequence_parallel else tokens
    hidden_bytes = norm_tokens * h * ACTIVATION_BYTES
    ops: list[Op] = [
        Memory("input norm", 2 * hidden_bytes),
        Matmul("qkv", tokens, (heads + 2 * kv_heads) * d, h),
    ]
    keys = seq * context
    scores = micro_batch * heads * seq * keys
    if attention in SCORE_FREE_ATTENTION:
        ops.append(Attention("attention", 4 * scores * d))
    else:
        ops += [
            Matmul("scores", seq, keys, d, count=micro_batch * heads),
            # Megatron's fused scale-mask-softmax reads and writes the scores once; dropout
            # on the probabilities reads them again and writes them with a mask.
            Memory("softmax", 2 * scores * ACTIVATION_BYTES + 3 * scores * ACTIVATION_BYTES),
            Matmul("context", seq, d, keys, count=micro_batch * heads),
        ]
    ops += [
        Matmul("attention output", tokens, h, heads * d),
        Memory("residual add", 3 * hidden_bytes),
        Memory("post-attention norm", 2 * hidden_bytes),
    ]
    ops += _mlp_ops(config, tokens, tensor)
    ops.append(Memory("residual add", 3 * hidden_bytes))
    return ops


def _mlp_ops(config: TransformerConfig, tokens: float, tensor: int) -> list[Op]:
    h, f = config.hidden_size, config.ffn_size
    inputs = 2 if config.activation == "swiglu" else 1
    routed = tokens
    ops: list[Op] = []
    if config.num_experts is not None:
        ops.append(Matmul("router", tokens, config.num_experts, h))
        routed = tokens * config.moe_top_k
    ops += [
        Matmul("mlp input", routed, inputs * f / tensor, h),
        # Bias + GeLU (or SiLU x gate) reads the wide activation(s) and writes one.
        Memory("activation", (inputs + 1) * routed * f / tensor * ACTIVATION_BYTES),
        Matmul("mlp output", routed, h, f / tensor),
    ]
    return ops


def head_ops(config: TransformerConfig, micro_batch: int, seq: int, tensor: int) -> list[Op]:
    """Forward kernels of the final norm, output layer and cross-entropy on one rank."""
    h, v = config.hidden_size, config.vocab_size
    tokens = micro_batch * seq
    return [
        Memory("final norm", 2 * tokens * h * ACTIVATION_BYTES),
        Matmul("logits", tokens, v / tensor, h),
        # Vocab-parallel cross-entropy in fp32: max, exp-sum and the loss pass the logits.
        Memory("cross entropy", 3 * tokens * v / tensor * 4),
    ]


def fp8_casts(ops: list[Op], recipe: str) -> list[Op]:
    """The casts to fp8 that `ops`' projection matmuls need under `recipe`: one memory
    kernel per matmul over its activation input (backward: the gradient's cast, priced
    as twice the bytes like every memory kernel)."""
    per_element = FP8_CAST_BYTES[recipe]
    return [Memory(f"{op.name} fp8 cast", op.m * op.k * op.count * per_element)
            for op in projections(ops)]


def projections(ops: list[Op]) -> list[Matmul]:
    """The matmuls of `ops` with a weight: not attention's scores and context products,
    which multiply two activations (and stay in 16 bits under fp8)."""
    return [op for op in ops if isinstance(op, Matmul) and op.name not in ("scores", "context")]


def attention_kernels(ops: list[Op]) -> list[Op]:
    """The kernels of `ops` that selective recomputation replays: fused attention, or the
    unfused scores, softmax and context of `layer_ops`."""
    return [op for op in ops
            if isinstance(op, Attention) or op.name in ("scores", "softmax", "context")]


def every_other_matmul_replayed(config: TransformerConfig, ops: list[Op]) -> list[Op]:
    """The kernels of `ops` that TorchTitan's op-level selective checkpointing replays in
    backward (torchtitan/distributed/activation_checkpoint.py: it saves SDPA's outputs and
    every odd-numbered matmul of a block, counting wq, wk, wv, wo, then the MLP's up
    projections and its down projection): the even-numbered matmuls (wk, wo, and w3 of
    SwiGLU or the down projection of a one-matrix MLP) and every memory-bound kernel."""
    heads, kv = config.num_attention_heads, config.num_kv_heads
    swiglu = config.activation == "swiglu"
    # Share of each (fused) matmul of `layer_ops` that is replayed.
    replayed = {"qkv": kv / (heads + 2 * kv), "attention output": 1.0,
                "mlp input": 0.5 if swiglu else 0.0, "mlp output": 0.0 if swiglu else 1.0}
    kept: list[Op] = []
    for op in ops:
        if isinstance(op, Memory):
            kept.append(op)
        elif isinstance(op, Matmul) and replayed.get(op.name, 0.0) > 0:
            kept.append(Matmul(op.name, op.m, op.n * replayed[op.name], op.k, op.count))
    return kept


def forward_flops(ops: list[Op]) -> float:
    """FLOPs of the matmuls and attention of a kernel list (memory kernels count 0)."""
    return sum(op.flops for op in ops if not isinstance(op, Memory))
