"""Plans of zoo transformers on the analytic path import no torch (3 of the old 5 seconds
of `plan gpt3-175b ...` were torch's import): the CLI runs in a fresh interpreter and the
modules it loaded are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import sys
from planner.cli.main import main
code = main({argv!r})
heavy = sorted(m for m in ("torch", "transformers", "ortools") if m in sys.modules)
print("LOADED", heavy)
sys.exit(code)
"""


def loaded_modules(argv: list[str]) -> str:
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.rsplit("LOADED", 1)[1].strip()


def test_a_zoo_training_plan_imports_no_torch() -> None:
    argv = ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
            "--global-batch-size", "1536", "--train-tokens", "300B"]
    assert loaded_modules(argv) == "[]"


def test_a_zoo_shape_given_by_flags_imports_no_torch() -> None:
    argv = ["llama", "--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
            "--seq-length", "1024", "--vocab-size", "32000", "--cluster", "dgx-h100",
            "--gpus", "8", "--global-batch-size", "64"]
    assert loaded_modules(argv) == "[]"


def _widest_line(argv: list[str]) -> int:
    result = subprocess.run([sys.executable, "-m", "planner", *argv], cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "80", "TERM": "dumb"})
    assert result.returncode == 0, result.stderr
    return max(len(line) for line in (result.stdout + result.stderr).splitlines())


def test_every_line_fits_80_columns() -> None:
    """Tables, the preset list and the launch lines (shell commands continued with '\\')."""
    assert _widest_line(["clusters"]) <= 80
    assert _widest_line(["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
                         "--global-batch-size", "1536", "--train-tokens", "300B"]) <= 80


def test_json_to_stdout_leaves_stdout_to_the_json() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "planner", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus",
         "8", "--global-batch-size", "64", "--json", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"] == "gpt3-1.3b"
    assert "Megatron-LM flags" in result.stderr


def test_the_command_exits_with_mains_code_and_all_it_wrote() -> None:
    # `plan` ends without tearing its modules down (planner.cli.main.run): its exit code
    # and every line it wrote, to a pipe, arrive all the same.
    result = subprocess.run(
        [sys.executable, "-m", "planner", "gpt3-1.3b", "--cluster", "nosuch", "--gpus", "8",
         "--global-batch-size", "64"], cwd=REPO, capture_output=True, text=True, timeout=120)
    said = result.stdout + result.stderr
    assert result.returncode == 2
    assert said.startswith("error: Unknown cluster preset 'nosuch'")
    assert said.rstrip().endswith("or give a .yaml/.json file path).")


def test_an_hf_config_stating_its_shape_plans_without_torch(tmp_path: Path) -> None:
    fields = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 131072, "tie_word_embeddings": False,
              "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    argv = [f"hf:{tmp_path}", "--cluster", "dgx-h100", "--gpus", "64",
            "--global-batch-size", "512"]
    assert loaded_modules(argv) == "[]"
