"""The published fine-tuning and offload runs (`published_finetune_offload.csv`) as
benchmarks/finetune_accuracy.py predicts them: every row read, peak memory within 10% where
it was measured, throughput within 15% but for the one figure whose losses Tessel does not
price: DeepSpeed 0.6's ZeRO-3 on 1,024 A100 at 8 sequences a GPU (its size sweep), predicted
1.26x its measured TFLOP/s, where the row's 16 a GPU (its GPU sweep) is within 15%."""

from __future__ import annotations

from dataclasses import replace

from cost_models.published_finetune import predict, read_runs


def test_every_row_is_read_and_its_memory_is_within_10_percent() -> None:
    runs, unpriced = read_runs()
    assert not unpriced
    assert len(runs) == 8  # DeepSpeed's row has two batches a GPU, each its own run
    measured = [predict(run) for run in runs if run.memory_gib is not None]
    assert [r.run.line for r in measured] == [3, 4, 5, 6]
    assert all(abs(r.memory_error) <= 0.10 for r in measured), \
        [(r.run.line, r.memory_error) for r in measured]


def test_throughput_is_within_15_percent_but_deepspeeds_zero3_at_8_sequences_a_gpu() -> None:
    errors = {run.name: predict(run).speed_error for run in read_runs()[0]}
    missed = [name for name, error in errors.items() if abs(error) > 0.15]
    assert missed == ["gpt3-175b ZeRO-3 offload, 8/GPU (size sweep)"]
    assert 0.2 < errors[missed[0]] < 0.3
    # The row's GPU sweep: the blocking checkpoint copies (9.3 s of the 108.5 s step) priced.
    assert 0.05 < errors["gpt3-175b ZeRO-3 offload, 16/GPU (GPU sweep)"] < 0.15


def test_deepspeeds_checkpoint_copies_are_what_brings_its_row_within_15_percent() -> None:
    """Without the blocking copies of DeepSpeed's cpu_checkpointing, 175B at 16 a GPU on
    1,024 A100 would be predicted 21% fast: Figure 5's measured 190.7 TFLOP/s."""
    run = next(run for run in read_runs()[0] if "16/GPU" in run.name)
    result = predict(run)
    unblocked = predict(replace(run, parallel=run.parallel.but(offload_checkpoints=False)))
    assert result.prediction.offload_s > 9.0
    assert unblocked.speed_error > 0.2 > 0.15 > result.speed_error
