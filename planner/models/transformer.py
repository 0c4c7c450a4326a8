"""One decoder-only transformer that builds GPT, Llama and Mixtral shapes from a config.

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.config import TransformerConfig

__all__ = [
    "Attention",
    "Block",
    "GeluMLP",
    "LMHead",
    "MoEMLP",
    "RMSNorm",
    "SwiGLUMLP",
    "Transformer",
    "build_model",
    "example_inputs",
]

Rotary = tuple[torch.Tensor, torch.Tensor]
"""Cosine and sine tables of rotary embeddings, each ``[s, head_dim]``."""


class RMSNorm(nn.Module):
    """Root-mean-square normalization with a learned scale and no bias (Zhang & Sennrich 2019)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 so that bf16 activations do not lose the mean-square's precision.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def _norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.hidden_size)
    return nn.LayerNorm(config.hidden_size)


def rotary_tables(seq_length: int, head_dim: int, base: int, like: torch.Tensor) -> Rotary:
    """Cosine and sine tables of rotary position embeddings (Su et al. 2021).

    They are computed in the forward pass rather than stored as buffers: a buffer built on
    the meta device would have no values after the model is materialized, and computing
    them costs next to nothing next to the attention that uses them.
    """
    exponents = torch.arange(0, head_dim, 2, device=like.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponents)
    positions = torch.arange(seq_length, device=like.device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    # Halves rather than interleaved pairs: same rotation up to a fixed permutation of the
    # q/k features, and it needs only slices and a concat.
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(like.dtype), angles.sin().to(like.dtype)


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """Rotate ``x`` (``[b, heads, s, head_dim]``) by its positions' angles."""
    cos, sin = rotary
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v/o projections and grouped-query attention.

    Separate projections let tensor parallelism shard heads by splitting each weight along
    its output (q/k/v) or input (o) dimension, with no slicing of a fused weight.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(h, h, bias=config.bias)
        self.k_proj = nn.Linear(h, kv, bias=config.bias)
        self.v_proj = nn.Linear(h, kv, bias=config.bias)
        self.o_proj = nn.Linear(h, h, bias=config.bias)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        b, s, h = x.shape
        q = self._split_heads(self.q_proj(x), self.num_heads)
        k = self._split_heads(self.k_proj(x), self.num_kv_heads)
        v = self._split_heads(self.v_proj(x), self.num_kv_heads)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, h))

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


class GeluMLP(nn.Module):
    """GPT MLP: hidden -> ffn -> GeLU (tanh approximation) -> hidden."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_size, bias=config.bias)
        self.fc2 = nn.Linear(config.ffn_size, config.hidden_size, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SwiGLUMLP(nn.Module):
    """Llama MLP: down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        h, f = config.hidden_size, config.ffn_size
        self.gate_proj = nn.Linear(h, f, bias=config.bias)
        self.up_proj = nn.Linear(h, f, bias=config.bias)
        self.down_proj = nn.Linear(f, h, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _dense_mlp(config: TransformerConfig) -> nn.Module:
    return SwiGLUMLP(config) if config.activation == "swiglu" else GeluMLP(config)


class MoEMLP(nn.Module):
    """Mixtral-style mixture of experts: softmax router, top-k, renormalized weights.

    Computed densely (every expert on every token); see the module docstring for why.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        assert config.num_experts is not None
        self.top_k = config.moe_top_k
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=config.bias)
        self.experts = nn.ModuleList(_dense_mlp(config) for _ in range(config.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.routing_weights(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + weights[..., e : e + 1] * expert(x)
        return out

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token expert weights ``[b, s, num_experts]``: the top-k routing probabilities,
        renormalized to sum to one as Mixtral does, and zero for unselected experts."""
        probs = F.softmax(self.router(x).float(), dim=-1)
        top, index = probs.topk(self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        # scatter into zeros keeps the shape static: no per-expert token lists.
        return torch.zeros_like(probs).scatter(-1, index, top).to(x.dtype)


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
    """Pre-norm decoder block: x + attn(attn_norm(x)), then + mlp(mlp_norm(x))."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.attn_norm = _norm(config)
        self.attn = Attention(config)
        self.mlp_norm = _norm(config)
        self.mlp = MoEMLP(config) if config.is_moe else _dense_mlp(config)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Decoder-only language model: token ids ``[b, s]`` -> logits ``[b, s, vocab]``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, h)
        if config.position_embedding == "learned":
            assert config.max_position_embeddings is not None
            self.pos_embed = nn.Embedding(config.max_position_embeddings, h)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = _norm(config)
        self.lm_head = LMHead(h, config.vocab_size, tied=config.tie_embeddings)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.embed(input_ids)
        rotary = None
        if self.config.position_embedding == "learned":
            x = x + self.pos_embed(torch.arange(s, device=input_ids.device))
        else:
            rotary = rotary_tables(s, self.config.head_dim, self.config.rotary_base, x)
        for layer in self.layers:
            x = layer(x, rotary)
        return self.lm_head(self.final_norm(x), self.embed.weight)


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
