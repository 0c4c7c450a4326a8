"""cost_models.model_flops: the one MFU function (PaLM, Appendix B) and its peak, which the
transformer plans' step-time model and the graph plans both report, and the model FLOPs it
divides: Megatron-LM's count, checked against its formula by hand."""

from __future__ import annotations

import pytest

from cost_models.model_flops import (
    MODEL_FLOPS_COUNT,
    megatron_flops_per_token,
    model_flops_utilization,
    peak_flops,
    step_flops,
)
from cost_models.step_time import predict_step
from planner.models.presets import get_preset
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig


def test_mfu_is_model_flops_per_second_per_gpu_over_the_peak() -> None:
    a100 = Cluster.load("dgx-a100-80g").device
    # 1.5e18 model FLOPs in 10 s on 1000 GPUs: 150 TFLOP/s each, of A100's 312 bf16.
    assert model_flops_utilization(1.5e18, 10.0, 1000, a100, "bf16") == \
        pytest.approx(150 / 312, rel=1e-15)
    assert peak_flops(a100, "bf16") == 312e12


def test_a_precision_without_a_peak_is_measured_against_fp32() -> None:
    # DeviceSpec's one fallback for dtypes its datasheet does not list: a V100 has no bf16.
    v100 = Cluster.load("aws-p3.16xlarge").device
    assert "bf16" not in v100.peak_tflops
    assert peak_flops(v100, "bf16") == peak_flops(v100, "fp32") == 15.7e12
    assert peak_flops(v100, "fp16") == 125e12


def test_the_step_time_model_reports_this_mfu() -> None:
    model = get_preset("gpt3-175b")
    cluster = Cluster.load("dgx-a100-80g").with_devices(512)
    parallel = ParallelConfig.of(tensor=8, pipeline=8, micro_batch_size=1,
                                 global_batch_size=1536, recompute="full")
    p = predict_step(model, cluster, parallel)
    flops, _ = step_flops(model, parallel.resolve(512), 96)
    assert p.mfu == model_flops_utilization(flops, p.step_time_s, 512, cluster.device, "bf16")


# Megatron-LM's model FLOPs, hand-counted from its formula with each model card's numbers
# (megatron/training/training.py `num_floating_point_operations` at d98e8a64dd): per token,
# 6 = 3 (forward, data and weight gradients) x 2 (a multiply-add) per weight; the core
# attention term 6 x s x (query width) for QK^T and AV over half the keys (causal mask).


def test_gpt3_175b_counts_as_megatron_lm_with_the_causal_half() -> None:
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, h 12288, 96 heads of 128,
    # GeLU MLP 4h, vocabulary 51200 (50257 padded), sequence 2048.
    qkv_out = 6 * (12288 * 3 * 12288 + 12288 * 12288)
    core = 6 * 2048 * 12288 / 2 * 2
    mlp = 6 * 12288 * 49152 * 2
    logits = 6 * 12288 * 51200
    per_token = 96 * (qkv_out + core + mlp) + logits
    assert per_token == 1_061_947_441_152
    # Narayanan et al.'s 72 l h^2 (1 + s/6h + V/12hl) with the attention-score term halved.
    assert per_token == pytest.approx(
        72 * 96 * 12288**2 * (1 + 2048 / (12 * 12288) + 51200 / (12 * 12288 * 96)))
    assert megatron_flops_per_token(get_preset("gpt3-175b")) == pytest.approx(per_token,
                                                                              rel=1e-12)


def test_llama3_70b_counts_as_megatron_lm_with_the_causal_half() -> None:
    # Llama 3 70B (Dubey et al. 2024, Table 3): 80 layers, h 8192, 64 query heads of 128,
    # 8 key/value heads, SwiGLU FFN 28672, vocabulary 128256; sequence 8192.
    qkv_out = 6 * (8192 * (64 * 128 + 2 * 8 * 128) + 64 * 128 * 8192)
    core = 6 * 8192 * (64 * 128) / 2 * 2
    mlp = 6 * 8192 * 28672 * 3
    logits = 6 * 8192 * 128256
    per_token = 80 * (qkv_out + core + mlp) + logits
    assert per_token == 449_222_541_312
    assert megatron_flops_per_token(get_preset("llama3-70b")) == pytest.approx(per_token,
                                                                               rel=1e-12)


def test_qwen3_235b_counts_148_gflop_per_token_as_megatron_lm_does() -> None:
    # Qwen3-235B-A22B (its config.json): 94 layers, h 4096, 64 query heads of 128, 4
    # key/value heads, every layer 128 experts of 1536 with 8 routed (SwiGLU), no shared
    # expert, vocabulary 151936; sequence 4096. The router counts nothing.
    qkv_out = 6 * (4096 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * 4096)
    core = 6 * 4096 * (64 * 128) / 2 * 2
    experts = 6 * 4096 * 1536 * 8 * 3
    logits = 6 * 4096 * 151936
    per_token = 94 * (qkv_out + core + experts) + logits
    assert per_token == 148_034_813_952  # ../shared/calibration/README.md: 148.0 GFLOP
    # Megatron-MoE-ModelZoo's H100 FP8 run (published_moe_runs.csv): 253 TFLOP/s at
    # 1712 tokens/s per GPU, its TFLOP/s rounded to three figures.
    assert per_token == pytest.approx(253e12 / 1712, rel=0.002)
    assert megatron_flops_per_token(get_preset("qwen3-235b-a22b")) == pytest.approx(
        per_token, rel=1e-12)


def test_deepseek_v3_counts_mla_and_mtp_as_megatron_lm_does() -> None:
    # DeepSeek-V3 (its report, Sec. 4.2, and config.json): 61 layers, the first 3 dense
    # (SwiGLU FFN 18432), the others 256 experts of 2048 with 8 routed and 1 shared of
    # 2048; h 7168; MLA with 128 heads, q rank 1536, kv rank 512, query/key head 128 + 64
    # rotary, value head 128; one MTP layer (a MoE block, as the last layer); vocabulary
    # 129280; sequence 4096.
    q = 1536 * (7168 + 128 * (128 + 64) + 1)           # q down, q up, q norm ("+ 1")
    kv = 512 * (7168 + 128 * (128 + 128) + 1)          # kv down, kv up, kv norm
    attention = 6 * (q + kv + 7168 * 64 + 128 * 128 * 7168)  # + shared rotary key, output
    core = 6 * 4096 * (128 * (128 + 64) / 2 + 128 * 128 / 2)
    dense = 6 * 7168 * 18432 * 3
    moe = 6 * 7168 * (2048 * 8 + 2048) * 3
    mtp = 6 * (3 * 7168 + 2 * 7168 * 7168)             # its norms and 2h -> h projection
    logits = 6 * 7168 * 129280 * 2                     # the model's and the MTP layer's
    per_token = (61 + 1) * (attention + core) + 3 * dense + (58 + 1) * moe + mtp + logits
    assert per_token == 259_992_950_784
    # Megatron-MoE-ModelZoo's B200 MXFP8 run (published_moe_runs.csv): 864 TFLOP/s at
    # 3328 tokens/s per GPU.
    assert per_token == pytest.approx(864e12 / 3328, rel=0.002)
    assert megatron_flops_per_token(get_preset("deepseek-v3")) == pytest.approx(
        per_token, rel=1e-12)


def test_the_full_score_matrix_is_the_count_before_the_causal_half() -> None:
    """`causal=False`: Megatron-LM's count before 8873b55d6a, Narayanan et al.'s
    72 l h^2 (1 + s/6h + V/12hl) per token, which Megatron-Core's H100 table used."""
    model = get_preset("gpt3-175b")
    layers, h, s, v = 96, 12288, 2048, 51200
    assert megatron_flops_per_token(model, causal=False) == pytest.approx(
        72 * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers)), rel=1e-12)


def test_model_tflops_and_mfu_are_megatron_lms_count() -> None:
    """A step's model TFLOP/s and MFU count its tokens as Megatron-LM does; the executed
    count is the kernels': the router on top for a MoE model, and no more for a dense one
    without recomputation (its causal kernels skip the masked half as the count halves it)."""
    cluster = Cluster.load("dgx-h100").with_devices(256)
    model = get_preset("qwen3-235b-a22b")
    parallel = ParallelConfig.of(tensor=2, pipeline=8, expert=16, micro_batch_size=1,
                                 global_batch_size=2048, sequence_parallel=True,
                                 recompute="none")
    p = predict_step(model, cluster, parallel)
    model_flops = 2048 * 4096 * 148_034_813_952
    assert p.model_tflops_per_gpu * 1e12 * p.step_time_s * 256 == pytest.approx(model_flops,
                                                                               rel=1e-9)
    assert p.mfu == pytest.approx(
        model_flops / p.step_time_s / 256 / peak_flops(cluster.device, "bf16"), rel=1e-9)
    assert p.flops_count == MODEL_FLOPS_COUNT == "megatron-lm causal"
    router = 2048 * 4096 * 94 * 6 * 4096 * 128
    assert p.hardware_tflops_per_gpu * 1e12 * p.step_time_s * 256 == pytest.approx(
        model_flops + router, rel=1e-9)
    dense = predict_step(get_preset("llama3-70b"), cluster, ParallelConfig.of(
        tensor=8, pipeline=4, micro_batch_size=1, global_batch_size=64, recompute="none"))
    assert dense.hardware_tflops_per_gpu == pytest.approx(dense.model_tflops_per_gpu)


def test_sliding_windows_count_as_full_attention_but_execute_their_band() -> None:
    """Megatron-LM's count has no window term; the kernels compute a window's band."""
    model = get_preset("gpt-oss-120b")
    full = model.model_copy(update={"window_size": None, "window_attn_skip_freq": None})
    assert megatron_flops_per_token(model) == megatron_flops_per_token(full)
    parallel = ParallelConfig.of(global_batch_size=1).resolve(1)
    assert step_flops(model, parallel, 0)[1] < step_flops(full, parallel, 0)[1]


def test_a_plan_names_its_flop_count() -> None:
    model, cluster = get_preset("gpt3-1.3b"), Cluster.load("dgx-h100").with_devices(8)
    plan = training_plan("gpt3-1.3b", model, cluster,
                         ParallelConfig.of(tensor=2, micro_batch_size=1, global_batch_size=8))
    assert plan.predicted.flops_count == "megatron-lm causal"
