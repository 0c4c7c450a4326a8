"""planner.models.hf_shape: a config.json that states its whole shape is read without
transformers (and so without torch), to the same zoo shape transformers' config gives;
any other goes through transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from planner.models.hf_shape import (  # noqa: E402
    default_seq_length,
    hf_num_layers,
    plain_config,
    read_config_fields,
    to_transformer_config,
)
from planner.models.huggingface import load_hf_config  # noqa: E402

LLAMA = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
         "max_position_embeddings": 8192, "tie_word_embeddings": False}
FULL = {
    "gpt2": {"model_type": "gpt2", "n_layer": 4, "n_embd": 64, "n_head": 4, "n_inner": 192,
             "vocab_size": 128, "n_positions": 64, "tie_word_embeddings": True,
             "bos_token_id": 127, "eos_token_id": 127},
    "llama": {"model_type": "llama", **LLAMA, "rope_theta": 500000.0},
    "mistral": {"model_type": "mistral", **LLAMA, "rope_theta": 1000000.0,
                "sliding_window": None},
    "mixtral": {"model_type": "mixtral", **LLAMA, "num_local_experts": 4,
                "num_experts_per_tok": 2, "rope_parameters": {"rope_theta": 1e6,
                                                              "rope_type": "default"}},
}


def _write(folder: Path, fields: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder / "config.json"


@pytest.mark.parametrize("family", list(FULL))
def test_a_whole_shape_reads_as_transformers_reads_it(family: str, tmp_path: Path) -> None:
    file = _write(tmp_path, FULL[family])
    plain = plain_config(read_config_fields(file)[1])
    assert plain is not None
    full = load_hf_config(file)
    assert to_transformer_config(plain, 32) == to_transformer_config(full, 32)
    assert hf_num_layers(plain) == hf_num_layers(full) == 4
    assert default_seq_length(plain) == default_seq_length(full)


@pytest.mark.parametrize("change", [
    {"tie_word_embeddings": None},  # left to the family's default
    {"rope_theta": None},
    {"num_key_value_heads": True},  # a bool is no head count
    {"hidden_size": 66},  # heads do not divide it: transformers says so
    {"num_experts": 4},  # another name for a field: transformers resolves it
    {"layer_types": ["full_attention"] * 4},
    {"model_type": "qwen2"},  # derives per-layer attention types
])
def test_any_other_config_is_left_to_transformers(change: dict[str, Any]) -> None:
    fields = {**FULL["llama"], **change}
    fields = {k: v for k, v in fields.items() if v is not None}
    assert plain_config(fields) is None


def test_an_hf_training_plan_is_the_one_transformers_config_gives(tmp_path: Path) -> None:
    from planner import cli

    plans = []
    # A null layer_types means what its absence does, but only transformers says so.
    for folder, fields in (("plain", FULL["llama"]),
                           ("via-transformers", {**FULL["llama"], "layer_types": None})):
        config = _write(tmp_path / folder / "m", fields)
        out = tmp_path / f"{folder}.json"
        assert cli.main([f"hf:{config.parent}", "--seq-length", "64", "--cluster", "dgx-h100",
                         "--gpus", "8", "--global-batch-size", "16", "--json", str(out)]) == 0
        plans.append(json.loads(out.read_text()))
    assert plans[0]["megatron_flags"] == plans[1]["megatron_flags"]
    assert plans[0]["predicted"] == plans[1]["predicted"]
