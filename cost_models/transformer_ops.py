"""The kernels of one transformer layer on one GPU, as Megatron-LM runs them (where
TorchTitan's differ: `cost_models.torchtitan_kernels`).

A layer is a list of matmuls (with their m, n, k on one tensor-parallel rank), fused
attention, and memory-bound kernels (norms, activations, residual adds, softmax) with the
bytes they move. Shapes follow Megatron-LM's tensor parallelism (Shoeybi et al. 2019):
the q/k/v and MLP input projections are split by output columns, the attention output
and MLP output projections by input rows, attention by heads. Mixture-of-experts layers
run each token through `moe_top_k` experts (Fedus et al. 2021; Jiang et al. 2024).
Megatron-LM runs Transformer Engine's fused norm, activation and cross-entropy kernels.

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
# recipes); row-wise scaling (torchao's "rowwise" recipe, Float8LinearConfig.from_recipe_name)
# casts the 16-bit input twice, scaled along rows for the forward matmul and along columns
# for the weight gradient's, each reading 16 bits and writing 8 with its amax reduction fused
# into the cast (torch.compile, which TorchTitan's float8 runs under). Weights are cast once
# per step, not per micro-batch, and are not counted.
FP8_CAST_BYTES = {"delayed": 3, "tensorwise": 5, "mxfp8": 4, "blockwise": 4, "rowwise": 6}
FP8_EXEMPT = ("router", "q up", "kv up")
"""Projections with no cast of their own under fp8: the router runs in fp32 outside
Transformer Engine's fp8 autocast (Megatron-Core's TopKRouter, --moe-router-dtype), and
MLA's up projections cast inside their fused norm."""


@dataclass(frozen=True)
class Matmul:
    """A (batched) matmul: `count` products of (m x k) @ (k x n)."""

    name: str
    m: float
    n: float
    k: float
    count: float = 1
    launches: float = 1
    """Kernels the products run as: 1 batched or grouped, `count` one after another."""

    @property
    def flops(self) -> float:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Attention:
    """Fused (flash) attention over `heads` heads of one rank."""

    name: str
    flops: float
    """FLOPs of QK^T and AV over the full (unmasked) score matrix; a causal kernel skips the
    masked half (`causal`), which `kernel_time` prices and `model_flops` counts."""
    causal: bool = True


@dataclass(frozen=True)
class Memory:
    """A memory-bound kernel: its time is the bytes it reads and writes."""

    name: str
    bytes: float
    launches: float = 1
    """Kernels the bytes are moved by (one per expert without grouped GEMMs)."""


Op = Matmul | Attention | Memory


def layer_ops(
    config: TransformerConfig,
    micro_batch: int,
    seq: int,
    tensor: int,
    sequence_parallel: bool,
    attention: str = "flash",
    context: int = 1,
    experts: ExpertSplit | None = None,
) -> list[Op]:
    """Forward kernels of one transformer block on one rank, for `seq` tokens per
    sequence (the rank's share under context parallelism: its queries attend to all
    `seq x context` keys, gathered around the context group).

    `attention` is the backend (`ParallelConfig.attention_backend`, resolved): flash and
    fused run one fused kernel; local and unfused write the scores, run softmax and
    dropout over them and multiply again. Both of the latter fuse scale, mask and softmax
    into one kernel (Megatron's FusedScaleMaskSoftmax, Transformer Engine's
    scaled-masked-softmax), so they are priced alike. `experts`: how a mixture-of-experts
    MLP is split (default: over the tensor ranks, no expert parallelism)."""
    h = config.hidden_size
    tokens = micro_batch * seq
    # Norms, dropout and residual adds run on the whole hidden state, or on 1/t of the
    # tokens with sequence parallelism.
    norm_tokens = tokens / tensor if sequence_parallel else tokens
    hidden_bytes = norm_tokens * h * ACTIVATION_BYTES
    ops: list[Op] = [Memory("input norm", 2 * hidden_bytes)]
    ops += _attention_ops(config, micro_batch, seq, tensor, attention, context)
    ops += [
        Memory("residual add", 3 * hidden_bytes),
        Memory("post-attention norm", 2 * hidden_bytes),
    ]
    split = experts or ExpertSplit(tensor, tensor if sequence_parallel else 1)
    ops += _mlp_ops(config, tokens, tensor, split)
    ops.append(Memory("residual add", 3 * hidden_bytes))
    return ops


@dataclass(frozen=True)
class ExpertSplit:
    """How one rank runs a mixture-of-experts MLP (Megatron-Core's parallel folding,
    Liu et al. 2025, arXiv 2504.14960): each rank routes its sequence shard's tokens to
    the ranks holding their experts; `expert` ranks hold the experts between them, each
    expert split `expert_tensor` ways over ranks that gather their tokens."""

    expert_tensor: int = 1
    """Tensor degree inside each expert."""
    sequence_shards: int = 1
    """Ranks the tensor group's tokens are split over before routing: t under sequence
    parallelism (which Megatron-LM requires with experts and t > 1), else 1."""
    expert: int = 1
    """Expert-parallel degree: each rank holds num_experts / expert experts."""
    load: float = 1.0
    """Tokens of the busiest rank over an even share (`cost_models.moe_dispatch`)."""
    grouped_gemm: bool = True
    """One grouped GEMM per projection over the rank's experts; False: each expert's GEMMs
    and activation run as kernels of their own (`Moe.moe_grouped_gemm`)."""

    @property
    def routed_share(self) -> float:
        """(token, expert) rows one rank computes per token of its tensor group, over
        top-k: its shard's, times the expert-tensor ranks whose tokens it gathers."""
        gathered = self.expert_tensor if self.sequence_shards > 1 else 1
        return gathered / self.sequence_shards * self.load


def _attention_ops(config: TransformerConfig, micro_batch: int, seq: int, tensor: int,
                   attention: str, context: int) -> list[Op]:
    h = config.hidden_size
    heads, kv_heads = config.num_attention_heads / tensor, config.num_kv_heads / tensor
    tokens = micro_batch * seq
    keys = seq * context
    if config.window_size is not None:
        # Sliding-window attention computes the band of `window` keys left of each query
        # (FlashAttention's window_size; Megatron-LM's --window-size): dense, not causal.
        keys = min(keys, config.window_size + 1)
    if config.multi_latent_attention:
        qk = config.qk_head_dim + config.qk_pos_emb_head_dim
        v = config.v_head_dim
        # Megatron-Core's MLASelfAttention: the down projections are duplicated on every
        # tensor rank (their outputs are small latents); the up projections split heads.
        if config.q_lora_rank is None:
            ops: list[Op] = [Matmul("q", tokens, heads * qk, h)]
        else:
            # The latents' norms run inside the up projections (Megatron-Core's MLA spec:
            # TELayerNormColumnParallelLinear), which also cast to fp8 there.
            ops = [Matmul("q down", tokens, config.q_lora_rank, h),
                   Matmul("q up", tokens, heads * qk, config.q_lora_rank)]
        kv_latent = config.kv_lora_rank
        ops += [Matmul("kv down", tokens, kv_latent + config.qk_pos_emb_head_dim, h),
                Matmul("kv up", tokens, heads * (config.qk_head_dim + v), kv_latent),
                # The shared rotary key is broadcast to every head and joined to q and k.
                Memory("rotary join", 4 * tokens * heads * qk * ACTIVATION_BYTES)]
        qk_width, v_width = qk, v
    else:
        d = config.head_dim
        ops = [Matmul("qkv", tokens, (heads + 2 * kv_heads) * d, h)]
        if config.qk_layernorm:
            ops.append(Memory("qk norm", 2 * tokens * (heads + kv_heads) * d * ACTIVATION_BYTES))
        qk_width = v_width = d
    scores = micro_batch * heads * seq * keys
    causal = config.window_size is None
    if attention in SCORE_FREE_ATTENTION:
        ops.append(Attention("attention", 2 * scores * (qk_width + v_width), causal))
    else:
        ops += [
            Matmul("scores", seq, keys, qk_width, count=micro_batch * heads),
            # Megatron's fused scale-mask-softmax reads and writes the scores once; dropout
            # on the probabilities reads them again and writes them with a mask.
            Memory("softmax", 2 * scores * ACTIVATION_BYTES + 3 * scores * ACTIVATION_BYTES),
            Matmul("context", seq, v_width, keys, count=micro_batch * heads),
        ]
    ops.append(Matmul("attention output", tokens, h, heads * v_width))
    return ops


def _mlp_ops(config: TransformerConfig, tokens: float, tensor: int,
             split: ExpertSplit) -> list[Op]:
    h = config.hidden_size
    inputs = 2 if config.activation == "swiglu" else 1
    if config.num_experts is None:
        return _dense_mlp_ops("mlp", tokens, config.ffn_size / tensor, h, inputs)
    experts = config.num_experts
    local = experts / split.expert
    routed = tokens * config.moe_top_k * split.routed_share
    f = config.expert_ffn_size / split.expert_tensor
    routing = tokens / split.sequence_shards
    launches = 1 if split.grouped_gemm else local
    ops: list[Op] = [
        Matmul("router", routing, experts, h),
        # Scores, top-k and the permutation of each (token, expert) row to its expert's
        # block and back (Megatron-Core's moe_utils.permute / unpermute): the routed rows
        # read and written once each way.
        Memory("router top-k", 3 * routing * experts * 4),
        Memory("permute", 2 * 2 * routed * h * ACTIVATION_BYTES),
        # One grouped GEMM over the rank's experts: each product is as small as one
        # expert's share of the tokens (what sets its efficiency). Without grouped GEMMs
        # Megatron-Core's SequentialMLP runs each local expert's MLP in turn
        # (megatron/core/transformer/moe/experts.py: a loop over local_experts), so each
        # expert's GEMMs and activation are kernels of their own.
        Matmul("expert input", routed / local, inputs * f, h, count=local, launches=launches),
        Memory("expert activation", (inputs + 1) * routed * f * ACTIVATION_BYTES,
               launches=launches),
        Matmul("expert output", routed / local, h, f, count=local, launches=launches),
    ]
    if config.moe_shared_expert_intermediate_size:
        ops += _dense_mlp_ops("shared expert", tokens,
                              config.moe_shared_expert_intermediate_size / tensor, h, inputs)
    return ops


def _dense_mlp_ops(name: str, tokens: float, f: float, h: int, inputs: int) -> list[Op]:
    return [
        Matmul(f"{name} input", tokens, inputs * f, h),
        # Bias + GeLU (or SiLU x gate) reads the wide activation(s) and writes one.
        Memory(f"{name} activation", (inputs + 1) * tokens * f * ACTIVATION_BYTES),
        Matmul(f"{name} output", tokens, h, f),
    ]


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


def mtp_ops(config: TransformerConfig, micro_batch: int, seq: int, tensor: int,
            experts: ExpertSplit | None = None) -> list[Op]:
    """Forward kernels of one multi-token-prediction layer on the last stage (DeepSeek-V3
    report Sec. 2.2; Megatron-Core's MultiTokenPredictionLayer): the two input norms, the
    2h -> h projection of their concatenation, one block of the last layer's kind, and
    the shared output layer and loss again."""
    h = config.hidden_size
    tokens = micro_batch * seq
    block = config.for_layer(config.mtp_kind())
    return [
        Memory("mtp norms", 4 * tokens * h * ACTIVATION_BYTES),
        Matmul("mtp projection", tokens, h / tensor, 2 * h),
        *layer_ops(block, micro_batch, seq, tensor, False, experts=experts),
        *head_ops(config, micro_batch, seq, tensor),
    ]


def fp8_casts(ops: list[Op], recipe: str) -> list[Op]:
    """The casts to fp8 that `ops`' projection matmuls need under `recipe`: one memory
    kernel per matmul over its activation input (backward: the gradient's cast, priced
    as twice the bytes like every memory kernel)."""
    per_element = FP8_CAST_BYTES[recipe]
    return [Memory(f"{op.name} fp8 cast", op.m * op.k * op.count * per_element, op.launches)
            for op in projections(ops) if op.name not in FP8_EXEMPT]


def projections(ops: list[Op]) -> list[Matmul]:
    """The matmuls of `ops` with a weight: not attention's scores and context products,
    which multiply two activations (and stay in 16 bits under fp8)."""
    return [op for op in ops if isinstance(op, Matmul) and op.name not in ("scores", "context")]


# The kernels each of Megatron-LM's --recompute-modules replays in backward (Megatron-Core
# transformer_layer.py / multi_latent_attention.py / moe_layer.py: each module's forward
# is checkpointed on its own), by the names `layer_ops` gives them; their fp8 casts too.
MODULE_KERNELS = {
    "layernorm": ("input norm", "post-attention norm"),
    "mla_up_proj": ("q up", "kv up", "rotary join"),
    "mlp": ("mlp input", "mlp activation", "mlp output"),
    "moe_act": ("expert activation",),
    "moe": ("router", "router top-k", "permute", "expert input", "expert activation",
            "expert output"),
    "shared_experts": ("shared expert input", "shared expert activation",
                       "shared expert output"),
}


def recomputed_kernels(ops: list[Op], modules: tuple[str, ...]) -> list[Op]:
    """The kernels of `ops` that selective recomputation of `modules` replays
    (`core_attn`: `attention_kernels`; the others by `MODULE_KERNELS`)."""
    names = {name for module in modules for name in MODULE_KERNELS.get(module, ())}
    names |= {f"{name} fp8 cast" for name in names}
    kept = attention_kernels(ops) if "core_attn" in modules else []
    return kept + [op for op in ops if op.name in names]


def selective_kernels(config: TransformerConfig, ops: list[Op], engine: str,
                      modules: tuple[str, ...]) -> list[Op]:
    """What selective recomputation replays of a layer's `ops` under `engine`:
    TorchTitan's op-level checkpointing every other matmul and the memory-bound kernels;
    Megatron-LM the --recompute-modules `modules`; Tessel's runtime the attention core."""
    if engine == "torchtitan":
        return every_other_matmul_replayed(config, ops)
    if engine == "tessel":
        return attention_kernels(ops)
    return recomputed_kernels(ops, modules)


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
    replayed = {"qkv": kv / (heads + 2 * kv), "attention output": 1.0}
    for mlp in ("mlp", "shared expert", "expert"):
        replayed |= {f"{mlp} input": 0.5 if swiglu else 0.0,
                     f"{mlp} output": 0.0 if swiglu else 1.0}
    kept: list[Op] = []
    for op in ops:
        if isinstance(op, Memory):
            kept.append(op)
        elif isinstance(op, Matmul) and replayed.get(op.name, 0.0) > 0:
            kept.append(Matmul(op.name, op.m, op.n * replayed[op.name], op.k, op.count,
                               op.launches))
    return kept


def forward_flops(ops: list[Op]) -> float:
    """FLOPs of the matmuls and attention of a kernel list (memory kernels count 0)."""
    return sum(op.flops for op in ops if not isinstance(op, Memory))

