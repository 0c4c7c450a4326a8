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


# ------------------------------------------------- the mixtures of experts trained in 2026

def _gpt_oss_layers(n: int) -> list[str]:
    """GPT-OSS's released layer_types: sliding first, then full, alternating."""
    return ["sliding_attention", "full_attention"] * (n // 2)


# The released config.json files (Hugging Face: deepseek-ai/DeepSeek-V3, Qwen/Qwen3-235B-A22B,
# Qwen/Qwen3-30B-A3B, openai/gpt-oss-120b, openai/gpt-oss-20b, mistralai/Mixtral-8x22B-v0.1),
# field for field; auto_map and quantization_config included, as the Hub serves them.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}


def _qwen3_moe(layers: int, hidden: int, heads: int, ffn: int, moe_ffn: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": hidden,
        "initializer_range": 0.02, "intermediate_size": ffn, "max_position_embeddings": 40960,
        "max_window_layers": layers, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": moe_ffn, "norm_topk_prob": True,
        "num_attention_heads": heads, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": layers, "num_key_value_heads": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    }


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True,
        "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
        "layer_types": _gpt_oss_layers(layers), "max_position_embeddings": 131072,
        "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": layers, "num_key_value_heads": 8, "num_local_experts": experts,
        "output_router_logits": False, "pad_token_id": 199999,
        "quantization_config": {"modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"], "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
    }


MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 6144, "initializer_range": 0.02,
    "intermediate_size": 16384, "max_position_embeddings": 65536, "model_type": "mixtral",
    "num_attention_heads": 48, "num_experts_per_tok": 2, "num_hidden_layers": 56,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.38.0", "use_cache": True, "vocab_size": 32768,
}

RELEASED = {
    "deepseek-v3": DEEPSEEK_V3,
    "qwen3-235b-a22b": _qwen3_moe(94, 4096, 64, 12288, 1536),
    "qwen3-30b-a3b": _qwen3_moe(48, 2048, 32, 6144, 768),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "gpt-oss-20b": _gpt_oss(24, 32),
    "mixtral-8x22b": MIXTRAL_8X22B,
}


@pytest.mark.parametrize("preset", list(RELEASED))
def test_a_released_config_is_its_preset(preset: str, tmp_path: Path) -> None:
    """The released config.json of each MoE the presets name maps onto the preset's
    shape: the same total and active parameters, and every field (the training sequence
    is the preset's)."""
    from planner.models.presets import PRESETS

    expected = PRESETS[preset]
    shape = to_transformer_config(load_hf_config(_write(tmp_path, RELEASED[preset])),
                                  expected.seq_length)
    assert shape.num_parameters() == expected.num_parameters()
    assert shape.num_active_parameters() == expected.num_active_parameters()
    ignored = {"hidden_dropout", "attention_dropout"}  # presets state none; both are 0
    assert {k: v for k, v in shape.model_dump().items() if k not in ignored} == {
        k: v for k, v in expected.model_dump().items() if k not in ignored}


def test_the_released_deepseek_v3_reads_as_its_report_states_it(tmp_path: Path) -> None:
    """DeepSeek-V3 (arXiv 2412.19437, Sec. 4.2): every MoE field of the shape."""
    shape = to_transformer_config(load_hf_config(_write(tmp_path, DEEPSEEK_V3)), 4096)
    assert shape.multi_latent_attention and shape.num_query_groups is None
    assert (shape.q_lora_rank, shape.kv_lora_rank, shape.qk_head_dim,
            shape.qk_pos_emb_head_dim, shape.v_head_dim) == (1536, 512, 128, 64, 128)
    assert shape.moe_layer_freq == [0] * 3 + [1] * 58
    assert (shape.num_experts, shape.moe_top_k, shape.moe_ffn_hidden_size,
            shape.moe_shared_expert_intermediate_size, shape.ffn_hidden_size) == (
        256, 8, 2048, 2048, 18432)
    assert (shape.moe_router_score_function, shape.moe_router_num_groups,
            shape.moe_router_group_topk, shape.mtp_num_layers) == ("sigmoid", 8, 4, 1)
    assert round(shape.num_parameters() / 1e9) == 683  # 671B + the 14B MTP module
    assert round(shape.num_active_parameters() / 1e9) == 38  # the report's "37B"


# Small configs of each family, with the released files' field names: the zoo shape
# counts exactly the parameters transformers' own model has.
SMALL = {
    "deepseek_v3": {**DEEPSEEK_V3, "num_hidden_layers": 3, "first_k_dense_replace": 1,
                    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 16,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
                    "topk_group": 2, "n_shared_experts": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
                    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                    "vocab_size": 128, "max_position_embeddings": 64,
                    "quantization_config": None},
    "deepseek_v3_no_q_rank": {**DEEPSEEK_V3, "num_hidden_layers": 2, "hidden_size": 64,
                              "first_k_dense_replace": 0, "intermediate_size": 96,
                              "moe_intermediate_size": 16, "n_routed_experts": 4,
                              "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                              "num_attention_heads": 4, "num_key_value_heads": 4,
                              "q_lora_rank": None, "kv_lora_rank": 16,
                              "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                              "vocab_size": 128, "max_position_embeddings": 64,
                              "num_nextn_predict_layers": 0, "quantization_config": None},
    "qwen3_moe": {**_qwen3_moe(4, 64, 4, 96, 16), "head_dim": 32, "num_key_value_heads": 2,
                  "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [1],
                  "decoder_sparse_step": 1, "vocab_size": 128},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "attention_bias": False, "head_dim": 32, "hidden_size": 64,
              "intermediate_size": 96, "max_position_embeddings": 64, "max_window_layers": 2,
              "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
              "rope_theta": 1000000.0, "sliding_window": 8, "use_sliding_window": True,
              "tie_word_embeddings": True, "vocab_size": 128},
    "gpt_oss": {**_gpt_oss(4, 8), "hidden_size": 64, "intermediate_size": 32, "head_dim": 16,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                "sliding_window": 8, "max_position_embeddings": 64,
                "quantization_config": None, "pad_token_id": 0, "eos_token_id": 1},
    "mixtral": {**MIXTRAL_8X22B, "hidden_size": 64, "intermediate_size": 96,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "num_local_experts": 4, "head_dim": 32, "sliding_window": 8,
                "vocab_size": 128},
}


@pytest.mark.parametrize("family", list(SMALL))
def test_a_small_config_counts_the_parameters_transformers_builds(
        family: str, tmp_path: Path) -> None:
    from planner.models.huggingface import build_hf_model

    fields = {k: v for k, v in SMALL[family].items() if v is not None or k == "q_lora_rank"}
    config = load_hf_config(_write(tmp_path, fields))
    shape = to_transformer_config(config, 16)
    model, _ = build_hf_model(config)
    assert shape.num_parameters() == sum(
        p.numel() for p in model.parameters()) + _mtp_parameters(shape)


def _mtp_parameters(shape: Any) -> int:
    """transformers builds no MTP module (it loads only the decoder): what the zoo adds."""
    if not shape.mtp_num_layers:
        return 0
    with_mtp = shape.num_parameters()
    return with_mtp - shape.model_copy(update={"mtp_num_layers": 0}).num_parameters()


def test_small_configs_read_every_moe_field(tmp_path: Path) -> None:
    """The fields each family states, as the zoo states them."""
    def shape(family: str) -> Any:
        folder = tmp_path / family
        fields = {k: v for k, v in SMALL[family].items() if v is not None
                  or k == "q_lora_rank"}
        return to_transformer_config(load_hf_config(_write(folder, fields)), 16)

    deepseek = shape("deepseek_v3")
    assert deepseek.moe_layer_freq == [0, 1, 1]
    assert deepseek.moe_shared_expert_intermediate_size == 32  # 2 shared x 16
    assert (deepseek.moe_router_num_groups, deepseek.moe_router_group_topk) == (4, 2)
    lite = shape("deepseek_v3_no_q_rank")
    assert lite.q_lora_rank is None and lite.moe_layer_freq == 1 and lite.mtp_num_layers == 0
    assert lite.moe_router_num_groups is None  # one group: no group limit
    qwen = shape("qwen3_moe")
    assert (qwen.kv_channels, qwen.qk_layernorm, qwen.moe_layer_freq) == (32, True,
                                                                          [1, 0, 1, 1])
    assert (qwen.num_experts, qwen.moe_ffn_hidden_size, qwen.ffn_hidden_size) == (8, 16, 96)
    dense = shape("qwen3")
    # max_window_layers 2: layers 2 and 3 slide (Qwen3Config's layer_types).
    assert (dense.window_size, dense.window_attn_skip_freq) == (8, [0, 0, 1, 1])
    oss = shape("gpt_oss")
    assert (oss.window_size, oss.window_attn_skip_freq, oss.softmax_type, oss.bias) == (
        8, 2, "learnable", True)
    mixtral = shape("mixtral")
    assert (mixtral.kv_channels, mixtral.window_size, mixtral.window_attn_skip_freq) == (
        32, 8, None)


@pytest.mark.parametrize(("family", "change", "field"), [
    ("gpt_oss", {"attention_bias": False}, "attention_bias"),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("gpt_oss", {"layer_types": ["chunked_attention"] * 4}, "layer_types"),
    # transformers divides by the step (ZeroDivisionError here before) and routes to k experts.
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen3_moe", {"num_experts_per_tok": 0}, "num_experts_per_tok"),
])
def test_a_shape_the_zoo_cannot_state_is_refused_naming_the_field(
        family: str, change: dict[str, Any], field: str, tmp_path: Path) -> None:
    from planner.models.hf_shape import HFConfigError

    fields = {k: v for k, v in {**SMALL[family], **change}.items() if v is not None}
    with pytest.raises(HFConfigError) as raised:
        to_transformer_config(load_hf_config(_write(tmp_path, fields)), 16)
    message = str(raised.value)
    assert f"'{field}'" in message and "\n" not in message


def test_a_config_whose_layers_differ_has_no_uniform_depth(tmp_path: Path) -> None:
    """DeepSeek-V3's dense first layers and Qwen3-MoE's mlp_only_layers make blocks of
    two kinds: no one repeated block."""
    for family in ("deepseek_v3", "qwen3_moe", "gpt_oss"):
        fields = {k: v for k, v in SMALL[family].items() if v is not None}
        assert hf_num_layers(load_hf_config(_write(tmp_path / family, fields))) is None
    uniform = {k: v for k, v in SMALL["deepseek_v3_no_q_rank"].items()
               if v is not None or k == "q_lora_rank"}
    assert hf_num_layers(load_hf_config(_write(tmp_path / "lite", uniform))) == 2
