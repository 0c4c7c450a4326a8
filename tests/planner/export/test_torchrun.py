"""planner.export.torchrun: the torchrun line of a Plan, read back by torchrun's own parser."""

from __future__ import annotations

import shlex

import pytest
from torch.distributed.run import get_args_parser

from planner.vocabulary.cluster import Cluster
from planner.export.torchrun import torchrun_command
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan


def parsed(command: str):
    words = shlex.split(command.replace("$MASTER_ADDR", "node0"))
    assert words[0] == "torchrun"
    return get_args_parser().parse_args(words[1:])


@pytest.mark.parametrize(("gpus", "nodes", "per_node"), [(1024, 128, 8), (4, 1, 4)])
def test_torchrun_starts_one_process_per_gpu_on_each_node(gpus, nodes, per_node) -> None:
    cluster = Cluster.load("dgx-a100-80g").with_devices(gpus)
    tensor = min(gpus, 8)
    parallel = ParallelConfig.of(tensor=tensor, pipeline=1, micro_batch_size=1,
                              global_batch_size=gpus // tensor * 2, recompute="full",
                              zero_stage=1)
    plan = training_plan("gpt3-2.7b", get_preset("gpt3-2.7b"), cluster, parallel)
    args = parsed(torchrun_command(plan))
    assert (args.nnodes, args.nproc_per_node) == (str(nodes), str(per_node))
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "node0:29500"
    assert args.training_script == "pretrain_gpt.py"
    script_args = " ".join(args.training_script_args)
    assert script_args == " ".join(plan.megatron_flags)
    assert f"--tensor-model-parallel-size {tensor}" in script_args


def test_a_hostile_model_name_stays_one_word(monkeypatch) -> None:
    cluster = Cluster.load("dgx-a100-80g").with_devices(8)
    parallel = ParallelConfig.of(tensor=8, pipeline=1, micro_batch_size=1, global_batch_size=8)
    plan = training_plan("x; rm -rf / #", get_preset("gpt3-2.7b"), cluster, parallel)
    args = parsed(torchrun_command(plan))
    assert args.rdzv_id == "tessel-x-rm--rf"
    assert args.training_script == "pretrain_gpt.py"


def test_no_launch_line_for_a_plan_megatron_cannot_run() -> None:
    cluster = Cluster.load("dgx-a100-80g").with_devices(8)
    parallel = ParallelConfig.of(tensor=1, pipeline=1, micro_batch_size=1, global_batch_size=8,
                              zero_stage=3)
    plan = training_plan("gpt3-2.7b", get_preset("gpt3-2.7b"), cluster, parallel)
    assert plan.megatron_flags is None and torchrun_command(plan) is None
