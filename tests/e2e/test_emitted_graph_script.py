"""`plan MODEL --gpus N --emit pytorch DIR` for a model of one's own: the graph plan's
launch script, started by torchrun on 4 CPU ranks, trains as one process does, saves
checkpoints and resumes from them; engines that cannot run a graph plan say so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.checks.operator import grown, synthetic_batches, train_single_process

REPO = Path(__file__).parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from graph_models import narrow_mlp  # noqa: E402


def _torchrun(folder: Path, *args: str, ranks: int = 4) -> dict[int, float]:
    # torchrun keeps its agent's logs in the temporary folder: the test's own.
    scratch = folder.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(ranks), str(folder / "train_graph.py"), *args],
        cwd=folder.parent, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {int(s): float(v) for s, v in re.findall(r"step (\d+) loss ([0-9.e-]+)",
                                                    result.stdout)}


def test_the_emitted_script_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "planner", "tests/e2e/graph_models.py:narrow_mlp",
         "--cluster", "tests/fixtures/small_memory.yaml", "--gpus", "4",
         "--global-batch-size", "16", "--micro-batch-size", "4", "--zero-stage", "3",
         "--emit", "pytorch,slurm,megatron", str(out), "--elastic", "2:4"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "megatron: no file: --elastic: only a graph plan's PyTorch job" in result.stdout
    # torchrun restarts the job with the nodes present (all four ranks on one host here).
    assert "torchrun --nnodes 1:1 --nproc-per-node 4 --max-restarts 3" in (
        out / "train_graph.py").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "train_graph.py"]
    assert "slurm: no file: --elastic" in result.stdout
    # Without --elastic, Slurm starts the same script.
    from planner.export.engines import engine_files
    from planner.vocabulary.plan import Plan

    slurm = engine_files("slurm", Plan.from_json(out / "plan.json"), None)
    assert "train_graph.py" in slurm["slurm.sh"]
    # Launched from another folder: the script finds its plan and the factory's file.
    first = _torchrun(out, "--steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt"),
                      "--checkpoint-every", "2")
    model, inputs = narrow_mlp()
    examples = tuple(grown(x, 16) for x in inputs)
    batches = [synthetic_batches(examples, 1, seed=step)[0] for step in range(3)]
    reference, _ = train_single_process(model, None, batches)
    assert [first[s] for s in (1, 2, 3)] == pytest.approx(reference, rel=1e-4)
    # Restarted: resumes from the checkpoint of step 2, so step 3 is the same step again.
    resumed = _torchrun(out, "--steps", "4", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert sorted(resumed) == [3, 4]
    assert resumed[3] == pytest.approx(first[3], rel=1e-6)
    # Two ranks left (--elastic 2:4): the job re-plans for them, loads the checkpoint of
    # step 2 onto the new plan and trains steps 3 and 4 as one process does.
    elastic = _torchrun(out, "--steps", "4", "--checkpoint-dir", str(tmp_path / "ckpt"),
                        ranks=2)
    fourth = synthetic_batches(examples, 1, seed=3)[0]
    reference, _ = train_single_process(*narrow_mlp()[:1], None, [*batches, fourth])
    assert [elastic[s] for s in (3, 4)] == pytest.approx(reference[2:], rel=1e-4)


def test_a_zoo_transformers_script_builds_it_at_the_plans_shape(tmp_path: Path) -> None:
    """`plan gpt --num-layers 6 ... --intra-op ilp --emit pytorch DIR`: the plan holds the
    shape flags, and the script builds the transformer at that shape (weights of its own
    initialisation) and trains it on 4 ranks as one process does."""
    from planner.models.sources import load_model, with_weights

    shape = {"num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
             "vocab_size": 128}
    out = tmp_path / "launch"
    result = subprocess.run(
        [sys.executable, "-m", "planner", "gpt", "--num-layers", "6", "--hidden-size", "64",
         "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
         "--cluster", "tests/fixtures/small_memory.yaml", "--gpus", "4",
         "--global-batch-size", "16", "--micro-batch-size", "4", "--intra-op", "ilp",
         "--precision", "fp32", "--emit", "pytorch", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = _torchrun(out, "--steps", "2")
    loaded = with_weights(load_model("gpt", shape))
    examples = tuple(grown(x, 16) for x in loaded.example_inputs)
    batches = [synthetic_batches(examples, 1, seed=step)[0] for step in range(2)]
    reference, _ = train_single_process(loaded.model, loaded.loss_fn, batches)
    assert [losses[s] for s in (1, 2)] == pytest.approx(reference, rel=1e-4)
