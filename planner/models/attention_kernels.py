"""The zoo transformer's primitives that depend on no config: RMSNorm, rotary position
embeddings, and causal (optionally windowed, optionally with softmax sinks) attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "Rotary", "apply_rotary", "attention_core", "attention_mask",
           "rotary_tables"]

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


def attention_mask(
    positions: torch.Tensor, keys: int, window: int | None
) -> torch.Tensor | None:
    """Boolean mask ``[queries, keys]`` (True: attend) of queries at `positions` over keys
    0..keys-1: causal, and with `window` each query sees itself and at most `window`
    earlier keys (Megatron-LM's window_size (w, 0))."""
    key_positions = torch.arange(keys, device=positions.device)[None, :]
    mask = key_positions <= positions[:, None]
    if window is not None:
        mask = mask & (key_positions >= positions[:, None] - window)
    return mask


def attention_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v over ``[b, heads, s, d]``: causal without `mask`.

    With `sinks` (one logit per head, GPT-OSS's attention sinks) each row's softmax also
    counts ``exp(sink)`` in its denominator, as transformers' GPT-OSS eager attention
    does: the scores are written out (SDPA has no sink term)."""
    if sinks is None:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, heads, s, d = q.shape
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    if mask is None:
        mask = attention_mask(torch.arange(s, device=q.device), k.shape[2], None)
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(1, heads, 1, 1).expand(b, heads, s, 1).to(scores.dtype)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1).float(), dim=-1)
    return probs[..., :-1].to(v.dtype) @ v


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
