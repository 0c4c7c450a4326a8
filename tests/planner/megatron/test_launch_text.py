"""planner.megatron.launch_text: a launch line or script, read as the shell reads it.

Continuations, comments, environment assignments, shell variables and arrays, the
torchrun prefix and the world size it starts.
"""

from __future__ import annotations

import pytest

from planner.megatron.arguments import parse_megatron_flags
from planner.megatron.errors import LaunchLineError
from planner.megatron.launch_text import launch_words, split_launcher


def test_a_torchrun_line_with_continuations_gives_the_flags_and_the_world_size() -> None:
    line = launch_words(
        "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 8 --nproc-per-node 8 \\\n"
        "    --rdzv-endpoint $MASTER_ADDR:29500 pretrain_gpt.py \\\n"
        "    --num-layers 4 \\\n"
        "    --data-path /data/a   # a comment\n"
    )
    assert line.flags == ["--num-layers", "4", "--data-path", "/data/a"]
    assert line.script == "pretrain_gpt.py"
    assert line.world_size == 64
    assert line.launcher[0] == "torchrun"


@pytest.mark.parametrize("launcher, world", [
    ("python -m torch.distributed.run --nproc_per_node=4 --nnodes=2", 8),
    ("torchrun --standalone --nproc-per-node 8", 8),
    ("torchrun --nnodes 2:2 --nproc-per-node 8", 16),
    ("torchrun --nnodes 1:4 --nproc-per-node 8", None),  # elastic: the machines decide
    ("torchrun --nproc-per-node gpu", None),
    ("python", None),
])
def test_the_world_size_is_what_torchrun_starts(launcher: str, world: int | None) -> None:
    line = launch_words(f"{launcher} pretrain_gpt.py --num-layers 4")
    assert line.world_size == world
    assert line.flags == ["--num-layers", "4"]


def test_a_script_with_arrays_and_variables_is_read_at_its_launch_command() -> None:
    script = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
CHECKPOINT_PATH=$1
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 24   # depth
    --hidden-size 2048
)
OLD_STYLE="--seq-length 1024 --micro-batch-size 2"
mkdir -p $CHECKPOINT_PATH

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${MODEL_ARGS[@]} $OLD_STYLE \\
    --save $CHECKPOINT_PATH --lr ${LR:-3e-4}
"""
    line = launch_words(script)
    assert line.world_size == 16
    # $1 not given: bash leaves --save without its value.
    assert line.flags == ["--num-layers", "24", "--hidden-size", "2048", "--seq-length",
                          "1024", "--micro-batch-size", "2", "--save", "--lr", "3e-4"]
    assert launch_words(script, {"LR": "1e-4"}, ["ckpt"]).flags[-4:] == [
        "--save", "ckpt", "--lr", "1e-4"]
    assert line.nodes_set_by == "NUM_NODES on line 4" and line.per_node == 8


def test_flags_alone_are_taken_whole_and_a_launcher_without_a_script_is_refused() -> None:
    assert launch_words("--num-layers 4\n--bf16\n").flags == ["--num-layers", "4", "--bf16"]
    assert split_launcher(["--num-layers", "4"]).script is None
    with pytest.raises(LaunchLineError, match="runs no \\*.py training script"):
        split_launcher(["torchrun", "--nnodes", "2", "-m", "megatron.train"])
    with pytest.raises(LaunchLineError, match="runs 2 training commands \\(lines 1, 2\\)"):
        launch_words("python a.py --x 1\npython b.py --y 2\n")
    # echo lines that mention the script are not commands that run it.
    line = launch_words('echo "torchrun pretrain_gpt.py"\npython tools/prep.py\n'
                        'torchrun pretrain_gpt.py --bf16\n')
    assert line.flags == ["--bf16"] and line.script == "pretrain_gpt.py"


def test_a_variable_the_text_does_not_set_is_empty_as_in_bash() -> None:
    line = launch_words('torchrun pretrain_gpt.py --num-layers $LAYERS ${EXTRA_ARGS} "$@"')
    assert line.flags == ["--num-layers"]
    parsed = parse_megatron_flags(line.flags)
    assert parsed.valueless == {"num_layers": "--num-layers"}
