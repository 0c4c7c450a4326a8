"""One decoder-only transformer that builds GPT, Llama, Mixtral, Qwen3-MoE, GPT-OSS and
DeepSeek-V3 shapes from a config.

Written for planning: every matrix tensor parallelism would split is its own ``nn.Linear``
(separate q/k/v/o and gate/up/down projections, no fused weights), there is no dropout or
KV cache, and reshapes use sizes read from the input, so ``torch.export`` traces the model
without guards on data. Build it on ``torch.device("meta")`` (the default of `build_model`)
to plan models of any size without allocating their weights.

Mixture-of-experts MLPs use a *dense* formulation: every expert runs on every token and
the outputs are weighted by routing probabilities that are zero outside each token's top-k.
The usual sparse dispatch gathers a data-dependent number of tokens per expert, a shape
``torch.export`` can only express with unbacked symbols that the sharding and cost passes
do not handle; the dense form has static shapes and the same parameters, gradients' shapes
and results. Its graph holds ``num_experts / moe_top_k`` times the expert FLOPs a real MoE
layer executes, so FLOP counts read off the graph must scale the expert MLPs by
``moe_top_k / num_experts``.

What the 2025 MoE models add, each built as Megatron-Core builds it (the parameter structure
`TransformerConfig.num_parameters` counts): a head width of its own (``kv_channels``), a
per-head RMSNorm of queries and keys (``qk_layernorm``), one learned softmax sink per head
(GPT-OSS), a sliding causal window on the layers `windowed_layers` names, multi-latent
attention (`MLAttention`), dense and MoE layers mixed (`TransformerConfig.layer_kinds`),
routed experts of their own width, a shared expert every token runs, sigmoid routing
limited to the best groups of experts (DeepSeek-V3), and multi-token prediction layers
(`MTPLayer`): `Transformer.forward(ids)` returns the main logits; given
``mtp_targets`` (the next-token targets) it also returns the mean of the MTP layers'
losses, which a training loss adds scaled by `MTP_LOSS_SCALING_FACTOR` (`lm_loss`), as
Megatron-LM does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.attention_kernels import (
    Rotary,
    RMSNorm,
    apply_rotary,
    attention_core,
    attention_mask,
    rotary_tables,
)
from planner.models.config import LayerKind, TransformerConfig

__all__ = [
    "Attention",
    "Block",
    "GeluMLP",
    "LMHead",
    "MLAttention",
    "MTPLayer",
    "MTP_LOSS_SCALING_FACTOR",
    "MoEMLP",
    "RMSNorm",
    "SwiGLUMLP",
    "Transformer",
    "build_model",
    "example_inputs",
    "lm_loss",
]

MTP_LOSS_SCALING_FACTOR = 0.1
"""Megatron-LM's --mtp-loss-scaling-factor default: the training loss is the main loss plus
this times the mean of the multi-token-prediction layers' losses."""

def _norm(config: TransformerConfig, width: int | None = None) -> nn.Module:
    """The config's norm over `width` features (default: the hidden size)."""
    width = config.hidden_size if width is None else width
    if config.norm == "rmsnorm":
        return RMSNorm(width)
    return nn.LayerNorm(width)


def rotary_dim(config: TransformerConfig) -> int:
    """Width the rotary tables cover: the head, or MLA's decoupled rotary part."""
    if config.multi_latent_attention:
        return config.qk_pos_emb_head_dim
    return config.head_dim


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v/o projections and grouped-query attention.

    Separate projections let tensor parallelism shard heads by splitting each weight along
    its output (q/k/v) or input (o) dimension, with no slicing of a fused weight.
    """

    def __init__(self, config: TransformerConfig, window: int | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.window = window
        h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
        q = config.num_attention_heads * config.head_dim
        self.q_proj = nn.Linear(h, q, bias=config.bias)
        self.k_proj = nn.Linear(h, kv, bias=config.bias)
        self.v_proj = nn.Linear(h, kv, bias=config.bias)
        self.o_proj = nn.Linear(q, h, bias=config.bias)
        # Qwen3's q_norm / k_norm: one norm of the head width, shared by the heads.
        self.q_norm = _norm(config, config.head_dim) if config.qk_layernorm else None
        self.k_norm = _norm(config, config.head_dim) if config.qk_layernorm else None
        # GPT-OSS's attention sinks: one logit per head.
        self.sinks = None
        if config.softmax_type == "learnable":
            self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self._project_heads(x)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        if self.window is None and self.sinks is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = attention_mask(torch.arange(s, device=x.device), s, self.window)
            y = attention_core(q, k, v, mask, self.sinks)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))

    def _project_heads(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of `x`, [b, heads, s, d] (keys and values with their
        own, grouped, head count), queries and keys normed where the model norms them."""
        q = self._split_heads(self.q_proj(x), self.num_heads)
        k = self._split_heads(self.k_proj(x), self.num_kv_heads)
        v = self._split_heads(self.v_proj(x), self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _split_heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        # [b, s, heads * d] -> [b, heads, s, d], the layout SDPA expects.
        b, s, _ = t.shape
        return t.view(b, s, heads, self.head_dim).transpose(1, 2)

    def _repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        """Give each query head its group's key/value head: [b, g, s, d] -> [b, heads, s, d].

        expand + reshape (not SDPA's ``enable_gqa``) keeps the graph to plain view ops, for
        which the sharding rules exist, and lays heads out group-major as Megatron does.
        """
        b, g, s, d = t.shape
        if g == self.num_heads:
            return t
        repeats = self.num_heads // g
        return t[:, :, None].expand(b, g, repeats, s, d).reshape(b, self.num_heads, s, d)


class MLAttention(nn.Module):
    """DeepSeek's multi-latent attention, as Megatron-Core's MLASelfAttention builds it.

    Queries come through a normed rank-``q_lora_rank`` latent (``q_down_proj``,
    ``q_norm``, ``q_up_proj``) or straight from the hidden state (``q_proj``, when
    q_lora_rank is None); keys and values from one normed rank-``kv_lora_rank`` latent
    (``kv_down_proj``, ``kv_norm``, ``kv_up_proj``), whose down projection also makes the
    rotary part of the key, one of ``qk_pos_emb_head_dim`` shared by every head. Each
    query head is ``qk_head_dim`` features without positions and ``qk_pos_emb_head_dim``
    rotated ones; values are ``v_head_dim`` wide; the softmax scale is
    1 / sqrt(qk_head_dim + qk_pos_emb_head_dim). No biases.
    """

    def __init__(self, config: TransformerConfig, window: int | None = None) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        self.num_heads = heads
        self.window = window
        self.qk_head_dim, self.pos_dim = config.qk_head_dim, config.qk_pos_emb_head_dim
        self.v_head_dim, self.kv_lora_rank = config.v_head_dim, config.kv_lora_rank
        q_width = heads * (self.qk_head_dim + self.pos_dim)
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(h, q_width, bias=False)
        else:
            self.q_down_proj = nn.Linear(h, config.q_lora_rank, bias=False)
            self.q_norm = _norm(config, config.q_lora_rank)
            self.q_up_proj = nn.Linear(config.q_lora_rank, q_width, bias=False)
        self.kv_down_proj = nn.Linear(h, self.kv_lora_rank + self.pos_dim, bias=False)
        self.kv_norm = _norm(config, self.kv_lora_rank)
        self.kv_up_proj = nn.Linear(
            self.kv_lora_rank, heads * (self.qk_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_head_dim, h, bias=False)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """All (local) heads' queries ``[b, s, heads x (qk + pos)]``."""
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_up_proj(self.q_norm(self.q_down_proj(x)))

    def project(
        self, x: torch.Tensor, k_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q without and with positions ``[b, heads, s, qk]`` / ``[.., pos]``, k without
        positions, the shared rotary key part ``[b, 1, s, pos]`` and v ``[b, heads, s,
        v]``, for the heads this module holds."""
        b, s, _ = x.shape
        q = self.queries(x).view(b, s, -1, self.qk_head_dim + self.pos_dim).transpose(1, 2)
        q_nope, q_pos = q.split([self.qk_head_dim, self.pos_dim], dim=-1)
        latent, k_pos_raw = self.kv_down_proj(x).split([self.kv_lora_rank, self.pos_dim], -1)
        if k_pos is None:
            k_pos = k_pos_raw
        else:  # a hook (tensor parallelism) handed the rotary key back through itself
            k_pos = k_pos(k_pos_raw)
        kv = self.kv_up_proj(self.kv_norm(latent))
        kv = kv.view(b, s, -1, self.qk_head_dim + self.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([self.qk_head_dim, self.v_head_dim], dim=-1)
        return q_nope, q_pos, k_nope, k_pos.unsqueeze(1), v

    @staticmethod
    def join(
        q_nope: torch.Tensor, q_pos: torch.Tensor, k_nope: torch.Tensor, k_pos: torch.Tensor,
        rotary: Rotary,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys with their rotated parts appended, the key's over every head."""
        q_pos, k_pos = apply_rotary(q_pos, rotary), apply_rotary(k_pos, rotary)
        b, heads, s, _ = k_nope.shape
        k = torch.cat([k_nope, k_pos.expand(b, heads, s, k_pos.shape[-1])], dim=-1)
        return torch.cat([q_nope, q_pos], dim=-1), k

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q_nope, q_pos, k_nope, k_pos, v = self.project(x)
        if rotary is None:
            rotary = rotary_tables(s, self.pos_dim, 10000, x)
        q, k = self.join(q_nope, q_pos, k_nope, k_pos, rotary)
        mask = None
        if self.window is not None:
            mask = attention_mask(torch.arange(s, device=x.device), s, self.window)
        y = attention_core(q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


def _attention(config: TransformerConfig, window: int | None = None) -> nn.Module:
    if config.multi_latent_attention:
        return MLAttention(config, window)
    return Attention(config, window)


class GeluMLP(nn.Module):
    """GPT MLP: hidden -> ffn -> GeLU (tanh approximation) -> hidden."""

    def __init__(self, config: TransformerConfig, ffn: int | None = None) -> None:
        super().__init__()
        f = config.ffn_size if ffn is None else ffn
        self.fc1 = nn.Linear(config.hidden_size, f, bias=config.bias)
        self.fc2 = nn.Linear(f, config.hidden_size, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SwiGLUMLP(nn.Module):
    """Llama MLP: down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

    def __init__(self, config: TransformerConfig, ffn: int | None = None) -> None:
        super().__init__()
        h, f = config.hidden_size, config.ffn_size if ffn is None else ffn
        self.gate_proj = nn.Linear(h, f, bias=config.bias)
        self.up_proj = nn.Linear(h, f, bias=config.bias)
        self.down_proj = nn.Linear(f, h, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _dense_mlp(config: TransformerConfig, ffn: int | None = None) -> nn.Module:
    """The config's dense MLP of inner width `ffn` (default: ffn_hidden_size)."""
    return SwiGLUMLP(config, ffn) if config.activation == "swiglu" else GeluMLP(config, ffn)


class MoEMLP(nn.Module):
    """Mixture of experts: a router, routed experts of width ``expert_ffn_size`` and, with
    ``moe_shared_expert_intermediate_size``, a shared expert every token runs, added to
    the routed output (``shared_experts``, as Megatron-Core and DeepSeek-V3 name it).

    Routing (`route`): Mixtral's softmax, top-k and renormalization; or DeepSeek-V3's
    sigmoid scores, optionally limited to the best ``moe_router_group_topk`` of
    ``moe_router_num_groups`` groups of experts, the chosen scores normalized to sum one.
    With `force_balance` set (--moe-router-force-load-balancing) the experts are chosen by
    a fixed rule instead (`forced_experts`) and weighted by the router's scores of them.
    Computed densely (every expert on every token); see the module docstring for why.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        assert config.num_experts is not None
        self.top_k = config.moe_top_k
        self.num_experts = config.num_experts
        self.score_function = config.moe_router_score_function
        self.num_groups = config.moe_router_num_groups
        self.group_topk = config.moe_router_group_topk
        self.force_balance = False
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=config.bias)
        self.experts = nn.ModuleList(
            _dense_mlp(config, config.expert_ffn_size) for _ in range(config.num_experts))
        self.shared_experts = None
        if config.moe_shared_expert_intermediate_size:
            self.shared_experts = _dense_mlp(config, config.moe_shared_expert_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.routing_weights(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + weights[..., e : e + 1] * expert(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k weights and expert indices, both ``[b, s, k]``: weights in
        x's dtype, indices int64."""
        logits = self.router(x).float()
        if self.score_function == "softmax":
            scores = F.softmax(logits, dim=-1)
        else:
            scores = torch.sigmoid(logits)
        if self.force_balance:
            index = forced_experts(x.shape[0], x.shape[1], self.top_k, self.num_experts,
                                   x.device)
            top = scores.gather(-1, index)
        elif self.score_function == "softmax":
            top, index = scores.topk(self.top_k, dim=-1)
        else:
            index = self._group_limited_topk(scores)
            top = scores.gather(-1, index)
        if self.score_function == "softmax":
            top = top / top.sum(dim=-1, keepdim=True)
        else:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return top.to(x.dtype), index

    def _group_limited_topk(self, scores: torch.Tensor) -> torch.Tensor:
        """DeepSeek-V3's expert choice (transformers' DeepseekV3MoE.route_tokens_to_experts;
        Megatron-Core's moe_utils.group_limited_topk): the experts fall into groups, each
        group scored by the sum of its best two scores, the best group_topk groups kept and
        the top-k experts chosen within them. Without groups: the top-k scores."""
        if self.num_groups is None or self.group_topk is None:
            return scores.topk(self.top_k, dim=-1)[1]
        shape = scores.shape
        grouped = scores.reshape(*shape[:-1], self.num_groups, -1)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
        groups = group_scores.topk(self.group_topk, dim=-1)[1]
        keep = torch.zeros_like(group_scores).scatter(-1, groups, 1.0)
        keep = keep.unsqueeze(-1).expand(grouped.shape).reshape(shape)
        return scores.masked_fill(keep == 0, float("-inf")).topk(self.top_k, dim=-1)[1]

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token expert weights ``[b, s, num_experts]``: the top-k routing weights
        (`route`), zero for unselected experts."""
        top, index = self.route(x)
        # scatter into zeros keeps the shape static: no per-expert token lists.
        zeros = torch.zeros(*x.shape[:-1], self.num_experts, dtype=torch.float32,
                            device=x.device)
        return zeros.scatter(-1, index, top.float()).to(x.dtype)


def forced_experts(
    batch: int, seq: int, top_k: int, num_experts: int, device: torch.device | None = None,
) -> torch.Tensor:
    """Experts of forced load balancing, ``[batch, seq, top_k]``: the token at position p
    goes to experts (p k + j) mod E, j < k. Megatron-Core's --moe-router-force-load-
    balancing routes random logits (router.py, apply_random_logits), balanced only in
    expectation; this rule is balanced exactly whenever E divides seq x k (every expert
    gets seq k / E tokens of each sequence), so the all-to-all dispatcher's bytes are known
    before the step and `plan check` compares them like every other collective. It reads
    only positions, so one process and any split of the batch route alike."""
    p = torch.arange(seq, device=device)[:, None] * top_k
    index = (p + torch.arange(top_k, device=device)[None, :]) % num_experts
    return index.expand(batch, seq, top_k)


class LMHead(nn.Module):
    """Output layer: hidden states -> vocabulary logits, without a bias.

    With tied embeddings it owns no weight and is handed the token embedding's in forward,
    as Megatron-LM's output layer is. Registering one Parameter under two modules instead
    makes torch.export's joint forward-backward graph reject the model (a "parameter that
    did not receive a gradient", pytorch/pytorch#101192).
    """

    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__()
        if tied:
            self.register_parameter("weight", None)
        else:
            # GPT-2's init (std 0.02) rather than nn.Linear's fan-in uniform: what LM
            # training scripts use, and the zoo's weights only matter for small CPU tests.
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))
            nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, shared_weight: torch.Tensor | None = None) -> torch.Tensor:
        weight = self.weight if self.weight is not None else shared_weight
        if weight is None:
            raise ValueError("a tied LM head needs the token embedding's weight")
        return F.linear(x, weight)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(attn_norm(x)), then + mlp(mlp_norm(x)).

    `kind` (`TransformerConfig.layer_kinds`) says whether its MLP is dense or a mixture of
    experts and whether its attention is windowed; by default the config's first layer's."""

    def __init__(self, config: TransformerConfig, kind: LayerKind | None = None) -> None:
        super().__init__()
        kind = config.layer_kinds()[0] if kind is None else kind
        self.attn_norm = _norm(config)
        self.attn = _attention(config, kind.window)
        self.mlp_norm = _norm(config)
        self.mlp = MoEMLP(config) if kind.moe else _dense_mlp(config)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary)
        return x + self.mlp(self.mlp_norm(x))


class MTPLayer(nn.Module):
    """One multi-token-prediction layer (DeepSeek-V3 report, Sec. 2.2; Megatron-Core's
    MultiTokenPredictionLayer): the previous depth's hidden states and the embedding of
    the next token, each normed (``hnorm``, ``enorm``), concatenated (embedding first) and
    projected 2h -> h (``eh_proj``, no bias), one block of the last layer's kind and a
    final norm; the embedding and the output head are the model's own."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.enorm = _norm(config)
        self.hnorm = _norm(config)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = Block(config, config.mtp_kind())
        self.final_norm = _norm(config)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor,
                rotary: Rotary | None = None) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.final_norm(self.block(x, rotary))


def mtp_depth_inputs(targets: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids the MTP layer at `depth` (1, 2, ...) embeds and the labels it predicts,
    both ``[b, s]``, from the main next-token `targets`: position i embeds token i + depth
    (targets[i + depth - 1]) and predicts token i + depth + 1; rolled, as Megatron-LM rolls
    them, so the last `depth` positions hold wrapped ids that `mtp_cross_entropy` leaves
    out."""
    return torch.roll(targets, -(depth - 1), dims=1), torch.roll(targets, -depth, dims=1)


def mtp_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, depth: int) -> torch.Tensor:
    """Mean cross-entropy over the positions that have a label `depth` tokens further on."""
    keep = logits.shape[1] - depth
    return F.cross_entropy(logits[:, :keep].reshape(-1, logits.shape[-1]).float(),
                           labels[:, :keep].reshape(-1))


def lm_loss(output, targets: torch.Tensor) -> torch.Tensor:
    """The training loss: mean next-token cross-entropy of the logits, plus, when `output`
    is ``(logits, mtp_loss)``, `MTP_LOSS_SCALING_FACTOR` x the MTP layers' mean loss."""
    mtp = None
    if isinstance(output, tuple):
        output, mtp = output
    loss = F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1))
    return loss if mtp is None else loss + MTP_LOSS_SCALING_FACTOR * mtp


class Transformer(nn.Module):
    """Decoder-only language model: token ids ``[b, s]`` -> logits ``[b, s, vocab]``.

    With multi-token-prediction layers and ``mtp_targets`` (the next-token targets of
    the ids) forward returns ``(logits, mtp_loss)``, the mean of the MTP layers' losses
    (`lm_loss` adds it); without targets, only the logits (the MTP layers do not run)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, h)
        if config.position_embedding == "learned":
            assert config.max_position_embeddings is not None
            self.pos_embed = nn.Embedding(config.max_position_embeddings, h)
        self.layers = nn.ModuleList(Block(config, kind) for kind in config.layer_kinds())
        self.final_norm = _norm(config)
        self.lm_head = LMHead(h, config.vocab_size, tied=config.tie_embeddings)
        if config.mtp_num_layers:
            self.mtp = nn.ModuleList(MTPLayer(config) for _ in range(config.mtp_num_layers))

    def forward(self, input_ids: torch.Tensor, mtp_targets: torch.Tensor | None = None):
        s = input_ids.shape[1]
        x = self._embed(input_ids)
        rotary = None
        if self.config.position_embedding == "rope" or self.config.multi_latent_attention:
            rotary = rotary_tables(s, rotary_dim(self.config), self.config.rotary_base, x)
        for layer in self.layers:
            x = layer(x, rotary)
        x = self.final_norm(x)
        logits = self.lm_head(x, self.embed.weight)
        if mtp_targets is None or not self.config.mtp_num_layers:
            return logits
        losses = []
        for depth, layer in enumerate(self.mtp, start=1):
            ids, labels = mtp_depth_inputs(mtp_targets, depth)
            x = layer(x, self._embed(ids), rotary)
            losses.append(mtp_cross_entropy(self.lm_head(x, self.embed.weight), labels, depth))
        return logits, torch.stack(losses).mean()

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        if self.config.position_embedding == "learned":
            s = input_ids.shape[1]
            x = x + self.pos_embed(torch.arange(s, device=input_ids.device))
        return x


def build_model(config: TransformerConfig, device: str | torch.device = "meta") -> Transformer:
    """Build the model `config` describes, with its parameters created on `device`.

    On the default meta device no parameter memory is allocated, whatever the size.
    """
    with torch.device(device):
        return Transformer(config)


def example_inputs(
    config: TransformerConfig,
    batch_size: int,
    seq_length: int | None = None,
    device: str | torch.device = "meta",
) -> torch.Tensor:
    """Random token ids ``[batch_size, seq_length]`` (default: the config's seq_length)."""
    s = config.seq_length if seq_length is None else seq_length
    limit = config.max_position_embeddings
    if config.position_embedding == "learned" and limit is not None and s > limit:
        raise ValueError(
            f"seq_length ({s}) exceeds max_position_embeddings ({limit}) of the learned "
            f"position table; pass a seq_length of at most {limit}."
        )
    return torch.randint(0, config.vocab_size, (batch_size, s), device=device)
