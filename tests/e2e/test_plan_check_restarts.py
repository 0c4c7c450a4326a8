"""`plan check --gpus N` with a rank SIGKILLed mid-run: torch's elastic agent restarts the
job, which resumes from its last complete checkpoint by itself, and every step's loss
still equals one process's."""

from __future__ import annotations

import json

import pytest

from planner import cli

SHAPE = ["gpt", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16"]


@pytest.mark.timeout(180)
def test_a_killed_rank_restarts_the_job_from_its_last_checkpoint(tmp_path, capsys) -> None:
    report = tmp_path / "check.json"
    code = cli.main([
        "check", *SHAPE, "--gpus", "2", "--global-batch-size", "4",
        "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "1",
        "--steps", "5", "--checkpoint-every", "2", "--kill-rank", "1", "--kill-at-step", "4",
        "--max-restarts", "1", "--checkpoint-dir", str(tmp_path / "checkpoints"),
        "--json", str(report),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    check = json.loads(report.read_text())["details"]["check"]
    # The step-2 checkpoint was complete before step 4 began (step 4's save, started after
    # step 3, waited for it); step 4's may have been cut short by the kill.
    assert check["attempt"] == 1 and check["resumed_from"] in (2, 4), check
    assert check["steps_run"] == 5 - check["resumed_from"]
    assert len(check["losses"]) == 5 and check["loss_max_rel_error"] < 1e-4
    assert "PASSED" in out and "rank 1 was killed (SIGKILL) at step 4" in out, out
    assert f"resumed from the checkpoint of step {check['resumed_from']}" in out

