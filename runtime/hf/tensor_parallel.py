"""Megatron's tensor (and sequence) parallel layout of a Hugging Face decoder's stage.

Dense families get the layout `runtime.hf.layout` derives from each decoder layer (the
same torch styles the zoo's `runtime.parallelize.apply_tensor_parallel` uses, so the same
collectives: one input gather or gradient reduction per sublayer, one output reduction);
every stage then gets the vocabulary-parallel embedding, the column-parallel LM head with
gathered logits (or the tied head) and, under sequence parallelism, the sequence-parallel
final norm. The mixtures of experts (Mixtral, Qwen3-MoE) get that layout of their
attention and the zoo's of their experts (`_mlp_styles`); DeepSeek-V3's multi-latent
attention and experts get the zoo's layout of them (`_deepseek_v3_tensor_parallel`).

Norms inside the attention (Qwen3's per-head QK norms) are replicated over the tensor
ranks while each rank normalizes only its own heads, so each rank's gradient of their
weights is a partial sum: `reduce_head_norm_gradients` sums them over the tensor ranks
once per step, in one all-reduce of all of them, as Megatron-LM's finalize_model_grads
all-reduces the q_layernorm and k_layernorm gradients over the tensor-parallel group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from runtime.experts import all_reduce_bucket
from runtime.hf.experts import HFExpertParallelMoE
from runtime.hf.layout import BlockLayout, block_layout, block_plan, is_linear, local_heads
from runtime.hf.stages import MOE_FAMILIES, HFStageModule
from runtime.parallelize import SequenceScatter
from runtime.stages import sum_gradient_over


def apply_hf_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """Megatron's tensor (and sequence) parallel layout of `stage` on `tp_mesh` (before
    `materialize`: on the meta device)."""
    tp = tp_mesh.size()
    if tp == 1:
        return
    config = stage.hf_config
    if config.model_type == "deepseek_v3":
        _deepseek_v3_tensor_parallel(stage, tp_mesh, sequence_parallel)
        return
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if config.num_attention_heads % tp or kv_heads % tp:
        raise ValueError(
            f"tensor parallelism {tp} must divide the {config.num_attention_heads} heads "
            f"and {kv_heads} key/value heads of the {config.model_type} config")
    moe = config.model_type in MOE_FAMILIES
    seq = Shard(1) if sequence_parallel else Replicate()
    layout = None
    for block in stage.layers.values():
        # Every layer of a family is built alike (windows differ only in their masks); a
        # mixture of experts' MLP is a dense MLP or the experts, laid out apart.
        layout = layout or (_layout_beside_the_mlp(block, config, stage.rotary) if moe
                            else block_layout(block, config, stage.rotary))
        plan = block_plan(layout, sequence_parallel)
        if moe:
            plan.update(_mlp_styles(block.mlp, seq, sequence_parallel))
        parallelize_module(block, tp_mesh, plan)
        local_heads(block, layout, tp)
        stage.head_norms += _head_norms(block, layout)
    _ends_tensor_parallel(stage, tp_mesh, sequence_parallel)


def _layout_beside_the_mlp(block: nn.Module, config: Any, rotary: nn.Module | None
                           ) -> BlockLayout:
    """`block_layout` of a mixture of experts' decoder layer without its MLP (the experts'
    routing does not run on the meta device): its attention and its own norms."""
    mlp = block.mlp
    block.mlp = nn.Identity()
    try:
        return block_layout(block, config, rotary)
    finally:
        block.mlp = mlp


def _head_norms(block: nn.Module, layout: BlockLayout) -> list[nn.Module]:
    """The modules with parameters inside the layer's attention other than its linears:
    per-head norms (Qwen3's q_norm and k_norm), replicated over the tensor ranks and run
    on each rank's heads."""
    norms = []
    for sublayer in layout.sublayers:
        if sublayer.attention is not None:
            attention = block.get_submodule(sublayer.attention)
            norms += [m for m in attention.modules()
                      if not is_linear(m) and any(True for _ in m.parameters(recurse=False))]
    return norms


def reduce_head_norm_gradients(stages: list[nn.Module], tp_mesh: DeviceMesh) -> None:
    """The gradients of every stage's per-head norms (`_head_norms`) summed over the
    tensor ranks: one all-reduce of all of them flattened (Megatron-LM's coalesced
    all-reduce of the q_layernorm and k_layernorm gradients). Call it after the step's
    last backward (and data-parallel reduction), on every rank of the tensor group."""
    if tp_mesh.size() == 1:
        return
    grads = [param.grad for stage in stages for norm in getattr(stage, "head_norms", ())
             for param in norm.parameters() if param.grad is not None]
    all_reduce_bucket(grads, tp_mesh.get_group())


def _ends_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """The vocabulary-parallel token embedding (scattered to sequence shards under
    sequence parallelism), and the last stage's head (column-parallel, logits gathered;
    or the tied head's input layout) and final norm."""
    seq = Shard(1) if sequence_parallel else Replicate()
    names = stage.anatomy
    if stage.embed is not None:
        parallelize_module(stage.trunk, tp_mesh, {
            names.embedding: RowwiseParallel(input_layouts=Replicate(),
                                             output_layouts=Replicate()),
        })
        if sequence_parallel and stage.first_stage:
            stage.scatter_sequence = SequenceScatter(tp_mesh)
    if sequence_parallel:
        stage.sequence_shards = tp_mesh.size()
    if stage.last_stage:
        if stage.tie_embeddings:
            stage.head_input_layout = seq
        else:
            parallelize_module(stage, tp_mesh, {
                names.head: ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
            })
        if sequence_parallel:
            parallelize_module(stage.trunk, tp_mesh, {names.final_norm: SequenceParallel()})


def _deepseek_v3_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """DeepSeek-V3's Megatron-Core layout, read off transformers' modules as the zoo's
    `runtime.parallelize._block_tensor_parallel` lays out its MLA and MoE blocks:

    - multi-latent attention: the down projections to the latents (``q_a_proj``,
      ``kv_a_proj_with_mqa``) and the latents' norms replicated; the up projections
      (``q_b_proj``, or ``q_proj`` without a query latent, and ``kv_b_proj``) column-
      parallel by heads, their inputs' gradients reduced by ColwiseParallel; ``o_proj``
      row-parallel. The shared rotary key, which every head reads, is held whole: its
      gradient sums over the tensor ranks (one all-reduce in backward). transformers'
      attention reshapes with ``-1`` heads, so it runs on the local heads unchanged.
    - the dense MLP as Llama's (gate/up column-, down row-parallel, one input reduction);
    - the MoE block: the shared expert column- then row-parallel with its output reduced,
      every routed expert split over the tensor ranks the same way
      (`HFExpertParallelMoE.tensor_parallel`), the router replicated.
    """
    tp = tp_mesh.size()
    seq = Shard(1) if sequence_parallel else Replicate()
    config = stage.hf_config
    if config.num_attention_heads % tp:
        raise ValueError(f"tensor parallelism {tp} must divide the "
                         f"{config.num_attention_heads} heads")
    for block in stage.layers.values():
        attn = block.self_attn
        q_up = "self_attn.q_proj" if attn.q_proj is not None else "self_attn.q_b_proj"
        plan = {q_up: ColwiseParallel(), "self_attn.kv_b_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(output_layouts=seq)}
        plan.update(_mlp_styles(block.mlp, seq, sequence_parallel))
        if sequence_parallel:
            # The sequence shards gathered for attention (its input's gradient is whole:
            # the latents' are reduced, so backward only slices it), as the zoo's MLA
            # under sequence parallelism.
            plan["self_attn"] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": seq},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=True)
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)
        rope = config.qk_rope_head_dim
        attn.kv_a_proj_with_mqa.register_forward_hook(
            lambda module, args, out, rope=rope: _rotary_key_gradient_summed(out, rope, tp_mesh))
    _ends_tensor_parallel(stage, tp_mesh, sequence_parallel)


def _mlp_styles(mlp: nn.Module, seq, sequence_parallel: bool) -> dict[str, Any]:
    """A mixture of experts' MLP under tensor parallelism, as the zoo's: a dense MLP as
    Llama's (one input reduction); the experts each split over the tensor ranks (here:
    `HFExpertParallelMoE.tensor_parallel`), the router replicated, a shared expert
    column- then row-parallel, and under sequence parallelism the block's input gathered
    and its output cut back to shards (backward: an all-gather)."""
    if not isinstance(mlp, HFExpertParallelMoE):
        if hasattr(mlp, "experts"):
            raise ValueError("tensor parallelism of a Hugging Face MoE model runs with "
                             "expert parallelism (--expert-model-parallel-size > 1)")
        return _mlp_plan("mlp.", seq, reduce_input=True)
    mlp.tensor_parallel()
    plan: dict[str, Any] = {}
    if mlp.shared_experts is not None:  # DeepSeek-V3's
        plan.update(_mlp_plan("mlp.shared_experts.", Replicate(), reduce_input=False))
    if sequence_parallel:
        plan["mlp"] = PrepareModuleInputOutput(
            input_layouts=(seq,), desired_input_layouts=(Replicate(),),
            use_local_input=True, output_layouts=(Replicate(),),
            desired_output_layouts=(seq,), use_local_output=True)
    return plan


def _mlp_plan(prefix: str, seq, reduce_input: bool) -> dict[str, Any]:
    """A gated MLP's layout: gate/up column-, down row-parallel with its output reduced
    (to sequence shards `seq`); with `reduce_input`, gate and up read one replicated input
    gathered from `seq` (one gradient reduction, as Megatron's fused FC1), else each
    reduces its own (the zoo's experts)."""
    plan: dict[str, Any] = {prefix + "gate_proj": ColwiseParallel(),
                            prefix + "up_proj": ColwiseParallel(),
                            prefix + "down_proj": RowwiseParallel(output_layouts=seq)}
    if reduce_input:
        plan[prefix.rstrip(".")] = PrepareModuleInput(input_layouts=(seq,),
                                                      desired_input_layouts=(Replicate(),))
    return plan


def _rotary_key_gradient_summed(out: torch.Tensor, rope: int, tp_mesh: DeviceMesh):
    """``kv_a_proj_with_mqa``'s output (latent, rotary key) with the rotary key's gradient
    summed over `tp_mesh` (the latent's is reduced by ``kv_b_proj``'s ColwiseParallel)."""
    latent, key = out.split([out.shape[-1] - rope, rope], dim=-1)
    return torch.cat([latent, sum_gradient_over(tp_mesh)(key)], dim=-1)
