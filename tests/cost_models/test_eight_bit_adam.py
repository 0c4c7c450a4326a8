"""bitsandbytes' 8-bit Adam, paged or not, and a step in backward, as a user of torchtune's
single-device full fine-tune sees them: the memory per GPU against a hand count, the paged
state's traffic against the preset's PCIe, the published rows within their targets, and
the one-line errors."""

from __future__ import annotations

import re

import pytest

from cost_models.eight_bit_adam import BLOCK, STATE_BYTES, STEP_BYTES, paged_bytes
from cost_models.offload import PCIE_EFFICIENCY
from cost_models.published_finetune import predict, read_runs
from cost_models.step_time import predict_step
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

LLAMA = zoo_config("llama3-8b", {"seq_length": 2048})
RTX_4090 = Cluster.load("rtx-4090").with_devices(1)
PARAMS = LLAMA.num_parameters()
GIB = 2**30


def full(**knobs: object) -> ParallelConfig:
    """torchtune's full fine-tune of Llama 3.1 8B on one GPU, bf16 throughout."""
    return ParallelConfig.of(**{
        "global_batch_size": 2, "micro_batch_size": 2, "recompute": "full",
        "engine": "torchtitan", "finetune": "full", "main_grads_dtype": "bf16",
        "loss_chunks": 8, "compile": True, "compile_loss": True, **knobs})


def test_bitsandbytes_blockwise_state_is_two_bytes_and_a_scale_per_256() -> None:
    # Optimizer2State.init_state: two uint8 moments, an fp32 absmax per block of 256.
    assert BLOCK == 256 and STATE_BYTES == 2 + 2 * 4 / 256
    # The step reads the bf16 weight and gradient and both moments, writes three of them.
    assert STEP_BYTES == 2 + 2 + 2 * STATE_BYTES + 2


def test_an_8bit_adam_holds_its_moments_and_no_fp32_copy() -> None:
    eight = predict_step(LLAMA, RTX_4090, full(optimizer="adam8bit")).memory_breakdown_gib
    assert eight["weights"] == pytest.approx(2 * PARAMS / GIB)
    assert eight["gradients"] == pytest.approx(2 * PARAMS / GIB)
    assert eight["optimizer"] == pytest.approx(STATE_BYTES * PARAMS / GIB)
    adam = predict_step(LLAMA, RTX_4090, full()).memory_breakdown_gib
    assert adam["optimizer"] == pytest.approx(12 * PARAMS / GIB)  # fp32 master + moments


def test_a_step_in_backward_keeps_one_gradient_the_heads() -> None:
    # Each parameter stepped and its gradient freed as it is made: the largest gradient,
    # the output layer's (vocabulary x hidden, bf16), is all that is alive at once.
    knobs = full(optimizer="adam8bit", optimizer_in_backward=True)
    memory = predict_step(LLAMA, RTX_4090, knobs).memory_breakdown_gib
    assert memory["gradients"] == pytest.approx(2 * LLAMA.vocab_size * LLAMA.hidden_size / GIB)


def test_paged_state_leaves_the_allocator_and_what_does_not_fit_moves_each_step() -> None:
    knobs = full(optimizer="paged_adam8bit", optimizer_in_backward=True)
    paged = predict_step(LLAMA, RTX_4090, knobs)
    resident = predict_step(LLAMA, RTX_4090, full(optimizer="adam8bit",
                                                  optimizer_in_backward=True))
    assert paged.memory_breakdown_gib["optimizer"] == 0.0
    assert not resident.fits and paged.fits  # 15 GiB of state beside a 15 GiB model
    state = STATE_BYTES * PARAMS
    assert paged.host_memory_gib_per_host == pytest.approx(state / GIB)
    # What does not fit beside torch's reserved pool goes out and comes back, in line with
    # the compute: at 80% of the 4090's PCIe 4.0 x16 (the preset's 32 GB/s).
    free = (23.99 - paged.reserved_gib_per_gpu) * GIB  # the pool and memory outside it
    moved = state - free
    assert paged.pcie_gb_per_step == pytest.approx(2 * moved / 1e9)
    assert RTX_4090.host is not None and RTX_4090.host.pcie_gbs == 32
    assert paged.offload_s == pytest.approx(2 * moved / (32e9 * PCIE_EFFICIENCY))
    assert paged.step_time_s == pytest.approx(resident.step_time_s + paged.offload_s)


def test_paged_state_that_fits_beside_the_pool_never_moves() -> None:
    assert paged_bytes(10.0, 12.0) == 0.0
    assert paged_bytes(10.0, 4.0) == 6.0
    assert paged_bytes(10.0, -3.0) == 10.0  # a pool that overflows leaves no room at all


def test_torchtunes_full_finetune_row_is_predicted_within_the_targets() -> None:
    # published_finetune_offload.csv's RTX 4090 full fine-tune: 18.9 GiB, 1,650 tokens/s.
    run = next(r for r in read_runs()[0] if r.name == "Llama-3.1-8B Full finetune")
    result = predict(run)
    assert abs(result.memory_error) <= 0.10
    assert abs(result.speed_error) <= 0.15


@pytest.mark.parametrize(("knobs", "message"), [
    (dict(optimizer_in_backward=True, micro_batch_size=1),
     "optimizer_in_backward needs one micro-batch per step and one pipeline stage (got 2 "
     "micro-batches, pipeline 1)"),
    (dict(optimizer="paged_adam8bit", offload_optimizer="cpu"),
     "optimizer paged_adam8bit steps on the GPU: offload_optimizer must be none"),
])
def test_what_cannot_run_is_refused_in_one_line(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        full(**knobs).resolve(1)
    assert "\n" not in str(error.value)
