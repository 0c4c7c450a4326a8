"""A family of transformer-like models drawn from a seed, for planners no test tunes to.

`draw_family(seed, count)` returns `ModelSpec`s: GPT, Llama, BERT-style encoder, ViT,
T5-style encoder-decoder block, an MoE block and an MLP-mixer, with widths, depths, fused
or separate projections, attention by `F.scaled_dot_product_attention` or by hand, batch
and sequence drawn at random, each with a mesh (1-D or 2-D, 4 or 8 devices). `build(spec)`
makes the `nn.Module` and its example input.

Imports torch only: the same module builds the same models in Tessel's environment and in
AutoParallel's (`benchmarks/vs_autoparallel.py`). Every model reads one float tensor of
shape (batch, sequence, width) and returns one of the same leading shape, so both
planners see the same graph: the batch is that tensor's dim 0.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("gpt", "llama", "bert", "vit", "t5", "moe", "mixer")
MESHES = ((4,), (2, 2), (8,), (2, 4))


@dataclass(frozen=True)
class ModelSpec:
    kind: str
    width: int
    heads: int
    depth: int
    ffn_ratio: int
    fused_qkv: bool
    sdpa: bool
    batch: int
    seq: int
    experts: int
    mesh: tuple[int, ...]
    seed: int

    @property
    def name(self) -> str:
        attention = "sdpa" if self.sdpa else "hand"
        qkv = "fused" if self.fused_qkv else "split"
        mesh = "x".join(map(str, self.mesh))
        return (f"{self.kind}-w{self.width}-d{self.depth}-{qkv}-{attention}"
                f"-b{self.batch}s{self.seq}@{mesh}")

    def as_dict(self) -> dict:
        return asdict(self)


def draw_family(seed: int, count: int) -> list[ModelSpec]:
    """`count` specs, kinds in turn (every kind before any repeats), meshes alternating
    1-D and 2-D; everything else drawn from `seed`."""
    rng = random.Random(seed)
    specs = []
    for k in range(count):
        kind = KINDS[k % len(KINDS)]
        heads = rng.choice((2, 4, 8))
        width = heads * rng.choice((16, 32, 48, 64))
        mesh = MESHES[k % len(MESHES)]
        # The batch splits over the whole mesh; the sequence is drawn independently.
        batch = math.prod(mesh) * rng.choice((1, 2, 4))
        specs.append(ModelSpec(
            kind=kind, width=width, heads=heads, depth=rng.choice((1, 2, 3)),
            ffn_ratio=rng.choice((2, 4)), fused_qkv=rng.random() < 0.5,
            sdpa=rng.random() < 0.5, batch=batch, seq=rng.choice((32, 64, 128)),
            experts=rng.choice((2, 4)), mesh=mesh, seed=seed * 1000 + k,
        ))
    return specs


def spec_from_dict(data: dict) -> ModelSpec:
    return ModelSpec(**{**data, "mesh": tuple(data["mesh"])})


def build(spec: ModelSpec, device: str | torch.device = "cpu") -> tuple[nn.Module, torch.Tensor]:
    """The model of `spec` (parameters drawn from its seed) and an example input."""
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = _BUILDERS[spec.kind](spec)
        example = torch.randn(spec.batch, spec.seq, spec.width)
    return model, example


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    """Multi-head attention; `source` (cross-attention) supplies keys and values."""

    def __init__(self, spec: ModelSpec, causal: bool, bias: bool, cross: bool = False) -> None:
        super().__init__()
        w = spec.width
        self.heads, self.causal, self.sdpa = spec.heads, causal, spec.sdpa
        self.fused = spec.fused_qkv and not cross
        if self.fused:
            self.qkv = nn.Linear(w, 3 * w, bias=bias)
        else:
            self.q = nn.Linear(w, w, bias=bias)
            self.k = nn.Linear(w, w, bias=bias)
            self.v = nn.Linear(w, w, bias=bias)
        self.o = nn.Linear(w, w, bias=bias)

    def forward(self, x: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
        source = x if source is None else source
        if self.fused:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q(x), self.k(source), self.v(source)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            # By hand, as many models write it (unmasked: the sharding problem is the same).
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            out = scores.softmax(dim=-1) @ v
        return self.o(out.transpose(1, 2).flatten(-2))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec, gated: bool, bias: bool, act=F.gelu) -> None:
        super().__init__()
        hidden = spec.width * spec.ffn_ratio
        self.gated, self.act = gated, act
        self.up = nn.Linear(spec.width, hidden, bias=bias)
        if gated:
            self.gate = nn.Linear(spec.width, hidden, bias=bias)
        self.down = nn.Linear(hidden, spec.width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.gate(x)) * self.up(x) if self.gated else self.act(self.up(x))
        return self.down(h)


class PreNormBlock(nn.Module):
    """GPT, Llama and ViT blocks: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, spec: ModelSpec, llama: bool, causal: bool) -> None:
        super().__init__()
        norm = (lambda: RMSNorm(spec.width)) if llama else (lambda: nn.LayerNorm(spec.width))
        self.norm1, self.norm2 = norm(), norm()
        self.attn = Attention(spec, causal=causal, bias=not llama)
        self.ffn = FeedForward(spec, gated=llama, bias=not llama,
                               act=F.silu if llama else F.gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class PostNormBlock(nn.Module):
    """BERT: norm(x + attn(x)), then norm(x + ffn(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attn = Attention(spec, causal=False, bias=True)
        self.ffn = FeedForward(spec, gated=False, bias=True)
        self.norm1, self.norm2 = nn.LayerNorm(spec.width), nn.LayerNorm(spec.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class Stack(nn.Module):
    """An input projection, `depth` blocks, a final norm and an output projection."""

    def __init__(self, spec: ModelSpec, block, out_width: int, final_norm: bool) -> None:
        super().__init__()
        self.embed = nn.Linear(spec.width, spec.width)
        self.blocks = nn.ModuleList(block() for _ in range(spec.depth))
        self.norm = nn.LayerNorm(spec.width) if final_norm else nn.Identity()
        self.head = nn.Linear(spec.width, out_width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class T5Block(nn.Module):
    """An encoder block and a decoder block (causal self-attention, cross-attention to
    the encoder's output) on the same input sequence."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        w = spec.width
        self.enc_norm1, self.enc_norm2 = RMSNorm(w), RMSNorm(w)
        self.enc_attn = Attention(spec, causal=False, bias=False)
        self.enc_ffn = FeedForward(spec, gated=False, bias=False, act=F.relu)
        self.dec_norm1, self.dec_norm2, self.dec_norm3 = RMSNorm(w), RMSNorm(w), RMSNorm(w)
        self.dec_self = Attention(spec, causal=True, bias=False)
        self.dec_cross = Attention(spec, causal=False, bias=False, cross=True)
        self.dec_ffn = FeedForward(spec, gated=False, bias=False, act=F.relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        enc = x + self.enc_attn(self.enc_norm1(x))
        enc = enc + self.enc_ffn(self.enc_norm2(enc))
        dec = x + self.dec_self(self.dec_norm1(x))
        dec = dec + self.dec_cross(self.dec_norm2(dec), enc)
        return dec + self.dec_ffn(self.dec_norm3(dec))


class MoEBlock(nn.Module):
    """Attention, then a soft mixture of expert MLPs weighted by a softmax router (dense:
    every token runs every expert, so neither planner needs a dispatch rule)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(spec.width), RMSNorm(spec.width)
        self.attn = Attention(spec, causal=True, bias=False)
        self.router = nn.Linear(spec.width, spec.experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(spec, gated=True, bias=False, act=F.silu) for _ in range(spec.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        gates = self.router(h).softmax(dim=-1)
        mixed = sum(gates[..., e:e + 1] * expert(h) for e, expert in enumerate(self.experts))
        return x + mixed


class MixerBlock(nn.Module):
    """MLP-mixer: an MLP across tokens (on the transposed sequence), then across channels."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(spec.width), nn.LayerNorm(spec.width)
        self.token_up = nn.Linear(spec.seq, spec.seq * 2)
        self.token_down = nn.Linear(spec.seq * 2, spec.seq)
        self.channel = FeedForward(spec, gated=False, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.norm1(x).transpose(1, 2)
        x = x + self.token_down(F.gelu(self.token_up(t))).transpose(1, 2)
        return x + self.channel(self.norm2(x))


def _gpt(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: PreNormBlock(spec, llama=False, causal=True),
                 out_width=4 * spec.width, final_norm=True)


def _llama(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: PreNormBlock(spec, llama=True, causal=True),
                 out_width=4 * spec.width, final_norm=True)


def _bert(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: PostNormBlock(spec), out_width=spec.width, final_norm=False)


def _vit(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: PreNormBlock(spec, llama=False, causal=False),
                 out_width=spec.width // 2, final_norm=True)


def _t5(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: T5Block(spec), out_width=spec.width, final_norm=True)


def _moe(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: MoEBlock(spec), out_width=spec.width, final_norm=True)


def _mixer(spec: ModelSpec) -> nn.Module:
    return Stack(spec, lambda: MixerBlock(spec), out_width=spec.width, final_norm=True)


_BUILDERS = {"gpt": _gpt, "llama": _llama, "bert": _bert, "vit": _vit, "t5": _t5,
             "moe": _moe, "mixer": _mixer}
