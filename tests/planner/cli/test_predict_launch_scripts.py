"""`plan predict --args-file`: Megatron-LM's own launch scripts, unedited, predicted as bash
and Megatron-LM run them; a script Tessel cannot know is one line and exit 2, and nothing
in it runs.

The scripts are NVIDIA's examples (tests/planner/megatron/launch_scripts/, SOURCES.md names
their commit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli

SCRIPTS = Path(__file__).resolve().parents[1] / "megatron" / "launch_scripts"
LLAMA = SCRIPTS / "train_llama3_8b_h100_fp8.sh"
MIXTRAL = SCRIPTS / "train_mixtral_8x7b_distributed.sh"
GPT3 = SCRIPTS / "train_gpt3_175b_distributed.sh"


def predict(argv: list[str], tmp_path: Path, capsys) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    path = tmp_path / "prediction.json"
    assert cli.main(["predict", "--cluster", "dgx-h100", "--no-search", "--json", str(path),
                     *argv]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def refused(argv: list[str], capsys) -> str:  # type: ignore[no-untyped-def]
    assert cli.main(["predict", "--cluster", "dgx-h100", "--no-search", *argv]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "Traceback" not in out, out
    return out


def test_nvidias_llama3_fp8_script_is_read_with_its_arrays_and_if_blocks(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    report, output = predict(["--args-file", str(LLAMA)], tmp_path, capsys)
    plan = report["launch_line"]
    assert plan["num_gpus"] == 8  # torchrun --nproc_per_node 8 --nnodes 1
    assert plan["precision"] == "fp8"  # set inside if [[ "$DTYPE" == "fp8" ]]
    assert plan["run"]["fp8_param_gather"] is True
    assert plan["parallel"]["zero_stage"] == 1  # TRAINING_ARGS+=("${DDP_ARGS[@]}")
    assert plan["run"]["overlap_grad_reduce"] and plan["run"]["overlap_param_gather"]
    assert plan["architecture"]["vocab_size"] == 128256  # the MOCK-data branch
    assert plan["predicted"]["fits"] is True  # 77.6 of the H100's 79.6 GiB
    assert round(plan["predicted"]["memory_gib_per_gpu"], 1) == 77.6
    assert any(note.startswith("--sequence-parallel is off: Megatron-LM turns it off at "
                               "--tensor-model-parallel-size 1") for note in report["notes"])
    assert plan["provenance"]["launch_argv"][:3] == ["torchrun", "--nproc_per_node", "8"]
    assert plan["provenance"]["launch_argv"][11] == "pretrain_gpt.py"
    assert "note: --sequence-parallel is off" in " ".join(output.split())


@pytest.mark.parametrize("gpus", [64, 1024])
def test_the_mixtral_script_at_the_scale_asked_keeps_its_degrees(
        gpus: int, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    report, _ = predict(["--args-file", str(MIXTRAL), "--gpus", str(gpus)], tmp_path, capsys)
    parallel = report["launch_line"]["parallel"]
    assert report["launch_line"]["num_gpus"] == gpus
    assert (parallel["tensor"], parallel["pipeline"], parallel["expert"],
            parallel["data"]) == (1, 4, 8, gpus // 4)
    assert (f"--gpus {gpus}: the script's torchrun starts 1 node(s) of 8 (set by NNODES on "
            f"line 11); read as {gpus // 8} nodes of 8, the degrees as written") in report["notes"]
    assert "vocabulary 32,000: --tokenizer-type Llama2Tokenizer's (Llama 2's SentencePiece " \
           "model, as Mixtral's); give --vocab-size if your tokenizer's differs" in report["notes"]


def test_the_environment_a_user_gives_is_the_scripts(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    report, _ = predict(["--args-file", str(MIXTRAL), "--env", "SLURM_NNODES=8"],
                        tmp_path, capsys)
    assert report["launch_line"]["num_gpus"] == 64
    assert not any(note.startswith("--gpus") for note in report["notes"])


def test_the_gpt3_script_is_refused_where_megatron_lm_refuses_it(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Its TRAINING_ARGS item "0:16 2.4B:320 ..." reaches Megatron-LM as six words (the
    # array is expanded unquoted), and Megatron-LM's parser refuses the five extra ones.
    assert refused(["--args-file", str(GPT3), "--gpus", "1024"], capsys) == (
        f"error: {GPT3}, line 40: --step-batch-size-schedule takes one value and is given "
        "'0:16' then '2.4B:320', which Megatron-LM refuses too; if the script meant one value, "
        "quote it where bash splits it at blanks (an unquoted ${ARRAY[@]} or $VARIABLE)")
    quoted = tmp_path / "gpt3.sh"
    quoted.write_text(GPT3.read_text().replace("${TRAINING_ARGS[@]}", '"${TRAINING_ARGS[@]}"'))
    report, _ = predict(["--args-file", str(quoted), "--gpus", "1024"], tmp_path, capsys)
    parallel = report["launch_line"]["parallel"]
    assert (parallel["tensor"], parallel["pipeline"], parallel["data"]) == (8, 16, 8)
    assert report["launch_line"]["precision"] == "fp16"
    assert report["launch_line"]["architecture"]["vocab_size"] == 51200  # GPT-2's, padded
    # Its degrees need 128 GPUs: 64 contradicts them.
    assert "64 GPUs are not divisible by --tensor-model-parallel-size 8 x " \
           "--pipeline-model-parallel-size 16" in refused(
               ["--args-file", str(quoted), "--gpus", "64"], capsys)


def test_explain_args_shows_each_flag_and_the_line_it_came_from(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from planner.cli.console import console

    monkeypatch.setattr(console, "width", 160)  # one table row per line
    _, output = predict(["--args-file", str(LLAMA), "--explain-args"], tmp_path, capsys)
    rows = {cells[2]: [cells[1], cells[3]] for cells in (
        [cell.strip() for cell in line.split("│")] for line in output.splitlines()
        if line.startswith("│")) if cells[2]}
    assert rows["--num-layers"] == ["57", "32 (from NUM_LAYERS, line 38)"]
    assert rows["--fp8-format"] == ["108", "hybrid"]  # an item of an if block's array
    assert rows["--vocab-size"] == ["139", "128256"]  # the MOCK-data branch
    assert rows["--use-distributed-optimizer"] == ["126", ""]  # DDP_ARGS, appended


HOSTILE_FLAG = "touch PWNED; echo 8"


@pytest.mark.parametrize("script, message", [
    (f"TP=$({HOSTILE_FLAG})\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n",
     "launch.sh, line 1: the command substitution $(touch PWNED; echo 8) on line 1, which "
     "Tessel does not run reaches the training command on line 2; Tessel never runs the "
     "script's commands, so write the value out (or give the variable with --env NAME=VALUE)"),
    ("eval 'TP=8'\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n",
     "launch.sh, line 2: $TP (`eval` on line 1, text Tessel does not evaluate may set it) "
     "reaches the training command on line 2"),
    ("eval torchrun pretrain_gpt.py --num-layers 2\n",
     "launch.sh, line 1: it runs through `eval` on line 1, text Tessel does not evaluate, so "
     "Tessel cannot know what runs"),
    ("ARGS=()\nfor L in 2 4; do ARGS+=(--num-layers $L); done\ntorchrun pretrain_gpt.py "
     "${ARGS[@]}\n",
     "launch.sh, line 2: $ARGS, set in the for loop on line 2, which Tessel does not run "
     "reaches the training command on line 3"),
    ("mkdir -p ckpt\necho 'torchrun pretrain_gpt.py'\n",
     "launch.sh runs no training script (its commands: mkdir, echo); give the script or line "
     "that runs pretrain_gpt.py, or only its flags"),
    ("torchrun pretrain_gpt.py --num-layers 2\ntorchrun pretrain_gpt.py --num-layers 4\n",
     "launch.sh runs 2 training commands (lines 1, 2); keep the one to predict"),
    ("TP=2\nsource cluster.env\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n",
     "launch.sh, line 3: $TP (`source cluster.env` on line 2, a file Tessel does not read may "
     "set it) reaches the training command on line 3; Tessel reads the one script, not the "
     "files it sources: write the values it takes from them into the script"),
    ("source env.sh\ntorchrun pretrain_gpt.py `touch PWNED`\n",
     "launch.sh, line 2: the command substitution `touch PWNED` on line 2, which Tessel does "
     "not run reaches the training command on line 2"),
])
def test_a_script_tessel_cannot_know_is_one_line_and_nothing_runs(
        script: str, message: str, tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "launch.sh").write_text(script)
    out = refused(["--gpus", "8", "--args-file", "launch.sh"], capsys)
    assert out.startswith(f"error: {message}"), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.sh"]


@pytest.mark.parametrize("argv, message", [
    (["--args-file", str(MIXTRAL), "--env", "SLURM_NNODES"],
     "--env 'SLURM_NNODES' is not NAME=VALUE; give the variable and its value, e.g. --env "
     "SLURM_NNODES=8"),
    (["--gpus", "8", "--script-arg", "1", "--", "--num-layers", "2"],
     "--script-arg sets what a launch script reads; give the script with --args-file, or "
     "drop it"),
])
def test_env_is_checked_before_any_work(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert message in refused(argv, capsys)
