"""planner.cli: a mistake in the input exits with status 2 and a message saying what to
change, without a traceback. Every case here fails before tracing, so they are fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import cli

UNTRACEABLE = Path(__file__).parents[2] / "fixtures" / "untraceable.py"
SHAPE = ["--num-layers", "2", "--seq-length", "16", "--vocab-size", "64"]

# (argv, fragments the message must contain)
CASES = {
    "mesh-letters": (["demo:mlp", "--mesh", "2y2"], ["--mesh '2y2'", "2x2"]),
    "mesh-zero": (["demo:mlp", "--mesh", "0"], ["--mesh '0'", "not a mesh shape"]),
    "mesh-zero-axis": (["demo:mlp", "--mesh", "2x0"], ["--mesh '2x0'"]),
    "unknown-demo": (["demo:nope"], ["Unknown demo 'nope'", "mlp", "gpt"]),
    "unknown-name": (["nocolon"], ["unknown model 'nocolon'", "plan models", "demo:NAME"]),
    "missing-file": (["nofile.py:f"], ["'nofile.py'", "does not exist"]),
    "unknown-cluster": (
        ["demo:mlp", "--cluster", "dgx-a100"],
        ["Unknown cluster preset 'dgx-a100'", "did you mean 'dgx-a100-80g'"],
    ),
    "check-unknown-demo": (["check", "demo:nope", "--mesh", "2"], ["Unknown demo 'nope'"]),
    "check-bad-steps": (["check", "demo:mlp", "--steps", "0"], ["--steps 0"]),
    "unknown-preset": (
        ["inspect", "gpt3-17b"], ["unknown model 'gpt3-17b'", "did you mean 'gpt3-175b'"]
    ),
    "family-without-shape": (
        ["inspect", "gpt"], ["model 'gpt' needs its shape", "--num-layers", "--vocab-size"]
    ),
    "heads-not-dividing-hidden": (
        ["inspect", "gpt", *SHAPE, "--hidden-size", "100", "--num-attention-heads", "7"],
        ["--hidden-size (100) must be divisible by --num-attention-heads (7)"],
    ),
    "groups-not-dividing-heads": (
        ["inspect", "llama3-8b", "--num-query-groups", "5"],
        ["num_attention_heads (32) must be divisible by --num-query-groups (5)"],
    ),
    "shape-flag-on-a-factory": (["demo:mlp", "--num-layers", "3"], ["--num-layers only apply"]),
    # Named as typed, not as the config fields they set (moe_top_k, activation).
    "renamed-flags-on-a-factory": (
        ["demo:mlp", "--mesh", "2", "--moe-router-topk", "2", "--swiglu"],
        ["--moe-router-topk, --swiglu only apply"],
    ),
    "hf-missing": (["inspect", "hf:nope/config.json"], ["'nope/config.json' does not exist"]),
    "hf-malformed-json": (["inspect", "hf:bad"], ["not valid JSON", "line 2"]),
    "hf-without-model-type": (["inspect", "hf:untyped/config.json"], ['no "model_type"']),
    "hf-unknown-model-type": (["inspect", "hf:alien"], ["model_type 'alien-9000'"]),
    "untraceable-module": (
        ["inspect", f"{UNTRACEABLE}:build"],
        [
            "could not trace the model in blocks.1 (Gate)",
            "untraceable.py:14 (if y.sum() > 0:)",
            "depends on tensor values",
            "torch.where",
        ],
    ),
    "check-meta-model": (["check", "gpt3-125m"], ["meta device", "cannot train"]),
    "zoo-without-cluster-size": (["gpt3-125m"], ["add --gpus N", "--mesh SHAPE"]),
    "gpus-without-batch": (
        ["gpt3-125m", "--gpus", "8", "--cluster", "dgx-a100-80g"], ["--global-batch-size"]
    ),
    "fp8-on-a100": (
        ["gpt3-125m", "--gpus", "8", "--cluster", "dgx-a100-80g", "--global-batch-size", "64",
         "--precision", "fp8"],
        ["--precision fp8 needs fp8 tensor cores", "A100"],
    ),
    "degrees-not-multiplying": (
        ["gpt3-125m", "--gpus", "8", "--cluster", "dgx-a100-80g", "--global-batch-size", "8",
         "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "4",
         "--micro-batch-size", "1"],
        ["tensor (4) x context (1) x pipeline (4) must divide the 8 GPUs"],
    ),
}


@pytest.fixture(autouse=True)
def _in_empty_dir(tmp_path, monkeypatch):
    # 'nofile.py' must not exist; run every case from a directory holding only the
    # broken Hugging Face configs.
    monkeypatch.chdir(tmp_path)
    for folder, text in {
        "bad": '{"model_type": "llama",\n',
        "untyped": '{"hidden_size": 64}',
        "alien": '{"model_type": "alien-9000"}',
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(text)


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("case", list(CASES))
def test_input_mistake_exits_2_with_a_message(case: str, capsys) -> None:
    argv, fragments = CASES[case]
    code, output = run(argv, capsys)
    assert code == 2
    assert "Traceback" not in output
    assert output.startswith("error: ")
    text = " ".join(output.split())  # however the terminal wrapped it
    for fragment in fragments:
        assert fragment in text


# Messages longer than 80 columns must not be wrapped when stdout is not a terminal.
@pytest.mark.parametrize("case", list(CASES))
def test_input_mistake_message_is_one_line_when_piped(case: str, capsys, piped_width) -> None:
    code, output = run(CASES[case][0], capsys)
    assert code == 2
    assert len(output.strip().splitlines()) == 1, output


def test_debug_adds_the_traceback_and_keeps_the_exit_code(capsys) -> None:
    code = cli.main(["demo:nope", "--debug"])
    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" in captured.err and "ModelSpecError" in captured.err
    assert captured.out.startswith("error: Unknown demo 'nope'")


def test_parse_mesh_accepts_sizes_joined_by_x() -> None:
    assert cli.parse_mesh("4") == (4,)
    assert cli.parse_mesh("2x2") == (2, 2)
    assert cli.parse_mesh("2X4") == (2, 4)
    with pytest.raises(cli.UsageError):
        cli.parse_mesh("")
