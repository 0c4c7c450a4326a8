"""Small demo models, each a factory returning ``(model, example_inputs)``.

They are written for planning rather than accuracy: every layer that tensor parallelism
would split is its own ``nn.Linear`` (no fused QKV weight), there is no dropout, and
reshapes use sizes read from the input, so ``torch.export`` traces them without guards on
data.  Factories draw weights and inputs from the global RNG; call ``torch.manual_seed``
first for reproducible results.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "GPT", "Block", "CausalSelfAttention", "FeedForward", "mlp", "gpt", "DEMOS"]

Demo = tuple[nn.Module, tuple[torch.Tensor, ...]]


class MLP(nn.Module):
    """Two linear layers with a ReLU between: the column -> row tensor-parallel pattern."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate Q/K/V/O projections.

    Separate projections let tensor parallelism shard heads by splitting each weight along
    its output (Q/K/V) or input (O) dimension, with no slicing of a fused weight.
    """

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        head_dim = h // self.heads

        def split_heads(t: torch.Tensor) -> torch.Tensor:
            # [b, s, h] -> [b, heads, s, head_dim], the layout SDPA expects.
            return t.view(b, s, self.heads, head_dim).transpose(1, 2)

        q = split_heads(self.q_proj(x))
        k = split_heads(self.k_proj(x))
        v = split_heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, s, h)
        return self.o_proj(y)


class FeedForward(nn.Module):
    """Transformer MLP: hidden -> 4*hidden -> GELU (tanh) -> hidden."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer decoder block."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = FeedForward(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT decoder: token + learned position embeddings, blocks, untied LM head."""

    def __init__(self, vocab: int, max_seq_len: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_seq_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Map token ids ``[b, s]`` to logits ``[b, s, vocab]``."""
        b, s = idx.shape
        pos = torch.arange(s, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def mlp(
    batch: int = 8, in_features: int = 1024, hidden: int = 4096, out_features: int = 1024
) -> Demo:
    """Build an :class:`MLP` and an input of shape ``[batch, in_features]``."""
    model = MLP(in_features, hidden, out_features)
    return model, (torch.randn(batch, in_features),)


def gpt(
    batch: int = 2,
    seq_len: int = 16,
    vocab: int = 128,
    hidden: int = 64,
    heads: int = 4,
    layers: int = 2,
) -> Demo:
    """Build a :class:`GPT` and token ids of shape ``[batch, seq_len]``.

    The position table has exactly ``seq_len`` rows, so longer inputs are rejected by the
    embedding lookup rather than silently planned for.
    """
    model = GPT(vocab=vocab, max_seq_len=seq_len, hidden=hidden, heads=heads, layers=layers)
    return model, (torch.randint(0, vocab, (batch, seq_len)),)


#: Demo factories by the name used in ``demo:NAME`` model specs.
DEMOS: dict[str, Callable[[], Demo]] = {"mlp": mlp, "gpt": gpt}
