"""runtime on a Hugging Face model: transformers' own Llama modules as pipeline stages
(tiny config: 4 layers, hidden 64, 4 heads / 2 key-value heads, seq 16), trained on gloo
ranks equal to ``LlamaForCausalLM`` in one process, with exactly the collectives of the zoo
Llama of the same shape under the same plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

transformers = pytest.importorskip("transformers")

from planner.models.hf_shape import to_transformer_config  # noqa: E402
from planner.vocabulary.parallel_dims import ParallelDims  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model_parts import model_parts  # noqa: E402
from runtime.parallelize import apply_data_parallel  # noqa: E402
from runtime.spec import RunSpec, even_chunks  # noqa: E402
from planner.checks.training_check import TrainingCheck, check_training  # noqa: E402

HF_LLAMA = transformers.LlamaConfig(
    num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=256, max_position_embeddings=64,
    tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
).to_dict()
SHAPE = to_transformer_config(transformers.LlamaConfig.from_dict(HF_LLAMA), seq_length=16)
TOLERANCE = 1e-4


def _spec(pp=1, dp=1, tp=1, virtual=1, micro_batches=4, expert=1, **knobs) -> RunSpec:
    return RunSpec(
        degrees=ParallelDims(pipeline=pp, data=dp, tensor=tp, expert=expert),
        chunks=even_chunks(4, pp * virtual),
        micro_batch_size=1, num_micro_batches=micro_batches, virtual_pipeline=virtual,
        **knobs,
    )


# ----- without processes -------------------------------------------------------------


def test_hf_stages_hold_hf_names_and_compute_what_the_whole_model_does() -> None:
    parts = model_parts(SHAPE, HF_LLAMA)
    reference = parts.reference(seed=3)
    assert type(reference).__name__ == "LlamaForCausalLM"
    want = dict(reference.named_parameters())
    first, last = parts.build_stage((0, 2), True, False), parts.build_stage((2, 4), False, True)
    assert type(first.layers["0"]).__name__ == "LlamaDecoderLayer"
    got = {}
    for stage in (first, last):
        parts.materialize(stage, seed=3)
        got.update(dict(stage.named_parameters()))
    assert set(got) == set(want)
    assert {"model.layers.3.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.0.input_layernorm.weight"} <= set(got)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert torch.equal(got["model.norm.weight"], torch.ones(64))
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(
            last(first(tokens)), parts.logits(reference, tokens), rtol=0, atol=0
        )


_TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "vocab_size": 128, "max_position_embeddings": 64, "intermediate_size": 96,
         "tie_word_embeddings": False, "rope_theta": 10000.0}
FAMILIES = {
    "qwen2": {"model_type": "qwen2", **_TINY, "num_key_value_heads": 2},
    "mistral": {"model_type": "mistral", **_TINY, "num_key_value_heads": 2,
                "sliding_window": 8},
    "qwen3": {"model_type": "qwen3", **_TINY, "num_key_value_heads": 2, "head_dim": 16},
    "gemma2": {"model_type": "gemma2", **_TINY, "num_key_value_heads": 2, "head_dim": 16,
               "tie_word_embeddings": True, "sliding_window": 8},
    "phi3": {"model_type": "phi3", **_TINY, "num_key_value_heads": 4, "pad_token_id": 0,
             "bos_token_id": 1, "eos_token_id": 1},
    "gpt_neox": {"model_type": "gpt_neox", **_TINY},
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 96,
             "vocab_size": 128, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0},
    "mixtral": {"model_type": "mixtral", **_TINY, "num_key_value_heads": 2,
                "num_local_experts": 4, "num_experts_per_tok": 2},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_s_stages_are_its_causal_lm_and_its_plan_counts_them(family) -> None:
    """Two stages hold the causal LM's parameters under its names and compute its logits
    (masks, soft-caps and scaled embeddings included); the zoo shape counts exactly those
    parameters, and where names correspond one to one the Plan lists them by them."""
    from cost_models.stage_parameters import chunk_parameters
    from planner.models.hf_shape import parameter_namer

    fields = FAMILIES[family]
    hf = transformers.CONFIG_MAPPING[fields["model_type"]].from_dict(fields)
    shape = to_transformer_config(hf, seq_length=16)
    parts = model_parts(shape, fields)
    reference = parts.reference(seed=1)
    want = dict(reference.named_parameters())
    assert shape.num_parameters() == sum(p.numel() for p in want.values())
    first, last = parts.build_stage((0, 1), True, False), parts.build_stage((1, 2), False, True)
    for stage in (first, last):
        parts.materialize(stage, seed=1)
    got = {**dict(first.named_parameters()), **dict(last.named_parameters())}
    if shape.tie_embeddings:  # the last stage's copy of the embedding, under its name
        assert torch.equal(first.embed.weight, last.embed.weight)
    assert set(got) == set(want)
    tokens = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(last(first(tokens)), parts.logits(reference, tokens),
                                   rtol=0, atol=0)
    namer = parameter_namer(hf)
    if family in ("phi3", "gpt_neox", "gpt2", "mixtral"):  # fused: the zoo's names stay
        assert namer is None
    else:
        listed = {namer(p.name) for p in chunk_parameters(shape, (0, 2), True, True)}
        assert listed == set(want)


def test_a_rank_materializes_only_its_shards_of_the_hf_model(fake_world) -> None:
    # Rank 5 of pp2.dp2.tp2: pipeline rank 1, data rank 0, tensor rank 1.
    fake_world(5, 8)
    mesh = build_mesh(ParallelDims(pipeline=2, data=2, tensor=2))
    parts = model_parts(SHAPE, HF_LLAMA)
    stage = parts.build_stage((2, 4), False, True)
    parts.tensor_parallel(stage, mesh["tp"], True)
    apply_data_parallel(stage, mesh["dp"], zero_stage=3)
    parts.materialize(stage, seed=0)
    full = dict(parts.reference(seed=0).named_parameters())
    names = {n for n, _ in stage.named_parameters()}
    assert names == {n for n in full if n.startswith(("model.layers.2.", "model.layers.3."))} | {
        "model.norm.weight", "lm_head.weight"}
    attn = stage.layers["2"].self_attn
    q, o = attn.q_proj.weight, attn.o_proj.weight  # column- / row-parallel, then FSDP dim 0
    assert isinstance(q, DTensor) and isinstance(o, DTensor)
    want_q = full["model.layers.2.self_attn.q_proj.weight"].chunk(2, 0)[1].chunk(2, 0)[0]
    want_o = full["model.layers.2.self_attn.o_proj.weight"].chunk(2, 1)[1].chunk(2, 0)[0]
    assert torch.equal(q.to_local(), want_q) and torch.equal(o.to_local(), want_o)
    head = stage.lm_head.weight  # vocabulary-parallel rows
    want_head = full["lm_head.weight"].chunk(2, 0)[1].chunk(2, 0)[0]
    assert torch.equal(head.to_local(), want_head)
    local = sum(p.to_local().numel() for p in stage.parameters())
    whole = sum(full[n].numel() for n in names)
    assert whole / 4 <= local < whole / 3  # norms replicated over tp, the rest split 4 ways


def test_selective_recomputation_reruns_only_the_hf_attention_cores(monkeypatch) -> None:
    from runtime.hf import stages as hf_stages

    calls = []
    core = hf_stages.sdpa_attention_forward
    monkeypatch.setattr(
        hf_stages, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or core(*a, **k)
    )
    parts = model_parts(SHAPE, HF_LLAMA)
    stage = parts.build_stage((0, 4), True, True)
    parts.recompute(stage, "selective")
    parts.materialize(stage, seed=0)
    stage(torch.randint(0, 256, (2, 16))).sum().backward()
    assert len(calls) == 8  # 4 forward, 4 recomputed in backward


# ----- multi-rank: trained on local gloo ranks, compared with one process ---------------


def _train_and_compare(spec: RunSpec, steps: int = 2) -> TrainingCheck:
    """The HF model trained as one process does, with the zoo Llama's collectives."""
    check = check_training(SHAPE, spec, steps, hf_config=HF_LLAMA)
    print(f"hf losses {check.losses} vs {check.reference_losses}; rel err loss "
          f"{check.loss_max_rel_error:.2e}, parameters {check.parameter_rel_error:.2e}")
    assert check.passed(TOLERANCE)
    assert check.losses[1] != check.losses[0]  # the step moved the model
    zoo = check_training(SHAPE, spec, steps)
    assert zoo.passed(TOLERANCE)
    for rank, (hf_kinds, zoo_kinds) in enumerate(zip(check.collectives, zoo.collectives)):
        assert hf_kinds == zoo_kinds, (rank, hf_kinds, zoo_kinds)
    return check


def test_hf_llama_pp2_tp2_dp2_1f1b_trains_as_one_process_with_the_zoo_collectives() -> None:
    check = _train_and_compare(_spec(pp=2, dp=2, tp=2, schedule="1f1b", zero_stage=1))
    for kinds in check.collectives:
        assert {"send", "recv", "all_gather", "reduce_scatter", "all_reduce"} <= set(kinds)


HF_DEEPSEEK_V3 = {  # tiny DeepseekV3ForCausalLM: MLA, a dense first layer, 8 fused experts
    "model_type": "deepseek_v3", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,
    "v_head_dim": 8, "qk_nope_head_dim": 8, "n_group": 4, "topk_group": 2,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def test_hf_deepseek_v3_experts_split_over_expert_and_tensor_ranks(fake_world) -> None:
    """Rank 5 of pp2.dp2.tp2 with ep2 (expert rank 0, tensor rank 1) holds experts 0-3,
    each split as a dense MLP is: the same rows of gate and up (the fused gate_up_proj
    split alike), down_proj's columns; MLA's up projections split by heads, its down
    projections whole."""
    from runtime.experts import expert_mesh

    fake_world(5, 8)
    mesh = build_mesh(ParallelDims(pipeline=2, data=2, tensor=2))
    shape = to_transformer_config(
        transformers.DeepseekV3Config.from_dict(HF_DEEPSEEK_V3), seq_length=16)
    parts = model_parts(shape, HF_DEEPSEEK_V3)
    parts.check(RunSpec(degrees=ParallelDims(pipeline=2, data=2, tensor=2, expert=2),
                        chunks=even_chunks(4, 2), micro_batch_size=1, num_micro_batches=2,
                        expert_dispatcher="alltoall"))
    stage = parts.build_stage((2, 4), False, True)
    parts.expert_parallel(stage, expert_mesh(mesh, 2), "alltoall")
    parts.tensor_parallel(stage, mesh["tp"], True)
    parts.materialize(stage, seed=0)
    full = dict(parts.reference(seed=0).named_parameters())
    experts = stage.layers["3"].mlp.experts
    gate_up = full["model.layers.3.mlp.experts.gate_up_proj"][:4]
    want = torch.cat([gate_up[:, 8:16], gate_up[:, 24:32]], dim=1)
    assert torch.equal(experts.gate_up_proj.to_local(), want)
    down = full["model.layers.3.mlp.experts.down_proj"][:4, :, 8:16]
    assert torch.equal(experts.down_proj.to_local(), down)
    attn = stage.layers["3"].self_attn
    assert isinstance(attn.kv_b_proj.weight, DTensor)
    assert not isinstance(attn.kv_a_proj_with_mqa.weight, DTensor)


HF_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "vocab_size": 128, "num_experts": 8, "moe_intermediate_size": 16,
                "tie_word_embeddings": False}


def test_what_the_runtime_runs_of_a_hugging_face_moe_is_stated_once() -> None:
    """Qwen3-MoE under tensor parallelism runs with expert parallelism and the all-to-all
    dispatcher (flex runs as all-to-all): the knobs the planner fixes (`needs`) and the
    plans every rank refuses (`check`) come from the same rules."""
    spec = RunSpec(degrees=ParallelDims(pipeline=1, data=2, tensor=2, expert=2),
                   chunks=even_chunks(4, 1), micro_batch_size=1, num_micro_batches=1,
                   expert_dispatcher="alltoall")
    shape = to_transformer_config(transformers.Qwen3MoeConfig.from_dict(HF_QWEN3_MOE), 16)
    parts = model_parts(shape, HF_QWEN3_MOE)
    parts.check(spec)
    assert [(rule.knob, rule.value) for rule in parts.needs()] == [
        ("context", 1), ("moe_token_dispatcher", "alltoall")]
    dispatcher = parts.needs()[1]
    assert dispatcher.allows("flex") and not dispatcher.allows("allgather")
    with pytest.raises(ValueError, match="expert parallelism 1 is not run yet"):
        parts.check(replace(spec, degrees=replace(spec.degrees, expert=1)))
    with pytest.raises(ValueError, match="runs the alltoall token dispatcher"):
        parts.check(replace(spec, expert_dispatcher="allgather"))
    shape = to_transformer_config(
        transformers.DeepseekV3Config.from_dict(HF_DEEPSEEK_V3), seq_length=16)
    with pytest.raises(ValueError, match="expert parallelism 1 is not run"):
        model_parts(shape, HF_DEEPSEEK_V3).check(
            replace(spec, degrees=replace(spec.degrees, expert=1)))
    # A dense family: one expert degree, and its tensor-parallel layout probed once.
    llama = model_parts(SHAPE, HF_LLAMA)
    assert [(rule.knob, rule.value) for rule in llama.needs()] == [("context", 1),
                                                                   ("expert", 1)]


def test_a_zoo_model_the_runtime_never_runs_is_refused_whatever_the_plan() -> None:
    """QK layer norm fixes the zoo's tensor degree at 1; multi-token prediction with
    learned positions runs under no plan: `needs` refuses it, naming why."""
    from planner.models.config import TransformerConfig

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                seq_length=16)
    qk = model_parts(TransformerConfig(**base, qk_layernorm=True))
    assert [(rule.knob, rule.value) for rule in qk.needs()] == [("tensor", 1)]
    learned = model_parts(TransformerConfig(**base, mtp_num_layers=1,
                                            position_embedding="learned"))
    with pytest.raises(ValueError, match="multi-token prediction with learned positions"):
        learned.needs()


def test_hf_qwen3_moe_splits_heads_and_experts_and_sums_its_qk_norms(fake_world) -> None:
    """Rank 3 of dp2.tp2 with ep2 (expert rank 1, tensor rank 1): its heads' q/k/v rows,
    experts 4-7 each split over the tensor ranks, and every layer's q_norm and k_norm
    held whole and listed for the gradient sum over the tensor ranks."""
    from runtime.experts import expert_mesh

    fake_world(3, 4)
    mesh = build_mesh(ParallelDims(data=2, tensor=2))
    shape = to_transformer_config(transformers.Qwen3MoeConfig.from_dict(HF_QWEN3_MOE), 16)
    parts = model_parts(shape, HF_QWEN3_MOE)
    stage = parts.build_stage((0, 4), True, True)
    parts.expert_parallel(stage, expert_mesh(mesh, 2), "alltoall")
    parts.tensor_parallel(stage, mesh["tp"], True)
    parts.materialize(stage, seed=0)
    full = dict(parts.reference(seed=0).named_parameters())
    layer = stage.layers["1"]
    q = layer.self_attn.q_proj.weight
    assert isinstance(q, DTensor) and torch.equal(
        q.to_local(), full["model.layers.1.self_attn.q_proj.weight"][32:])
    gate_up = full["model.layers.1.mlp.experts.gate_up_proj"][4:]
    want = torch.cat([gate_up[:, 8:16], gate_up[:, 24:32]], dim=1)
    assert torch.equal(layer.mlp.experts.gate_up_proj.to_local(), want)
    assert stage.head_norms == [
        m for i in range(4) for m in (stage.layers[str(i)].self_attn.q_norm,
                                      stage.layers[str(i)].self_attn.k_norm)]
    assert not isinstance(layer.self_attn.q_norm.weight, DTensor)
