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
- tessel: Tessel's runtime (`runtime/stages.py`, `runtime/parallelize.py`) runs the zoo's
  decoder as torch's eager modules, each tensor counted as the autograd op that keeps it
  does (`tessel_layer`, `tessel_stage`): a norm its input and statistics on its (sequence-
  parallel) shard; q/k/v and the MLP's first matmuls one input between them, the norm's
  whole output (its one all-gathered copy under sequence parallelism); SDPA's fused
  kernels q, k and v (keys and values repeated to every query head, gathered over the
  context group), the output (which o_proj reads as a view) and an fp32 log-sum-exp;
  rotary embeddings their cos and sin tables; the MLP its activation's inputs and
  outputs. The first stage keeps the token ids, the last the final norm's, the head's
  input and the fp32 log-softmax of the whole logits. Under LoRA a frozen weight's
  gradient reads nothing, so autograd keeps what only it would (`tessel_block`): no
  linear's input but through its adapter, which adds x A^T; no frozen norm scale's
  normalised input, embedding ids or head input; nothing of the first block until an
  adapter makes a tensor require grad. `plan check` measures it.

Bytes are per micro-batch on one GPU: s tokens of the (context-parallel) sequence, b
sequences, tensor degree t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.adapters import adapted_linears
from cost_models.identity_memo import IdentityMemo
from cost_models.layer_mix import layer_variants
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import Moe, ParallelConfig

FP32 = 4
INT64 = 8


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
    t = parallel.dims.tensor
    seq = math.ceil(model.seq_length / parallel.dims.context)
    sequence_parallel = (parallel.sharding.sequence_parallel
                         or parallel.execution.engine == "torchtitan")
    return LayerShape(
        tokens=seq * parallel.batch.micro_batch_size, hidden=model.hidden_size,
        query=model.num_attention_heads * model.head_dim / t,
        key=model.num_kv_heads * model.head_dim / t, ffn=model.ffn_size / t,
        heads=model.num_attention_heads / t, tensor=t,
        sequence_shards=t if sequence_parallel else 1,
    )


def activation_element_bytes(precision: str) -> int:
    """Bytes of one activation element: 4 in fp32 training, else 2 (bf16/fp16; fp8 runs
    keep bf16 activations between matmuls)."""
    return 4 if precision == "fp32" else 2


_SAVED: IdentityMemo[dict[str, float]] = IdentityMemo(100_000)
"""`saved_per_layer` by model, knobs and score_free: a search asks it of every layout's
stages."""


def saved_per_layer(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """Bytes one layer saves for backward for one micro-batch on one GPU, by kind, when
    the layer is not recomputed whole (`parallel.recomputation.recompute` none or selective).
    `score_free`: the attention kernel never writes the s x s scores (flash, fused)."""
    return dict(_SAVED.get((model,), (parallel, score_free),
                           lambda: _saved_per_layer(model, parallel, score_free)))


def _saved_per_layer(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """`saved_per_layer`, computed."""
    if parallel.execution.engine == "tessel" and tessel_counted(model):
        return tessel_layer(model, parallel)
    block = _megatron if parallel.execution.engine == "megatron" else _torch_eager
    variants = layer_variants(model)
    if len(variants) == 1:
        return block(model, parallel, score_free)
    # Dense and MoE (or windowed and full) blocks mixed: the mean block, kind by kind.
    mean: dict[str, float] = {}
    for variant, share in variants:
        for kind, bytes_ in block(variant, parallel, score_free).items():
            mean[kind] = mean.get(kind, 0.0) + share * bytes_
    return mean


def checkpoint_bytes(model: TransformerConfig, parallel: ParallelConfig) -> float:
    """Bytes a fully recomputed layer keeps: its input, split over t under sequence
    parallelism (TorchTitan always runs tensor parallelism with it)."""
    shape = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    return e * shape.tokens * shape.hidden / shape.sequence_shards


def _megatron(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for part in megatron_sublayers(model, parallel, score_free).values():
        for kind, bytes_ in part.items():
            kinds[kind] = kinds.get(kind, 0.0) + bytes_
    return kinds


def megatron_sublayers(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, dict[str, float]]:
    """What one Megatron-Core layer (of one kind, `layer_mix`) saves for one micro-batch on
    one GPU, by the module that saves it ("attn": the attention sublayer with its fused
    norm; "mlp": the MLP or MoE sublayer with its; "layer": the bias-dropout-adds between
    them), each by kind: what a CUDA graph of one module (--cuda-graph-scope) holds."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    fp8 = parallel.numerics.precision == "fp8"
    linear_input = 1 if fp8 else e  # Transformer Engine keeps the fp8 cast it made
    n, sp = x.tokens, x.sequence_shards
    recomputation = parallel.recomputation
    modules = recomputation.recompute_modules if recomputation.recompute == "selective" else ()
    up = 2 * x.ffn if model.activation == "swiglu" else x.ffn
    # q/k/v and fc1 read the norms' outputs (replayed from the norm inputs when the
    # layernorm module is recomputed); proj reads attention's output, which flash
    # attention keeps in bf16 anyway, so an fp8 copy adds to it.
    norm_output = 0 if "layernorm" in modules else linear_input * n * x.hidden / sp
    attn = {"norm inputs": e * n * x.hidden / sp,
            "linear inputs": norm_output + (linear_input * n * x.query if fp8 else 0),
            "attention": e * n * (2 * x.query + 2 * x.key)}
    mlp = {"norm inputs": e * n * x.hidden / sp, "linear inputs": norm_output,
           "mlp": e * n * up + linear_input * n * x.ffn}
    layer: dict[str, float] = {}
    if model.multi_latent_attention:
        attn["attention"] = _mla_saved(model, parallel, n, e, modules)
    if model.is_moe:
        mlp["mlp"] = _moe_saved(model, parallel, n, e, linear_input, modules)
    if score_free:
        attn["attention"] += FP32 * x.heads * n  # the log-sum-exp of each row
    elif "core_attn" not in modules:
        # Scores and softmax (bf16) and the attention dropout mask (1 byte), Korthikanti
        # et al.'s 5 a s^2 b / t; without dropout the mask is not made.
        mask = 1 if model.attention_dropout > 0 else 0
        attn["scores"] = (2 * e + mask) * x.heads * n * (model.seq_length / parallel.dims.context)
    if "mlp" in modules and not model.is_moe:
        # The dense MLP is replayed from its input, which fc1 saves anyway (an MoE layer's
        # is the moe module's).
        mlp["mlp"] = 0.0
    if model.hidden_dropout > 0:
        layer["dropout masks"] = 2 * n * x.hidden / sp
    return {"attn": attn, "mlp": mlp, "layer": layer}


def _mla_saved(model: TransformerConfig, parallel: ParallelConfig, n: float, e: int,
               modules: tuple[str, ...]) -> float:
    """What Megatron-Core's MLASelfAttention keeps per micro-batch on one rank: the
    query and key/value latents its fused norm-and-up projections read (every tensor rank
    computes them whole), the rotary key, and for attention q and k (qk + rotary width
    per head) and v and the output (v_head_dim per head); `mla_up_proj` recomputation
    frees q, k and v, replayed from the latents in backward (Megatron-Core's
    --recompute-modules mla_up_proj)."""
    t = parallel.dims.tensor
    latents = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_pos_emb_head_dim
    qk, v = model.query_width / t, model.value_width / t
    kept = e * n * latents + e * n * v  # the latents and the core's output
    if "mla_up_proj" not in modules:
        kept += e * n * (2 * qk + v)
    return kept


def _moe_saved(model: TransformerConfig, parallel: ParallelConfig, n: float, e: int,
               linear_input: int, modules: tuple[str, ...]) -> float:
    """What Megatron-Core's MoE layer keeps per micro-batch on one rank: the router's fp32
    scores of its sequence shard, and for each (token, expert) row it computes (its
    shard's rows, gathered over the expert-tensor ranks, at the padded capacity where
    inputs are padded) the grouped GEMMs' inputs and the activation's input; the shared
    expert like a dense MLP. `moe_act` frees the activation's output (fc2's input),
    `shared_experts` the shared expert's, `moe` all of it but the layer's input."""
    if "moe" in modules:
        return 0.0
    sp = parallel.dims.tensor if parallel.sharding.sequence_parallel else 1
    etp = parallel.dims.expert_tensor_degree if sp > 1 else parallel.dims.tensor
    gathered = etp if sp > 1 else 1
    pad = _expert_rows_kept(parallel.moe)
    rows = n / sp * model.moe_top_k * gathered * pad
    f = model.expert_ffn_size / etp
    up = 2 * f if model.activation == "swiglu" else f
    kept = 2 * FP32 * n / sp * (model.num_experts or 0)  # router logits and probabilities
    kept += rows * (linear_input * model.hidden_size + e * up)
    if "moe_act" not in modules:
        kept += linear_input * rows * f
    shared = model.moe_shared_expert_intermediate_size
    if shared and "shared_experts" not in modules:
        width = shared / parallel.dims.tensor
        kept += e * n * (2 * width if model.activation == "swiglu" else width) \
            + linear_input * n * width
    return kept


def _expert_rows_kept(moe: Moe) -> float:
    """The routed rows whose activations the experts keep, over an even share: the padded
    capacity where inputs are padded to it, or HybridEP's rank budget, else 1; under
    --moe-paged-stash, the paged
    buffer, sized at its factor of the expected (unpadded) tokens, or of the padded ones
    for a negative factor (megatron/core/transformer/moe/paged_stash.py,
    allocate_stash_buffers; experts.py stashes the grouped MLP's saved tensors into it)."""
    cap = moe.moe_expert_capacity_factor
    padded = cap if moe.moe_pad_expert_input_to_capacity and cap else 1.0
    # HybridEP's static rank budget sizes the permuted rows' buffers, kept for backward
    # (--moe-expert-rank-capacity-factor).
    padded = max(padded, moe.moe_expert_rank_capacity_factor or 1.0)
    if not moe.moe_paged_stash:
        return padded
    factor = moe.moe_paged_stash_buffer_factor
    return factor if factor >= 0 else -factor * padded


def _torch_eager(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """A block as TorchTitan's (and Tessel's) eager modules run it: Llama's, DeepSeek-V3's
    multi-latent attention, an MoE layer of routed and shared experts."""
    if parallel.recomputation.recompute == "selective":
        return _op_selective(model, parallel, score_free)
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    n = x.tokens
    # Column-parallel matmuls under DTensor save the all-gathered (whole-sequence) input.
    gathered = n * x.hidden
    lse = FP32 * x.heads * n if score_free else 0.0
    compiled = parallel.execution.compile
    norm_saves = 1 if compiled else 2  # eager RMSNorm: input and normalised input
    swiglu = 2 if compiled else 4  # eager: w1 out, silu out, w3 out, their product
    up = swiglu if model.activation == "swiglu" else (1 if compiled else 2)
    # The MLP's second matmul reads the activation's output: the dense width, or an MoE
    # layer's shared experts (the routed experts' are counted below).
    down = (model.moe_shared_expert_intermediate_size or 0) / x.tensor if model.is_moe \
        else x.ffn
    if model.multi_latent_attention:
        # q, k and v (whole heads: the rotary key broadcast to each), the output, and the
        # key/value (and query) latents with their norm's input and output.
        latents = model.kv_lora_rank + model.qk_pos_emb_head_dim + (model.q_lora_rank or 0)
        attention = e * n * (2 * model.query_width + 2 * model.value_width) / x.tensor \
            + norm_saves * e * n * latents + lse
    else:
        # repeat_kv expands keys and values to every query head before SDPA: a copy,
        # unless the rank holds one key head (the reshape is a view) or as many as query
        # heads. wo reads SDPA's output: flash attention lays it out [b, s, heads, d], so
        # the transpose and .contiguous() before wo copy nothing (counted here).
        repeated = x.key if x.key in (x.query / x.heads, x.query) else x.query
        attention = e * n * (2 * x.query + 2 * repeated) + lse
    kinds = {
        "norm inputs": 2 * norm_saves * e * n * x.hidden / x.sequence_shards,
        "linear inputs": 2 * e * gathered + e * n * down,
        "attention": attention,
        "mlp": e * n * down * (up - 1),
    }
    if model.is_moe:
        # TorchTitan's MoE (torchtitan/models/moe/moe.py): each (token, expert) row's input
        # (gathered by index, received by all-to-all under expert parallelism), which the
        # grouped GEMMs keep; the activation's inputs and outputs as for a dense MLP (the
        # last is w2's input); and the routed output the router's scores multiply.
        rows = n / x.sequence_shards * model.moe_top_k
        f = model.expert_ffn_size
        kinds["mlp"] += e * rows * (2 * x.hidden + up * f)
    if not score_free:
        kinds["scores"] = 2 * e * x.heads * n * model.seq_length / parallel.dims.context
    return kinds


def _op_selective(
    model: TransformerConfig, parallel: ParallelConfig, score_free: bool
) -> dict[str, float]:
    """What TorchTitan's op-level selective checkpointing keeps of one block
    (`selective_ac_option = "op"`; the policy in torchtitan/distributed/
    activation_checkpoint.py, the save list `_op_sac_save_list` in each model's
    infra/parallelize.py): the block's input, SDPA's outputs, every reduce-scatter and
    (expert parallelism: DeepSeek-V3's list) all-to-all output, and the output of every
    other `aten.mm` the block runs, the 1st, 3rd, 5th, ...; the rest is replayed in
    backward. The routed experts' grouped GEMMs are not on the list: replayed."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    n, t = x.tokens, x.tensor
    # Output width per token of each mm, in the order the block runs them. Row-parallel
    # outputs (wo, w2) are whole-sequence partial sums of the full width under tensor
    # parallelism, reduce-scattered after.
    if model.multi_latent_attention:
        # wq (or wq_a, wq_b), wkv_a, wkv_b (keys without rotary and values per head), wo.
        queries = [model.q_lora_rank, model.query_width / t] if model.q_lora_rank \
            else [model.query_width / t]
        attention = queries + [
            model.kv_lora_rank + model.qk_pos_emb_head_dim,
            model.num_attention_heads * (model.qk_head_dim + model.v_head_dim) / t,
            x.hidden]
        attention_output = model.value_width / t
    else:
        attention = [x.query, x.key, x.key, x.hidden]  # wq, wk, wv, wo
        attention_output = x.query
    if model.is_moe:
        mlp: list[float] = [model.num_experts or 0]  # the router's gate
        shared = model.moe_shared_expert_intermediate_size
        if shared:
            mlp += [shared / t, shared / t, x.hidden]  # the shared experts' w1, w3, w2
    else:
        mlp = [x.ffn, x.ffn, x.hidden]  # w1, w3, w2
    widths = [("attention", w) for w in attention] + [("mlp", w) for w in mlp]
    kept = {
        "block inputs": e * n * x.hidden / x.sequence_shards,
        "attention": e * n * attention_output + (FP32 * x.heads * n if score_free else 0.0),
        "mlp": 0.0,
    }
    for index, (kind, width) in enumerate(widths):
        if index % 2 == 0:
            kept[kind] += e * n * width
    if t > 1:
        # wo's and w2's reduce-scatter outputs.
        kept["attention"] += e * n * x.hidden / t
        kept["mlp"] += e * n * x.hidden / t
    if model.is_moe and parallel.dims.expert > 1:
        # The dispatch's and the combine's all-to-all outputs: every (token, expert) row
        # this rank receives and gets back (torchtitan/distributed/expert_parallel.py).
        kept["mlp"] += 2 * e * n / x.sequence_shards * model.moe_top_k * x.hidden
    return kept


def tessel_counted(model: TransformerConfig) -> bool:
    """Whether `tessel_layer` counts `model`'s layer: dense decoders. The zoo's MoE layer
    runs every expert densely and its routing keeps tensors not counted here; it is
    priced as TorchTitan's eager layer."""
    return not model.is_moe


def tessel_layer(
    model: TransformerConfig, parallel: ParallelConfig, input_grad: bool = True,
) -> dict[str, float]:
    """Bytes one zoo block saves for backward per micro-batch on one rank of Tessel's
    runtime, by kind, when not recomputed whole (`parallel.recomputation.recompute` none or
    selective). `input_grad`: whether the block's input requires grad (under LoRA, not the
    first block's on the first stage: the embedding is frozen; see `tessel_block`).

    Element sizes: activations at the run's precision (e); fp32 where the code computes in
    fp32 (RMSNorm's normalisation, SDPA's log-sum-exp); LayerNorm's mean and rstd in the
    input's dtype (the CPU kernel's). Selective recomputation (`runtime/stages.py`:
    `checkpoint(_attention_core, q, k, v, mask)`, non-reentrant) saves q, k, v (and the
    mask) as the checkpoint's inputs and o_proj saves the core's output, so it drops only
    what SDPA itself keeps beyond them: the log-sum-exp (and the mask's converted copy).
    """
    return tessel_block(model, parallel, input_grad)[0]


def tessel_block(
    model: TransformerConfig, parallel: ParallelConfig, input_grad: bool = True,
) -> tuple[dict[str, float], bool]:
    """(`tessel_layer`'s bytes by kind, whether the block's output requires grad).

    Autograd saves a tensor only for a gradient it will compute: an op with no input that
    requires grad records nothing, and one whose derivative formulas for its inputs read
    different tensors saves each only where that input requires grad (the generated
    VariableType code guards each save on ``grad_fn->should_compute_output(i)``: pytorch's
    tools/autograd/gen_variable_type.py, `guard_for`). Pre-training and full fine-tuning
    train every weight, so every op of the block records and saves all it reads. Under
    LoRA (`tessel_adapters`; `runtime/adapters.py`) the base is frozen:

    - a base linear saves no input: its ``mm``/``addmm`` saves ``self`` (the input) only
      for ``mat2``'s (the weight's) gradient (tools/autograd/derivatives.yaml: ``mm``,
      ``mat2: mm_mat2_backward(grad, self, ...)``). The adapter's ``lora_a`` saves that
      input instead (A trains), once for the linears that read one tensor (q, k and v;
      gate and up), and ``lora_b`` saves x A^T, tokens x rank, for each adapted linear
      (whole on every tensor rank: A is whole beside a column-parallel linear, and beside
      a row-parallel one its output is a partial sum of the whole shape);
    - RMSNorm's scale multiplication saves the normalised input only for the scale's
      gradient (``mul.Tensor``: ``other: mul_tensor_backward(grad, self, ...)``), so a
      frozen scale drops it; LayerNorm's one joint formula (``native_layer_norm``: input,
      mean, rstd) saves it all whenever its input requires grad;
    - a region whose inputs need no grad saves nothing: the first block's norm, its
      attention (SDPA's joint formula, the rotary tables' multiplications) until an
      adapter makes q, k and v require grad; the MLP's activation likewise.

    Selective recomputation's checkpoint keeps q, k, v and the mask as its inputs
    (torch/utils/checkpoint.py: `_CheckpointFrame.save_inputs`) only as long as something
    the region saved refers to its frame (the unpack hooks of `_checkpoint_hook`): a core
    none of whose inputs requires grad would record nothing, so the runtime does not
    checkpoint it (`runtime.stages.needs_grad`). SDPA's output is kept by the o_proj that
    reads it (its adapter, under LoRA)."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    n, sp, b = x.tokens, x.sequence_shards, parallel.batch.micro_batch_size
    s = n / b  # this rank's positions: the sequence over the context degree
    selective = parallel.recomputation.recompute == "selective"
    adapters = tessel_adapters(model, parallel)
    trained = adapters is None

    def reads(target: str) -> bool:
        """Whether the linears of `target` save their input: a trained weight's
        gradient, or an adapter's A, reads it."""
        return trained or bool((adapters or {}).get(target))

    # Keys and values as SDPA gets them: repeat_kv's copy for every local query head; no
    # copy with as many key/value heads as query heads, nor with one key/value head per
    # tensor rank (the reshape of its expand then merges a size-1 dim: a view).
    local_groups = model.num_kv_heads // parallel.dims.tensor
    kv = x.key if local_groups in (1, model.num_attention_heads // parallel.dims.tensor) \
        else x.query
    # q, k and v require grad where the block's input does or their linears train.
    qkv_grad = input_grad or reads("linear_qkv")
    attention = 0.0
    if qkv_grad:
        # q on this rank's positions; k and v over the whole sequence (gathered over the
        # context group): SDPA's, or the checkpoint's, inputs.
        attention += e * n * x.query + 2 * e * b * s * parallel.dims.context * kv
    if (qkv_grad and not selective) or reads("linear_proj"):
        # SDPA's output: the flash kernel lays it out [b, s, heads, d], so the transpose
        # and reshape before o_proj are views of it and o_proj saves the same storage.
        attention += e * n * x.query
    if qkv_grad and not selective:
        attention += FP32 * n * x.heads  # the log-sum-exp of each query row
    if parallel.dims.context > 1 and qkv_grad:
        # The causal mask offset by the rank's first position [s, s c]: a bool checkpoint
        # input under selective recomputation, else the copy SDPA converts it to.
        attention += (1 if selective else e) * s * s * parallel.dims.context
    # The residual after attention requires grad where the input, attention or o_proj do.
    mid_grad = qkv_grad or reads("linear_proj")
    # The MLP's first matmuls' outputs, and so its activation, require grad likewise.
    up_grad = mid_grad or reads("linear_fc1")
    up = 4 if model.activation == "swiglu" else 2  # silu's input and output, up's output
    # and their product; or GeLU's input and output (fc2's input)
    mlp = e * n * x.ffn * (up - 1) if up_grad else 0.0
    if reads("linear_fc2"):
        mlp += e * n * x.ffn  # the down projection's input
    norm = _tessel_norm(model, n / sp, x.hidden, e, trained)
    kinds = {
        "norms": (input_grad + mid_grad) * norm,
        # q, k, v (and fc1, or gate and up) read one tensor: the norm's output whole on
        # every tensor rank (replicated), or under sequence parallelism the copy
        # PrepareModuleInput all-gathers once per block input.
        "linear inputs": (reads("linear_qkv") + reads("linear_fc1")) * e * n * x.hidden,
        "attention": attention,
        "mlp": mlp,
    }
    if model.position_embedding == "rope":
        # Each block's attention computes its own cos and sin tables [s, head_dim], which
        # the rotation's multiplications keep (q's and k's share them) where q or k
        # requires grad.
        kinds["rotary"] = 2 * e * s * model.head_dim if qkv_grad else 0.0
    if adapters is not None:
        # Each adapted linear's x A^T, which lora_b keeps for B's gradient.
        kinds["adapters"] = sum(adapters.values()) * e * n * parallel.finetuning.lora_rank
    return kinds, up_grad or reads("linear_fc2")


_ADAPTED: IdentityMemo[dict[str, int] | None] = IdentityMemo(4096)


def tessel_adapters(model: TransformerConfig, parallel: ParallelConfig) -> dict[str, int] | None:
    """Under LoRA (or QLoRA) fine-tuning, the adapted linears of one block by LoRA target
    (`cost_models.adapters`' rules: linear_qkv q, k and v; linear_fc1 gate and up, or
    fc1; ...), the targets the plan names only; None where every base weight trains."""
    tuning = parallel.finetuning
    if not tuning.adapters:
        return None
    key = tuning.lora_targets
    return _ADAPTED.get((model,), key, lambda: _adapted_linears(model, key))


def _adapted_linears(model: TransformerConfig, targets: tuple[str, ...]) -> dict[str, int]:
    """How many of a block's linears each target adapts (Tessel's runtime counts dense
    blocks only: `tessel_counted`)."""
    return {target: round(sum(share for share, _ in adapted_linears(model, (target,))))
            for target in targets}


def _tessel_norm(model: TransformerConfig, tokens: float, hidden: float, e: int,
                 scale_trained: bool = True) -> float:
    """What one of the zoo's norms saves on `tokens` tokens when its input requires grad:
    LayerNorm its input, mean and rstd; RMSNorm (`planner/models/transformer.py`, computed
    in fp32) the fp32 input (or its fp32 copy), rstd and, where its scale trains, the
    normalised input cast back, which the scale multiplies. Its output is saved by whoever
    reads it (`tessel_layer`'s linear inputs)."""
    if model.norm == "layernorm":
        return e * tokens * hidden + 2 * e * tokens
    kept = FP32 * tokens * hidden + FP32 * tokens
    return kept + e * tokens * hidden if scale_trained else kept


def tessel_stage(
    model: TransformerConfig, parallel: ParallelConfig, layers: int, first: bool, last: bool,
) -> dict[str, float]:
    """Bytes one rank of a pipeline chunk of `layers` blocks saves for backward per
    micro-batch in Tessel's runtime, by kind: the blocks (`tessel_layer`, or under full
    recomputation each block's input, which `checkpoint_wrapper` keeps), and on the first
    chunk (`first`) what the embeddings keep, on the last (`last`) the final norm, the
    head and the loss (`runtime/training_loop.py` `lm_loss`).

    Under LoRA the embeddings, the final norm and the head are frozen: the first chunk's
    first block gets an input that requires no grad (`tessel_block`), the embeddings keep
    no indices (``embedding``'s only derivative is the weight's), the head no input (a
    frozen ``mm``'s), the final norm no normalised input. A later chunk's input requires
    grad (`torch.distributed.pipelining` receives it so)."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    n, sp = x.tokens, x.sequence_shards
    trained = not parallel.finetuning.adapters
    # The chunk's input requires grad: a received activation, or a trained embedding's.
    grad = trained or not first
    kinds: dict[str, float] = {}
    for index in range(layers):
        block, grad_out = tessel_block(model, parallel, grad)
        if grad_out == grad:  # every later block alike
            block = {kind: (layers - index) * bytes_ for kind, bytes_ in block.items()}
        for kind, bytes_ in block.items():
            kinds[kind] = kinds.get(kind, 0.0) + bytes_
        if grad_out == grad:
            break
        grad = grad_out
    if parallel.recomputation.recompute == "full":
        # Non-reentrant checkpointing saves the block's input (its sequence shard under
        # sequence parallelism) outside its own hooks, whatever it requires, and hides
        # what the block saves (the loop above still says what reaches the head).
        kinds = {"checkpointed inputs": layers * e * n * x.hidden / sp}
    if first:
        # The embedding keeps its int64 indices: the token ids (whole on every tensor
        # rank) and, for learned positions, the positions' ids; a frozen one none.
        positions = n / parallel.batch.micro_batch_size if model.position_embedding == "learned" \
            else 0
        kinds["embedding"] = INT64 * (n + positions) if trained else 0.0
    if last:
        # The final norm on its shard; the head's input whole (gathered under sequence
        # parallelism); the loss the fp32 log-softmax of the whole logits (gathered over
        # the tensor group), the int64 targets and the scalar total weight: each where
        # what it reads requires grad.
        kinds["head"] = (_tessel_norm(model, n / sp, x.hidden, e, trained) if grad else 0.0) \
            + (e * n * x.hidden if trained else 0.0)
        kinds["loss"] = FP32 * n * model.vocab_size + INT64 * n + FP32 if grad else 0.0
    return kinds


def tessel_stage_bytes(
    model: TransformerConfig, parallel: ParallelConfig, layers: int, first: bool, last: bool,
) -> int:
    """`tessel_stage`'s total: what one rank saves per micro-batch in the chunk."""
    return round(sum(tessel_stage(model, parallel, layers, first, last).values()))
