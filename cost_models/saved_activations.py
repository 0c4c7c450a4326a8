"""What one transformer layer keeps for its backward, by kind, as each engine runs it.

Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", MLSys
2023, Sec. 4) count a GPT layer's saved tensors as s b h (34 + 5 a s / h) bytes; this module
counts the same tensors one by one, so that a Llama layer (SwiGLU's three matrices, grouped
keys and values, no dropout), an fp8 layer and another engine's layer are each counted by
what their kernels save rather than by GPT's total:

- megatron: Megatron-Core with Transformer Engine. A linear saves its input (under sequence
  parallelism its local shard: it gathers again in backward; fp8 casts are saved in 1 byte),
  flash attention saves q, k, v, its output and the fp32 log-sum-exp (FlashAttention-2,
  Dao 2023), local/unfused attention the scores, softmax and dropout mask instead of the
  log-sum-exp; a norm saves its input; dropout saves a 1-byte mask where its rate is not 0
  (`torch.nn.functional.dropout` returns its input at p = 0). Selective recomputation
  drops what the modules it replays made (`--recompute-modules`, Megatron-Core's
  `transformer_block.py` / `transformer_layer.py`); full keeps the layer's input.
- torchtitan: TorchTitan's Llama (torchtitan/models/llama3/model.py): DTensor tensor
  parallelism saves the all-gathered input of each column-parallel matmul (no gather again
  in backward), keys and values repeated to every query head before SDPA (`repeat_kv`),
  the attention output made contiguous before `wo`, SiLU and the gate's product saving
  both operands, an eager RMSNorm its input and normalised input. Op-level selective
  checkpointing (torchtitan/distributed/activation_checkpoint.py, `_save_list`) keeps the
  block's input, SDPA's outputs, reduce-scatter outputs and every other matmul output (the
  1st, 3rd, 5th and 7th of wq, wk, wv, wo, w1, w3, w2), and replays the rest.
  `torch.compile` fuses the elementwise chains, so a norm keeps only its input and SwiGLU
  only the two matmul outputs it reads.
- tessel: Tessel's runtime runs the zoo's decoder as torch's eager modules; it is priced
  as TorchTitan's eager layer without tensor-parallel gathers (`plan check` measures it).

Bytes are per micro-batch on one GPU: s tokens of the (context-parallel) sequence, b
sequences, tensor degree t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.models.config import TransformerConfig
from planner.parallel import ParallelConfig

FP32 = 4


@dataclass(frozen=True)
class LayerShape:
    """Element counts of one layer's tensors on one GPU for one micro-batch."""

    tokens: float
    """s x b: tokens of one micro-batch on this rank's share of the sequence."""
    hidden: float
    """h: the residual stream's width."""
    query: float
    """Width of the queries (and attention output) on this tensor rank: a d / t."""
    key: float
    """Width of the keys (and of the values) on this tensor rank: g d / t."""
    ffn: float
    """Width of the MLP's inner activation on this tensor rank: f / t."""
    heads: float
    """Query heads on this tensor rank: a / t."""
    tensor: int
    """Tensor-parallel degree."""
    sequence_shards: int
    """t with sequence parallelism (norms, dropouts and residuals split over t), else 1."""


def layer_shape(model: TransformerConfig, parallel: ParallelConfig) -> LayerShape:
    """The shapes of `model`'s layer as `parallel` splits it: the sequence over the context
    degree, heads and the MLP over the tensor degree."""
    t = parallel.tensor
    seq = math.ceil(model.seq_length / parallel.context)
    sequence_parallel = parallel.sequence_parallel or (parallel.engine == "torchtitan")
    return LayerShape(
        tokens=seq * parallel.micro_batch_size, hidden=model.hidden_size,
        query=model.num_attention_heads * model.head_dim / t,
        key=model.num_kv_heads * model.head_dim / t, ffn=model.ffn_size / t,
        heads=model.num_attention_heads / t, tensor=t,
        sequence_shards=t if sequence_parallel else 1,
    )


def activation_element_bytes(precision: str) -> int:
    """Bytes of one activation element: 4 in fp32 training, else 2 (bf16/fp16; fp8 runs
    keep bf16 activations between matmuls)."""
    return 4 if precision == "fp32" else 2


def saved_per_layer(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """Bytes one layer saves for backward for one micro-batch on one GPU, by kind, when
    the layer is not recomputed whole (`parallel.recompute` none or selective).
    `score_free`: the attention kernel never writes the s x s scores (flash, fused)."""
    if parallel.engine == "megatron":
        return _megatron(model, parallel, score_free)
    return _torch_eager(model, parallel, score_free)


def checkpoint_bytes(model: TransformerConfig, parallel: ParallelConfig) -> float:
    """Bytes a fully recomputed layer keeps: its input, split over t under sequence
    parallelism (TorchTitan always runs tensor parallelism with it)."""
    shape = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.precision)
    return e * shape.tokens * shape.hidden / shape.sequence_shards


def _megatron(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.precision)
    fp8 = parallel.precision == "fp8"
    linear_input = 1 if fp8 else e  # Transformer Engine keeps the fp8 cast it made
    n, sp = x.tokens, x.sequence_shards
    modules = parallel.recompute_modules if parallel.recompute == "selective" else ()
    up = 2 * x.ffn if model.activation == "swiglu" else x.ffn
    kinds: dict[str, float] = {
        "norm inputs": 2 * e * n * x.hidden / sp,
        # q/k/v and fc1 read the norms' outputs (replayed from the norm inputs when the
        # layernorm module is recomputed); proj reads attention's output, which flash
        # attention keeps in bf16 anyway, so an fp8 copy adds to it.
        "linear inputs": (0 if "layernorm" in modules else 2 * linear_input * n * x.hidden / sp)
        + (linear_input * n * x.query if fp8 else 0),
        "attention": e * n * (2 * x.query + 2 * x.key),
        "mlp": e * n * up + linear_input * n * x.ffn,
    }
    if score_free:
        kinds["attention"] += FP32 * x.heads * n  # the log-sum-exp of each row
    elif "core_attn" not in modules:
        # Scores and softmax (bf16) and the attention dropout mask (1 byte), Korthikanti
        # et al.'s 5 a s^2 b / t; without dropout the mask is not made.
        mask = 1 if model.attention_dropout > 0 else 0
        kinds["scores"] = (2 * e + mask) * x.heads * n * (model.seq_length / parallel.context)
    if "mlp" in modules:
        # The MLP is replayed from its input, which fc1 saves anyway.
        kinds["mlp"] = 0.0
    if model.hidden_dropout > 0:
        kinds["dropout masks"] = 2 * n * x.hidden / sp
    return kinds


def _torch_eager(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """A Llama-form block as TorchTitan's (and Tessel's) eager modules run it."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.precision)
    n, t = x.tokens, x.tensor
    # Column-parallel matmuls under DTensor save the all-gathered (whole-sequence) input.
    gathered = n * x.hidden
    lse = FP32 * x.heads * n if score_free else 0.0
    if parallel.recompute == "selective":
        # Op-level selective checkpointing: the block's input, SDPA's outputs and the 1st,
        # 3rd, 5th and 7th matmul outputs (wq, wv, w1, w2; w2's is a whole-sequence partial
        # sum under tensor parallelism, and its reduce-scatter output is kept too).
        w2 = e * n * x.hidden + (e * n * x.hidden / t if t > 1 else 0)
        kept = {
            "block inputs": e * n * x.hidden / x.sequence_shards,
            "attention": e * n * (x.query + x.key + x.query) + lse,
            "mlp": e * n * x.ffn + w2,
        }
        return kept
    norm_saves = 1 if parallel.compile else 2  # eager RMSNorm: input and normalised input
    swiglu = 2 if parallel.compile else 4  # eager: w1 out, silu out, w3 out, their product
    up = swiglu if model.activation == "swiglu" else (1 if parallel.compile else 2)
    kinds = {
        "norm inputs": 2 * norm_saves * e * n * x.hidden / x.sequence_shards,
        "linear inputs": 2 * e * gathered + e * n * x.query + e * n * x.ffn,
        # repeat_kv expands keys and values to every query head before SDPA.
        "attention": e * n * 3 * x.query + e * n * x.query + lse,
        "mlp": e * n * x.ffn * (up - 1),
    }
    if not score_free:
        kinds["scores"] = 2 * e * x.heads * n * model.seq_length / parallel.context
    return kinds
