"""cost_models.offload: what offload keeps off the GPU and moves per step, and the time it
adds, checked against hand computations from the DGX H100 preset's host figures (PCIe Gen5
x16 = 64 GB/s a direction per GPU, 563.2 GB/s of host memory, 55.2 GB/s NVMe read and 32
GB/s write per host of 8 GPUs); and the search that turns to offload when nothing fits."""

from __future__ import annotations

import pytest

from cost_models.offload import (
    CPU_ADAM_BYTES,
    HOST_MEMORY_EFFICIENCY,
    NVME_STATE_BYTES,
    PCIE_EFFICIENCY,
    StageState,
    cpu_adam_seconds,
    nvme_bytes_per_s,
    offload_bytes,
    offload_time,
    pageable_bytes_per_s,
    pcie_bytes_per_s,
)
from cost_models.step_time import predict_step
from planner.models.presets import zoo_config
from planner.search import search
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import FixedKnobs, ParallelConfig

H100 = Cluster.load("dgx-h100").with_devices(8)
# One GPU's state of a 70B model's pipeline stage under ZeRO-3 over 8 GPUs (8.75B each).
SHARD = 70e9 / 8
STATE = StageState(optimizer_parameters=SHARD, optimizer_bytes=12 * SHARD,
                   gradient_bytes=4 * SHARD, weight_shard_bytes=2 * SHARD,
                   activation_bytes_per_layer=1e9, layers=80)


def test_the_preset_host_links_by_hand() -> None:
    # PCIe: 64 GB/s at 80%, below each GPU's eighth of 563.2 GB/s of host memory (70.4).
    assert pcie_bytes_per_s(H100) == pytest.approx(64e9 * PCIE_EFFICIENCY)
    assert nvme_bytes_per_s(H100) == pytest.approx((55.2e9 / 8, 32e9 / 8))
    # The CPU's Adam: each GPU's eighth of the host's bandwidth, at the sustained share.
    assert cpu_adam_seconds(SHARD, H100) == pytest.approx(
        SHARD * CPU_ADAM_BYTES / (563.2e9 * HOST_MEMORY_EFFICIENCY / 8))


def test_optimizer_offload_to_nvme_by_hand() -> None:
    parallel = ParallelConfig.of(zero_stage=3, offload_optimizer="nvme")
    moved = offload_bytes(STATE, parallel, in_flight=1)
    # The fp32 gradients stay on the host under ZeRO-3; the state goes to the drives.
    assert moved.host_bytes == pytest.approx(4 * SHARD)
    assert moved.nvme_bytes == pytest.approx(12 * SHARD)
    assert (moved.nvme_read, moved.nvme_write) == pytest.approx(
        (NVME_STATE_BYTES * SHARD, NVME_STATE_BYTES * SHARD))
    assert moved.pcie_bytes(micro_batches=4) == pytest.approx(2 * SHARD + 2 * SHARD)
    time = offload_time(moved, parallel, H100, micro_batches=4, forward_s=1.0, backward_s=2.0,
                        layers=80)
    pcie, (read, write) = 64e9 * PCIE_EFFICIENCY, (55.2e9 / 8, 32e9 / 8)
    # Gradients out: 17.5 GB at 51.2 GB/s (0.34 s) hide behind the 2 s backward.
    assert time.transfers_s == 0.0
    adam = SHARD * CPU_ADAM_BYTES / (563.2e9 * HOST_MEMORY_EFFICIENCY / 8)
    assert time.optimizer_s == pytest.approx(
        adam + 2 * SHARD / pcie + 12 * SHARD / read + 12 * SHARD / write)


def test_parameter_offload_fetches_every_pass_by_hand() -> None:
    parallel = ParallelConfig.of(zero_stage=3, recompute="full", offload_params="nvme")
    moved = offload_bytes(STATE, parallel, in_flight=1)
    assert moved.fetches == 3  # forward, the recomputed forward, backward
    assert moved.nvme_bytes_read(micro_batches=2) == pytest.approx(2 * 3 * 2 * SHARD)
    assert moved.nvme_write == pytest.approx(2 * SHARD)  # the updated weights, once
    # A 17.5 GB fetch from NVMe at 6.9 GB/s (2.54 s) beside 0.5 s passes.
    time = offload_time(moved, parallel, H100, micro_batches=2, forward_s=0.5,
                        backward_s=0.5, layers=80)
    fetch = 2 * SHARD / (55.2e9 / 8)
    assert time.transfers_s == pytest.approx(2 * 3 * (fetch - 0.5))
    # The updated weights go back to the drives after the step.
    assert time.optimizer_s == pytest.approx(2 * SHARD / (32e9 / 8))


def test_activation_offload_hides_behind_the_next_layer() -> None:
    parallel = ParallelConfig.of(offload_activation_layers=10)
    moved = offload_bytes(STATE, parallel, in_flight=2)
    assert moved.host_bytes == pytest.approx(10 * 1e9 * 2)
    # 1 GB a layer at 51.2 GB/s is 19.5 ms, under each layer's 25 ms of forward.
    slow = offload_time(moved, parallel, H100, 8, forward_s=2.0, backward_s=4.0, layers=80)
    assert slow.total == 0.0
    fast = offload_time(moved, parallel, H100, 8, forward_s=0.8, backward_s=4.0, layers=80)
    assert fast.transfers_s == pytest.approx(8 * 10 * (1e9 / (64e9 * PCIE_EFFICIENCY) - 0.01))


def test_offload_moves_state_off_the_gpu_and_prices_it() -> None:
    model = zoo_config("llama3-70b", {"seq_length": 4096})
    base = ParallelConfig.of(tensor=8, global_batch_size=8, zero_stage=1, recompute="full",
                             sequence_parallel=True)
    kept = predict_step(model, H100, base)
    moved = predict_step(model, H100, base.but(offload_optimizer="cpu"))
    # Megatron-LM keeps its fp32 main gradients; the optimizer's 12 bytes leave.
    assert moved.memory_breakdown_gib["optimizer"] == 0.0
    assert kept.memory_breakdown_gib["optimizer"] == pytest.approx(
        12 * 70.55e9 / 8 / 2**30, rel=0.01)
    assert moved.memory_gib_per_gpu < kept.memory_gib_per_gpu - 70
    assert moved.offload_s > 1.0 and moved.step_time_s > kept.step_time_s
    assert moved.host_memory_gib_per_host == pytest.approx(
        8 * kept.memory_breakdown_gib["optimizer"], rel=0.01)


def test_the_search_offloads_when_nothing_fits_and_says_what() -> None:
    model = zoo_config("llama3-405b", {"seq_length": 8192})
    cluster = Cluster.load("dgx-h100").with_devices(32)
    result = search(model, cluster, 16, FixedKnobs(), "megatron")
    best, prediction = result.ranked[0]
    assert best.parallel.offload.offload_optimizer != "none"
    assert prediction.fits and prediction.offload_s > 0
    # Offload given as a knob is kept, never searched.
    cpu_only = search(model, cluster, 16, FixedKnobs(offload_optimizer="cpu"), "megatron")
    assert all(c.parallel.offload.offload_optimizer == "cpu" for c, _ in cpu_only.ranked)


def test_no_offload_without_host_figures() -> None:
    model = zoo_config("llama3-405b", {"seq_length": 8192})
    bare = Cluster.load("dgx-h100").with_devices(32).model_copy(update={"host": None})
    assert search(model, bare, 16, FixedKnobs(), "megatron").ranked == []


def test_a_job_smaller_than_a_host_shares_it_among_its_own_gpus() -> None:
    # One GPU of a DGX H100 has the host's bandwidth and drives to itself.
    one = Cluster.load("dgx-h100").with_devices(1)
    assert pcie_bytes_per_s(one) == pytest.approx(64e9 * PCIE_EFFICIENCY)
    assert nvme_bytes_per_s(one) == pytest.approx((55.2e9, 32e9))
    assert cpu_adam_seconds(SHARD, one) == pytest.approx(
        SHARD * CPU_ADAM_BYTES / (563.2e9 * HOST_MEMORY_EFFICIENCY))


def test_checkpoint_offload_blocks_on_pageable_copies_by_hand() -> None:
    """DeepSpeed's cpu_checkpointing: every layer's checkpointed input out in forward and
    back before its recomputation; with blocking copies (DeepSpeed until its 2026 offload
    engine) each holds the stream, staged through pageable memory:
    the host link (51.2 GB/s on the DGX H100) then the CPU's copy in the GPU's share of
    host memory (563.2 GB/s x 0.5 / 8, read and written: 17.6 GB/s), in turn."""
    model = zoo_config("llama3-8b", {"seq_length": 4096})
    base = ParallelConfig.of(zero_stage=3, recompute="full", global_batch_size=32,
                             micro_batch_size=2, engine="tessel", offload_copies="blocking")
    kept = predict_step(model, H100, base)
    moved = predict_step(model, H100, base.but(offload_checkpoints=True))
    per_layer = 2 * 4096 * 4096 * 2  # a micro-batch's checkpointed input, 16 bits
    rate = 1 / (1 / (64e9 * PCIE_EFFICIENCY) + 2 / (563.2e9 * HOST_MEMORY_EFFICIENCY / 8))
    assert pageable_bytes_per_s(H100) == pytest.approx(rate)
    micro_batches = 32 // (2 * 8)
    assert moved.offload_s - kept.offload_s == pytest.approx(
        micro_batches * 32 * 2 * per_layer / rate)
    assert moved.pcie_gb_per_step == pytest.approx(micro_batches * 32 * 2 * per_layer / 1e9)
    # On the GPU only the layer being recomputed keeps its input; the host holds the rest.
    checkpoints = kept.memory_breakdown_gib["activations: checkpointed inputs"]
    assert checkpoints == pytest.approx(32 * per_layer / 2**30)
    assert moved.memory_breakdown_gib["activations: checkpointed inputs"] == pytest.approx(
        checkpoints / 32)
    assert moved.host_memory_gib_per_host == pytest.approx(8 * checkpoints, rel=0.01)
    # Async (DeepSpeed's offload engine of 2026): pinned, each beside the next layer.
    overlapped = predict_step(model, H100, base.but(offload_checkpoints=True,
                                                    offload_copies="async"))
    assert overlapped.offload_s == kept.offload_s == 0.0
    assert overlapped.pcie_gb_per_step == pytest.approx(moved.pcie_gb_per_step)
    with pytest.raises(ValueError, match="offload_checkpoints needs full recomputation"):
        ParallelConfig.of(offload_checkpoints=True).resolve(8)
