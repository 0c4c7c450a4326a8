"""`megatron.sh`: the whole multi-node Megatron-LM launch of a Plan, one torchrun per node.

The plan's own flags (`Plan.megatron_flags`, from `planner.export.megatron`) follow
`pretrain_gpt.py` on the torchrun line of `planner.export.torchrun`, and then what every run
needs besides the plan: its length (`--train-iters`: the plan's `--train-tokens` steps when
it has them), a learning-rate schedule, and data. The data is Megatron-LM's mock data and
null tokenizer, so that the line runs as written; a real run swaps those two flags for
`--data-path` and its tokenizer (the comment above the line says so).

`CUDA_DEVICE_MAX_CONNECTIONS=1` is exported because Megatron-LM's `validate_args` refuses
tensor or context parallelism without it on GPUs before Blackwell; expandable segments where
the plan's reserved estimate crosses the device (`launch.allocator_environment`). The tests
read this file back with torchrun's parser and with Megatron-LM's own `parse_args` and
`validate_args`.
"""

from __future__ import annotations

import shlex

from planner.export.torchrun import allocator_exports, torchrun_command
from planner.vocabulary.plan import Plan

FILE = "megatron.sh"
DEFAULT_ITERS = 1000
"""Steps of a run whose plan has no length (planned without --train-tokens)."""
# Words every launch needs beyond the plan: schedule, logging and runnable mock data.
RUN_WORDS = ["--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
             "--weight-decay", "0.1", "--clip-grad", "1.0", "--log-interval", "10",
             "--eval-iters", "0", "--mock-data", "--tokenizer-type", "NullTokenizer"]


def megatron_incompatibility(plan: Plan) -> str | None:
    """Why Megatron-LM cannot run `plan` (one line), or None."""
    if plan.megatron_flags is None:
        return plan.megatron_incompatibility or "the plan has no Megatron-LM flags"
    return None


def train_iters(plan: Plan) -> int:
    """Optimizer steps of the run: the plan's whole-run steps, else DEFAULT_ITERS."""
    return plan.training.steps if plan.training is not None else DEFAULT_ITERS


def launch_words(plan: Plan) -> list[str]:
    """Everything after `pretrain_gpt.py` beyond the plan's flags."""
    iters = train_iters(plan)
    return ["--train-iters", str(iters), "--lr-warmup-iters", str(max(1, iters // 100)),
            *RUN_WORDS]


def megatron_script(plan: Plan) -> dict[str, str]:
    """{'megatron.sh': text}. ValueError (one line) when Megatron-LM cannot run `plan`."""
    why = megatron_incompatibility(plan)
    if why:
        raise ValueError(f"Megatron-LM cannot run this plan: {why}")
    command = torchrun_command(plan)
    assert command is not None
    line = command + " " + " ".join(shlex.quote(word) for word in launch_words(plan))
    q = plan.parallel
    assert q is not None
    lines = [
        "#!/bin/bash",
        f"# Megatron-LM: {plan.model} on {plan.num_gpus} GPUs ({plan.cluster}), as Tessel "
        "planned it:",
        f"#   tensor {q.tensor} x pipeline {q.pipeline} x data {q.data} x context "
        f"{q.context}, expert {q.expert}; micro-batch {plan.micro_batch_size}, global batch "
        f"{plan.global_batch_size}; predicted step {plan.predicted.step_time_s:.3f} s.",
        "# Run this on every node, from a Megatron-LM checkout (pretrain_gpt.py), with",
        "# MASTER_ADDR set to the first node's address (slurm.sh does both for Slurm).",
        "# --mock-data and the null tokenizer make the line run as written: for a real run,",
        "# replace them with --data-path PREFIX and your tokenizer's flags.",
        "set -euo pipefail",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the first node\'s address}"',
        "# validate_args refuses tensor or context parallelism without it (before Blackwell).",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        *allocator_exports(plan),
        line,
        "",
    ]
    return {FILE: "\n".join(lines)}
