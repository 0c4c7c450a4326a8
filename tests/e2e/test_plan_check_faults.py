"""`plan check --gpus 4` meeting the faults people meet most, each injected: a rank that
hangs in a collective is named with the collective its peers waited in; a slow rank is
named as a straggler and the job completes; a NaN loss is rolled back to the last
checkpoint and its batch skipped; a rank lost for good is re-planned around. Nothing is
left in the temporary folder."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from planner import cli

SHAPE = ["gpt", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16", "--gpus", "4",
         "--global-batch-size", "8"]
TP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]


def check(tmp_path: Path, capsys, *argv: str) -> tuple[int, str, dict | None]:
    report = tmp_path / "check.json"
    code = cli.main(["check", *SHAPE, *argv, "--json", str(report)])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines; unwrap them
    return code, out, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.timeout(120)
def test_a_stalled_rank_is_named_with_the_collective_its_peers_waited_in(
        tmp_path, capsys, monkeypatch) -> None:
    # Everything the launch makes in the temporary folder goes, torch's error files too.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    start = time.monotonic()
    code, out, _ = check(tmp_path, capsys, *TP2, "--steps", "4", "--stall-rank", "2",
                         "--stall-at-step", "2", "--collective-timeout", "5")
    assert code == 1
    # Ranks 2 and 3 are a tensor-parallel pair: 3 waits in their all-reduce of step 2.
    failed = out[out.index("FAILED"):]
    assert failed.startswith("FAILED: rank 2 never entered all_reduce #"), failed
    assert "on ranks 2, 3 (step 2), in which rank 3 waited" in failed
    assert time.monotonic() - start < 60  # the collective timeout, not torch's 30 minutes
    # (torch's own compile cache, torchinductor_USER, is torch's to keep.)
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []


@pytest.mark.timeout(120)
def test_a_slow_rank_is_named_a_straggler_and_the_job_completes(tmp_path, capsys) -> None:
    code, out, report = check(tmp_path, capsys, *TP2, "--steps", "3", "--slow-rank", "1",
                              "--slow-factor", "3")
    assert code == 0 and report["passed"]
    assert list(report["details"]["check"]["stragglers"]) == ["1"]
    assert 2.0 < report["details"]["check"]["stragglers"]["1"] < 4.5
    assert "straggler: rank 1 worked" in out


@pytest.mark.timeout(120)
def test_a_nan_loss_rolls_back_and_skips_its_batch(tmp_path, capsys) -> None:
    code, out, report = check(
        tmp_path, capsys, "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2", "--steps", "6", "--checkpoint-every", "2",
        "--nan-at-step", "3", "--on-divergence", "rollback")
    assert code == 0 and report["passed"], out
    # Back to the checkpoint of step 2: step 2 trained again, batch 3 never applied; one
    # process that skipped batch 3 agrees step for step.
    assert report["losses"][3] is None and report["reference_losses"][3] is None
    assert all(x is not None for i, x in enumerate(report["losses"]) if i != 3)
    assert report["errors"]["max_rel"] < 1e-4
    check_ = report["details"]["check"]
    assert check_["skipped"] == [3] and check_["steps_run"] == 7
    assert "rolled back to the checkpoint of step 2, skipping batch 3" in " ".join(
        capsys.readouterr().err.split()) or "diverged: batch 3 skipped" in out


@pytest.mark.timeout(180)
def test_a_rank_lost_for_good_is_replanned_around(tmp_path, capsys) -> None:
    code, out, report = check(tmp_path, capsys, "--steps", "6", "--checkpoint-every", "1",
                              "--kill-rank", "1", "--kill-at-step", "3", "--elastic", "2:4")
    assert code == 0 and report["passed"], out
    assert "rank 1 is lost; re-planning for the 3 ranks left" in out
    plan = report["plan"]
    assert plan["num_gpus"] == 3 and len(report["ranks"]) == 3
    check_ = report["details"]["check"]
    assert check_["resumed_from"] in (1, 2, 3)
    assert len(report["losses"]) == 6 and None not in report["losses"]
    assert max(abs(a - b) / b for a, b in zip(report["losses"],
                                              report["reference_losses"])) < 1e-5
    assert not report["mismatches"]
