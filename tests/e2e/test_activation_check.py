"""What a training plan's ranks save for backward equals the Plan's prediction, per stage
and micro-batch (within `plan check`'s 2%; the count is exact), on real gloo ranks: the
zoo GPT and Llama on pp2 x tp2, every recompute mode with every schedule, with and without
sequence parallelism. The plans share one launch of 4 ranks; one more runs `plan check`
itself, whose table and exit code say the same."""

from __future__ import annotations

import json

import pytest

from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from planner.checks.training_check import ACTIVATION_TOLERANCE, compare
from runtime.elastic import launch
from runtime.spec import from_training_plan

SHAPE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16)
MODELS = {name: TransformerConfig(**SHAPE, **FAMILIES[name]) for name in ("gpt", "llama")}
# Every (recompute, schedule) pair once; the model and sequence parallelism alternate so
# that each meets every recompute mode and schedule, with and without sequence parallelism.
CASES = [
    ("gpt", "none", "gpipe", False), ("llama", "none", "1f1b", True),
    ("gpt", "none", "interleaved", True), ("llama", "selective", "gpipe", True),
    ("gpt", "selective", "1f1b", False), ("llama", "selective", "interleaved", False),
    ("gpt", "full", "gpipe", True), ("llama", "full", "1f1b", False),
    ("llama", "full", "interleaved", True),
]
GPUS = 4


def _plan(model: str, recompute: str, schedule: str, sequence_parallel: bool):
    parallel = ParallelConfig.of(
        tensor=2, pipeline=2, micro_batch_size=1, global_batch_size=4, precision="fp32",
        recompute=recompute, schedule=schedule, sequence_parallel=sequence_parallel,
        virtual_pipeline=2 if schedule == "interleaved" else 1, engine="tessel",
    )
    return training_plan(model, MODELS[model], Cluster.load("cpu").with_devices(GPUS), parallel)


def _train_each(rank: int, world: int, runs: list) -> list[dict]:
    """One step of each plan on this rank: what it saved, issued and holds."""
    from runtime.comm_counter import CommCounter
    from runtime.pipeline_trainer import PipelineTrainer
    from runtime.training_loop import batches

    out = []
    for config, spec in runs:
        # AdamW: the optimizer state the Plan's memory counts, as plan check trains.
        trainer = PipelineTrainer(config, spec, optimizer="adamw", count_activations=True)
        with CommCounter() as counter:
            trainer.step(*batches(config, spec, 1)[0])
        out.append({"coords": trainer.coords, "saved": trainer.saved_activation_bytes(),
                    "collectives": counter.by_kind(), "held": trainer.local_bytes()})
    return out


@pytest.mark.timeout(300)
def test_saved_activations_equal_the_plans_per_stage_and_micro_batch() -> None:
    plans = [_plan(*case) for case in CASES]
    runs = [(MODELS[case[0]], from_training_plan(plan)) for case, plan in zip(CASES, plans)]
    results = launch(_train_each, GPUS, runs)
    totals = {}
    for index, (case, plan) in enumerate(zip(CASES, plans)):
        ranks = [r[index] for r in results]
        comparison = compare(plan, [r["coords"] for r in ranks],
                             [r["collectives"] for r in ranks], [r["held"] for r in ranks],
                             1, [r["saved"] for r in ranks])
        assert comparison.passed, (case, comparison.mismatches)
        rows = comparison.activations
        # Every rank, every chunk it runs, each of the 4 micro-batches.
        assert len(rows) == GPUS * plan.parallel.virtual_pipeline * 4, case
        assert all(row.relative_error <= ACTIVATION_TOLERANCE for row in rows)
        assert all(row.measured == row.predicted for row in rows), case  # exact, in fact
        totals[case] = sum(row.measured for row in rows)
    # What each mode keeps, as one would expect of it: full recomputation the least.
    assert totals[CASES[0]] > totals[CASES[4]] > totals[CASES[6]]


@pytest.mark.timeout(300)
def test_plan_check_prints_and_compares_saved_activations(tmp_path, capsys) -> None:
    report = tmp_path / "check.json"
    code = cli.main([
        "check", "llama", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads",
        "4", "--vocab-size", "256", "--seq-length", "16", "--gpus", "4",
        "--global-batch-size", "4", "--micro-batch-size", "1",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--num-layers-per-virtual-pipeline-stage", "1", "--sequence-parallel",
        "--recompute-granularity", "selective", "--steps", "1", "--json", str(report),
    ])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines at its width
    assert code == 0, out
    assert "activations saved for backward per micro-batch" in out
    assert "saved activations match the plan's" in out
    data = json.loads(report.read_text())
    assert data["plan"]["run"]["engine"] == "tessel"  # priced as Tessel's runtime runs it
    stages = data["plan"]["stages"]
    assert [len(stage["saved_activation_bytes"]) for stage in stages] == [2, 2]
    rows = data["details"]["comparison"]["activations"]
    assert len(rows) == 4 * 2 * 4 and data["details"]["comparison"]["passed"]
    assert all(row["measured"] == row["predicted"] for row in rows)
