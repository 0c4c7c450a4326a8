"""Tensor, sequence and data parallelism, ZeRO and recomputation of one stage, with
torch's own pieces: `parallelize_module` on the ``tp`` submesh, FSDP2 `fully_shard` on the
``dp`` submesh, torch's checkpoint utilities.

Tensor parallelism is Megatron-LM's layout: in attention, q/k/v column-parallel (heads
split) and the output projection row-parallel; in the MLP, fc1 (gate and up) column- and
fc2 (down) row-parallel; the token embedding split over the vocabulary (row-parallel) and
the LM head over the vocabulary (column-parallel, logits gathered for the loss). With
sequence parallelism the norms run on sequence shards (`SequenceParallel`), the row-
parallel outputs are reduce-scattered to sequence shards and each block's attention and
MLP inputs are all-gathered back (`PrepareModuleInput`).

ZeRO on the data-parallel axis, with FSDP2:

- ZeRO-3: ``fully_shard(reshard_after_forward=True)``: parameters, gradients and optimizer
  state sharded; parameters all-gathered in forward and again in backward.
- ZeRO-2: ``fully_shard(reshard_after_forward=False)``: gradients and optimizer state
  sharded, parameters kept gathered from forward to backward (one all-gather per step).
- ZeRO-1: the same FSDP2 call as ZeRO-2. FSDP2 cannot keep full gradients while sharding
  only the optimizer state; Megatron's distributed optimizer (what ``--use-distributed-
  optimizer`` is) communicates exactly this way too (reduce-scatter of gradients,
  all-gather of parameters), so communication matches a ZeRO-1 plan and only the gradient
  memory differs: a ZeRO-1 run holds ZeRO-2's (sharded) gradients. `ZeroRedundancy
  Optimizer` would hold full gradients but needs DDP, which trap 1 of the gloo notes rules
  out under pipelining.
- ZeRO-0: FSDP2's `replicate` (``torch.distributed._composable.replicate_with_fsdp``):
  parameters whole, gradients all-reduced, as DDP does, but with FSDP2's hooks, which the
  pipeline schedules drive correctly (DDP's do not, trap 1).

Recomputation: ``full`` wraps every block in `checkpoint_wrapper` (torch.utils.checkpoint,
non-reentrant); ``selective`` recomputes only the attention core (softmax(QK^T)V), as
Megatron's selective recomputation does.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from runtime.stages import StageMLAttention, StageModule


def apply_tensor_parallel(stage: StageModule, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron's tensor (and sequence) parallel layout of `stage` on `tp_mesh`."""
    tp = tp_mesh.size()
    if tp == 1:
        return
    seq = Shard(1) if sequence_parallel else Replicate()
    if stage.embed is not None:
        parallelize_module(stage, tp_mesh, {
            "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        })
        if sequence_parallel and stage.first_stage:
            stage.scatter_sequence = SequenceScatter(tp_mesh)
    for block in stage.blocks():
        _block_tensor_parallel(stage.config, block, tp_mesh, sequence_parallel)
    if stage.last_stage:
        plan = {}
        if stage.lm_head is not None:
            plan["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
        else:
            stage.head_input_layout = seq
        if sequence_parallel:
            plan["final_norm"] = SequenceParallel()
        for k in range(len(stage.mtp or ())):
            # Megatron-Core's MTP eh_proj: column-parallel, its output gathered for the
            # block; the norms replicated.
            plan[f"mtp.{k}.eh_proj"] = ColwiseParallel(output_layouts=Replicate())
        parallelize_module(stage, tp_mesh, plan)


def _block_tensor_parallel(
    config, block: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """One block's Megatron layout: attention heads split, its MLP (or each expert, and
    the shared expert) column- then row-parallel."""
    seq = Shard(1) if sequence_parallel else Replicate()
    attn = block.attn
    attn.local_heads(tp_mesh.size())
    if isinstance(attn, StageMLAttention):
        # Down projections to the latents (and the latents' norms) replicated, the up
        # projections column-parallel, the output row-parallel (Megatron-Core's MLA). The
        # block input reaches attention as a plain tensor: the up projections' Colwise
        # reduces the latents' gradients, so the input's own gradient is complete.
        q_in = "attn.q_proj" if hasattr(attn, "q_proj") else "attn.q_up_proj"
        plan = {q_in: ColwiseParallel(), "attn.kv_up_proj": ColwiseParallel(),
                "attn.o_proj": RowwiseParallel(output_layouts=seq),
                "attn": PrepareModuleInput(input_layouts=(seq, None),
                                           desired_input_layouts=(Replicate(), None),
                                           use_local_output=True)}
        attn.k_pos_gradient_mesh = tp_mesh
    else:
        plan = {
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(output_layouts=seq),
        }
        # Each block's attention input becomes one replicated DTensor that q, k and v
        # all read: their input gradients add up as partial sums and are reduced once
        # (one all-reduce, or one reduce-scatter under sequence parallelism), as
        # Megatron's fused QKV does, instead of once per projection.
        # Block calls attn(x, rotary); rotary is None (StageAttention makes it).
        plan["attn"] = PrepareModuleInput(
            input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)
        )
    swiglu = config.activation == "swiglu"
    mlp_in, mlp_out = (("gate_proj", "up_proj"), "down_proj") if swiglu else (
        ("fc1",), "fc2")
    moe = hasattr(block.mlp, "experts")
    if moe:
        # Every expert split as a dense MLP is; the router replicated. Each expert's
        # output is all-reduced (Replicate) before its routing weight scales it, and the
        # weighted sum is cut to sequence shards under sequence parallelism.
        # (MoEMLP's experts, or this rank's under expert parallelism, by global index.)
        # The shared expert likewise, on the rank's own tokens.
        prefixes = [f"mlp.experts.{e}." for e, _ in block.mlp.experts.named_children()]
        if getattr(block.mlp, "shared_experts", None) is not None:
            prefixes.append("mlp.shared_experts.")
        for prefix in prefixes:
            plan.update({prefix + name: ColwiseParallel() for name in mlp_in})
            plan[prefix + mlp_out] = RowwiseParallel(output_layouts=Replicate())
    else:
        plan.update({f"mlp.{name}": ColwiseParallel() for name in mlp_in})
        plan[f"mlp.{mlp_out}"] = RowwiseParallel(output_layouts=seq)
        # The MLP input likewise: gate and up (fc1) read one replicated DTensor.
        plan["mlp"] = PrepareModuleInput(
            input_layouts=(seq,), desired_input_layouts=(Replicate(),)
        )
    if sequence_parallel:
        plan.update({
            "attn_norm": SequenceParallel(),
            "mlp_norm": SequenceParallel(),
        })
        if moe:
            plan["mlp"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_input=True, output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),), use_local_output=True,
            )
    parallelize_module(block, tp_mesh, plan)
    if getattr(attn, "sinks", None) is not None:
        # GPT-OSS's attention sinks, one per head: split with the heads.
        attn.sinks = nn.Parameter(distribute_tensor(attn.sinks, tp_mesh, [Shard(0)]))


def keep_gradients_sharded(module: nn.Module) -> None:
    """Give every DTensor parameter's gradient the parameter's own placements.

    DTensor's embedding backward returns a replicated (full) gradient for the vocabulary-
    sharded weight; this keeps only the rank's rows, as Megatron's vocab-parallel embedding
    does (a local slice, no communication). Call it on the materialized module: `to_empty`
    replaces the parameters and with them their hooks.
    """
    for param in module.parameters():
        if isinstance(param, DTensor) and param.requires_grad:  # (not a frozen base's)
            param.register_post_accumulate_grad_hook(_grad_like_param)


def _grad_like_param(param: DTensor) -> None:
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        param.grad = grad.redistribute(param.device_mesh, param.placements)


class SequenceScatter(nn.Module):
    """Replicated hidden states -> this rank's sequence shard (backward: all-gather)."""

    def __init__(self, tp_mesh: DeviceMesh) -> None:
        super().__init__()
        self.tp_mesh = tp_mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = DTensor.from_local(x, self.tp_mesh, [Replicate()], run_check=False)
        return full.redistribute(self.tp_mesh, [Shard(1)]).to_local()


def slice_stage_boundaries(stage: nn.Module, tp_mesh: DeviceMesh, first: bool, last: bool) -> None:
    """Megatron's scatter-gather between pipeline stages without sequence parallelism: a
    stage's hidden-state output is replicated over the tensor group, so each rank sends
    only its 1/t slice of the sequence (forward hook; backward: all-gather of the slices'
    gradients) and the next stage all-gathers the slices it receives (forward pre-hook;
    backward: the rank's slice of the replicated gradient). Under sequence parallelism the
    hidden states already are such slices."""
    if tp_mesh.size() == 1:
        return
    if not first:
        stage.register_forward_pre_hook(
            lambda module, args: (_gather_sequence(args[0], tp_mesh), *args[1:]))
    if not last:
        scatter = SequenceScatter(tp_mesh)
        # A copy, not a view of the output: the zero-bubble schedules detach stage outputs
        # in place, which autograd refuses on views.
        stage.register_forward_hook(lambda module, args, output: scatter(output).clone())


def _gather_sequence(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    shards = DTensor.from_local(x, tp_mesh, [Shard(1)], run_check=False)
    return shards.redistribute(tp_mesh, [Replicate()]).to_local()


def apply_recompute(stage: StageModule, recompute: str) -> None:
    """Full: checkpoint every block; selective: only each attention core."""
    if recompute == "full":
        for name, block in list(stage.layers.items()):
            stage.layers[name] = checkpoint_wrapper(block)
    elif recompute == "selective":
        blocks = stage.blocks() if hasattr(stage, "blocks") else stage.layers.values()
        for block in blocks:
            block.attn.recompute_core = True


def apply_data_parallel(
    stage: StageModule, dp_mesh: DeviceMesh, zero_stage: int,
    ignored: set[nn.Parameter] | None = None,
) -> None:
    """FSDP2 on `dp_mesh`, per block and at the stage root, with the ZeRO stage mapped as
    the module docstring says; `ignored` parameters (expert-parallel experts) are left
    alone."""
    if dp_mesh.size() == 1:
        return
    ignored = ignored or None
    # One unit per block and per multi-token-prediction layer, then the stage's rest.
    units = list(stage.layers.values()) + list(getattr(stage, "mtp", None) or ())
    if zero_stage == 0:
        for block in units:
            replicate(block, mesh=dp_mesh, ignored_params=ignored)
        replicate(stage, mesh=dp_mesh, ignored_params=ignored)
        return
    reshard = zero_stage == 3
    for block in units:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=ignored)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=ignored)
