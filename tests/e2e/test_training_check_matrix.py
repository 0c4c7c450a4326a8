"""`plan check MODEL --gpus N` over the parallel layouts a training plan takes, for a zoo
GPT, a zoo Llama and a Hugging Face Llama: every plan trains as one process does (losses
and parameters within 1e-4), every rank issues exactly the collectives the Plan predicts
(count and bytes per kind) and holds the model state it predicts (within 1%)."""

from __future__ import annotations

import json

import pytest

from planner import cli

SHAPE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16"]
HF_LLAMA = {  # 4 key/value heads, so tensor parallelism 4 splits them
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}


def _degrees(tp: int, pp: int, *more: str) -> list[str]:
    return ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size",
            str(pp), *more]


# (gpus, knobs, the plan's (tensor, pipeline, data, zero, schedule, recompute, sp))
LAYOUTS = {
    "pp2-dp2-tp2-1f1b-zero0": (8, _degrees(2, 2, "--schedule", "1f1b", "--zero-stage", "0"),
                               (2, 2, 2, 0, "1f1b", "none")),
    "pp2-tp2-dp2-interleaved": (8, _degrees(2, 2, "--num-layers-per-virtual-pipeline-stage",
                                            "1"), (2, 2, 2, None, "interleaved", "none")),
    "pp4-dp2-gpipe": (8, _degrees(1, 4, "--schedule", "gpipe"),
                      (1, 4, 2, None, "gpipe", "none")),
    "tp2-dp4-sequence-parallel": (8, _degrees(2, 1, "--sequence-parallel"),
                                  (2, 1, 4, None, None, "none")),
    "dp8-zero1": (8, _degrees(1, 1, "--zero-stage", "1"), (1, 1, 8, 1, None, "none")),
    "dp8-zero2": (8, _degrees(1, 1, "--zero-stage", "2"), (1, 1, 8, 2, None, "none")),
    "dp8-zero3": (8, _degrees(1, 1, "--zero-stage", "3"), (1, 1, 8, 3, None, "none")),
    "pp2-dp4-zero1-full": (8, _degrees(1, 2, "--zero-stage", "1", "--recompute-granularity",
                                       "full"), (1, 2, 4, 1, None, "full")),
    "tp4-dp2-selective": (8, _degrees(4, 1, "--recompute-granularity", "selective"),
                          (4, 1, 2, None, None, "selective")),
}
MODELS = ("gpt", "llama", "hf-llama")
# Where every state (parameters, gradients, optimizer) is compared with the Plan.
MEMORY_CASES = {"pp2-dp2-tp2-1f1b-zero0", "dp8-zero3"}


def _check(argv: list[str], tmp_path, capsys) -> dict:
    report = tmp_path / "check.json"
    code = cli.main(["check", *argv, "--steps", "2", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out and "match the plan's" in out, out
    return json.loads(report.read_text())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", MODELS)
def test_a_training_plan_runs_as_predicted(model: str, layout: str, tmp_path, capsys) -> None:
    gpus, knobs, expected = LAYOUTS[layout]
    if model == "hf-llama":
        config = tmp_path / "config.json"
        config.write_text(json.dumps(HF_LLAMA))
        spec = [f"hf:{config}", "--seq-length", "16"]
    else:
        spec = [model, *SHAPE]
    data = _check([*spec, "--gpus", str(gpus), "--global-batch-size", "16", *knobs],
                  tmp_path, capsys)
    plan, check, comparison = data["plan"], data["details"]["check"], data["details"]["comparison"]
    p = plan["parallel"]
    assert plan["cluster"] == "cpu" and plan["precision"] == "fp32"  # plan check's defaults
    tensor, pipeline, dp, zero, schedule, recompute = expected
    assert (p["tensor"], p["pipeline"], p["data"]) == (tensor, pipeline, dp)
    assert zero is None or p["zero_stage"] == zero
    assert schedule is None or plan["schedule"] == schedule
    assert plan["recompute"] == recompute
    if "--sequence-parallel" in knobs:
        assert p["sequence_parallel"]
    assert check["loss_max_rel_error"] < 1e-4 and check["parameter_rel_error"] < 1e-4
    assert check["losses"][1] != check["losses"][0]
    # Every rank's collectives equal the plan's, kind by kind (the check exits 1 else).
    assert comparison["passed"] and comparison["measured"] == comparison["predicted"]
    if pipeline > 1:
        assert all("send" in kinds for kinds in comparison["measured"])
    if layout in MEMORY_CASES:
        rows = comparison["memory"]
        assert len(rows) == 3 * gpus and not any(row["note"] for row in rows)
        for row in rows:
            assert abs(row["measured"] - row["predicted"]) <= 0.01 * row["predicted"], row
    if model == "hf-llama":
        assert "model.layers.0.self_attn.q_proj.weight" in plan["stages"][0]["parameters"]


@pytest.mark.timeout(300)
def test_a_mixtral_plan_with_expert_parallelism_runs_as_predicted(tmp_path, capsys) -> None:
    data = _check(["mixtral", *SHAPE, "--num-experts", "4", "--gpus", "4",
                   "--global-batch-size", "8", "--expert-model-parallel-size", "2",
                   *_degrees(1, 1)], tmp_path, capsys)
    assert data["plan"]["parallel"]["expert"] == 2
    comparison = data["details"]["comparison"]
    assert comparison["passed"] and comparison["measured"] == comparison["predicted"]
    # Tokens travel over the expert group: all-gathered and reduce-scattered.
    assert {"all_gather", "reduce_scatter"} <= set(comparison["measured"][0])
