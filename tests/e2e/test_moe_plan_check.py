"""A tiny DeepSeek-V3-shaped zoo model (multi-latent attention, a dense first layer, a
shared expert, 8 fine-grained routed experts with top-2 sigmoid routing limited to 2 of 4
groups, one multi-token-prediction layer) planned and trained as `plan check` does, on 8
real gloo ranks, with forced load balancing and the all-to-all dispatcher: ep2 x tp2 x pp2
and ep4 x dp2 (expert-data 2 inside data 8) with ZeRO-1. Each plan trains as one process
does (losses and parameters within 1e-4), every rank issues exactly the collectives the
Plan predicts, kind by kind in count and bytes, all-to-all included, and holds the model
state (parameters, gradients, optimizer state; expert and non-expert) the Plan predicts,
within 1%. The same launch of the 8 ranks trains a tiny DeepSeek-V3 from an hf: config
with one MTP layer (which transformers does not build, nor the plan count) through
transformers' own modules under ep2 x tp2 x pp2 (with sequence parallelism; and without
it and without a query latent) and ep4 x dp2 with ZeRO-1, and a tiny Qwen3-MoE under ep2 x
tp2 (its QK norms' gradients summed over the tensor ranks) without forced balance, planned
and checked the same way. Then `plan check` itself of the hf: Qwen3-MoE under ep2 x tp2 x
pp2 and of the hf: DeepSeek-V3 under ep2 x tp2 x pp2 and ep4 x dp2, with forced balance;
and of a tiny hf: Mixtral on 2 and 4 ranks with no dispatcher given (the runtime's
all-to-all is fixed before the search) and no forced balance, where the routing decides
the all-to-all bytes (`planner.checks.training_check.routing_note`)."""

from __future__ import annotations

import json

import pytest

from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from planner.checks.training_check import MEMORY_TOLERANCE, PlanComparison, compare
from runtime.elastic import launch
from runtime.spec import from_training_plan
from planner.checks.training_check import merge_results, relative_errors, train_reference

DEEPSEEK_V3_TINY = TransformerConfig(
    num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=16,
    norm="rmsnorm", activation="swiglu", position_embedding="rope", tie_embeddings=False,
    bias=False, ffn_hidden_size=96, multi_latent_attention=True, q_lora_rank=24,
    kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8, num_experts=8,
    moe_top_k=2, moe_ffn_hidden_size=16, moe_shared_expert_intermediate_size=16,
    moe_layer_freq=[0, 1], moe_router_score_function="sigmoid", moe_router_num_groups=4,
    moe_router_group_topk=2, mtp_num_layers=1,
)
# Every parameter's dim 0 divides by 8, so ZeRO's shards are even on every rank (the
# rotary width 8 makes kv_down_proj's 16 + 8 rows).
GPUS, STEPS = 8, 2
HF_QWEN3_MOE = {  # transformers' Qwen3MoeForCausalLM: QK norms, fused experts, top-2 of 8
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 16, "num_experts": 8,
    "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
    "max_position_embeddings": 64, "norm_topk_prob": True, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
HF_DEEPSEEK_V3 = {  # DeepseekV3ForCausalLM: MLA, a dense first layer, shared expert,
    # sigmoid routing limited to 2 of 4 groups (transformers builds no MTP layer)
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
    "routed_scaling_factor": 1.0, "kv_lora_rank": 16, "q_lora_rank": 24,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8, "n_group": 4,
    "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_interleave": True, "num_nextn_predict_layers": 1,
}
HF_MIXTRAL = {  # MixtralForCausalLM: 4 experts, top-2, no shared expert
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 128, "max_position_embeddings": 64, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}


# name -> the plan's fixed knobs
LAYOUTS = {
    "ep2-tp2-pp2": dict(tensor=2, pipeline=2, expert=2, global_batch_size=4, zero_stage=0),
    "ep4-dp2-zero1": dict(tensor=1, pipeline=1, expert=4, global_batch_size=8, zero_stage=1),
}
# The hf: DeepSeek-V3 in the same launch, through transformers' own modules: ep2 x tp2 x
# pp2 with sequence parallelism (what Megatron-LM requires with experts and tensor
# parallelism), and without it with MLA's queries straight from the hidden states (no
# query latent); and ep4 x dp2 with ZeRO-1. The hf: Qwen3-MoE under ep2 x tp2 x dp4
# with sequence parallelism, routed as its router chooses (no forced balance).
# name -> (hf config, layout, sequence parallelism, forced balance)
HF_LAYOUTS = {
    "hf-ep2-tp2-pp2-sp": (HF_DEEPSEEK_V3, "ep2-tp2-pp2", True, True),
    "hf-ep2-tp2-pp2-no-q-latent": ({**HF_DEEPSEEK_V3, "q_lora_rank": None}, "ep2-tp2-pp2",
                                   False, True),
    "hf-ep4-dp2-zero1": (HF_DEEPSEEK_V3, "ep4-dp2-zero1", False, True),
    "hf-qwen3-moe-ep2-tp2-routed": (HF_QWEN3_MOE, "ep2-tp2-dp4", True, False),
}
LAYOUTS_HF_ONLY = {
    "ep2-tp2-dp4": dict(tensor=2, pipeline=1, expert=2, global_batch_size=8, zero_stage=0),
}


def _hf_shape(fields: dict) -> TransformerConfig:
    """The zoo shape `plan check` plans an hf: config as: as transformers builds it."""
    from transformers import CONFIG_MAPPING

    from planner.models.hf_shape import as_transformers_builds, to_transformer_config

    built, _ = as_transformers_builds(CONFIG_MAPPING[fields["model_type"]].from_dict(fields))
    return to_transformer_config(built, 16)


def _plan(knobs: dict, config: TransformerConfig = DEEPSEEK_V3_TINY, forced: bool = True):
    parallel = ParallelConfig.of(
        **knobs, micro_batch_size=1, precision="fp32", engine="tessel",
        moe_token_dispatcher="alltoall", moe_router_force_load_balancing=forced,
    )
    return training_plan("deepseek-v3-tiny", config,
                         Cluster.load("cpu").with_devices(GPUS), parallel)


def _expert_state(plan, config: TransformerConfig, pp_rank: int) -> tuple[int, int, int]:
    """The Plan's (parameters, gradients, optimizer) bytes of a rank's experts on pipeline
    rank `pp_rank` (`cost_models.stage_parameters`, the experts only)."""
    from cost_models.memory import state_element_bytes
    from cost_models.stage_parameters import chunk_parameters, rank_state_bytes

    stage, chunks = plan.stages[pp_rank], [tuple(c) for s in plan.stages for c in s.chunks]
    last = len(chunks) - 1
    params = [p for c in stage.chunks for p in chunk_parameters(
        config, tuple(c), chunks.index(tuple(c)) == 0,
        chunks.index(tuple(c)) == last) if p.expert is not None]
    p = plan.parallel
    return rank_state_bytes(params, p.tensor, p.data, p.zero_stage, p.expert,
                            config.num_experts, state_element_bytes("fp32"))


def _train_each(rank: int, world: int, runs: list) -> list[dict]:
    from runtime.training_loop import train_on_rank

    return [train_on_rank(rank, world, config, spec, STEPS, 0, "adamw", hf_config=hf)
            for config, spec, hf in runs]


@pytest.mark.timeout(300)
def test_tiny_deepseek_v3_plans_train_as_one_process_and_as_predicted() -> None:
    """The zoo's plans, and hf: DeepSeek-V3's ep2 x tp2 x pp2 (experts split over the
    tensor ranks too, Megatron's default expert tensor degree) and ep4 x dp2 with ZeRO-1,
    in one launch of the 8 ranks."""
    runs = {name: (DEEPSEEK_V3_TINY, _plan(knobs), None) for name, knobs in LAYOUTS.items()}
    for name, (fields, layout, sequence, forced) in HF_LAYOUTS.items():
        config = _hf_shape(fields)
        knobs = {**LAYOUTS, **LAYOUTS_HF_ONLY}[layout]
        runs[name] = (config, _plan({**knobs, "sequence_parallel": sequence}, config, forced),
                      fields)
    specs = {name: from_training_plan(plan) for name, (_, plan, _) in runs.items()}
    assert all(spec.expert_dispatcher == "alltoall" for spec in specs.values())
    assert [name for name, spec in specs.items() if not spec.force_balance] == [
        "hf-qwen3-moe-ep2-tp2-routed"]
    # The hf: DeepSeek-V3's MTP layer is not built, nor counted.
    assert runs["hf-ep4-dp2-zero1"][0].mtp_num_layers == 0
    results = launch(_train_each, GPUS, [(config, specs[name], hf)
                                         for name, (config, _, hf) in runs.items()])
    for index, (name, (config, plan, hf)) in enumerate(runs.items()):
        ranks = [r[index] for r in results]
        losses, params = merge_results(ranks)
        ref_losses, ref_params = train_reference(config, specs[name], STEPS, 0, "adamw",
                                                 hf_config=hf)
        loss_err, param_err = relative_errors(losses, params, ref_losses, ref_params)
        assert loss_err < 1e-4 and param_err < 1e-4, (name, losses, ref_losses)
        if hf is None:
            assert any(n.startswith("mtp.0.block.mlp.experts.") for n in params)
        else:  # the fused experts, gathered whole from their ep x tp shards
            assert params["model.layers.3.mlp.experts.gate_up_proj"].shape == (8, 32, 64)
        comparison = compare(plan, [r["coords"] for r in ranks],
                             [r["collectives"] for r in ranks],
                             [r["local_bytes"] for r in ranks], STEPS)
        assert comparison.passed, (name, comparison.mismatches)
        if specs[name].force_balance:
            # Every rank's collectives equal the Plan's, the all-to-all dispatch included
            # (on the last pipeline stage, which holds the MoE layer and the MTP layer's).
            assert comparison.measured == comparison.predicted
        else:  # the routing moved bytes, not counts: compare's group sums and bounds
            _assert_routed_as_compared(comparison, ("all_to_all", "all_reduce"))
        last = plan.parallel.pipeline - 1
        assert all(kinds["all_to_all"]["count"] > 0
                   for kinds, r in zip(comparison.measured, ranks) if r["coords"]["pp"] == last)
        # Model state per rank, expert and non-expert together, within 1% (ZeRO-1's
        # gradients are held sharded by FSDP2 and marked, not compared).
        compared = [row for row in comparison.memory if not row.note]
        assert len(compared) == GPUS * (2 if plan.parallel.zero_stage == 1 else 3)
        assert all(row.relative_error <= MEMORY_TOLERANCE for row in compared)
        if hf is not None:  # transformers' modules hold exactly the Plan's bytes
            assert all(row.measured == row.predicted for row in compared), name
        # The experts' part on its own: each rank holds its expert group's share, whole
        # (none on a first stage of only the dense layer).
        held = []
        for r in ranks:
            want = _expert_state(plan, config, r["coords"]["pp"])
            got = [r["local_bytes"][k] for k in ("expert_parameters", "expert_gradients",
                                                 "expert_optimizer")]
            assert got == list(want), (name, r["coords"], got, want)
            held.append(got[0])
        assert held[-1] > 0


def _assert_routed_as_compared(comparison, routed: tuple[str, ...]) -> None:
    """Every rank's count of every kind and bytes of every kind the routing does not
    decide as predicted; the routed kinds' bytes summed over all ranks (every expert-
    parallel group's sum is compared by `compare`) as predicted, and some rank's
    all-to-all bytes not (the routing was not even)."""
    pairs = list(zip(comparison.measured, comparison.predicted))
    for measured, predicted in pairs:
        assert {k: v["count"] for k, v in measured.items()} == \
            {k: v["count"] for k, v in predicted.items()}
        assert all(measured[k] == predicted[k] for k in measured if k not in routed)
    zero = {"count": 0, "bytes": 0}
    for kind in routed:
        assert sum(m.get(kind, zero)["bytes"] for m, _ in pairs) == \
            sum(p.get(kind, zero)["bytes"] for _, p in pairs)
    assert any(m["all_to_all"] != p["all_to_all"] for m, p in pairs)


# model -> its flags beyond the shared ones, and the plan's (expert, pipeline, tensor, data)
HF_CHECKS = {
    # Megatron-LM's sequence parallelism with experts and tensor parallelism (the
    # plan's default there); each expert split over the tensor ranks, the QK norms'
    # gradients summed over them: ep2 x tp2 x pp2.
    "qwen3_moe_tp2": (["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size",
                       "2", "--sequence-parallel", "--expert-model-parallel-size", "2"],
                      (2, 2, 2, 2)),
    # With its MTP layer left out, as transformers builds it: ep4 x dp2 with ZeRO-1, and
    # ep2 x tp2 x pp2.
    "deepseek_v3": (["--pipeline-model-parallel-size", "1", "--tensor-model-parallel-size",
                     "1", "--expert-model-parallel-size", "4", "--zero-stage", "1"],
                    (4, 1, 1, 8)),
    "deepseek_v3_tp2": (["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size",
                         "2", "--sequence-parallel", "--expert-model-parallel-size", "2"],
                        (2, 2, 2, 2)),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(HF_CHECKS))
def test_plan_check_of_a_hugging_face_moe_with_forced_balance(case, tmp_path, capsys) -> None:
    """`plan check hf:config.json` of a tiny Qwen3-MoE under ep2 x tp2 x pp2 and a tiny
    DeepSeek-V3 with one MTP layer under ep4 x dp2 with ZeRO-1 and ep2 x tp2 x pp2,
    through transformers' own modules (fused experts split over the expert-parallel ranks
    on dim 0, and over the tensor ranks), on 8 ranks, all-to-all dispatch with forced
    balance: as one process, every collective and held byte as the Plan predicts."""
    from planner import cli

    flags, degrees = HF_CHECKS[case]
    model = case.removesuffix("_tp2")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"qwen3_moe": HF_QWEN3_MOE,
                                  "deepseek_v3": HF_DEEPSEEK_V3}[model]))
    report = tmp_path / "check.json"
    code = cli.main([
        "check", f"hf:{config}", "--seq-length", "16", "--gpus", "8",
        "--global-batch-size", "8", *flags,
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-force-load-balancing",
        "--steps", "2", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    if model == "deepseek_v3":
        assert "note: transformers' DeepseekV3ForCausalLM builds no multi-token-" in out
    data = json.loads(report.read_text())
    plan, check, comparison = data["plan"], data["details"]["check"], data["details"]["comparison"]
    assert plan["run"]["moe_router_force_load_balancing"]
    parallel = plan["parallel"]
    assert (parallel["expert"], parallel["pipeline"], parallel["tensor"],
            parallel["data"]) == degrees
    assert parallel["sequence_parallel"] == (parallel["tensor"] > 1)
    assert data["plan"]["architecture"]["mtp_num_layers"] == 0
    assert check["loss_max_rel_error"] < 1e-4 and check["parameter_rel_error"] < 1e-4
    assert comparison["passed"] and comparison["measured"] == comparison["predicted"]
    assert all(kinds["all_to_all"]["count"] > 0 for kinds in comparison["measured"])
    # Every held byte as predicted (but ZeRO-1's gradients, which the runtime holds
    # sharded, should the plan choose ZeRO-1).
    rows = [r for r in comparison["memory"] if not r["note"]]
    assert len(rows) >= 2 * 8 and all(r["measured"] == r["predicted"] for r in rows)


# ranks -> flags beyond the shared ones (no dispatcher, no forced balance), and the plan's
# (expert, tensor, data)
MIXTRAL_CHECKS = {
    2: (["--expert-model-parallel-size", "2"], (2, 1, 2)),
    4: (["--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2"],
        (2, 2, 2)),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("gpus", list(MIXTRAL_CHECKS))
def test_plan_check_of_a_hugging_face_mixtral_as_its_router_routes(gpus, tmp_path,
                                                                  capsys) -> None:
    """`plan check hf:mixtral.json` with expert parallelism and no dispatcher given, on 2
    ranks (ep2) and on 4 (ep2 x tp2: each expert split over the tensor ranks): the
    all-to-all dispatcher the runtime runs is fixed before the search, and the plan passes
    as its router routes: as one process, every count of every collective, every byte
    the routing does not decide and every held byte as predicted, the routed bytes summed
    over each expert-parallel group (a note says how)."""
    from planner import cli

    flags, degrees = MIXTRAL_CHECKS[gpus]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_MIXTRAL))
    report = tmp_path / "check.json"
    code = cli.main(["check", f"hf:{config}", "--seq-length", "16", "--gpus", str(gpus),
                     "--global-batch-size", "4", *flags, "--steps", "2",
                     "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "--moe-token-dispatcher-type alltoall (a Hugging Face MoE model runs" in out
    assert "note: the routing decides each rank's all-to-all" in out
    data = json.loads(report.read_text())
    plan, check = data["plan"], data["details"]["check"]
    assert plan["run"]["moe_token_dispatcher"] == "alltoall"
    assert not plan["run"]["moe_router_force_load_balancing"]
    p = plan["parallel"]
    assert (p["expert"], p["tensor"], p["data"]) == degrees
    assert check["loss_max_rel_error"] < 1e-4 and check["parameter_rel_error"] < 1e-4
    comparison = PlanComparison(**{k: data["details"]["comparison"][k]
                                   for k in ("measured", "predicted", "mismatches")})
    assert comparison.passed
    _assert_routed_as_compared(comparison, ("all_to_all", "all_reduce"))
    rows = [r for r in data["details"]["comparison"]["memory"] if not r["note"]]
    assert len(rows) >= 2 * gpus and all(r["measured"] == r["predicted"] for r in rows)


def test_routed_bytes_are_compared_as_the_routing_allows() -> None:
    """Without forced balance (no processes): the all-to-all and the experts' tensor-
    parallel all-reduce bytes pass when their expert-parallel group's sum is the Plan's
    however the ranks split it, and fail otherwise; counts are compared rank by rank."""
    from planner.checks.training_check import routing_note

    config = _hf_shape(HF_MIXTRAL)
    plan = training_plan("mixtral", config, Cluster.load("cpu").with_devices(4),
                         ParallelConfig.of(tensor=2, expert=2, global_batch_size=4,
                                           micro_batch_size=2, zero_stage=0,
                                           sequence_parallel=True, precision="fp32",
                                           engine="tessel", moe_token_dispatcher="alltoall"))
    assert "summed over each expert-parallel group" in routing_note(plan)
    coords = [{"pp": 0, "dp": r // 2, "cp": 0, "tp": r % 2} for r in range(4)]
    predicted = compare(plan, coords, [{}] * 4, [{}] * 4, STEPS).predicted

    def mismatches(change) -> list[str]:
        measured = json.loads(json.dumps(predicted))
        change(measured)
        return compare(plan, coords, measured, [{}] * 4, STEPS).mismatches

    a2a = predicted[1]["all_to_all"]["bytes"]
    reduced = predicted[0]["all_reduce"]["bytes"]

    def shifted(m):  # rank 0 and rank 2 (an expert-parallel group) swap bytes
        m[0]["all_reduce"]["bytes"] += 1024
        m[2]["all_reduce"]["bytes"] -= 1024
        m[1]["all_to_all"]["bytes"] += 512  # rank 3, its group's other rank, sends less
        m[3]["all_to_all"]["bytes"] -= 512

    assert mismatches(shifted) == []
    assert mismatches(lambda m: m[1]["all_to_all"].update(bytes=a2a - 8)) == [
        f"ranks 1, 3 all_to_all: measured {2 * a2a - 8:,} B together; predicted "
        f"{2 * a2a:,} B"]
    assert mismatches(lambda m: m[0]["all_reduce"].update(bytes=reduced + 1024)) == [
        f"ranks 0, 2 all_reduce: measured {2 * reduced + 1024:,} B together; predicted "
        f"{2 * reduced:,} B"]
    assert mismatches(lambda m: m[2]["all_to_all"].update(count=0))[0].startswith(
        "rank 2 all_to_all: measured 0 x")
    forced = plan.model_copy(update={"run": plan.run.model_copy(
        update={"moe_router_force_load_balancing": True})})
    assert routing_note(forced) == ""
    assert compare(forced, coords, [{k: dict(v) for k, v in r.items()} for r in predicted],
                   [{}] * 4, STEPS).passed
