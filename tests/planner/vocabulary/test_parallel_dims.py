"""planner.vocabulary.parallel_dims: the one value of a plan's degrees, its rules and its mesh."""

from __future__ import annotations

import pytest

from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.parallel_dims import ParallelDims


def test_the_rest_is_resolved_once_and_the_enabled_axes_follow() -> None:
    dims = ParallelDims(pipeline=8, data=-1, tensor=2, expert=32, expert_tensor=1)
    resolved = dims.resolve(256)
    assert resolved.data == 16 and resolved.shape == (8, 16, 1, 2)
    assert resolved.tp_enabled and resolved.pp_enabled and resolved.ep_enabled
    assert not resolved.cp_enabled
    # Qwen3-235B's folding: 32 expert ranks over a stage's 2 x 16 ranks, expert-data 1.
    assert resolved.expert_data == 1 and resolved.expert_tensor_degree == 1
    assert ParallelDims(tensor=4, data=2).expert_tensor_degree == 4  # Megatron's default


@pytest.mark.parametrize(("dims", "gpus", "fragments"), [
    (ParallelDims(tensor=0, pipeline=0), 8, ["tensor must be positive, got 0",
                                             "pipeline must be positive, got 0"]),
    (ParallelDims(tensor=3, data=-1), 8, ["tensor (3)", "data (rest)", "8 GPUs"]),
    (ParallelDims(tensor=2, data=4, expert=16), 8,
     ["expert (16) x expert_tensor (2)", "the 8 ranks of a pipeline stage"]),
])
def test_one_message_names_every_degree(dims: ParallelDims, gpus: int,
                                        fragments: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        dims.resolve(gpus)
    assert all(fragment in str(error.value) for fragment in fragments), str(error.value)
    assert "\n" not in str(error.value)


def test_the_mesh_puts_tensor_fastest_and_pipeline_slowest() -> None:
    dims = ParallelDims(pipeline=2, data=2, tensor=2)
    assert dims.coordinates(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    assert dims.group(5, "tp") == [4, 5] and dims.group(5, "pp") == [1, 5]


def test_a_training_configuration_validates_its_degrees_through_them() -> None:
    config = ParallelConfig.of(tensor=2, pipeline=8, expert=32, expert_tensor=1,
                            global_batch_size=8192)
    assert config.resolve(256).dims == ParallelDims(pipeline=8, data=16, tensor=2,
                                                    expert=32, expert_tensor=1)
    with pytest.raises(ValueError, match=r"expert \(32\) x expert_tensor \(2\)"):
        ParallelConfig.of(tensor=2, pipeline=8, expert=32, global_batch_size=8192).resolve(256)

