"""`plan check` refuses a plan its runtime cannot train on the model before any rank
starts: one line, exit 2 (the check each rank would make, made first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli

pytest.importorskip("transformers")

QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
             "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
             "num_experts_per_tok": 2, "head_dim": 16, "max_position_embeddings": 64,
             "tie_word_embeddings": False}


def test_a_plan_the_runtime_cannot_train_is_refused_before_ranks_start(
        tmp_path: Path, capsys, monkeypatch) -> None:
    import planner.checks.training_check

    def no_ranks(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(planner.checks.training_check, "launch", no_ranks)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_MOE))
    code = cli.main(["check", f"hf:{config}", "--seq-length", "16", "--gpus", "2",
                     "--global-batch-size", "4", "--tensor-model-parallel-size", "2",
                     "--pipeline-model-parallel-size", "1"])
    out = capsys.readouterr()
    assert code == 2
    last = (out.out + out.err).strip().splitlines()[-1]
    assert last.startswith(f"error: hf:{config}: the runtime cannot train this plan: "
                           "tensor parallelism of a Hugging Face qwen3_moe")
