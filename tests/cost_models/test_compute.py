import pytest
import torch

from cost_models.compute import dtype_key, op_time
from planner.vocabulary.cluster import Cluster


@pytest.fixture
def a100():
    return Cluster.load("dgx-a100-80g").device


def test_dtype_key() -> None:
    assert dtype_key(torch.float32) == "fp32"
    assert dtype_key(torch.bfloat16) == "bf16"
    assert dtype_key(torch.float16) == "fp16"
    assert dtype_key(torch.int64) == "int64"


def test_compute_bound_matmul(a100) -> None:
    # 8192^3 bf16 matmul: 2*n^3 FLOPs, 3*n^2*2 bytes -> arithmetic intensity ~2700.
    n = 8192
    flops, nbytes = 2 * n**3, 3 * n * n * 2
    t = op_time(flops, nbytes, a100, dtype_key(torch.bfloat16))
    assert t == pytest.approx(flops / 312e12)
    assert t > nbytes / 2039e9


def test_memory_bound_elementwise(a100) -> None:
    # fp32 add of 2^28 elements: 1 FLOP and 12 bytes per element.
    n = 2**28
    t = op_time(n, 12 * n, a100, "fp32")
    assert t == pytest.approx(12 * n / 2039e9)
    assert t > n / 19.5e12


def test_unknown_dtype_uses_fp32_peak(a100) -> None:
    assert op_time(1e12, 0, a100, "int64") == pytest.approx(1e12 / 19.5e12)
    assert op_time(1e12, 0, a100, "fp8") == op_time(1e12, 0, a100, "fp32")
