"""`compare` holds each rank's bytes saved for backward, per chunk and micro-batch, against
its stage's prediction within 2%, and names what differs."""

from __future__ import annotations

from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from planner.checks.training_check import compare, predicted_collectives

GPT = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256,
                        seq_length=16)


def _check(saved_of):
    parallel = ParallelConfig.of(pipeline=2, micro_batch_size=1, global_batch_size=4,
                              schedule="interleaved", virtual_pipeline=2, precision="fp32",
                              engine="tessel")
    plan = training_plan("gpt", GPT, Cluster.load("cpu").with_devices(2), parallel)
    coords = [{"pp": 0, "dp": 0, "cp": 0, "tp": 0}, {"pp": 1, "dp": 0, "cp": 0, "tp": 0}]
    collectives = [predicted_collectives(stage, 1) for stage in plan.stages]
    # Pipeline rank i runs chunks i and i + 2, four micro-batches each.
    saved = [{i + 2 * k: [saved_of(i, k, mb, stage.saved_activation_bytes[k])
                          for mb in range(4)] for k in range(2)}
             for i, stage in enumerate(plan.stages)]
    return plan, compare(plan, coords, collectives, [{}, {}], 1, saved)


def test_saved_activations_within_two_percent_pass() -> None:
    plan, result = _check(lambda rank, chunk, mb, want: round(want * 1.015))
    assert result.passed and len(result.activations) == 2 * 2 * 4
    # The ends hold more: the embedding's ids on chunk 0, the head and loss on chunk 3.
    first, last = plan.stages[0].saved_activation_bytes, plan.stages[1].saved_activation_bytes
    assert first[0] > first[1] == last[0] < last[1]


def test_a_micro_batch_that_saves_more_is_a_named_mismatch() -> None:
    _, result = _check(lambda rank, chunk, mb, want: want + (want // 20) * (
        (rank, chunk, mb) == (1, 1, 2)))
    assert not result.passed
    (line,) = result.mismatches
    assert line.startswith("rank 1 stage 3 micro-batch 2: saved ") and "(5.0% apart)" in line
