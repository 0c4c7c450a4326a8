"""What the processes' environment changes in how Megatron-LM runs a launch line:
CUDA_DEVICE_MAX_CONNECTIONS=1 serializes every stream, so the EP all-to-all overlap hides
nothing; it is priced without it, with a note, and nothing else moves."""

from __future__ import annotations

import csv

import pytest

from planner.calibration.evidence_rows import CALIBRATION
from planner.megatron import megatron_run, parse_megatron_flags
from planner.megatron.recipe_runs import RECIPES, recipe_words

pytestmark = pytest.mark.skipif(not (CALIBRATION / RECIPES).is_file(),
                                reason="../shared/calibration/ is not beside the repository")


@pytest.fixture(scope="module")
def qwen3_flags() -> list[str]:
    """Qwen3-235B-A22B's GB200 recipe line, which sets --overlap-moe-expert-parallel-comm."""
    with open(CALIBRATION / RECIPES, encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["model"] == "Qwen3-235B-A22B")
    return recipe_words(row["megatron_flags"])


def test_one_device_connection_turns_the_ep_overlap_off_with_a_note(qwen3_flags) -> None:
    args = parse_megatron_flags(qwen3_flags)
    free = megatron_run(args, 256)
    serialized = megatron_run(args, 256, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert free.parallel.moe.overlap_moe_expert_parallel_comm
    assert free.parallel.moe.delay_wgrad_compute
    assert not serialized.parallel.moe.overlap_moe_expert_parallel_comm
    assert not serialized.parallel.moe.delay_wgrad_compute
    assert serialized.notes[-1].startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 runs every stream's "
                                           "kernels in launch order")
    assert serialized.parallel.but(overlap_moe_expert_parallel_comm=True,
                                   delay_wgrad_compute=True) == free.parallel
    # Other connection counts, or other variables, change nothing.
    assert megatron_run(args, 256, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}).parallel == \
        free.parallel
    assert megatron_run(args, 256, {"NCCL_DEBUG": "INFO"}).notes == free.notes
