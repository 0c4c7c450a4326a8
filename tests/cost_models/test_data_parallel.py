"""cost_models.data_parallel under blocking copies (DeepSpeed before v0.15.4): ZeRO-3's
gradient buckets as DeepSpeed fills them, and their reduce-scatters priced one after
another beside no compute, checked by hand."""

from __future__ import annotations

import itertools
import random

import pytest

from cost_models.comm import group_collective_time
from cost_models.data_parallel import (
    DEEPSPEED_REDUCE_BUCKET,
    blocking_reductions,
    data_parallel_comm,
    deepspeed_buckets,
    hidden,
)
from cost_models.kernel_time import Pass
from cost_models.stage_parameters import layer_gradients
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig


def test_deepspeed_fills_a_bucket_until_the_next_gradient_would_overflow_it() -> None:
    # A layer of GPT-3 175B backward-first: fc2's bias then weight, fc1's, ... at 9e7.
    assert deepspeed_buckets([1, 600, 4, 600, 2, 2, 1, 150], 90) == [1, 600, 4, 600, 5, 150]
    assert deepspeed_buckets([10, 20, 30, 40], 60) == [60, 40]
    assert deepspeed_buckets([], 60) == []


def brute_force(gradients: list[float], bucket: float) -> list[float]:
    """The same rule read literally: walk the gradients, closing the open bucket whenever
    adding the next would pass `bucket` and the bucket is not empty."""
    out, current = [], []
    for n in gradients:
        if current and sum(current) + n > bucket:
            out.append(sum(current))
            current = []
        current.append(n)
    return out + ([sum(current)] if current else [])


def test_deepspeed_buckets_keep_every_gradient_once_on_random_cases() -> None:
    rng = random.Random(0)
    for _ in range(200):
        gradients = [float(rng.randint(1, 100)) for _ in range(rng.randint(0, 12))]
        bucket = float(rng.randint(1, 150))
        buckets = deepspeed_buckets(gradients, bucket)
        assert buckets == brute_force(gradients, bucket)
        assert sum(buckets) == pytest.approx(sum(gradients))
        # A bucket over the size holds one gradient: the one that would not fit.
        assert all(b in gradients for b in buckets if b > bucket)
        assert all(a + b > bucket for a, b in itertools.pairwise(buckets))


def test_blocking_reductions_are_zero3_with_an_offloaded_optimizer_and_blocking_copies() -> None:
    blocking = ParallelConfig.of(zero_stage=3, offload_optimizer="cpu",
                                 offload_copies="blocking")
    assert blocking_reductions(blocking)
    assert not blocking_reductions(blocking.but(offload_copies="async"))
    assert not blocking_reductions(blocking.but(offload_optimizer="none"))
    assert not blocking_reductions(blocking.but(zero_stage=2))


def test_blocking_reductions_run_bucket_by_bucket_beside_no_compute_by_hand() -> None:
    """GPT-3 175B on 128 A100 under ZeRO-3 at the Azure recipe's 9e7-element buckets: 12
    reduce-scatters a layer (six weights, each over a bucket, and the biases and norms
    between them), each paying its latency, and not one hidden behind the backward; the
    forward's gathers still run beside the forward."""
    model = zoo_config("gpt3-175b", {"seq_length": 1024})
    cluster = Cluster.load("dgx-a100-80g").with_devices(128)
    layer = layer_gradients(model)
    h = model.hidden_size
    assert sum(layer) == pytest.approx(model.parameters_per_layer())
    assert layer[:2] == (h, h * 4 * h)  # fc2's bias, then its weight
    parallel = ParallelConfig.of(zero_stage=3, offload_optimizer="cpu", recompute="full",
                                 offload_copies="blocking", overlap_grad_reduce=True,
                                 ddp_bucket_size=90_000_000, global_batch_size=128,
                                 precision="fp16").resolve(128)
    params = 96 * sum(layer) + model.vocab_size * h + 2 * h
    kernels = Pass(forward=1.0, backward=2.0, recompute=1.0)
    buckets = deepspeed_buckets(list(layer) * 96 + [params - 96 * sum(layer)], 90_000_000)
    # fc2.b alone, fc2.w, fc1.b, fc1.w, the norms with proj's bias, proj.w, and the q, k
    # and v weights apart with each bias between: 12 a layer (a layer's input norm joins
    # the next layer's fc2.b); last the first layer's input norm, then the embeddings.
    assert len(buckets) == 12 * 96 + 2

    def reduce_scatter(n: float) -> float:
        return group_collective_time("reduce_scatter", 2 * n, 128, 1, cluster)

    def all_gather(n: float) -> float:
        return group_collective_time("all_gather", 2 * n, 128, 1, cluster)

    # Beside the compute: the micro-batch's gathers behind its forward and recomputation
    # (the first layer's waits), the updated weights' gather behind the next forward (its
    # first bucket waits); each slows the compute it runs beside.
    slowdown = cluster.device.efficiency.overlap_slowdown
    bucket = 90_000_000  # --ddp-bucket-size, DeepSpeed's reduce_bucket_size
    beside = (hidden(all_gather(params), 96 * 2.0, all_gather(params / 96), slowdown)
              + hidden(all_gather(params), 96 * 1.0, all_gather(bucket), slowdown))
    exposed = data_parallel_comm(params, parallel, cluster, kernels, 96, 96, sum(layer),
                                 layer_gradients=layer)
    assert exposed == pytest.approx(sum(reduce_scatter(n) for n in buckets) + beside)
    assert beside < 0.15 * exposed  # the reductions, serial, are what is exposed
    async_ = data_parallel_comm(params, parallel.but(offload_copies="async"), cluster,
                                kernels, 96, 96, sum(layer), layer_gradients=layer)
    assert async_ < exposed / 3  # bucketed overlap hides all but the last bucket
    assert DEEPSPEED_REDUCE_BUCKET == 500_000_000  # DeepSpeed's default reduce_bucket_size
