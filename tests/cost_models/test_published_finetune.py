"""The published fine-tuning and offload runs (`published_finetune_offload.csv`) as
benchmarks/finetune_accuracy.py predicts them: every row read, peak memory within 10% where
it was measured, throughput within 15%; and DeepSpeed's Figure 5 held out beside its row."""

from __future__ import annotations

from dataclasses import replace

from cost_models.published_finetune import azure_175b_figure5, predict, read_runs


def test_every_row_is_read_and_its_memory_is_within_10_percent() -> None:
    runs, unpriced = read_runs()
    assert not unpriced
    assert len(runs) == 8  # DeepSpeed's row has two batches a GPU, each its own run
    measured = [predict(run) for run in runs if run.memory_gib is not None]
    assert [r.run.line for r in measured] == [3, 4, 5, 6]
    assert all(abs(r.memory_error) <= 0.10 for r in measured), \
        [(r.run.line, r.memory_error) for r in measured]


def test_every_rows_throughput_is_within_15_percent() -> None:
    errors = {run.name: predict(run).speed_error for run in read_runs()[0]}
    assert all(abs(error) <= 0.15 for error in errors.values()), errors


def test_deepspeeds_blocking_copies_are_what_bring_its_row_within_15_percent() -> None:
    """DeepSpeed 0.6.2's 175B on 1,024 A100 (190.7 and 166 TFLOP/s at 16 and 8 sequences a
    GPU): with its copies to the host taken as async, the reductions would hide behind
    the backward and the checkpoints' copies behind the next layer, and both figures
    would be predicted over 20% fast."""
    for run in (run for run in read_runs()[0] if "ZeRO-3" in run.name):
        result = predict(run)
        unblocked = predict(replace(run, parallel=run.parallel.but(offload_copies="async")))
        assert abs(result.speed_error) < 0.05
        assert unblocked.speed_error > 0.2
        assert result.prediction.offload_s > unblocked.prediction.offload_s
        assert result.prediction.data_parallel_comm_s > \
            3 * unblocked.prediction.data_parallel_comm_s


def test_deepspeeds_figure_5_held_out_is_within_10_percent_from_4096_tokens_a_gpu() -> None:
    """Every bar of the post's Figure 5, none fitted: within 10% where a GPU runs 4,096
    tokens or more a step; below that the prediction runs fast (up to 39% at one sequence
    of 512 tokens on 256 GPUs), as ZeRO-3's per-module gathers, each paying its latency
    one module ahead, are not priced."""
    errors = {(run.model.seq_length * run.parallel.batch.micro_batch_size, run.name):
              predict(run).speed_error for run in azure_175b_figure5()}
    assert len(errors) == 37
    large = [error for (tokens, _), error in errors.items() if tokens >= 4096]
    assert len(large) == 20 and all(abs(error) <= 0.10 for error in large), errors
    assert all(-0.05 < error < 0.40 for error in errors.values()), errors
