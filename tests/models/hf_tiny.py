"""Tiny random-weight Hugging Face models for tests (helper module, not a test file).

Each factory builds its config in code (no downloads), seeds the RNG, and returns
``(model, example_inputs, loss_fn)`` in the shape ``planner.models.sources`` accepts, so a test
can use ``tests/models/hf_tiny.py:gpt2`` as a model spec.

Config choices that tracing needs (torch 2.13, transformers 5.x), checked with
``torch.export.export(..., strict=False)`` followed by
``torch.export.experimental._export_forward_backward`` on ``loss_fn(model(x), x)``:

* ``use_cache=False, return_dict=False`` at call time: the cache object and the
  ``ModelOutput`` dataclass are not plain tensors; the wrapper returns the logits only.
* ``tie_word_embeddings=False`` for GPT-2 and Llama: these small models train on gloo
  ranks in the end-to-end tests, where an untied head keeps the expected collectives
  simple; tied weights are traced (and merged back into one parameter) just as well, see
  tests/models/test_hf_configs.py.
* ``attn_implementation="sdpa"``: attention stays one fused op in Tessel's trace (its
  decomposition keeps scaled-dot-product attention whole), so its heads can be split.
* Dropout probabilities are 0 so training-mode runs are deterministic.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from planner.models.huggingface import LogitsOnly, next_token_loss

VOCAB = 128
BATCH, SEQ_LEN = 2, 16

HFTiny = tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., torch.Tensor]]


def _token_ids() -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (BATCH, SEQ_LEN)),)


def gpt2(layers: int = 2) -> HFTiny:
    """A 64-wide GPT-2 with untied embeddings and SDPA attention."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        # GPT-2's defaults (50256) lie outside the tiny vocabulary and trigger a warning.
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    return LogitsOnly(GPT2LMHeadModel(config)), _token_ids(), next_token_loss


def llama(layers: int = 2, key_value_heads: int = 4) -> HFTiny:
    """A 64-wide Llama with 4 query heads (grouped-query attention when
    `key_value_heads` < 4)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=key_value_heads,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LogitsOnly(LlamaForCausalLM(config)), _token_ids(), next_token_loss


def decoder_config_json(layers: int = 2, **fields: Any) -> dict[str, Any]:
    """The config.json fields of a tiny Llama-style decoder, as a Hub folder holds them:
    `layers` blocks 64 wide, 4 query and 2 key/value heads (grouped-query attention),
    vocabulary 128; `fields` added, or replacing these. Mistral, Qwen2 and Mixtral name
    their fields as Llama does."""
    return {
        "num_hidden_layers": layers,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        **fields,
    }


#: Factories by short name, for parametrized tests.
HF_TINY: dict[str, Callable[[], HFTiny]] = {"gpt2": gpt2, "llama": llama}
