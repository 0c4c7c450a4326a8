"""The two MoE recipe lines of `shared/calibration/moe_recipes.csv`, read as Megatron-LM reads
them into calibration runs, and the six MoE calibration runs against their throughput."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cost_models.moe_calibration import (
    MOE_RUNS,
    leave_one_out,
    predicted_throughput,
    read_moe_runs,
)
from planner.megatron.recipe_runs import RECIPES, read_recipe_runs, recipe_words

DATA = next((p / "calibration" for p in (Path(__file__).resolve().parents[4] / "shared",
                                        Path("/work/shared"))
             if (p / "calibration" / RECIPES).is_file()), None)
needs_data = pytest.mark.skipif(DATA is None, reason="shared/calibration not found")


def test_a_line_is_the_words_argparse_receives() -> None:
    """Megatron-LM's list and layout values stay one word each (a shell would read a
    subshell and a pipe); a line with shell quoting is refused, not guessed at."""
    words = recipe_words("--moe-layer-freq ([0]*3+[1]*58) "
                         "--pipeline-model-parallel-layout Et|(tt|)*30mL  --bf16")
    assert words == ["--moe-layer-freq", "([0]*3+[1]*58)",
                     "--pipeline-model-parallel-layout", "Et|(tt|)*30mL", "--bf16"]
    with pytest.raises(ValueError, match="shell quoting"):
        recipe_words("--moe-layer-freq '([0]*3+[1]*58)'")


@pytest.fixture(scope="module")
def recipes():
    return {run.step.label: run for run in read_recipe_runs(DATA / RECIPES)}


@needs_data
def test_each_recipe_reads_as_it_ran(recipes) -> None:
    """Qwen3-235B-A22B on 256 GB200: pp 8 x vp 3 over ep 32 with the embedding and loss
    counted as layers, HybridEP's rank budget of 1.5, a full-iteration graph, and the
    job in racks of 64 (Bridge's Slurm segment of 16 trays). DeepSeek-V3 on 1,024 H100:
    tp 2 x pp 8 over ep 64 laid out as Et|(tt|)*30mL, and its all-to-all overlap
    serialized by the recipe's single hardware queue."""
    qwen = recipes["Qwen3-235B-A22B GB200 recipe"]
    q = qwen.step.parallel
    assert (q.dims.tensor, q.dims.pipeline, q.pipelining.virtual_pipeline, q.dims.expert) \
        == (1, 8, 3, 32)
    assert qwen.layers_per_stage == (11, 12, 12, 12, 12, 12, 12, 11)
    assert q.moe.moe_expert_rank_capacity_factor == 1.5 and q.execution.cuda_graphs
    assert q.moe.overlap_moe_expert_parallel_comm and qwen.scale_up_domain == 64
    assert qwen.step.seconds == pytest.approx(8192 * 4096 / (7376 * 256))
    deepseek = recipes["DeepSeek-V3 H100 recipe"]
    d = deepseek.step.parallel
    assert (d.dims.tensor, d.dims.pipeline, d.dims.expert) == (2, 8, 64)
    assert deepseek.layers_per_stage == (7, 8, 8, 8, 8, 8, 8, 6)
    assert deepseek.step.model.mtp_num_layers == 1
    assert not d.moe.overlap_moe_expert_parallel_comm and deepseek.scale_up_domain is None
    assert "recipe" in deepseek.notes


@needs_data
def test_every_moe_calibration_run_is_within_15_percent(recipes) -> None:
    """The four rows of Megatron-Bridge's MoE table and the two recipe lines, with the
    MoE parameters the presets ship."""
    runs = read_moe_runs(DATA / MOE_RUNS) + list(recipes.values())
    assert len(runs) == 6
    predicted = predicted_throughput(runs)
    for run, tokens in zip(runs, predicted):
        assert tokens == pytest.approx(run.tokens_per_gpu_s, rel=0.15), run.step.label


@needs_data
def test_a_left_out_run_is_predicted_without_its_own_throughput(recipes) -> None:
    """Leave-one-out refits without the run: changing its published throughput moves the
    other run's left-out prediction (fitted to it) but not its own. Two runs whose
    dispatch all-to-alls cross InfiniBand, one parameter: each fit sees one run."""
    runs = read_moe_runs(DATA / MOE_RUNS)[:2]
    fields = ("alltoall_bandwidth",)
    before = leave_one_out(runs, iterations=20, fields=fields)
    runs[0] = replace(runs[0], tokens_per_gpu_s=runs[0].tokens_per_gpu_s * 0.8)
    after = leave_one_out(runs, iterations=20, fields=fields)
    assert after[0] == pytest.approx(before[0])
    assert after[1] < before[1] * 0.97
