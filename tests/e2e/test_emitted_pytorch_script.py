"""The PyTorch export trains: `pytorch_train.py`, as `plan --emit pytorch` writes it, runs
three steps under torchrun on 4 CPU processes (gloo) and prints a finite loss each step.

Three plans cover what the script does: pipeline x tensor parallelism with sequence
parallelism, the distributed optimizer and full recomputation (1F1B over two stages); a
GPT whose output layer is tied to the vocabulary-parallel embedding, with ZeRO-3 over two
data-parallel ranks, selective recomputation and gradient accumulation over micro-batches;
and LoRA fine-tuning (the script's own adapters beside tensor-parallel linears, the base
frozen) with FSDP2's CPU offload of parameters, gradients and optimizer step (unpinned on
CPU; priced on a cluster with host figures, which offload needs).
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from planner.vocabulary.cluster import Cluster
from planner.export.engines import engine_files
from planner.models.presets import zoo_config
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
SHAPE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256,
         "seq_length": 16}
PLANS = {
    "llama-pp2-tp2-sp-zero1-full": ("llama", {
        "tensor": 2, "pipeline": 2, "sequence_parallel": True, "zero_stage": 1,
        "recompute": "full", "micro_batch_size": 1, "global_batch_size": 4}),
    "gpt-tied-tp2-dp2-zero3-selective": ("gpt", {
        "tensor": 2, "sequence_parallel": True, "zero_stage": 3, "recompute": "selective",
        "micro_batch_size": 1, "global_batch_size": 8}),
    "llama-tp2-dp2-zero3-lora-cpu-offload": ("llama", {
        "tensor": 2, "sequence_parallel": True, "zero_stage": 3, "recompute": "full",
        "micro_batch_size": 1, "global_batch_size": 4, "finetune": "lora", "lora_rank": 4,
        "offload_optimizer": "cpu", "offload_params": "cpu"}),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", PLANS)
def test_emitted_pytorch_script_trains_on_four_cpu_ranks(name: str, tmp_path: Path) -> None:
    family, knobs = PLANS[name]
    model = zoo_config(family, SHAPE)
    cluster = "dgx-h100" if knobs.get("offload_params", "none") != "none" else "cpu"
    plan = training_plan(family, model, Cluster.load(cluster).with_devices(4),
                         ParallelConfig.of(**knobs, precision="fp32"))
    text = engine_files("pytorch", plan, model)["pytorch_train.py"]
    # A short run, logged every step.
    text, count = re.subn(r"^STEPS, LOG_EVERY = \d+, \d+$", f"STEPS, LOG_EVERY = {STEPS}, 1",
                          text, flags=re.MULTILINE)
    assert count == 1
    (tmp_path / "pytorch_train.py").write_text(text)
    # torchrun keeps its agent's logs in the temporary folder: this test's own.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path / "tmp")}
    # Its own session, so that a hang ends with every rank, not only torchrun.
    run = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "4", "pytorch_train.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = run.communicate(timeout=220)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, err = run.communicate()
    assert run.returncode == 0, err[-3000:]
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == STEPS, out
    # Random tokens over a 256-word vocabulary: cross-entropy near ln(256).
    assert all(math.isfinite(v) and abs(v - math.log(256)) < 1.0 for v in losses), losses
