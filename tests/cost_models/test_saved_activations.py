"""What a layer saves for backward, counted tensor by tensor per engine."""

from __future__ import annotations

import pytest

from cost_models.saved_activations import (
    checkpoint_bytes,
    saved_per_layer,
    tessel_layer,
    tessel_stage,
)
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES, get_preset
from planner.vocabulary.parallel import ParallelConfig

S, B, H, A = 2048, 2, 4096, 32
GPT = TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=A, vocab_size=1024,
                        seq_length=S, **FAMILIES["gpt"])


def _megatron(**knobs) -> ParallelConfig:
    return ParallelConfig.of(micro_batch_size=B, engine="megatron", **knobs)


def test_a_gpt_layer_saves_korthikantis_34_sbh_plus_the_scores() -> None:
    # Korthikanti et al., Sec. 4: s b h (34 + 5 a s / h) bytes without parallelism, with the
    # scores written (local attention); flash attention keeps the log-sum-exp instead.
    local = saved_per_layer(GPT, _megatron(), score_free=False)
    assert sum(local.values()) == pytest.approx(S * B * H * (34 + 5 * A * S / H))
    flash = saved_per_layer(GPT, _megatron(), score_free=True)
    assert sum(flash.values()) == pytest.approx(S * B * H * 34 + 4 * A * S * B)


def test_sequence_parallelism_splits_every_tensor_over_t() -> None:
    # Selective recomputation with sequence parallelism: 34 s b h / t (Table 2).
    saved = saved_per_layer(GPT, _megatron(tensor=8, sequence_parallel=True,
                                           recompute="selective"), score_free=False)
    assert sum(saved.values()) == pytest.approx(S * B * H * 34 / 8)
    assert "scores" not in saved
    assert checkpoint_bytes(GPT, _megatron(tensor=8, sequence_parallel=True)) == \
        2 * S * B * H / 8


def test_a_llama_layer_counts_swiglu_grouped_keys_and_no_dropout() -> None:
    model = get_preset("llama3-8b")  # f = 14336 = 3.5 h, 8 of 32 heads for keys and values
    s, b, h = model.seq_length, B, model.hidden_size
    saved = saved_per_layer(model, _megatron(), score_free=True)
    assert "dropout masks" not in saved
    assert saved["norm inputs"] == 2 * 2 * s * b * h
    assert saved["linear inputs"] == 2 * 2 * s * b * h
    assert saved["attention"] == pytest.approx(2 * s * b * (2 * h + 2 * h / 4) + 4 * 32 * s * b)
    assert saved["mlp"] == 2 * s * b * (2 * 14336 + 14336)


def test_fp8_keeps_the_casts_of_linear_inputs_in_one_byte() -> None:
    model = get_preset("llama3-8b")
    bf16 = saved_per_layer(model, _megatron(precision="bf16"), score_free=True)
    fp8 = saved_per_layer(model, _megatron(precision="fp8"), score_free=True)
    tokens = model.seq_length * B
    # q/k/v and fc1 inputs halve; the attention output gains an fp8 copy beside the one
    # flash attention keeps; fc2's input halves.
    assert fp8["linear inputs"] == bf16["linear inputs"] / 2 + tokens * model.hidden_size
    assert fp8["mlp"] == bf16["mlp"] - tokens * model.ffn_size


def test_recompute_modules_drop_what_they_replay() -> None:
    mlp = saved_per_layer(GPT, _megatron(recompute="selective",
                                         recompute_modules=("core_attn", "mlp")), False)
    assert mlp["mlp"] == 0
    norms = saved_per_layer(GPT, _megatron(recompute="selective",
                                           recompute_modules=("layernorm",)), False)
    assert norms["linear inputs"] == 0
    assert "scores" in norms  # core_attn not replayed: the scores are kept


def test_torchtitans_op_level_checkpointing_keeps_every_other_matmul() -> None:
    model = get_preset("llama3-8b")
    tokens, h, f = model.seq_length * B, model.hidden_size, model.ffn_size
    titan = ParallelConfig.of(micro_batch_size=B, engine="torchtitan", recompute="selective")
    saved = saved_per_layer(model, titan, score_free=True)
    # The block's input; wq's and wv's outputs, SDPA's output and log-sum-exp; w1's and
    # w2's outputs (wk, wo and w3 are replayed).
    assert saved == {
        "block inputs": 2 * tokens * h,
        "attention": pytest.approx(2 * tokens * (h + h / 4 + h) + 4 * 32 * tokens),
        "mlp": 2 * tokens * f + 2 * tokens * h,
    }


# TorchTitan's DeepSeek-V3 16B block (torchtitan/models/deepseek_v3): multi-latent
# attention without a query latent, 64 routed experts of 1408 (top 6) and two shared ones.
TITAN_MOE = TransformerConfig(
    num_layers=2, hidden_size=2048, num_attention_heads=16, vocab_size=1024,
    seq_length=4096, ffn_hidden_size=10944, multi_latent_attention=True, kv_lora_rank=512,
    qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, num_experts=64, moe_top_k=6,
    moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2816,
    **FAMILIES["llama"])


def test_torchtitans_op_level_checkpointing_of_an_moe_block() -> None:
    n = 4096 * B
    titan = dict(micro_batch_size=B, engine="torchtitan", recompute="selective")
    saved = saved_per_layer(TITAN_MOE, ParallelConfig.of(**titan), score_free=True)
    # The matmuls in order: wq (16 x 192), wkv_a (512 + 64), wkv_b (16 x (128 + 128)), wo,
    # the gate (64), the shared experts' w1, w3 (2816) and w2: the 1st, 3rd, 5th and 7th
    # kept. SDPA's output (16 x 128) and log-sum-exp. The routed experts' grouped GEMMs
    # are replayed.
    assert saved == {
        "block inputs": 2 * n * 2048,
        "attention": 2 * n * (3072 + 4096 + 2048) + 4 * 16 * n,
        "mlp": 2 * n * (64 + 2816),
    }
    # Under expert parallelism the dispatch's and the combine's all-to-all outputs are on
    # DeepSeek-V3's save list: each token's 6 rows, received and returned.
    ep8 = saved_per_layer(TITAN_MOE, ParallelConfig.of(**titan, data=8, expert=8,
                                                    moe_token_dispatcher="alltoall"),
                          score_free=True)
    assert ep8["mlp"] - saved["mlp"] == 2 * 2 * n * 6 * 2048


def test_torch_compile_fuses_what_eager_keeps() -> None:
    model = get_preset("llama3-8b")
    eager = saved_per_layer(model, ParallelConfig.of(engine="torchtitan"), score_free=True)
    compiled = saved_per_layer(model, ParallelConfig.of(engine="torchtitan", compile=True),
                               score_free=True)
    tokens = model.seq_length
    assert eager["mlp"] - compiled["mlp"] == 2 * 2 * tokens * model.ffn_size
    assert eager["norm inputs"] == 2 * compiled["norm inputs"]


# --- Korthikanti et al. 2022, Table 2, on GPT-3 175B (s 2048, b 1, h 12288, a 96, t 8) ---

GPT3 = get_preset("gpt3-175b")
SBH = 2048 * 12288


def _gpt3(**knobs) -> float:
    return sum(saved_per_layer(GPT3, ParallelConfig.of(**knobs), score_free=False).values())


def test_table_2_without_parallelism() -> None:
    # s b h (34 + 5 a s / h) = 2,868,903,936 bytes.
    assert _gpt3() == pytest.approx(2_868_903_936)


def test_table_2_tensor_parallel_with_and_without_sequence_parallelism() -> None:
    # s b h (10 + 24/t + 5 a s / (h t)) = 578,813,952 bytes; the 10 over t with SP.
    assert _gpt3(tensor=8) == pytest.approx(578_813_952)
    assert _gpt3(tensor=8, sequence_parallel=True) == pytest.approx(
        SBH * (34 / 8 + 5 * 96 * 2048 / (12288 * 8)))


def test_table_2_selective_and_full_recomputation() -> None:
    # Selective: 34 s b h / t with SP = 106,954,752 bytes, s b h (10 + 24/t) without.
    assert _gpt3(tensor=8, sequence_parallel=True, recompute="selective") == \
        pytest.approx(106_954_752)
    assert _gpt3(tensor=8, recompute="selective") == pytest.approx(SBH * (10 + 24 / 8))
    # Full: the layer's input, 2 s b h, over t with SP.
    assert checkpoint_bytes(GPT3, ParallelConfig.of(tensor=8)) == 2 * SBH
    assert checkpoint_bytes(GPT3, ParallelConfig.of(tensor=8, sequence_parallel=True)) == \
        2 * SBH / 8


def _tessel(**knobs) -> ParallelConfig:
    return ParallelConfig.of(micro_batch_size=B, engine="tessel", **{"precision": "fp32", **knobs})


@pytest.mark.parametrize("t, sp", [(1, 1), (8, 1), (8, 8)])
def test_tessels_gpt_layer_in_closed_form(t: int, sp: int) -> None:
    # n tokens: each LayerNorm its input and mean/rstd on its (sequence) shard; q/k/v and
    # fc1 one whole input each; q, k, v, SDPA's output and fp32 log-sum-exp per head;
    # GeLU's input and output. Selective drops the log-sum-exp, full keeps the input.
    e, n, f = 4, S * B, 4 * H
    knobs = dict(tensor=t, sequence_parallel=sp > 1)
    layer = e * n * (2 * H / sp + 2 * H + 4 * H / t + 2 * f / t) + 2 * 2 * e * n / sp
    lse = 4 * n * A / t
    assert sum(tessel_layer(GPT, _tessel(**knobs)).values()) == pytest.approx(layer + lse)
    assert sum(tessel_layer(GPT, _tessel(recompute="selective", **knobs)).values()) == \
        pytest.approx(layer)
    assert tessel_stage(GPT, _tessel(recompute="full", **knobs), 3, False, False) == \
        {"checkpointed inputs": pytest.approx(3 * e * n * H / sp)}


def test_tessels_llama_layer_and_end_stages_in_closed_form() -> None:
    model = get_preset("llama3-8b")  # 8 key/value heads of 32; f = 14336
    s, h, a, d, f, v = model.seq_length, model.hidden_size, 32, 128, model.ffn_size, \
        model.vocab_size
    n, t = s * B, 4
    # bf16: RMSNorm keeps its fp32 input copy and rstd, and the bf16 normalised input;
    # repeat_kv copies 2 key/value heads per rank to its 8 query heads; SwiGLU keeps
    # silu's input and output, up's output and their product; rotary its cos and sin.
    par = _tessel(tensor=t, sequence_parallel=True, precision="bf16")
    norm = (4 * h + 4 + 2 * h) * n / t
    layer = 2 * norm + 2 * n * (2 * h + 4 * h / t + 4 * f / t) + 4 * n * a / t + 2 * 2 * s * d
    assert sum(tessel_layer(model, par).values()) == pytest.approx(layer)
    # The first stage keeps the token ids; the last its norm's, the head's whole input
    # and the loss's fp32 log-softmax of the whole logits, the targets and one scalar.
    ends = tessel_stage(model, par, 0, True, True)
    assert {kind: ends[kind] for kind in ("embedding", "head", "loss")} == {
        "embedding": 8 * n, "head": pytest.approx(norm + 2 * n * h),
        "loss": 4 * n * v + 8 * n + 4}
