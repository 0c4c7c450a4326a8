"""Shape of a decoder-only transformer, in Megatron-LM's vocabulary.

Field names follow Megatron-LM's model-shape flags (``--num-layers`` -> ``num_layers``,
``--num-query-groups`` -> ``num_query_groups``, ...) so a config maps one to one onto a
launch line. One config describes the three families the zoo builds (GPT, Llama, Mixtral);
`num_parameters` counts exactly the parameters of the model that
`planner.models.transformer.build_model` makes from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TransformerConfig(BaseModel):
    """Shape of a decoder-only transformer language model."""

    # Unknown keys are rejected so that a misspelt field fails loudly instead of silently
    # leaving a default in place.
    model_config = ConfigDict(extra="forbid")

    num_layers: int = Field(gt=0, description="Number of transformer blocks (--num-layers).")
    hidden_size: int = Field(gt=0, description="Model width h (--hidden-size).")
    num_attention_heads: int = Field(
        gt=0,
        description="Attention (query) heads; must divide hidden_size (--num-attention-heads).",
    )
    ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        description="Inner width of the MLP (of each expert, for MoE) (--ffn-hidden-size); "
        "defaults to 4 * hidden_size, the GPT choice.",
    )
    num_query_groups: int | None = Field(
        default=None,
        gt=0,
        description="Key/value heads for grouped-query attention (--num-query-groups); must "
        "divide num_attention_heads. None means multi-head attention (one per query head).",
    )
    vocab_size: int = Field(gt=0, description="Rows of the token embedding (--vocab-size).")
    seq_length: int = Field(gt=0, description="Training sequence length s (--seq-length).")
    max_position_embeddings: int | None = Field(
        default=None,
        gt=0,
        description="Longest sequence the model supports (--max-position-embeddings); rows "
        "of the learned position table. Defaults to seq_length.",
    )
    norm: Literal["layernorm", "rmsnorm"] = Field(
        default="layernorm",
        description="Normalization (--normalization): 'layernorm' (weight and bias) or "
        "'rmsnorm' (weight only).",
    )
    activation: Literal["gelu", "swiglu"] = Field(
        default="gelu",
        description="MLP form: 'gelu' (two matrices, tanh GeLU) or 'swiglu' (gate, up and "
        "down matrices) (--swiglu).",
    )
    position_embedding: Literal["learned", "rope"] = Field(
        default="learned",
        description="Positions (--position-embedding-type): a 'learned' absolute table added "
        "to the token embedding, or rotary embeddings 'rope' applied to queries and keys.",
    )
    rotary_base: int = Field(
        default=10000,
        gt=0,
        description="Base (theta) of the rotary frequencies (--rotary-base); used only with "
        "position_embedding='rope'.",
    )
    tie_embeddings: bool = Field(
        default=True,
        description="Share the token embedding with the output layer (Megatron's default; "
        "--untie-embeddings-and-output-weights turns it off).",
    )
    num_experts: int | None = Field(
        default=None,
        gt=0,
        description="Experts per MoE MLP (--num-experts); None means a dense MLP.",
    )
    moe_top_k: int = Field(
        default=2,
        gt=0,
        description="Experts each token is routed to (--moe-router-topk); at most "
        "num_experts. Ignored for dense models.",
    )
    hidden_dropout: float = Field(
        default=0.1, ge=0, lt=1,
        description="Dropout after the attention and MLP outputs (--hidden-dropout; "
        "Megatron-LM's default 0.1). At 0 no mask is made or kept.",
    )
    attention_dropout: float = Field(
        default=0.1, ge=0, lt=1,
        description="Dropout of the attention probabilities (--attention-dropout; "
        "Megatron-LM's default 0.1); kept as a mask only where the scores are written.",
    )
    bias: bool = Field(
        default=True,
        description="Give every Linear layer a bias (off: --disable-bias-linear). Norms are "
        "unaffected: LayerNorm always has a bias, RMSNorm never does.",
    )
    kv_channels: int | None = Field(
        default=None, gt=0,
        description="Width of one attention head (--kv-channels); None: hidden_size / "
        "num_attention_heads. Qwen3 and GPT-OSS set it apart from the hidden size.",
    )
    qk_layernorm: bool = Field(
        default=False,
        description="Normalize each head's queries and keys before attention "
        "(--qk-layernorm; Qwen3's q_norm and k_norm).",
    )
    softmax_type: Literal["vanilla", "learnable"] = Field(
        default="vanilla",
        description="Attention softmax (--softmax-type): 'learnable' adds one learned sink "
        "logit per head to every row's denominator (GPT-OSS's attention sinks).",
    )
    window_size: int | None = Field(
        default=None, gt=0,
        description="Sliding-window attention: each query sees at most this many earlier "
        "tokens (--window-size; the left size). None: full causal attention.",
    )
    window_attn_skip_freq: int | list[int] | None = Field(
        default=None,
        description="Which layers keep full attention under window_size "
        "(--window-attn-skip-freq, as Megatron-LM's is_layer_window_attention reads it): "
        "N makes every N-th layer (1-indexed) full, the others windowed (GPT-OSS: 2); a "
        "list gives 1 (windowed) or 0 (full) per layer. None: every layer windowed.",
    )
    multi_latent_attention: bool = Field(
        default=False,
        description="DeepSeek's multi-latent attention (--multi-latent-attention): keys and "
        "values from a compressed latent of kv_lora_rank, a decoupled rotary part.",
    )
    q_lora_rank: int | None = Field(
        default=None, gt=0,
        description="MLA: rank of the compressed query (--q-lora-rank); None projects "
        "queries straight from the hidden state (DeepSeek-V2-Lite).",
    )
    kv_lora_rank: int = Field(
        default=32, gt=0, description="MLA: rank of the key/value latent (--kv-lora-rank)."
    )
    qk_head_dim: int = Field(
        default=128, gt=0,
        description="MLA: per-head query/key width without rotary (--qk-head-dim).",
    )
    qk_pos_emb_head_dim: int = Field(
        default=64, gt=0,
        description="MLA: per-head rotary query/key width, the key's shared by all heads "
        "(--qk-pos-emb-head-dim).",
    )
    v_head_dim: int = Field(
        default=128, gt=0, description="MLA: per-head value width (--v-head-dim)."
    )
    moe_ffn_hidden_size: int | None = Field(
        default=None, gt=0,
        description="Inner width of each routed expert (--moe-ffn-hidden-size); None: "
        "ffn_hidden_size. ffn_hidden_size is then the dense layers' width.",
    )
    moe_shared_expert_intermediate_size: int | None = Field(
        default=None, gt=0,
        description="Inner width of the shared experts every token also runs, all of them "
        "together (--moe-shared-expert-intermediate-size); None: no shared expert.",
    )
    moe_layer_freq: int | list[int] = Field(
        default=1,
        description="Which layers are MoE (--moe-layer-freq): N makes layers 0, N, 2N, ... "
        "MoE and the others dense; a list gives 1 (MoE) or 0 (dense) per layer, e.g. "
        "DeepSeek-V3's three dense layers first.",
    )
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field(
        default="softmax",
        description="Router scores (--moe-router-score-function): softmax (Mixtral, Qwen3) "
        "or sigmoid with a load-balancing expert bias (DeepSeek-V3).",
    )
    moe_router_num_groups: int | None = Field(
        default=None, gt=0,
        description="Group-limited routing: experts fall into this many groups "
        "(--moe-router-num-groups; DeepSeek-V3: 8, one per node of its expert-parallel "
        "layout).",
    )
    moe_router_group_topk: int | None = Field(
        default=None, gt=0,
        description="Group-limited routing: each token's experts come from at most this "
        "many groups (--moe-router-group-topk; DeepSeek-V3: 4 nodes).",
    )
    mtp_num_layers: int = Field(
        default=0, ge=0,
        description="Multi-token prediction layers after the last block (--mtp-num-layers): "
        "each predicts one more token ahead through its own block and the shared head.",
    )
    qkv_bias: bool = Field(
        default=False,
        description="Give the query, key and value projections a bias even where `bias` is "
        "off (--add-qkv-bias; Qwen2). Output projection and MLP follow `bias`.",
    )
    parallel_residual: bool = Field(
        default=False,
        description="Attention and MLP both read the block's input and their outputs are "
        "added to it together (GPT-J, GPT-NeoX's use_parallel_residual), instead of the MLP "
        "reading the attention's residual sum. Same parameters and collectives.",
    )
    rotary_percent: float = Field(
        default=1.0, gt=0, le=1,
        description="Fraction of each head's query/key width that rotary embeddings rotate "
        "(--rotary-percent; GPT-NeoX's partial_rotary_factor); the rest passes unrotated.",
    )
    apply_layernorm_1p: bool = Field(
        default=False,
        description="Norms scale by (1 + weight), their weights zero-centred "
        "(--apply-layernorm-1p; Gemma's RMSNorm). Same parameters.",
    )
    sandwich_norms: bool = Field(
        default=False,
        description="Each block also normalizes its attention's and its MLP's output before "
        "adding it to the residual (Gemma 2's post_attention_layernorm and "
        "post_feedforward_layernorm): two more norms per block.",
    )
    attention_softcap: float | None = Field(
        default=None, gt=0,
        description="Attention scores soft-capped to (-cap, cap) as cap x tanh(score / cap) "
        "before the softmax (Gemma 2's attn_logit_softcapping); None: not capped.",
    )
    final_logit_softcap: float | None = Field(
        default=None, gt=0,
        description="The output logits soft-capped likewise (Gemma 2's "
        "final_logit_softcapping); None: not capped.",
    )
    scale_embeddings: bool = Field(
        default=False,
        description="Token embeddings multiplied by sqrt(hidden_size) before the first block "
        "(Gemma's scaled embedding). No parameter.",
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> TransformerConfig:
        """Fill Megatron's defaults, then refuse an inconsistent shape (`_shape_problems`)."""
        # Megatron fills these two defaults in its argument validation; doing it here means
        # every consumer (model builder, cost model, flag export) reads a concrete number.
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        problems = self._shape_problems()
        if problems:
            # All at once, so a config with two mistakes needs one round trip, not two.
            raise ValueError(" ".join(problems))
        return self

    def _shape_problems(self) -> list[str]:
        """One sentence per inconsistency: the bad value and how to fix it."""
        h, a, g = self.hidden_size, self.num_attention_heads, self.num_kv_heads
        problems = []
        own_width = self.kv_channels is not None or self.multi_latent_attention
        if h % a and not own_width:
            problems.append(
                f"hidden_size ({h}) must be divisible by num_attention_heads ({a}); choose "
                f"a hidden_size that is a multiple of {a}, a head count that divides {h}, "
                f"or set kv_channels."
            )
        elif self.position_embedding == "rope" and not self.multi_latent_attention \
                and self.head_dim % 2:
            problems.append(
                f"rotary embeddings need an even head size, but it is {self.head_dim}; "
                f"change kv_channels or hidden_size / num_attention_heads so it is even."
            )
        problems += self._mla_problems() + self._moe_problems()
        for name in ("moe_layer_freq", "window_attn_skip_freq"):
            pattern = getattr(self, name)
            if isinstance(pattern, list) and (len(pattern) != self.num_layers
                                              or set(pattern) - {0, 1}):
                problems.append(
                    f"{name} as a list needs one 0 or 1 per layer, {self.num_layers} in all; "
                    f"it has {len(pattern)} entries: give one per layer.")
            elif isinstance(pattern, int) and pattern < 1:
                problems.append(f"{name} ({pattern}) must be 1 or more.")
        if a % g:
            problems.append(
                f"num_attention_heads ({a}) must be divisible by num_query_groups ({g}); "
                f"choose a num_query_groups that divides {a}."
            )
        if self.num_experts is not None and self.moe_top_k > self.num_experts:
            problems.append(
                f"moe_top_k ({self.moe_top_k}) cannot exceed num_experts "
                f"({self.num_experts}); route each token to at most {self.num_experts} experts."
            )
        assert self.max_position_embeddings is not None
        if self.position_embedding == "learned" and self.seq_length > self.max_position_embeddings:
            problems.append(
                f"seq_length ({self.seq_length}) exceeds max_position_embeddings "
                f"({self.max_position_embeddings}), the rows of the learned position table; "
                f"raise max_position_embeddings or shorten seq_length."
            )
        return problems

    def _mla_problems(self) -> list[str]:
        if not self.multi_latent_attention:
            return []
        h = self.hidden_size
        return [
            f"{name} ({rank}) must be smaller than hidden_size ({h}): the latent compresses "
            f"the hidden state; choose a rank below {h}."
            for name, rank in (("q_lora_rank", self.q_lora_rank),
                               ("kv_lora_rank", self.kv_lora_rank))
            if rank is not None and rank >= h
        ]

    def _moe_problems(self) -> list[str]:
        problems = []
        experts, groups, topk = self.num_experts, self.moe_router_num_groups, \
            self.moe_router_group_topk
        moe_only = [name for name in ("moe_ffn_hidden_size",
                                      "moe_shared_expert_intermediate_size",
                                      "moe_router_num_groups") if getattr(self, name)]
        if experts is None and moe_only:
            problems.append(f"{', '.join(moe_only)} describe experts, and num_experts is "
                            f"not set; set num_experts or drop them.")
        if experts is not None and groups is not None and experts % groups:
            problems.append(f"moe_router_num_groups ({groups}) must divide num_experts "
                            f"({experts}).")
        if topk is not None and (groups is None or topk > groups):
            problems.append(f"moe_router_group_topk ({topk}) needs moe_router_num_groups of "
                            f"at least {topk}.")
        return problems

    def beyond_zoo(self) -> list[str]:
        """The fields set away from their defaults that the zoo transformer does not build
        (Hugging Face models that have them run them through their own modules)."""
        return [name for name in _BEYOND_ZOO
                if getattr(self, name) != type(self).model_fields[name].default]

    @property
    def head_dim(self) -> int:
        """Width of one attention head's queries and keys (MLA: without the rotary part)."""
        if self.multi_latent_attention:
            return self.qk_head_dim
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_width(self) -> int:
        """Width of all heads' queries (and keys, under MLA): heads x query head width."""
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """Width of all heads' attention outputs, what the output projection reads."""
        if self.multi_latent_attention:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def expert_ffn_size(self) -> int:
        """Inner width of one routed expert (`moe_ffn_hidden_size`, else `ffn_size`)."""
        return self.moe_ffn_hidden_size or self.ffn_size

    def moe_layers(self) -> list[bool]:
        """Whether each layer's MLP is a mixture of experts (Megatron-LM's moe_layer_freq)."""
        if self.num_experts is None:
            return [False] * self.num_layers
        if isinstance(self.moe_layer_freq, list):
            return [bool(x) for x in self.moe_layer_freq]
        return [i % self.moe_layer_freq == 0 for i in range(self.num_layers)]

    def windowed_layers(self) -> list[bool]:
        """Whether each layer attends through the sliding window (Megatron-LM's
        `is_layer_window_attention`, layers counted from 1 there)."""
        freq = self.window_attn_skip_freq
        if self.window_size is None:
            return [False] * self.num_layers
        if freq is None:
            return [True] * self.num_layers
        if isinstance(freq, list):
            return [bool(x) for x in freq]
        return [(i + 1) % freq != 0 for i in range(self.num_layers)]

    def layer_kinds(self) -> list[LayerKind]:
        """The kind of each of the `num_layers` blocks (MTP layers not included)."""
        return [LayerKind(moe, self.window_size if window else None)
                for moe, window in zip(self.moe_layers(), self.windowed_layers())]

    def mtp_kind(self) -> LayerKind:
        """The block of each multi-token-prediction layer: the last layer's kind, as
        Megatron-LM's MTP spec reuses the decoder's last layer spec."""
        last = self.num_layers - 1
        moe, freq = self.num_experts is not None, self.moe_layer_freq
        moe = moe and (bool(freq[last]) if isinstance(freq, list) else last % freq == 0)
        window, skip = self.window_size, self.window_attn_skip_freq
        if window is not None and skip is not None:
            full = not skip[last] if isinstance(skip, list) else (last + 1) % skip == 0
            window = None if full else window
        return LayerKind(moe, window)

    def for_layer(self, kind: LayerKind) -> TransformerConfig:
        """This model with every layer of `kind`: what a cost per layer reads."""
        return self.model_copy(update={
            "num_experts": self.num_experts if kind.moe else None,
            "moe_layer_freq": 1,
            "window_size": kind.window,
            "window_attn_skip_freq": None,
            "mtp_num_layers": 0,
        })

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: num_query_groups, or one per query head for multi-head attention."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """`ffn_hidden_size` as a plain int (the validator always fills it in)."""
        assert self.ffn_hidden_size is not None
        return self.ffn_hidden_size

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts is not None

    def num_parameters(self) -> int:
        """Exact parameter count of the model `build_model(self)` makes (tied weights once),
        multi-token-prediction layers included."""
        return self._count(active=False)

    def num_active_parameters(self) -> int:
        """Parameters one token passes through: of each MoE layer's routed experts only its
        top-k (DeepSeek-V3: 37B of 671B, as its report counts, MTP excluded)."""
        return round(self._count(active=True, mtp=False))

    def _count(self, active: bool, mtp: bool = True) -> int:
        h, v = self.hidden_size, self.vocab_size
        total = v * h  # token embedding
        if self.position_embedding == "learned":
            assert self.max_position_embeddings is not None
            total += self.max_position_embeddings * h
        kinds = self.layer_kinds() + ([self.mtp_kind()] * self.mtp_num_layers if mtp else [])
        for kind in kinds:
            total += self.layer_parameters(kind)
            if active and kind.moe:
                total -= self.layer_expert_parameters(kind) * (
                    1 - self.moe_top_k / (self.num_experts or 1))
        if mtp:
            total += self.mtp_num_layers * self.mtp_extra_parameters()
        total += self._norm_parameters()  # final norm
        if not self.tie_embeddings:
            total += v * h  # LM head; it never has a bias
        return total

    def kind_counts(self) -> list[tuple[LayerKind, int]]:
        """Each kind of block and how many of the `num_layers` are of it, in order of first
        appearance (computed once per config: searches ask it for every layout)."""
        found = _KIND_COUNTS.get(id(self))
        if found is None or found[0] is not self:
            if len(_KIND_COUNTS) > 10_000:
                _KIND_COUNTS.clear()
            found = (self, list(Counter(self.layer_kinds()).items()))
            _KIND_COUNTS[id(self)] = found
        return found[1]

    def mtp_extra_parameters(self) -> int:
        """Parameters of one multi-token-prediction layer beyond its block: two input
        norms, the 2h -> h projection and its final norm (Megatron-Core's
        MultiTokenPredictionLayer; embedding and head are the model's own)."""
        return 3 * self._norm_parameters() + 2 * self.hidden_size * self.hidden_size

    def parameters_per_layer(self) -> float:
        """Parameters of one transformer block, all experts included; the mean over the
        layers where they differ (dense and MoE layers mixed)."""
        return self._per_layer()[0]

    def expert_parameters_per_layer(self) -> float:
        """Parameters of one block's routed experts (0 for a dense MLP), the mean over the
        layers: the part expert parallelism shards."""
        return self._per_layer()[1]

    def _per_layer(self) -> tuple[float, float]:
        found = _PER_LAYER.get(id(self))
        if found is None or found[0] is not self:
            if len(_PER_LAYER) > 10_000:
                _PER_LAYER.clear()
            counts = self.kind_counts()
            found = (self, (
                sum(self.layer_parameters(k) * n for k, n in counts) / self.num_layers,
                sum(self.layer_expert_parameters(k) * n for k, n in counts) / self.num_layers))
            _PER_LAYER[id(self)] = found
        return found[1]

    def layer_parameters(self, kind: LayerKind) -> int:
        """Parameters of one block of `kind` (all its experts included)."""
        h = self.hidden_size
        mlp = self._mlp_parameters(self.ffn_size)
        if kind.moe:
            assert self.num_experts is not None
            mlp = self.layer_expert_parameters(kind) + _linear(h, self.num_experts, self.bias)
            if self.moe_shared_expert_intermediate_size:
                mlp += self._mlp_parameters(self.moe_shared_expert_intermediate_size)
        norms = 4 if self.sandwich_norms else 2
        return norms * self._norm_parameters() + self._attention_parameters() + mlp

    def layer_expert_parameters(self, kind: LayerKind) -> int:
        """Parameters of the routed experts of one block of `kind` (0 if dense)."""
        if not kind.moe:
            return 0
        return (self.num_experts or 0) * self._mlp_parameters(self.expert_ffn_size)

    def _attention_parameters(self) -> int:
        h, a, bias = self.hidden_size, self.num_attention_heads, self.bias
        if self.multi_latent_attention:
            # Megatron-Core's MLASelfAttention: queries straight from h or through a
            # normed rank-q_lora_rank latent; keys and values from one rank-kv_lora_rank
            # latent (normed) plus the rotary key shared by the heads; no biases.
            if self.q_lora_rank is None:
                total = h * self.query_width
            else:
                total = h * self.q_lora_rank + self._rms_or_layer(self.q_lora_rank) \
                    + self.q_lora_rank * self.query_width
            total += h * (self.kv_lora_rank + self.qk_pos_emb_head_dim)
            total += self._rms_or_layer(self.kv_lora_rank)
            total += self.kv_lora_rank * a * (self.qk_head_dim + self.v_head_dim)
            return total + self.value_width * h
        kv = self.num_kv_heads * self.head_dim
        # q and o are h x (heads x d); k and v shrink to kv under grouped-query attention.
        total = _linear(h, self.query_width, bias) + _linear(self.value_width, h, bias) \
            + _linear(h, kv, bias) * 2
        if self.qkv_bias and not bias:
            total += self.query_width + 2 * kv
        if self.qk_layernorm:
            total += 2 * self._rms_or_layer(self.head_dim)
        if self.softmax_type == "learnable":
            total += a  # one sink logit per head
        return total

    def _mlp_parameters(self, ffn: int) -> int:
        h = self.hidden_size
        if self.activation == "swiglu":
            return 2 * _linear(h, ffn, self.bias) + _linear(ffn, h, self.bias)
        return _linear(h, ffn, self.bias) + _linear(ffn, h, self.bias)

    def _norm_parameters(self) -> int:
        return self._rms_or_layer(self.hidden_size)

    def _rms_or_layer(self, width: int) -> int:
        return 2 * width if self.norm == "layernorm" else width


@dataclass(frozen=True)
class LayerKind:
    """What sets one block apart from the others of a model: its MLP and its attention."""

    moe: bool
    """Whether its MLP is a mixture of experts (else dense)."""
    window: int | None = None
    """Its sliding attention window, or None for full causal attention."""

    @property
    def short(self) -> str:
        """E.g. ``moe``, ``dense/w128``."""
        return ("moe" if self.moe else "dense") + (f"/w{self.window}" if self.window else "")


_BEYOND_ZOO = ("qkv_bias", "parallel_residual", "rotary_percent", "apply_layernorm_1p",
               "sandwich_norms", "attention_softcap", "final_logit_softcap",
               "scale_embeddings")
"""Fields describing Hugging Face architectures the zoo transformer does not build."""
_KIND_COUNTS: dict[int, tuple[TransformerConfig, list[tuple[LayerKind, int]]]] = {}
"""`kind_counts` by config id (the config held, so its id stays its own); configs are
copied when they change (`model_copy`), never changed in place."""
_PER_LAYER: dict[int, tuple[TransformerConfig, tuple[float, float]]] = {}
"""`_per_layer` by config id, likewise."""


def _linear(in_features: int, out_features: int, bias: bool) -> int:
    """Parameters of one ``nn.Linear``."""
    return in_features * out_features + (out_features if bias else 0)
