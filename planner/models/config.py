"""Shape of a decoder-only transformer, in Megatron-LM's vocabulary.

Field names follow Megatron-LM's model-shape flags (``--num-layers`` -> ``num_layers``,
``--num-query-groups`` -> ``num_query_groups``, ...) so a config maps one to one onto a
launch line. One config describes the three families the zoo builds (GPT, Llama, Mixtral);
`num_parameters` counts exactly the parameters of the model that
`planner.models.transformer.build_model` makes from it.
"""

from __future__ import annotations

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

    @model_validator(mode="after")
    def _check_shapes(self) -> TransformerConfig:
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
        if h % a:
            problems.append(
                f"hidden_size ({h}) must be divisible by num_attention_heads ({a}); choose "
                f"a hidden_size that is a multiple of {a} or a head count that divides {h}."
            )
        elif self.position_embedding == "rope" and (h // a) % 2:
            problems.append(
                f"rotary embeddings need an even head size, but hidden_size / "
                f"num_attention_heads = {h} / {a} = {h // a}; change either so it is even."
            )
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

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

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
        """Exact parameter count of the model `build_model(self)` makes (tied weights once)."""
        h, v = self.hidden_size, self.vocab_size
        total = v * h  # token embedding
        if self.position_embedding == "learned":
            assert self.max_position_embeddings is not None
            total += self.max_position_embeddings * h
        total += self.num_layers * self.parameters_per_layer()
        total += self._norm_parameters()  # final norm
        if not self.tie_embeddings:
            total += v * h  # LM head; it never has a bias
        return total

    def parameters_per_layer(self) -> int:
        """Parameters of one transformer block (all experts included)."""
        h = self.hidden_size
        kv = self.num_kv_heads * self.head_dim
        # q and o are h x h; k and v shrink to h x kv under grouped-query attention.
        attention = _linear(h, h, self.bias) * 2 + _linear(h, kv, self.bias) * 2
        mlp = self._mlp_parameters()
        if self.num_experts is not None:
            mlp = self.num_experts * mlp + _linear(h, self.num_experts, self.bias)
        return 2 * self._norm_parameters() + attention + mlp

    def expert_parameters_per_layer(self) -> int:
        """Parameters of one block's experts (0 for a dense MLP): the part expert
        parallelism shards."""
        return (self.num_experts or 0) * self._mlp_parameters()

    def _mlp_parameters(self) -> int:
        h, f = self.hidden_size, self.ffn_size
        if self.activation == "swiglu":
            return 2 * _linear(h, f, self.bias) + _linear(f, h, self.bias)
        return _linear(h, f, self.bias) + _linear(f, h, self.bias)

    def _norm_parameters(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size


def _linear(in_features: int, out_features: int, bias: bool) -> int:
    """Parameters of one ``nn.Linear``."""
    return in_features * out_features + (out_features if bias else 0)
