"""The torchrun line that starts a Plan's ranks: one process per device, one agent per
node, torch's c10d rendezvous (the launcher Megatron-LM, TorchTitan and PyTorch all use).

    torchrun --nnodes 128 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id tessel-gpt3-175b pretrain_gpt.py ...

Rank r runs on node r // devices_per_node, as the Plan's mesh assumes (consecutive ranks
share a node's fast links). Checked against torchrun's own argument parser in the tests.
"""

from __future__ import annotations

import re
import shlex

from planner.plan import Plan

# The rendezvous endpoint is the first node's address; a job script sets MASTER_ADDR.
RDZV_PORT = 29500


def torchrun_args(plan: Plan) -> list[str]:
    """torchrun's own flags for `plan` (the script and its arguments not included)."""
    per_node = plan.devices_per_node
    nodes = -(-plan.num_gpus // per_node)
    run_id = "tessel-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", plan.model).strip("-")
    return [
        "--nnodes", str(nodes), "--nproc-per-node", str(min(per_node, plan.num_gpus)),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$MASTER_ADDR:{RDZV_PORT}",
        "--rdzv-id", run_id or "tessel",
    ]


def torchrun_command(plan: Plan, script: str = "pretrain_gpt.py") -> str | None:
    """The whole launch line of Megatron-LM's `script` with the plan's flags, or None when
    Megatron-LM cannot run the plan. Every word is shell-quoted except $MASTER_ADDR."""
    if plan.megatron_flags is None:
        return None
    flags = [word for flag in plan.megatron_flags for word in flag.split()]
    words = ["torchrun", *torchrun_args(plan), script, *flags]
    return " ".join(w if w.startswith("$MASTER_ADDR:") else shlex.quote(w) for w in words)
