"""Hugging Face decoders of seven families trained through transformers' own modules on 8
real gloo ranks, each as its training Plan says: Qwen2 (q/k/v biases, sliding windows on
some layers), Mistral (a sliding window on every layer), GPT-NeoX (fused per-head
query_key_value, parallel residual, partial rotary, LayerNorm with bias, GELU), Gemma 2
(sandwich norms, attention and final-logit soft-capping, alternating windows, scaled
embedding, (1 + w) RMSNorm, tied head), Phi-3 (fused qkv_proj and gate_up_proj), GPT-2
(Conv1D layers with a fused c_attn, learned positions, tied head) and Qwen3 (per-head QK
norms, whose gradients sum over the tensor ranks), tiny configs (4 layers, hidden 64, 4
heads, sequence 16; windows of 8, so they mask), under pp2 x tp2 x dp2 with 1F1B and
under dp8 with ZeRO-3. Every plan trains as one process does (losses and parameters
within 1e-4), every rank issues exactly the collectives the Plan predicts (count and
bytes per kind) and holds exactly the parameters, gradients and optimizer state it
predicts. Gemma 2 and GPT-2 also run tp2 x dp4 with sequence parallelism, and Mixtral
ep2 x pp2 and ep4 in dp8 with ZeRO-3 (all-to-all dispatch, forced balance). The 8 ranks
start once for all eighteen plans (importing torch and transformers in 8 processes costs
more than the plans' steps). Then `plan check` of a model type the runtime cannot train:
one line, exit 2, no rank started; and of a config that leaves its size to transformers'
defaults: one line, exit 2."""

from __future__ import annotations

import json

import pytest

from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from planner.checks.training_check import compare
from runtime.elastic import launch
from runtime.spec import from_training_plan
from planner.checks.training_check import merge_results, relative_errors, train_reference

GPUS, STEPS = 8, 2
_SHAPE = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
          "vocab_size": 256, "max_position_embeddings": 64, "intermediate_size": 128}
FAMILIES = {  # every width divides by 8: ZeRO's shards are even, so bytes are exact
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SHAPE,
              "num_key_value_heads": 2, "tie_word_embeddings": False, "rope_theta": 1e4,
              "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], **_SHAPE,
                "num_key_value_heads": 2, "tie_word_embeddings": False, "rope_theta": 1e4,
                "sliding_window": 8},
    "gpt_neox": {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
                 **_SHAPE, "tie_word_embeddings": False, "use_parallel_residual": True,
                 "attention_bias": True,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                     "partial_rotary_factor": 0.25}},
    "gemma2": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], **_SHAPE,
               "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True,
               "sliding_window": 8, "query_pre_attn_scalar": 16,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "rope_theta": 1e4},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SHAPE,
             "num_key_value_heads": 4, "tie_word_embeddings": False, "rope_theta": 1e4,
             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1},
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4,
             "n_embd": 64, "n_head": 4, "n_inner": 128, "vocab_size": 256,
             "n_positions": 64, "tie_word_embeddings": True, "bos_token_id": 0,
             "eos_token_id": 0},
}
MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **_SHAPE,
           "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
           "num_key_value_heads": 2, "tie_word_embeddings": False, "rope_theta": 1e4,
           "sliding_window": 8}
# Experts dispatched all-to-all with forced balance: all-to-all bytes are known.
_FORCED = dict(moe_token_dispatcher="alltoall", moe_router_force_load_balancing=True)
FAMILIES["qwen3"] = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_SHAPE,
                     "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": False,
                     "rope_theta": 1e4}
# name -> the plan's fixed knobs
LAYOUTS = {
    "pp2-tp2-dp2-1f1b": dict(pipeline=2, tensor=2, global_batch_size=8, zero_stage=0,
                             schedule="1f1b"),
    "dp8-zero3": dict(pipeline=1, tensor=1, global_batch_size=8, zero_stage=3),
}
# Beyond every family under every layout: Gemma 2's four norms per layer on sequence
# shards (each norm's gradient reduced over the tensor ranks), GPT-2 with sequence
# parallelism, Mixtral with expert parallelism. name -> (hf config, the plan's fixed knobs)
MORE_RUNS = {
    "gemma2/tp2-dp4-sequence-parallel": (FAMILIES["gemma2"], dict(
        pipeline=1, tensor=2, global_batch_size=8, zero_stage=0, sequence_parallel=True)),
    # GPT-2's learned positions added before the scatter to sequence shards, its Conv1D
    # layers split on their transposed dims.
    "gpt2/tp2-dp4-sequence-parallel": (FAMILIES["gpt2"], dict(
        pipeline=1, tensor=2, global_batch_size=8, zero_stage=0, sequence_parallel=True)),
    # Mixtral's fused experts over the expert-parallel ranks: ep2 x pp2 (expert-data 2),
    # and ep4 inside dp8 with ZeRO-3 on the rest.
    "mixtral/ep2-pp2-dp4": (MIXTRAL, dict(pipeline=2, expert=2, global_batch_size=8,
                                          zero_stage=0, **_FORCED)),
    "mixtral/ep4-dp8-zero3": (MIXTRAL, dict(pipeline=1, expert=4, global_batch_size=8,
                                            zero_stage=3, **_FORCED)),
}


def _shape(fields: dict):
    from transformers import CONFIG_MAPPING

    from planner.models.hf_shape import to_transformer_config

    return to_transformer_config(CONFIG_MAPPING[fields["model_type"]].from_dict(fields), 16)


def _plan(name: str, config, knobs: dict):
    parallel = ParallelConfig.of(**knobs, micro_batch_size=1, precision="fp32", engine="tessel")
    return training_plan(name, config, Cluster.load("cpu").with_devices(GPUS), parallel)


def _train_each(rank: int, world: int, runs: list) -> list[dict]:
    from runtime.training_loop import train_on_rank

    return [train_on_rank(rank, world, config, spec, STEPS, 0, "adamw", hf_config=hf)
            for config, spec, hf in runs]


@pytest.mark.timeout(600)
def test_hf_families_train_as_one_process_and_as_planned() -> None:
    runs = {}
    cases = {f"{family}/{layout}": (fields, knobs) for family, fields in FAMILIES.items()
             for layout, knobs in LAYOUTS.items()}
    for name, (fields, knobs) in {**cases, **MORE_RUNS}.items():
        config = _shape(fields)
        runs[name] = (config, _plan(fields["model_type"], config, knobs), fields)
    specs = {name: from_training_plan(plan) for name, (_, plan, _) in runs.items()}
    results = launch(_train_each, GPUS, [(config, specs[name], fields)
                                         for name, (config, _, fields) in runs.items()])
    for index, (name, (config, plan, fields)) in enumerate(runs.items()):
        ranks = [r[index] for r in results]
        losses, params = merge_results(ranks)
        ref_losses, ref_params = train_reference(config, specs[name], STEPS, 0, "adamw",
                                                 hf_config=fields)
        loss_err, param_err = relative_errors(losses, params, ref_losses, ref_params)
        print(f"{name}: losses {losses} vs {ref_losses}; rel err loss {loss_err:.2e}, "
              f"parameters {param_err:.2e}")
        assert loss_err < 1e-4 and param_err < 1e-4, (name, losses, ref_losses)
        assert losses[1] != losses[0], name  # the step moved the model
        comparison = compare(plan, [r["coords"] for r in ranks],
                             [r["collectives"] for r in ranks],
                             [r["local_bytes"] for r in ranks], STEPS)
        assert comparison.passed, (name, comparison.mismatches)
        differing = [(rank, got, want) for rank, (got, want)
                     in enumerate(zip(comparison.measured, comparison.predicted)) if got != want]
        assert not differing, (name, differing[:1])
        if plan.parallel.pipeline > 1:
            assert all({"send", "recv", "all_reduce"} <= set(kinds)
                       for kinds in comparison.measured), name
        # Parameters, gradients and optimizer state of every rank exactly as predicted.
        rows = comparison.memory
        assert len(rows) == 3 * GPUS and not any(row.note for row in rows), name
        assert all(row.measured == row.predicted for row in rows), (name, rows)


def test_plan_check_refuses_a_model_type_it_cannot_train(tmp_path, capsys, monkeypatch) -> None:
    """A decoder transformers knows and Tessel's training plans do not (Falcon): one line
    naming it, exit 2, before any rank starts."""
    import multiprocessing.process

    from planner import cli

    started = []  # a rank is a process (torch's elastic agent starts them with multiprocessing)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        lambda process: started.append(process))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"],
                                  "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "vocab_size": 256}))
    code = cli.main(["check", f"hf:{config}", "--seq-length", "16", "--gpus", "2",
                     "--global-batch-size", "2", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 2 and not started
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "'falcon'" in lines[0], out


def test_a_config_stating_only_its_model_type_is_refused(tmp_path, capsys) -> None:
    """transformers would plan a model of its default size: one line naming the size
    fields the file leaves out, exit 2 (GPT-2's own names count: n_layer is stated)."""
    from planner import cli

    config = tmp_path / "config.json"
    for fields, missing in (({"model_type": "qwen2"}, "num_hidden_layers, hidden_size, "
                             "num_attention_heads, vocab_size"),
                            ({"model_type": "gpt2", "n_layer": 2, "n_embd": 64,
                              "n_head": 4}, "states no vocab_size")):
        config.write_text(json.dumps(fields))
        code = cli.main(["check", f"hf:{config}", "--seq-length", "16", "--gpus", "2",
                         "--global-batch-size", "2", "--steps", "1"])
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and missing in lines[0], out
