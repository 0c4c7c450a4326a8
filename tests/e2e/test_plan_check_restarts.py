"""`plan check --gpus N` with a rank SIGKILLed mid-run: torch's elastic agent restarts the
job, which resumes from its last complete checkpoint by itself, and every step's loss
still equals one process's; with no restart left, the check names the killed rank and
the checkpoint the job would resume from. Either way the verdict comes within the first
5 lines, in at most 20."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_output import verdict_first  # noqa: E402

from planner import cli

SHAPE = ["gpt", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16"]
PP2_ON_2 = [*SHAPE, "--gpus", "2", "--global-batch-size", "4",
            "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "1"]


@pytest.mark.timeout(180)
def test_a_killed_rank_restarts_the_job_from_its_last_checkpoint(tmp_path, capsys) -> None:
    report = tmp_path / "check.json"
    code = cli.main([
        "check", *PP2_ON_2, "--steps", "5", "--checkpoint-every", "2", "--kill-rank", "1",
        "--kill-at-step", "4", "--max-restarts", "1",
        "--checkpoint-dir", str(tmp_path / "checkpoints"), "--json", str(report),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    verdict_first(out.splitlines(), "PASSED")
    check = json.loads(report.read_text())["details"]["check"]
    # The step-2 checkpoint was complete before step 4 began (step 4's save, started after
    # step 3, waited for it); step 4's may have been cut short by the kill.
    assert check["attempt"] == 1 and check["resumed_from"] in (2, 4), check
    assert check["steps_run"] == 5 - check["resumed_from"]
    assert len(check["losses"]) == 5 and check["loss_max_rel_error"] < 1e-4
    assert "PASSED" in out and "rank 1 was killed (SIGKILL) at step 4" in out, out
    assert f"resumed from the checkpoint of step {check['resumed_from']}" in out


@pytest.mark.timeout(120)
def test_with_no_restart_left_the_checkpoint_it_would_resume_from_is_named(
        tmp_path, capsys) -> None:
    """The step-2 checkpoint is whole before step 3 begins (step 3's save waited for it);
    step 3's may be, or may have been cut short by the kill."""
    folder = tmp_path / "checkpoints"
    code = cli.main(["check", *PP2_ON_2, "--steps", "4", "--checkpoint-every", "1",
                     "--kill-rank", "1", "--kill-at-step", "3",
                     "--checkpoint-dir", str(folder)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    failed = verdict_first(lines, "FAILED")
    # The agent's view (the signal) where it saw rank 1 die first, else its peer's.
    assert failed.startswith("FAILED: rank 1 failed") and (
        "SIGKILL" in failed or "rank 0 lost rank 1" in failed), failed
    assert failed.endswith("(injected: --kill-rank 1 --kill-at-step 3)"), failed
    resume = next(line for line in lines if line.startswith("would resume from: "))
    saved = resume.removeprefix("would resume from: ").split(" (")[0]
    assert saved in (str(folder / "step-00000002"), str(folder / "step-00000003")), resume
    assert (Path(saved) / "tessel-checkpoint.json").is_file()
    assert resume.endswith(f"(the checkpoint of step {saved[-1]}); --max-restarts 1 "
                           "restarts the job from it by itself")

