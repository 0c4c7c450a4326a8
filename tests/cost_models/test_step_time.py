"""The step-time model: FLOP accounting against Megatron-LM's formula, and the behaviour
of each knob a user would check (bubble, recomputation, overlap, precision, memory)."""

from __future__ import annotations


import pytest

from cost_models.kernel_time import kernel_seconds, pass_seconds
from cost_models.pipeline_memory import StageLayout, fits_memory, uniform_stages
from cost_models.pipeline_timing import dualpipev_bubble, dualpipev_chunk
from cost_models.step_time import predict_stages, predict_step, stage_phases
from cost_models.transformer_ops import (
    Matmul,
    Memory,
    every_other_matmul_replayed,
    forward_flops,
    layer_ops,
)
from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.search.megatron_space import enumerate_megatron

GPT3_175B = get_preset("gpt3-175b")
MEGATRON_175B = ParallelConfig.of(tensor=8, pipeline=8, micro_batch_size=1,
                               global_batch_size=1536, recompute="full")


def a100(gpus: int) -> Cluster:
    return Cluster.load("dgx-a100-80g").with_devices(gpus)


def test_model_flops_are_megatrons_formula() -> None:
    """Narayanan et al. 2021, eq. 3, as Megatron-LM counts it since 8873b55d6a (the
    attention scores' term halved for the causal mask): 72 B s l h^2 (1 + s/12h +
    V/(12 h l)) per step for the model (no recomputation); full recomputation executes
    96 instead of 72 on the layers (their eq. with the extra forward), the causal
    attention kernels their unmasked half."""
    p = predict_step(GPT3_175B, a100(512), MEGATRON_175B)
    b, s, layers, h, v = 1536, 2048, 96, 12288, 51200
    model = 72 * b * s * layers * h * h * (1 + s / (12 * h) + v / (12 * h * layers))
    assert p.model_tflops_per_gpu * 1e12 * p.step_time_s * 512 == pytest.approx(model, rel=1e-9)
    layer_part = 72 * b * s * layers * h * h * (1 + s / (12 * h))
    hardware = model + layer_part / 3
    assert p.hardware_tflops_per_gpu * 1e12 * p.step_time_s * 512 == pytest.approx(
        hardware, rel=1e-9
    )
    assert p.mfu == pytest.approx(p.model_tflops_per_gpu / 312, rel=1e-12)


def test_fewer_micro_batches_mean_a_larger_bubble() -> None:
    many = predict_step(GPT3_175B, a100(512), MEGATRON_175B)
    few = predict_step(GPT3_175B, a100(512), MEGATRON_175B.but(micro_batch_size=8))
    # 1F1B: the bubble is (p - 1) stage times; with 8x larger micro-batches the bubble's
    # share of the step grows from 7/192 to 7/24 of the busy time.
    assert few.bubble_s / few.compute_s > 4 * many.bubble_s / many.compute_s
    # Interleaving 4 chunks per stage cuts the schedule's bubble 4 ways, and adds 3 more
    # stage-to-stage transfers per micro-batch (small under sequence parallelism, where
    # each rank sends its 1/t slice of the activations).
    sequence = MEGATRON_175B.but(micro_batch_size=8, sequence_parallel=True)
    plain = predict_step(GPT3_175B, a100(512), sequence)
    interleaved = predict_step(GPT3_175B, a100(512), sequence.but(
        schedule="interleaved", virtual_pipeline=4))
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / 4, rel=0.2)


def test_recomputation_costs_time_and_saves_memory() -> None:
    full = predict_step(GPT3_175B, a100(512), MEGATRON_175B)
    none = predict_step(GPT3_175B, a100(512), MEGATRON_175B.but(recompute="none"))
    assert none.step_time_s < full.step_time_s
    assert none.memory_gib_per_gpu > full.memory_gib_per_gpu
    assert none.model_tflops_per_gpu == pytest.approx(none.hardware_tflops_per_gpu)


def test_overlapped_gradient_reduction_is_exposed_only_where_longer() -> None:
    config = ParallelConfig.of(tensor=1, pipeline=1, micro_batch_size=4, global_batch_size=512)
    model, cluster = get_preset("gpt3-1.3b"), a100(64)
    after = predict_step(model, cluster, config)
    overlapped = predict_step(model, cluster, config.but(overlap_grad_reduce=True))
    assert after.data_parallel_comm_s > 0
    assert overlapped.data_parallel_comm_s < after.data_parallel_comm_s
    assert predict_step(model, a100(1), config.but(global_batch_size=4)) \
        .data_parallel_comm_s == 0


def test_fp8_matmuls_are_faster_where_the_device_has_them() -> None:
    h100 = Cluster.load("dgx-h100").with_devices(512)
    bf16 = predict_step(GPT3_175B, h100, MEGATRON_175B)
    fp8 = predict_step(GPT3_175B, h100, MEGATRON_175B.but(precision="fp8"))
    assert fp8.compute_s < bf16.compute_s
    assert fp8.model_tflops_per_gpu > bf16.model_tflops_per_gpu


def test_gpt3_175b_fits_as_megatron_ran_it_and_not_on_one_node() -> None:
    assert predict_step(GPT3_175B, a100(512), MEGATRON_175B).fits
    one_node = ParallelConfig.of(tensor=8, pipeline=1, micro_batch_size=1, global_batch_size=8)
    assert not predict_step(GPT3_175B, a100(8), one_node).fits


def test_uniform_stages_predict_as_the_megatron_layout() -> None:
    cluster, config = a100(512), MEGATRON_175B.resolve(512)
    stages = [StageLayout(12, 8, 8)] * 8
    assert predict_stages(GPT3_175B, cluster, config, stages) == predict_step(
        GPT3_175B, cluster, config
    )


def test_expert_parallelism_shards_the_experts_memory() -> None:
    mixtral = get_preset("mixtral-8x7b")
    config = ParallelConfig.of(tensor=2, pipeline=4, micro_batch_size=1, global_batch_size=256,
                            recompute="full", sequence_parallel=True)
    one = predict_step(mixtral, a100(64), config)
    eight = predict_step(mixtral, a100(64), config.but(expert=8))
    # 8 experts over 8 ranks: each GPU keeps one expert of each MLP instead of eight.
    assert eight.memory_gib_per_gpu < one.memory_gib_per_gpu / 2


def test_a_pass_takes_its_gpu_time_or_its_host_launch_time_whichever_is_longer() -> None:
    """Eager PyTorch launches kernels ahead of the GPU: tiny kernels wait on the host (one
    launch per forward kernel, two per backward matmul), large ones on the GPU."""
    device = a100(8).device
    efficiency = device.efficiency.model_copy(update={"dispatch_us": 50.0})
    tiny = [Matmul("tiny", 8, 8, 8), Memory("norm", 1024)]
    assert pass_seconds(tiny, device, efficiency) == pytest.approx(2 * 50e-6)
    assert pass_seconds(tiny, device, efficiency, backward=True) == pytest.approx(3 * 50e-6)
    large = [Matmul("large", 8192, 8192, 8192)]
    gpu = kernel_seconds(large[0], device, efficiency)
    assert gpu > 50e-6
    assert pass_seconds(large, device, efficiency) == pytest.approx(gpu)


def test_the_memory_check_agrees_with_the_whole_prediction() -> None:
    """The search asks `fits_memory` first and prices only what fits: over every layout of
    the Megatron space of a 13B model on 64 GPUs, both answer alike (and both answers
    occur)."""
    model, cluster = get_preset("gpt3-13b"), a100(64)
    answers = set()
    for candidate in enumerate_megatron(model, cluster, 512, FixedKnobs()):
        split = list(candidate.layers_per_stage)
        fits = fits_memory(model, cluster, candidate.parallel, None, split)
        assert fits == predict_step(model, cluster, candidate.parallel, None, split).fits
        answers.add(fits)
    assert answers == {True, False}


def test_torchtitans_selective_checkpointing_replays_every_other_matmul() -> None:
    # Op-level SAC replays wk, wo and w3 (and the memory-bound kernels); Megatron-LM's
    # selective recomputation replays the attention core only.
    model = get_preset("llama3-8b")
    ops = layer_ops(model, 1, model.seq_length, 1, False)
    h, kv, f, s = model.hidden_size, model.num_kv_heads * model.head_dim, model.ffn_size, \
        model.seq_length
    assert forward_flops(every_other_matmul_replayed(model, ops)) == pytest.approx(
        2 * s * (h * kv + h * h + h * f))
    cluster = Cluster.load("dgx-h100").with_devices(8)
    knobs = dict(data=8, zero_stage=3, recompute="selective", global_batch_size=8)
    titan = predict_step(model, cluster, ParallelConfig.of(engine="torchtitan", **knobs))
    megatron = predict_step(model, cluster, ParallelConfig.of(**knobs))
    assert titan.hardware_tflops_per_gpu * titan.step_time_s > \
        megatron.hardware_tflops_per_gpu * megatron.step_time_s
    assert titan.model_tflops_per_gpu * titan.step_time_s == pytest.approx(
        megatron.model_tflops_per_gpu * megatron.step_time_s)


def test_dualpipev_s_predicted_bubble_equals_the_report_s_formula() -> None:
    # DeepSeek-V3 report Table 2 / DualPipe README: (PP/2 - 1)(F&B + B - 3W), PP = 2 p
    # stages, over the slowest rank's two chunks (`pipeline_timing.dualpipev_chunk`:
    # half its forward and backward each, W half a chunk's backward kernels), plus the
    # second chunk's transfers, which the bubble carries as the interleaved schedule's do.
    model, cluster = get_preset("llama3-8b"), Cluster.load("dgx-h100").with_devices(32)
    knobs = dict(tensor=2, pipeline=4, micro_batch_size=1, global_batch_size=64,
                 engine="torchtitan")
    dualpipev = ParallelConfig.of(**knobs, schedule="dualpipev", virtual_pipeline=2)
    predicted = predict_step(model, cluster, dualpipev)
    resolved = dualpipev.resolve(32)
    phases = stage_phases(model, cluster, resolved, uniform_stages(model, resolved, None))
    s = max(phases, key=lambda phase: phase.total)
    f, b, w = dualpipev_chunk(s.forward + s.forward_communication,
                              s.recompute + s.backward + s.backward_communication,
                              s.backward, s.transfer)
    m = resolved.num_micro_batches
    assert predicted.bubble_s == pytest.approx(
        (4 - 1) * ((f + b) + b - 3 * w) + m * s.transfer, rel=1e-12)
    assert predicted.bubble_s == pytest.approx(dualpipev_bubble(4, f, b, w) + m * s.transfer,
                                               rel=1e-12)
    # The same work as 1F1B and interleaving, with the least wait of the three.
    one_f_one_b = predict_step(model, cluster, ParallelConfig.of(**knobs))
    interleaved = predict_step(model, cluster, ParallelConfig.of(
        **knobs, schedule="interleaved", virtual_pipeline=2))
    assert predicted.compute_s == pytest.approx(one_f_one_b.compute_s, rel=1e-12)
    assert predicted.bubble_s < interleaved.bubble_s < one_f_one_b.bubble_s
    # Every rank holds p + 1/2 micro-batches (PP + 1 chunks): more than 1F1B's first rank.
    assert predicted.memory_gib_per_gpu > one_f_one_b.memory_gib_per_gpu
