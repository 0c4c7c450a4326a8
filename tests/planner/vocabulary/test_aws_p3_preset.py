"""The aws-p3.16xlarge preset (Alpa's evaluation cluster): its datasheet numbers, and that a
device without bf16 plans, prices and launches in fp16."""

from __future__ import annotations

import pytest

from cost_models.kernel_time import kernel_seconds
from cost_models.step_time import predict_step
from cost_models.transformer_ops import Attention, Matmul
from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.cluster import Cluster
from planner.search.knobs import check_knobs, default_precision
from planner.models.presets import PRESETS
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan

NAME = "aws-p3.16xlarge"


@pytest.fixture
def p3() -> Cluster:
    return Cluster.load(NAME)


def test_loads_with_the_datasheet_numbers(p3: Cluster) -> None:
    device = p3.device
    # V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core, 15.7 fp32; no bf16 (or tf32, fp8).
    assert device.peak_tflops == {"fp32": 15.7, "fp16": 125}
    assert device.memory_gib == 16160 / 1024  # of the datasheet's 16 GB, what CUDA sees
    assert device.memory_bandwidth_gbs == 900
    # NVLink 2: 300 GB/s total per GPU, counted both ways.
    assert p3.intra_node.bandwidth_gbs == 300 / 2
    assert p3.devices_per_node == 8
    # AWS: 25 Gbps per instance, shared by its 8 GPUs; the preset gives it per GPU.
    assert p3.inter_node.bandwidth_gbs == 25 / 8 / 8
    assert p3.devices_per_node * p3.inter_node.bandwidth_gbs == 25 / 8
    assert p3.intra_node.latency_us <= p3.inter_node.latency_us


def test_alpa_s_64_gpus_are_8_instances(p3: Cluster) -> None:
    assert p3.with_devices(64).num_nodes == 8


def test_default_precision_is_fp16_without_bf16(p3: Cluster) -> None:
    assert default_precision(p3) == "fp16"
    assert default_precision(Cluster.load("dgx-a100-80g")) == "bf16"
    assert default_precision(Cluster.load("cpu")) == "fp32"


def test_bf16_is_refused_naming_the_flag(p3: Cluster) -> None:
    with pytest.raises(ValueError, match="--precision bf16 needs bf16 tensor cores, which "
                                         "V100-SXM2-16GB lacks; use one it has"):
        check_knobs(FixedKnobs({"precision": "bf16"}), PRESETS["gpt3-350m"], p3, 64, "auto")
    check_knobs(FixedKnobs({"precision": "fp16"}), PRESETS["gpt3-350m"], p3, 64, "auto")


def test_fp16_kernels_run_at_the_fp16_peak(p3: Cluster) -> None:
    device, eff = p3.device, p3.device.efficiency
    big = Matmul("big", 8192, 8192, 8192)
    expected = big.flops / (125e12 * eff.matmul_fraction(8192, 8192, 8192))
    assert kernel_seconds(big, device, eff, "fp16") == pytest.approx(
        expected + eff.kernel_overhead_us * 1e-6)
    # Attention kernels are 16-bit too: fp16's peak, not the fp32 fallback.
    attention = Attention("core", 1e12, causal=False)
    assert kernel_seconds(attention, device, eff, "fp16") == pytest.approx(
        1e12 / (125e12 * eff.attention) + eff.kernel_overhead_us * 1e-6)


def test_fp16_plan_reports_mfu_against_fp16_and_launches_with_fp16(p3: Cluster) -> None:
    cluster = p3.with_devices(8)
    parallel = ParallelConfig.of(tensor=2, data=4, micro_batch_size=2, global_batch_size=64,
                              precision="fp16")
    prediction = predict_step(PRESETS["gpt3-350m"], cluster, parallel)
    assert prediction.mfu == pytest.approx(prediction.model_tflops_per_gpu / 125)
    plan = training_plan("gpt3-350m", PRESETS["gpt3-350m"], cluster, parallel)
    assert plan.precision == "fp16"
    assert "--fp16" in plan.megatron_flags
    assert "--bf16" not in plan.megatron_flags


def test_the_search_plans_in_the_devices_default_precision(p3: Cluster) -> None:
    # A caller of the search who fixes no precision gets fp16 on a V100, as the CLI does.
    from planner.models.presets import get_preset
    from planner.search import search

    result = search(get_preset("gpt3-350m"), p3.with_devices(8), 64, {}, "megatron")
    assert result.ranked
    assert {candidate.parallel.numerics.precision for candidate, _ in result.ranked} == {"fp16"}


def test_plans_on_a_v100_price_attention_unfused(p3: Cluster) -> None:
    # Volta runs no FlashAttention: the search and the plan price the score matrix.
    from planner.models.presets import get_preset
    from planner.search import search
    from planner.plans.transformer_plan import training_plan

    assert not p3.device.flash_attention and Cluster.load("dgx-a100-80g").device.flash_attention
    cluster = p3.with_devices(8)
    model = get_preset("gpt3-350m")
    candidate, prediction = search(model, cluster, 64, {}, "megatron").ranked[0]
    unfused = predict_step(model, cluster, candidate.parallel, flash_attention=False,
                           layers_per_stage=list(candidate.layers_per_stage))
    assert prediction.step_time_s == pytest.approx(unfused.step_time_s, rel=1e-12)
    plan = training_plan("gpt3-350m", model, cluster, candidate.parallel,
                         list(candidate.layers_per_stage))
    assert plan.predicted.step_time_s == pytest.approx(unfused.step_time_s, rel=1e-12)
