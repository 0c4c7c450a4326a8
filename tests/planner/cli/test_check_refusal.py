"""`plan check` plans only what its runtime runs on the model, before any rank starts: the
knobs the runtime runs one value of are fixed before the search (one note line), a flag
given with another value is refused in one line (exit 2) before the search, the best
ranked plan the runtime runs is the one trained (a note names the faster one passed
over), and a plan none of whose candidates run is refused in one line. An hf: DeepSeek-V3
is planned as transformers builds it: no multi-token-prediction layer, with a note.
No rank starts here: the launch is stopped where it would start them."""

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
MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 32,
           "num_local_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "max_position_embeddings": 64, "tie_word_embeddings": False}
PHI3 = {"model_type": "phi3", "num_hidden_layers": 4, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 64, "intermediate_size": 128, "tie_word_embeddings": False,
        "rope_theta": 1e4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}
DEEPSEEK_V3_MTP = {  # tests/e2e/test_moe_plan_check.py's, with one MTP layer
    "model_type": "deepseek_v3", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "routed_scaling_factor": 1.0, "kv_lora_rank": 16,
    "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8,
    "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "max_position_embeddings": 64, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}


class _Launched(BaseException):
    """Raised where the check would start its ranks (past the CLI's error handler)."""

    def __init__(self, config, spec) -> None:
        super().__init__()
        self.config, self.spec = config, spec


@pytest.fixture
def no_ranks(monkeypatch):
    """The launch of the ranks stopped: `_Launched` carries the model shape and the
    RunSpec it was given."""
    import planner.checks.training_check

    def stop(fn, world, config, spec, *args, **kwargs):
        raise _Launched(config, spec)

    monkeypatch.setattr(planner.checks.training_check, "launch", stop)


def _check(tmp_path: Path, fields: dict, *flags: str) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(fields))
    return ["check", f"hf:{config}", "--seq-length", "16", "--steps", "1", *flags]


def _notes(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("note: ")]


def test_a_plan_the_runtime_cannot_train_is_refused_before_ranks_start(
        tmp_path: Path, capsys, no_ranks) -> None:
    """Tensor parallelism of a Hugging Face MoE needs expert parallelism, which 2 ranks of
    tensor degree 2 leave no room for: no candidate runs."""
    argv = _check(tmp_path, QWEN3_MOE, "--gpus", "2", "--global-batch-size", "4",
                  "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1")
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 2
    last = (out.out + out.err).strip().splitlines()[-1]
    assert last.startswith(f"error: {argv[1]}: the runtime cannot train "), last
    assert ("tensor parallelism of a Hugging Face qwen3_moe runs with expert parallelism "
            "(its experts split over the tensor ranks, dispatched all-to-all); expert "
            "parallelism 1 is not run yet.") in last


@pytest.mark.parametrize("flags, line", [
    (["--moe-token-dispatcher-type", "allgather"],
     "error: --moe-token-dispatcher-type allgather: a Hugging Face MoE model runs the "
     "alltoall token dispatcher; give --moe-token-dispatcher-type alltoall or leave it to "
     "plan check"),
    (["--context-parallel-size", "2"],
     "error: --context-parallel-size 2: context parallelism runs on zoo models only, not on "
     "a Hugging Face model yet; give --context-parallel-size 1 or leave it to plan check"),
])
def test_a_flag_the_runtime_does_not_run_is_refused_before_the_search(
        tmp_path: Path, capsys, no_ranks, flags: list[str], line: str) -> None:
    code = cli.main(_check(tmp_path, QWEN3_MOE, "--gpus", "4", "--global-batch-size", "4",
                           *flags))
    out = capsys.readouterr()
    assert code == 2
    assert (out.out + out.err).strip().splitlines() == [line]  # nothing searched


def test_the_dispatcher_the_runtime_runs_is_fixed_before_the_search(
        tmp_path: Path, capsys, no_ranks) -> None:
    """Mixtral with expert parallelism and no dispatcher given: the all-to-all one is
    searched and trained (the search alone would pick allgather), and without forced
    balance a note says how its routing-dependent bytes are compared."""
    with pytest.raises(_Launched) as launched:
        cli.main(_check(tmp_path, MIXTRAL, "--gpus", "2", "--global-batch-size", "4",
                        "--expert-model-parallel-size", "2"))
    assert launched.value.spec.expert_dispatcher == "alltoall"
    notes = _notes(capsys.readouterr().out)
    assert notes[0] == (
        "note: fixed for the search, as the runtime runs this model: --context-parallel-size"
        " 1 (context parallelism runs on zoo models only, not on a Hugging Face model yet); "
        "--moe-token-dispatcher-type alltoall (a Hugging Face MoE model runs the alltoall "
        "token dispatcher)")
    assert notes[1].startswith("note: the routing decides each rank's all-to-all bytes "
                               "(--moe-router-force-load-balancing makes them exact per rank)")


def test_the_best_plan_the_runtime_runs_is_the_one_trained(
        tmp_path: Path, capsys, no_ranks) -> None:
    """Phi-3's fused projections split per head are not also ZeRO-sharded: the fastest
    plan (ZeRO-1) is passed over, with a note, for the best without ZeRO."""
    with pytest.raises(_Launched) as launched:
        cli.main(_check(tmp_path, PHI3, "--gpus", "4", "--global-batch-size", "8",
                        "--tensor-model-parallel-size", "2"))
    spec = launched.value.spec
    assert (spec.degrees.tp, spec.zero_stage) == (2, 0)
    notes = _notes(capsys.readouterr().out)
    assert notes[-1] == (
        "note: the runtime does not run the faster plan (t2 p1 d2 mb4 zero1: a Hugging Face "
        "phi3's fused self_attn.qkv_proj, mlp.gate_up_proj, split per head under tensor "
        "parallelism, is not also ZeRO-sharded yet; run it with --zero-stage 0 or "
        "--tensor-model-parallel-size 1); checking the best it runs")


def test_an_hf_deepseek_v3_is_planned_without_the_mtp_layer_transformers_does_not_build(
        tmp_path: Path, capsys, no_ranks) -> None:
    """`plan check` counts no MTP layer, with a note; `plan` (Megatron-LM, which builds
    them) still counts the config's."""
    from transformers import DeepseekV3Config

    from planner.models.hf_shape import as_transformers_builds, to_transformer_config

    config = DeepseekV3Config.from_dict(DEEPSEEK_V3_MTP)
    built, note = as_transformers_builds(config)
    assert note == ("transformers' DeepseekV3ForCausalLM builds no multi-token-prediction "
                    "layer, so the plan counts none of the config's 1 "
                    "(num_nextn_predict_layers; Megatron-LM builds them, and a plan for it "
                    "counts them)")
    assert to_transformer_config(built, 16).mtp_num_layers == 0
    assert to_transformer_config(config, 16).mtp_num_layers == 1  # as `plan` reads it
    assert config.num_mtp_layers == 1  # the config itself is left as read
    assert as_transformers_builds(DeepseekV3Config.from_dict(
        {**DEEPSEEK_V3_MTP, "num_nextn_predict_layers": 0}))[1] == ""
    with pytest.raises(_Launched) as launched:
        cli.main(_check(tmp_path, DEEPSEEK_V3_MTP, "--gpus", "4", "--global-batch-size",
                        "4", "--expert-model-parallel-size", "2"))
    assert launched.value.config.mtp_num_layers == 0
    assert _notes(capsys.readouterr().out)[0] == f"note: {note}"
    # `plan --engine tessel` (Tessel's runtime) counts what transformers builds too;
    # `plan` for Megatron-LM the config's MTP layer.
    config_file = tmp_path / "dsv3.json"
    config_file.write_text(json.dumps(DEEPSEEK_V3_MTP))
    for engine, layers in (("tessel", 0), ("megatron", 1)):
        out = tmp_path / f"{engine}.json"
        assert cli.main([f"hf:{config_file}", "--seq-length", "16", "--gpus", "4",
                         "--global-batch-size", "4", "--engine", engine, "--top", "1",
                         "--json", str(out)]) == 0
        assert json.loads(out.read_text())["architecture"]["mtp_num_layers"] == layers


@pytest.mark.parametrize("flags, named", [
    (["--zero-stage", "3", "--offload-optimizer", "cpu", "--offload-params", "cpu"],
     "--offload-optimizer and --offload-params"),
    (["--cpu-offloading-num-layers", "1"], "--cpu-offloading-num-layers"),
    (["--recompute-granularity", "full", "--offload-checkpoints"], "--offload-checkpoints"),
])
def test_offload_is_refused_by_plan_check_in_one_line(flags: list[str], named: str,
                                                      capsys) -> None:
    code = cli.main(["check", "llama", "--num-layers", "2", "--hidden-size", "64",
                     "--num-attention-heads", "4", "--vocab-size", "256", "--seq-length",
                     "16", "--gpus", "2", "--global-batch-size", "4", *flags])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2 and text.count("\n") == 1 and "Traceback" not in text
    assert text.startswith(f"error: {named}: plan check trains on CPU ranks")
