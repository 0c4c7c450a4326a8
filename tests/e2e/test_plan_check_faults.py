"""`plan check --gpus 4` meeting the faults people meet most, each injected: a rank that
hangs in a collective is named with the collective its peers waited in; a slow rank is
named as a straggler and the job completes; a NaN loss is named with its step and rank,
or rolled back to the last checkpoint and its batch skipped; a rank lost for good is
re-planned around. A fault run is read for its verdict: it comes within the first 5
lines, in at most 20 (the ranks' own output goes to a log file, named in one line);
nothing else is left in the temporary folder."""

from __future__ import annotations

import json
import sys
import math
import re
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_output import verdict_first  # noqa: E402

from planner import cli

SHAPE = ["gpt", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "256", "--seq-length", "16", "--gpus", "4",
         "--global-batch-size", "8"]
TP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]
PP2_ON_2 = [*SHAPE[:SHAPE.index("--gpus")], "--gpus", "2", "--global-batch-size", "4"]


def check(tmp_path: Path, capsys, *argv: str, shape: list[str] = SHAPE
          ) -> tuple[int, str, dict | None, list[str]]:
    """Exit code, output (unwrapped: rich wraps lines), JSON report and output lines as
    printed of `plan check`."""
    report = tmp_path / "check.json"
    code = cli.main(["check", *shape, *argv, "--json", str(report)])
    printed = capsys.readouterr().out
    return (code, " ".join(printed.split()),
            json.loads(report.read_text()) if report.exists() else None, printed.splitlines())


@pytest.mark.timeout(120)
def test_a_stalled_rank_is_named_with_the_collective_its_peers_waited_in(
        tmp_path, capsys, monkeypatch) -> None:
    # Everything the launch makes in the temporary folder goes, torch's error files too.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    start = time.monotonic()
    code, out, _, lines = check(tmp_path, capsys, *TP2, "--steps", "4", "--stall-rank", "2",
                                "--stall-at-step", "2", "--collective-timeout", "5")
    assert code == 1
    # Rank 2 stalled as it entered step 2's first collective: its data-parallel peer 0
    # waits in their all-gather, or its tensor-parallel peer 3 in their all-reduce.
    failed = verdict_first(lines, "FAILED")
    assert re.fullmatch(r"FAILED: rank 2 never entered (all_gather #\d+ on ranks 0, 2 \(step "
                        r"2\), in which rank 0|all_reduce #\d+ on ranks 2, 3 \(step 2\), in "
                        r"which rank 3) waited \(injected: --stall-rank 2 --stall-at-step 2\)",
                        failed), failed
    assert "would resume from: the start (the run saves no checkpoint" in out
    assert time.monotonic() - start < 60  # the collective timeout, not torch's 30 minutes
    # The ranks' own output is in the log named, the stalled rank's traceback with it
    # (where it hung); nothing else is left. (torch's own compile cache, torchinductor_USER,
    # is torch's to keep.)
    logged = next(line for line in lines if line.startswith("the ranks' output"))
    log = Path(logged.split(": ", 1)[1].split(" (--debug")[0])
    logged = log.read_text()
    assert "== attempt 0, rank 2: raised ==" in logged and "in _maybe_stall" in logged
    assert [p for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == [log]


@pytest.mark.timeout(120)
def test_a_slow_rank_is_named_a_straggler_and_the_job_completes(tmp_path, capsys) -> None:
    code, out, report, lines = check(tmp_path, capsys, *TP2, "--steps", "3", "--slow-rank",
                                     "1", "--slow-factor", "3")
    assert code == 0 and report["passed"]
    verdict_first(lines, "PASSED")
    assert list(report["details"]["check"]["stragglers"]) == ["1"]
    assert 2.0 < report["details"]["check"]["stragglers"]["1"] < 4.5
    assert "straggler: rank 1 worked" in out


@pytest.mark.timeout(120)
def test_a_nan_loss_is_named_with_its_step_and_rank(tmp_path, capsys) -> None:
    """No --on-divergence: the run trains on with the NaN; the verdict names the step and
    the rank whose loss it was, and what each policy would have done."""
    code, _, report, lines = check(tmp_path, capsys, "--pipeline-model-parallel-size", "2",
                                   "--steps", "3", "--nan-at-step", "1", shape=PP2_ON_2)
    assert code == 1 and not report["passed"]
    assert verdict_first(lines, "FAILED") == (
        f"FAILED: the loss became nan at step 1 on rank 1 (injected: --nan-at-step 1; one "
        f"process: {report['reference_losses'][1]:.8f}) and training went on with it (no "
        "--on-divergence); collectives, held bytes and saved activations match the plan's")
    assert "--on-divergence skip drops step 1's update and goes on; rollback needs a " \
        "checkpoint from before step 1 (--checkpoint-every 1 or less); stop ends the job " \
        "at step 1, naming it" in lines


@pytest.mark.timeout(120)
def test_a_nan_loss_rolls_back_and_skips_its_batch(tmp_path, capsys) -> None:
    code, out, report, lines = check(
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
    verdict_first(lines, "PASSED")
    assert "diverged: batch 3 skipped (--on-divergence rollback); the reference skipped " \
        "the same" in out


@pytest.mark.timeout(180)
def test_a_rank_lost_for_good_is_replanned_around(tmp_path, capsys) -> None:
    code, out, report, lines = check(tmp_path, capsys, "--steps", "6", "--checkpoint-every",
                                     "1", "--kill-rank", "1", "--kill-at-step", "3",
                                     "--elastic", "2:4")
    assert code == 0 and report["passed"], out
    # The verdict first, then the lost rank and the re-plan.
    verdict_first(lines, "PASSED")
    assert "rank 1 is gone for good (--elastic 2:4) re-planned on 3 ranks:" in out
    plan = report["plan"]
    assert plan["num_gpus"] == 3 and len(report["ranks"]) == 3
    check_ = report["details"]["check"]
    assert check_["resumed_from"] in (1, 2, 3)
    assert (f"the re-planned job went on from the checkpoint of step "
            f"{check_['resumed_from']}, resharded") in out
    assert len(report["losses"]) == 6 and None not in report["losses"]
    assert max(abs(a - b) / b for a, b in zip(report["losses"],
                                              report["reference_losses"])) < 1e-5
    assert not report["mismatches"]


# -- what a fault run prints, formatted without processes ---------------------------------


def _pp2_dp2_check(losses: list[float | None], reference: list[float | None]):
    """A check's result on pp2 x dp2 (ranks 2 and 3 hold the last stage), as the ranks
    would report it."""
    from planner.checks.training_check import TrainingCheck

    coordinates = [{"pp": rank // 2, "dp": rank % 2, "cp": 0, "tp": 0} for rank in range(4)]
    return TrainingCheck(
        world_size=4, losses=losses, reference_losses=reference, loss_max_abs_error=0.0,
        loss_max_rel_error=0.0, parameter_max_abs_error=math.nan,
        parameter_rel_error=math.nan, collectives=[{}] * 4, collectives_by_group=[[]] * 4,
        collectives_per_step=[[]] * 4, local_bytes=[{}] * 4, saved_activations=[{}] * 4,
        coordinates=coordinates)


def test_a_nan_on_a_data_parallel_last_stage_names_the_ranks_whose_mean_it_is() -> None:
    from rich.text import Text

    from planner.checks.training_check import PlanComparison
    from planner.cli.fault_report import training_verdict

    check_ = _pp2_dp2_check([5.5, math.inf, math.nan], [5.5, 5.4, 5.3])
    comparison = PlanComparison([{}] * 4, [{}] * 4, mismatches=["rank 2 send: 1 x, not 2 x"])
    assert Text.from_markup(training_verdict(check_, comparison)).plain == (
        "FAILED: the loss became inf at step 1 on ranks 2, 3 (the mean of the last stage's "
        "data-parallel ranks' losses; one process: 5.40000000) and training went on with "
        "it (no --on-divergence); collectives, held bytes and saved activations differ "
        "the plan's")


def test_where_a_failed_job_would_resume_from(tmp_path) -> None:
    from argparse import Namespace

    from planner.cli.fault_report import resume_point
    from runtime.checkpoint import MARKER, step_directory

    for step in (2, 3):
        step_directory(tmp_path, step).mkdir()
    (step_directory(tmp_path, 2) / MARKER).write_text('{"step": 2, "world_size": 2}')
    kept = Namespace(checkpoint_every=1, checkpoint_dir=str(tmp_path))
    assert resume_point(str(tmp_path), kept) == (
        f"{step_directory(tmp_path, 2)} (the checkpoint of step 2); --max-restarts 1 "
        "restarts the job from it by itself")
    (step_directory(tmp_path, 2) / MARKER).unlink()
    assert resume_point(str(tmp_path), Namespace(checkpoint_every=1, checkpoint_dir=None)) \
        == ("the start (no checkpoint was complete yet; step-00000002, step-00000003 were "
            "cut short by the failure; a temporary folder, removed at exit: --checkpoint-dir "
            "DIR keeps it)")
    assert resume_point(str(tmp_path), Namespace(checkpoint_every=None, checkpoint_dir=None)) \
        == "the start (the run saves no checkpoint: --checkpoint-every K saves one)"


def test_the_ranks_output_goes_to_a_log_named_in_one_line_or_with_debug_to_the_screen(
        tmp_path, capsys, monkeypatch) -> None:
    from argparse import Namespace

    from planner.cli.fault_report import print_ranks_output
    from runtime.local_ranks import RankError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    error = RankError("rank 1 failed: ValueError: bad", 1,
                      output="== attempt 0, rank 1: raised ==\nValueError: bad\n")
    print_ranks_output(error, Namespace(debug=False))
    [line] = capsys.readouterr().out.splitlines()
    [log] = tmp_path.iterdir()
    assert line == (f"the ranks' output and tracebacks (2 lines): {log} (--debug prints them "
                    "instead)")
    assert log.read_text() == error.output
    print_ranks_output(error, Namespace(debug=True))
    assert capsys.readouterr().out == error.output
    print_ranks_output(RankError("quiet", 0), Namespace(debug=False))
    assert capsys.readouterr().out == "" and len(list(tmp_path.iterdir())) == 1
