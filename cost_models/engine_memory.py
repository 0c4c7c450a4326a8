"""The memory rules that differ by engine: model state, working buffers at the peak, and
what the caching allocator reserves beyond what is allocated.

- megatron (Megatron-Core, `megatron/core/distributed/param_and_grad_buffer.py`,
  `megatron/core/optimizer/distrib_optimizer.py`): 16-bit weights and a contiguous
  main-gradient buffer (fp32 unless `--main-grads-dtype bf16` / `--grad-reduce-in-bf16`)
  on every data-parallel rank; the distributed optimizer shards the fp32 main weights and
  Adam's moments (fp32, or bf16 with the precision-aware optimizer's `--exp-avg-dtype`)
  over the data-parallel (x context) group. Transformer Engine's fp8 linears cache the
  weight's fp8 cast and its transpose across micro-batches (1 + 1 bytes), or with
  `--fp8-param-gather` keep only those (`transformer_engine/pytorch/module/base.py`).
- torchtitan (FSDP2, `torch/distributed/fsdp/_fully_shard`; TorchTitan's
  `parallelize.py`): fp32 parameters, gradients and moments sharded over the data group
  (mixed_precision_param bf16, reduce fp32, or bf16 with `main_grads_dtype` bf16 as
  torchtune's bf16 model reduces). Gathered bf16 weights live per block from its forward
  to the next block's, two blocks at a time (FSDP2 prefetches the next), and the root's
  (embedding, norm, output) until backward; resharded always, the ends are units of their
  own, gathered only beside their neighbouring block; with `reshard_after_forward` off
  (the default under pipeline parallelism) a stage's whole weights stay gathered, and the
  pipeline keeps unsharded gradients across micro-batches (`PipelineStage` turns gradient
  sync and reshard-after-backward off until the last micro-batch).
- tessel: ZeRO's accounting of the runtime's own state (`cost_models.memory`).

Reserved memory: the caching allocator (PyTorch's "CUDA memory management" notes) keeps
freed blocks for reuse and splits large ones; the blocks it cannot hand out again make
`reserved` exceed `allocated`. That share is fitted per engine on the runs of
`published_memory.csv` that logged both or reserved alone
(`benchmarks/memory_accuracy.py` prints the fit).
"""

from __future__ import annotations

from functools import lru_cache

from cost_models import memory
from cost_models.adapters import NF4_BYTES, layer_split
from cost_models.eight_bit_adam import STATE_BYTES, eight_bit
from cost_models.saved_activations import activation_element_bytes, layer_shape
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig

# Reserved over allocated at the peak, less one, by engine. megatron: Megatron-Bridge's
# Moonlight-16B run logged 36.6 GiB allocated and about 40 reserved (1.093); torchtitan:
# TorchTitan's Llama 3.1 8B runs' reserved over their predicted allocated, the mean of
# 1.182, 1.105 and 1.124 (benchmarks/memory_accuracy.py prints the fit); tessel runs
# torch's allocator as TorchTitan does.
FRAGMENTATION = {"megatron": 0.093, "torchtitan": 0.137, "tessel": 0.137}

# Memory outside the caching allocator: the CUDA context with its loaded kernels (about
# 0.5 GiB on Hopper with cuBLAS and Transformer Engine) and NCCL's buffers (NCCL_BUFFSIZE,
# 4 MiB per channel and peer, for the few groups a rank joins). An estimate.
NON_ALLOCATOR_BYTES = 1.0 * 2**30


def _moment_bytes(parallel: ParallelConfig) -> float:
    """Adam's two moments, per parameter."""
    if eight_bit(parallel):
        return STATE_BYTES
    return 2 * (2 if parallel.numerics.exp_avg_dtype == "bf16" else 4)


def model_state(
    params: float, block_params: float, end_params: float, parallel: ParallelConfig,
    expert_params: float = 0.0, end_unit: float | None = None,
) -> tuple[memory.ModelStateBytes, float]:
    """(state, gathered): the weights, gradients and optimizer state one GPU holds for
    `params` parameters (its tensor shard of a stage) and `expert_params` of routed
    experts (its expert shard), and the bytes of gathered weights and unsharded gradients
    it holds at the peak beyond them. `block_params`: one layer's parameters on this GPU;
    `end_params`: the embedding's and head's on this stage, the larger of them `end_unit`
    (None: one unit holds them all). Expert state is sharded over
    the expert-data-parallel ranks, as Megatron-Core's distributed optimizer (and FSDP2
    over TorchTitan's expert mesh) shard it; the rest over the data x context ranks."""
    dense, gathered = _model_state(params, block_params, end_params, parallel,
                                   end_params if end_unit is None else end_unit)
    if not expert_params:
        return dense, gathered
    # Each kind of expert state the engine shards over data x context ranks is sharded
    # over the expert-data ranks instead: whole on one rank, divided by them.
    sharded, _ = _model_state(expert_params, 0.0, 0.0, parallel, 0.0)
    whole, _ = _model_state(expert_params, 0.0, 0.0, _unsharded(parallel), 0.0)
    # Tessel's runtime keeps experts out of ZeRO (`runtime/experts.py`): whole per rank.
    edp = 1 if parallel.execution.engine == "tessel" else max(parallel.dims.expert_data, 1)
    kinds = {kind: getattr(whole, kind) / edp
             if getattr(sharded, kind) < getattr(whole, kind) else getattr(whole, kind)
             for kind in ("weights", "gradients", "optimizer")}
    return memory.ModelStateBytes(
        weights=dense.weights + kinds["weights"],
        gradients=dense.gradients + kinds["gradients"],
        optimizer=dense.optimizer + kinds["optimizer"],
        experts=(kinds["weights"], kinds["gradients"], kinds["optimizer"])), gathered


def adapter_state(
    model: TransformerConfig, params: float, layers: int, parallel: ParallelConfig,
    expert_params: float = 0.0,
) -> tuple[memory.ModelStateBytes, float]:
    """`model_state` of a LoRA or QLoRA stage (`cost_models.adapters`): its `layers`
    layers' adapters trained under the engine's rules, and the frozen base (`params` and
    `expert_params` of it on this GPU) held as 16-bit weights, or under QLoRA the adapted
    linears' weights in NF4, with no gradient and no optimizer state; ZeRO-3 (FSDP2)
    shards the frozen base too."""
    adapted, adapters, expert_adapted, expert_adapters = layer_split(model, parallel)
    trained, gathered = model_state(layers * adapters, 0.0, 0.0, parallel,
                                    layers * expert_adapters)
    base = activation_element_bytes(parallel.numerics.precision)
    weights = base * (params + expert_params)
    if parallel.finetuning.finetune == "qlora":
        quantized = layers * (adapted + expert_adapted)
        weights -= (base - NF4_BYTES) * quantized
        # Each linear's base is dequantized to 16 bits for its matmul, one at a time: the
        # largest, an MLP projection, is about a third of a layer's adapted weights.
        gathered += base * max(adapted, expert_adapted) / 3
    if parallel.sharding.zero_stage == 3:
        weights /= parallel.dims.data * parallel.dims.context
    return memory.ModelStateBytes(
        weights=weights + trained.weights, gradients=trained.gradients,
        optimizer=trained.optimizer, experts=trained.experts, frozen=weights), gathered


@lru_cache(maxsize=4096)
def _unsharded(parallel: ParallelConfig) -> ParallelConfig:
    """`parallel` on one data and context rank: the state nothing shards."""
    return parallel.but(data=1, context=1)


def _model_state(
    params: float, block_params: float, end_params: float, parallel: ParallelConfig,
    end_unit: float,
) -> tuple[memory.ModelStateBytes, float]:
    """`model_state` of parameters sharded over the data x context ranks."""
    shards = parallel.dims.data * parallel.dims.context
    if parallel.execution.engine == "torchtitan" and parallel.sharding.zero_stage >= 1:
        weight = 1 if parallel.numerics.fp8_param_gather else activation_element_bytes(
            parallel.numerics.precision)
        # FSDP2's reduce dtype (MixedPrecisionPolicy.reduce_dtype): fp32 as TorchTitan
        # sets it, or the 16-bit gradients themselves where nothing upcasts them
        # (torchtune's bf16 model under FSDP2 without a mixed-precision policy).
        reduced = memory.gradient_element_bytes(parallel.numerics.main_grads_dtype)
        state = memory.ModelStateBytes(weights=4 * params / shards,
                                       gradients=reduced * params / shards,
                                       optimizer=_moment_bytes(parallel) * params / shards)
        pipelined = parallel.dims.pipeline > 1
        policy = parallel.sharding.fsdp_reshard_after_forward
        keep = policy == "never" or (policy == "default" and pipelined)
        if keep:
            gathered = weight * params
        elif policy == "always":
            # Every unit resharded after its forward, the ends' too (TorchTitan's
            # embedding and [norm, output] units; torchtune's custom_sharded_layers): two
            # blocks gathered (FSDP2 prefetches the next), or an end beside its neighbour.
            gathered = weight * max(2 * block_params, block_params + end_unit)
        else:
            # The root's ends stay gathered from forward to backward.
            gathered = weight * (2 * block_params + end_params)
        # A block's bf16 gradient and its reduce-scatter input; under a pipeline the
        # whole stage's gradients, accumulated unsharded over the micro-batches.
        gradients = reduced * params if pipelined else (2 + reduced) * block_params
        return state, gathered + gradients
    if parallel.execution.engine == "megatron" and parallel.sharding.zero_stage <= 1:
        fp32 = parallel.numerics.precision == "fp32"
        weight = 4 if fp32 else 2
        if parallel.numerics.precision == "fp8":
            weight = 2 if parallel.numerics.fp8_param_gather else 2 + 2
        grads = 4 if fp32 else memory.gradient_element_bytes(parallel.numerics.main_grads_dtype)
        optimizer = (0 if fp32 else 4) + _moment_bytes(parallel)
        return memory.ModelStateBytes(
            weights=weight * params, gradients=grads * params,
            optimizer=optimizer * params / (shards if parallel.sharding.zero_stage == 1 else 1),
        ), 0.0
    element = memory.state_element_bytes(parallel.numerics.precision)
    grads, optimizer = element.grads, element.optimizer
    if eight_bit(parallel):
        # bitsandbytes steps the 16-bit weights in place with their own 16-bit gradients:
        # no fp32 master copy, only the 8-bit moments.
        grads = memory.gradient_element_bytes(parallel.numerics.main_grads_dtype)
        optimizer = STATE_BYTES
    return memory.model_state_bytes(
        params, shards, parallel.sharding.zero_stage, params_bytes=element.params,
        grads_bytes=grads, optimizer_bytes=optimizer,
    ), 0.0


def loss_bytes(model: TransformerConfig, parallel: ParallelConfig) -> tuple[float, float]:
    """(saved, working): what the last stage keeps for the loss's backward per micro-batch,
    and the buffers the loss holds at its peak beyond it.

    The engines compute the cross-entropy in fp32 over the vocabulary (split over t:
    Megatron-LM's vocab-parallel cross-entropy, TorchTitan's loss parallelism; whole in
    Tessel's runtime, which gathers the logits) and keep the fp32 softmax (Megatron, in
    place) or log-softmax (torch) of the logits, 4 s b v / t, with the head's input; at the
    peak the bf16 logits and (torch) the fp32 copy they were cast to are alive beside it,
    or under TorchTitan's loss parallelism three fp32 copies, in its backward.
    A compiled loss (TorchTitan's compile.components "loss") keeps the bf16 logits.
    A chunked loss (`loss_chunks`, torchtune's LinearCrossEntropyLoss) keeps every chunk's
    graph, so the same bytes, but its backward walks the chunks one at a time: the buffers
    at its peak are one chunk's."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    split = 1 if parallel.execution.engine == "tessel" else parallel.dims.tensor
    logits = x.tokens * model.vocab_size / split
    if parallel.execution.engine == "megatron":
        # --fp8-output-proj: Transformer Engine's MXFP8 linear keeps its input as the
        # weight gradient reads it, fp8 with one byte of scale per 32 elements
        # (megatron/core/extensions/transformer_engine.py, TELMHeadColumnParallelLinear).
        element = 1 + 1 / MXFP8_BLOCK if parallel.numerics.fp8_output_proj else e
        head_input = element * x.tokens * x.hidden / x.sequence_shards
        return FP32_BYTES * logits + head_input, e * logits
    head_input = e * x.tokens * x.hidden  # the gathered norm output the head's mm keeps
    saved, working = _torch_loss_bytes(parallel, logits, split, e)
    return saved + head_input, working / parallel.execution.loss_chunks


def _torch_loss_bytes(
    parallel: ParallelConfig, logits: float, split: int, e: int
) -> tuple[float, float]:
    """(saved, working) of torch's cross-entropy over `logits` logits of `e` bytes, split
    over `split` tensor ranks, beside the head's input."""
    if parallel.execution.compile_loss:
        # Inductor fuses the fp32 cast, the log-softmax and the gather into kernels that
        # write no fp32 copy of the logits; AOTAutograd's partitioner saves the bf16 logits
        # (and a log-sum-exp per token) for the backward, which writes their bf16 gradient.
        return e * logits, e * logits
    if split > 1:
        # Loss parallelism (TorchTitan's default under tensor parallelism): the loss runs
        # as DTensor's handlers (torch/distributed/tensor/parallel/loss.py), which follow
        # torch._decomp's unfused decomposition. Forward, `_log_softmax` holds the fp32
        # copy of the logits, `x - max` and `exp(x - max)` beside the bf16 logits (14 bytes
        # a logit); backward, `_nll_loss_and_log_softmax_backward` returns
        # `(zeros_like(x) + exp(x)) * grad_output` beside the saved fp32 log-probabilities:
        # four fp32 copies, 16 bytes a logit, 12 beyond what the forward saved.
        return FP32_BYTES * logits, 3 * FP32_BYTES * logits
    return FP32_BYTES * logits, (e + FP32_BYTES) * logits


FP32_BYTES = 4
MXFP8_BLOCK = 32
"""Elements per shared scale of the MXFP8 format (OCP Microscaling spec v1.0)."""


def layer_working_bytes(model: TransformerConfig, parallel: ParallelConfig) -> float:
    """Gradients alive at the widest point of one layer's backward, in its MLP: the output's
    gradient (whole: a row-parallel linear gathers it over the tensor group before its
    data-gradient matmul), the gradient of the down projection's input, and that of the up
    projection's output the activation function makes from it."""
    x = layer_shape(model, parallel)
    e = activation_element_bytes(parallel.numerics.precision)
    up = 2 * x.ffn if model.activation == "swiglu" else x.ffn
    return e * x.tokens * (x.hidden + x.ffn + up)


def reserved_bytes(allocated: float, parallel: ParallelConfig) -> float:
    """What the caching allocator holds when `allocated` bytes are allocated at the peak."""
    return allocated * (1 + FRAGMENTATION[parallel.execution.engine])
