"""cost_models.model_flops: the one MFU function (PaLM, Appendix B) and its peak, which the
transformer plans' step-time model and the graph plans both report."""

from __future__ import annotations

import pytest

from cost_models.model_flops import model_flops_utilization, peak_flops, step_flops
from cost_models.step_time import predict_step
from planner.models.presets import get_preset
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
