"""--moe-grouped-gemm (Megatron-Core's TEGroupedMLP) against its absence, Megatron-LM's
default (SequentialMLP: each local expert's MLP in turn): the same FLOPs, one kernel per
expert instead of one per projection, and a launch line is priced as it runs."""

from __future__ import annotations

from cost_models.kernel_time import pass_seconds
from cost_models.moe_dispatch import expert_split
from cost_models.transformer_ops import layer_ops
from planner.megatron import megatron_run, parse_megatron_flags
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

EXPERTS = ("expert input", "expert activation", "expert output")


def _expert_ops(grouped: bool):
    model = zoo_config("qwen3-30b-a3b")
    parallel = ParallelConfig.of(expert=8, global_batch_size=64, micro_batch_size=1,
                                 moe_grouped_gemm=grouped)
    split = expert_split(model, parallel)
    ops = layer_ops(model, 1, model.seq_length, 1, False, experts=split)
    return [op for op in ops if op.name in EXPERTS], model.num_experts // 8


def test_sequential_experts_pay_a_kernel_per_expert_for_the_same_flops() -> None:
    grouped, local = _expert_ops(True)
    sequential, _ = _expert_ops(False)
    assert [op.launches for op in grouped] == [1, 1, 1]
    assert [op.launches for op in sequential] == [local] * 3
    assert [getattr(op, "flops", 0) for op in grouped] == \
        [getattr(op, "flops", 0) for op in sequential]
    device = Cluster.load("dgx-h100").device
    eff = device.efficiency
    overhead = eff.kernel_overhead_us * 1e-6
    forward = pass_seconds(sequential, device, eff) - pass_seconds(grouped, device, eff)
    # Three kernels (two GEMMs, the activation) per further expert, forward.
    assert abs(forward - 3 * (local - 1) * overhead) < 1e-12
    backward = (pass_seconds(sequential, device, eff, backward=True)
                - pass_seconds(grouped, device, eff, backward=True))
    # Backward: each GEMM's input and weight gradients, and the activation's.
    assert abs(backward - 5 * (local - 1) * overhead) < 1e-12


def test_a_launch_line_reads_grouped_gemms_and_megatron_lms_default_is_off() -> None:
    line = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
            "--max-position-embeddings 1024 --num-experts 16 --moe-router-topk 2 "
            "--expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 "
            "--moe-token-dispatcher-type alltoall --bf16")
    off = megatron_run(parse_megatron_flags(line.split()), 8)
    on = megatron_run(parse_megatron_flags([*line.split(), "--moe-grouped-gemm"]), 8)
    assert not off.parallel.moe.moe_grouped_gemm and on.parallel.moe.moe_grouped_gemm
    assert "--moe-grouped-gemm" not in on.ignored
