"""Mixture-of-experts blocks of a Hugging Face decoder (transformers' fused-expert MoE
blocks: Mixtral's, Qwen3-MoE's, DeepSeek-V3's) under expert parallelism, and forced load
balancing of their routers.

`HFExpertParallelMoE` holds a rank's experts (split over the ``ep`` axis, and over the
tensor ranks too under tensor parallelism) and dispatches tokens all-to-all
(`runtime.experts.alltoall_dispatch`); `force_hf_routing` fixes every router's choice
to the zoo's position rule (`planner.models.transformer.forced_experts`), so that
all-to-all bytes are known.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from planner.models.transformer import forced_experts
from runtime.experts import alltoall_dispatch
from runtime.stages import sum_gradient_over


def zero_router_biases(module: nn.Module) -> None:
    """DeepSeek-V3's routers keep a score-correction bias buffer (the aux-loss-free
    balancing's, zero at the start; transformers' _init_weights zeroes it), which
    `to_empty` leaves uninitialized."""
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()


def _routers(module: nn.Module) -> list[nn.Module]:
    """transformers' top-k routers of fused-expert MoE blocks (``mlp.gate``)."""
    return [m for m in module.modules() if type(m).__name__.lower().endswith("topkrouter")]


def force_hf_routing(module: nn.Module, seq_length: int) -> None:
    """Forced load balancing of every router in `module` (the zoo's rule,
    `planner.models.transformer.forced_experts`, over positions of `seq_length`-token
    sequences): the experts fixed, weighted by the router's softmax probabilities of them,
    renormalized where the config says (``norm_topk_prob``)."""
    for router in _routers(module):
        router.forward = types.MethodType(_forced_forward, router)
        router.seq_length = seq_length


def _forced_forward(self, hidden_states: torch.Tensor):
    """The router's scores (softmax; DeepSeek-V3's sigmoid, normalized and scaled as its
    router does) of the forced experts."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    sigmoid = hasattr(self, "routed_scaling_factor")  # DeepseekV3TopkRouter
    if sigmoid:
        logits = F.linear(hidden_states.float(), self.weight.float())
        probs = logits.sigmoid()
    else:
        logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    tokens = hidden_states.shape[0]
    index = forced_experts(tokens // self.seq_length, self.seq_length, self.top_k,
                           self.num_experts, logits.device).reshape(tokens, self.top_k)
    top = probs.gather(-1, index)
    if sigmoid:
        if self.norm_topk_prob:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, top * self.routed_scaling_factor, index
    if getattr(self, "norm_topk_prob", True):  # Mixtral's router always renormalizes
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), index


class HFExpertParallelMoE(nn.Module):
    """This rank's experts of a transformers fused-expert MoE block (``mlp.experts.
    gate_up_proj`` ``[E, 2f, h]``, ``down_proj`` ``[E, h, f]``, each a DTensor split over
    the expert-parallel ranks on dim 0, under their full names) with its replicated
    router (``mlp.gate``), dispatched all-to-all (`runtime.experts.alltoall_dispatch`).

    Under tensor parallelism (`tensor_parallel`: Megatron's default expert tensor degree,
    the tensor degree) every expert is split as a dense MLP is: ``gate_up_proj`` on its
    output dim with the gate and up halves split alike (each rank holds the same rows of
    both: `_StridedShard` with split factor 2), ``down_proj`` on its input dim. An expert
    reduces its output over the tensor ranks, and its gate's and its up's input gradients
    each on their own, as the zoo's experts (separate gate and up projections) do."""

    def __init__(self, moe: nn.Module, mesh: DeviceMesh) -> None:
        super().__init__()
        self.gate, self.experts = moe.gate, moe.experts
        self.shared_experts = getattr(moe, "shared_experts", None)  # DeepSeek-V3's
        self.num_experts = moe.experts.num_experts
        ep_mesh = mesh["ep"]
        self.mesh = mesh
        self.tp_mesh: DeviceMesh | None = None
        self.ep, self.ep_group = ep_mesh.size(), ep_mesh.get_group()
        if self.num_experts % self.ep:
            raise ValueError(f"expert parallelism {self.ep} must divide the "
                             f"{self.num_experts} experts")
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(self.experts, name)
            setattr(self.experts, name,
                    nn.Parameter(distribute_tensor(param, ep_mesh, [Shard(0)])))

    def tensor_parallel(self) -> None:
        """Split every expert over the tensor ranks (before `materialize`: on meta)."""
        mesh = self.mesh["ep", "tp"]
        tp = mesh.size(1)
        f = self.experts.gate_up_proj.shape[1] // 2
        if f % tp:
            raise ValueError(f"tensor parallelism {tp} must divide the experts' "
                             f"intermediate size {f}")
        layouts = {"gate_up_proj": [Shard(0), _StridedShard(1, split_factor=2)],
                   "down_proj": [Shard(0), Shard(2)]}
        for name, placements in layouts.items():
            whole = torch.empty(getattr(self.experts, name).shape, device="meta")
            setattr(self.experts, name, nn.Parameter(distribute_tensor(
                whole, mesh, placements, src_data_rank=None)))
        self.tp_mesh = self.mesh["tp"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        _, top, index = self.gate(x.reshape(-1, h))
        gate_up = self.experts.gate_up_proj.to_local()
        down = self.experts.down_proj.to_local()
        act = self.experts.act_fn
        tp_mesh = self.tp_mesh

        def run(local: int, rows: torch.Tensor) -> torch.Tensor:
            if tp_mesh is None:
                gate, up = F.linear(rows, gate_up[local]).chunk(2, dim=-1)
                return F.linear(act(gate) * up, down[local])
            gate_w, up_w = gate_up[local].chunk(2, dim=0)
            reduced = sum_gradient_over(tp_mesh)
            gate = F.linear(reduced(rows), gate_w)
            up = F.linear(reduced(rows), up_w)
            partial = F.linear(act(gate) * up, down[local])
            return DTensor.from_local(partial, tp_mesh, [Partial()], run_check=False
                                      ).redistribute(tp_mesh, [Replicate()]).to_local()

        out = alltoall_dispatch(x, top.reshape(b, s, -1), index.reshape(b, s, -1),
                                self.num_experts, self.ep, self.ep_group, run)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


def apply_hf_expert_parallel(stage: nn.Module, mesh: DeviceMesh, dispatcher: str) -> None:
    """Each MoE block's experts split over the ``ep`` axis of `mesh`
    (`runtime.experts.expert_mesh`), tokens dispatched all-to-all."""
    if dispatcher != "alltoall":
        raise ValueError("a Hugging Face MoE model runs the alltoall token dispatcher "
                         "(--moe-token-dispatcher-type alltoall)")
    for block in stage.layers.values():
        if hasattr(block.mlp, "experts"):
            block.mlp = HFExpertParallelMoE(block.mlp, mesh)
