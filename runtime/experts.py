"""Expert parallelism for the zoo's mixture-of-experts MLP, with Megatron-LM's two token
dispatchers, ``allgather`` and ``alltoall`` (--moe-token-dispatcher-type).

The expert-parallel group is carved out of the data-parallel ranks, as Megatron does
(``ep`` consecutive data-parallel ranks; the ``edp`` "expert data parallel" axis strides
over them). Each of the ``ep`` ranks holds ``num_experts / ep`` experts under their full
names (``mlp.experts.5.fc1.weight``). In forward every rank routes its own tokens with the
replicated router, all-gathers the tokens and routing weights of its expert group, runs its
experts on them and reduce-scatters the weighted outputs back to the tokens' owners; the
backward is the mirror (all-gather of output gradients, reduce-scatter of input
gradients), from the functional collectives' autograd. Experts run densely on the
gathered tokens, weighted by the routing weights (zero outside each token's top-k): the
zoo model's own formulation, so results and gradients equal a single process's.

The ``alltoall`` dispatcher sends each (token, selected expert) pair only to the rank
that holds the expert: pairs are sorted by expert, their counts exchanged (a small
all-to-all of int64 counts), the tokens exchanged with an uneven `all_to_all_single`, each
expert runs on the rows it received, the outputs travel back the same way and are added
into their tokens weighted by the routing weights, in expert order (the dense sum's order
without its zero terms).

Expert gradients: an expert's gradient after backward sums the losses of its expert
group's tokens; `reduce_expert_gradients` sums it over the ``edp`` axis too (one bucket
per MoE block) and divides by the data-parallel degree, the mean every dense parameter
gets from FSDP2. Expert parameters are therefore kept out of FSDP2 (``ignored_params``)
and are not ZeRO-sharded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from planner.models.transformer import MoEMLP

EXPERT_MARK = ".experts."
DISPATCHERS = ("allgather", "alltoall")


class ExpertParallelMoE(nn.Module):
    """This rank's experts of one MoE MLP, with the replicated router and the shared
    expert (which runs on the rank's own tokens, as a dense MLP does)."""

    routing_weights = MoEMLP.routing_weights
    route = MoEMLP.route
    _group_limited_topk = MoEMLP._group_limited_topk

    def __init__(
        self, moe: MoEMLP, ep_group: dist.ProcessGroup, ep_rank: int, ep: int,
        dispatcher: str = "allgather",
    ) -> None:
        super().__init__()
        if dispatcher not in DISPATCHERS:
            raise ValueError(f"token dispatcher {dispatcher!r}: one of {', '.join(DISPATCHERS)}")
        num_experts = len(moe.experts)
        if num_experts % ep:
            raise ValueError(f"expert parallelism {ep} must divide the {num_experts} experts")
        per_rank = num_experts // ep
        self.top_k = moe.top_k
        self.score_function, self.force_balance = moe.score_function, moe.force_balance
        self.num_groups, self.group_topk = moe.num_groups, moe.group_topk
        self.router = moe.router
        self.shared_experts = moe.shared_experts
        self.experts = nn.ModuleDict({
            str(e): moe.experts[e] for e in range(ep_rank * per_rank, (ep_rank + 1) * per_rank)
        })
        self.ep_group = ep_group
        self.ep, self.per_rank, self.first = ep, per_rank, ep_rank * per_rank
        self.num_experts = num_experts
        self.dispatcher = dispatcher

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._routed(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        if self.dispatcher == "alltoall":
            return self._forward_alltoall(x)
        weights = self.routing_weights(x)
        tokens = funcol.all_gather_tensor_autograd(x, 0, self.ep_group)
        weights = funcol.all_gather_tensor_autograd(weights, 0, self.ep_group)
        out = torch.zeros_like(tokens)
        for name, expert in self.experts.items():
            e = int(name)
            out = out + weights[..., e : e + 1] * expert(tokens)
        return funcol.reduce_scatter_tensor_autograd(out, "sum", 0, self.ep_group)

    def _forward_alltoall(self, x: torch.Tensor) -> torch.Tensor:
        # The routing of MoEMLP.routing_weights, kept sparse: top-k experts and weights.
        top, index = self.route(x)
        experts = self.experts

        def run(local: int, rows: torch.Tensor) -> torch.Tensor:
            return experts[str(self.first + local)](rows)

        return alltoall_dispatch(x, top, index, self.num_experts, self.ep, self.ep_group, run)


def alltoall_dispatch(
    x: torch.Tensor, top: torch.Tensor, index: torch.Tensor, num_experts: int, ep: int,
    group: dist.ProcessGroup, run_expert,
) -> torch.Tensor:
    """Megatron's all-to-all token dispatch of `x` ``[b, s, h]`` routed to experts `index`
    with weights `top` (both ``[b, s, k]``): (token, expert) pairs sorted by expert, their
    counts exchanged, the tokens sent to the ranks that hold their experts,
    ``run_expert(local_expert, rows)`` run on each of this rank's experts' rows, the
    outputs sent back and added into their tokens weighted, in expert order."""
    b, s, h = x.shape
    flat = x.reshape(-1, h)
    top_k, per_rank = index.shape[-1], num_experts // ep
    experts = index.reshape(-1)
    order = torch.argsort(experts, stable=True)
    token_of_pair = torch.arange(flat.shape[0]).repeat_interleave(top_k)[order]
    gate = top.reshape(-1)[order]
    per_expert = torch.bincount(experts, minlength=num_experts)
    # How many pairs each rank sends me for each of my experts: [ep, per_rank].
    received_counts = funcol.all_to_all_single(
        per_expert, None, None, group
    ).reshape(ep, per_rank)
    send = per_expert.reshape(ep, per_rank).sum(1).tolist()
    recv = received_counts.sum(1).tolist()
    rows = funcol.all_to_all_single_autograd(flat[token_of_pair], recv, send, group)
    local_expert = torch.arange(per_rank).repeat(ep).repeat_interleave(
        received_counts.reshape(-1)
    )
    out = torch.zeros_like(rows)
    for local in range(per_rank):
        where = (local_expert == local).nonzero().squeeze(1)
        out = out.index_copy(0, where, run_expert(local, rows[where]))
    back = funcol.all_to_all_single_autograd(out, send, recv, group)
    combined = torch.zeros_like(flat).index_add(0, token_of_pair, back * gate[:, None])
    return combined.reshape(b, s, h)


def expert_mesh(world_mesh: DeviceMesh, ep: int) -> DeviceMesh:
    """The world's ranks as (pp, edp, ep, cp, tp): the data-parallel axis split into expert
    data parallel (slow) and expert parallel (fast). Collective: every rank calls it."""
    pp, dp, cp, tp = world_mesh.mesh.shape
    if dp % ep:
        raise ValueError(f"expert parallelism {ep} must divide the data-parallel degree {dp}")
    ranks = world_mesh.mesh.reshape(pp, dp // ep, ep, cp, tp)
    return DeviceMesh("cpu", ranks, mesh_dim_names=("pp", "edp", "ep", "cp", "tp"))


def apply_expert_parallel(
    stage: nn.Module, mesh: DeviceMesh, dispatcher: str = "allgather",
) -> None:
    """Replace each block's MoE MLP (multi-token-prediction blocks' too) by this rank's
    experts of it (on the meta device)."""
    ep = mesh["ep"].size()
    ep_rank = mesh["ep"].get_local_rank()
    blocks = stage.blocks() if hasattr(stage, "blocks") else stage.layers.values()
    for block in blocks:
        if isinstance(block.mlp, MoEMLP):
            block.mlp = ExpertParallelMoE(
                block.mlp, mesh["ep"].get_group(), ep_rank, ep, dispatcher
            )


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The module's expert parameters in name order: the same order on every rank, which
    the gradient all-reduces need (a set's order follows object ids)."""
    return [p for name, p in module.named_parameters() if EXPERT_MARK in f".{name}"]


def reduce_expert_gradients(module: nn.Module, mesh: DeviceMesh, dp: int) -> None:
    """Expert gradients summed over the expert-data-parallel axis and divided by the
    data-parallel degree: the data-parallel mean dense parameters get. One all-reduce per
    MoE block, of all its experts' gradients on this rank flattened together (a bucket, as
    Megatron-LM's gradient buffer reduces them), so a block's count is the same whether its
    experts are separate modules (the zoo's) or fused 3-D tensors (transformers')."""
    edp = mesh["edp"]
    buckets: dict[str, list[torch.Tensor]] = {}
    for name, param in module.named_parameters():
        if EXPERT_MARK not in f".{name}" or param.grad is None:
            continue
        # Tensor-parallel (or expert-sharded) experts: each rank reduces its own shard.
        grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        buckets.setdefault(f".{name}".split(EXPERT_MARK)[0], []).append(grad)
    for grads in buckets.values():
        if edp.size() > 1:
            all_reduce_bucket(grads, edp.get_group())
        for g in grads:
            g.div_(dp)


def all_reduce_bucket(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """`grads` (local shards of DTensor gradients taken as they are) summed over `group`
    in place, with one all-reduce of them flattened together: a gradient bucket, as
    Megatron-LM reduces them. Nothing is issued for no gradients; every rank of `group`
    must pass the same shapes in the same order."""
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if not local:
        return
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in local:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
