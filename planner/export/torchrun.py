"""The torchrun line that starts a Plan's ranks: one process per device, one agent per
host, torch's c10d rendezvous (the launcher Megatron-LM, TorchTitan and PyTorch all use).

    torchrun --nnodes 128 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id tessel-gpt3-175b pretrain_gpt.py ...

One agent runs per host (one OS instance): a DGX node of 8 GPUs, but a 4-GPU compute tray
of a GB200 NVL72 rack, whose 72 GPUs share one NVLink domain across 18 hosts. Rank r runs
on host r // devices_per_host, so consecutive ranks share a host and, as the Plan's mesh
assumes, a scale-up domain (hosts never straddle domains). 256 GB200s are 64 trays:
`--nnodes 64 --nproc-per-node 4`. Checked against torchrun's own argument parser in the
tests.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from planner.vocabulary.plan import Plan

# The rendezvous endpoint is the first host's address; a job script sets MASTER_ADDR.
RDZV_PORT = 29500


def devices_per_host(plan: Plan) -> int:
    """Processes torchrun starts per host for `plan`: its host size, or for a plan written
    before plans recorded hosts, its domain (one host per domain then)."""
    return plan.devices_per_host or plan.devices_per_node


# Restarts torchrun allows an elastic job (each after a lost node, or one that came back).
ELASTIC_RESTARTS = 3


@dataclass(frozen=True)
class Elastic:
    """An elastic job: torchrun restarts it with the nodes present, between the hosts of
    `min_ranks` and of `max_ranks`, and the job re-plans on `cluster` (a preset name or a
    cluster file's full path) for the ranks it finds."""

    min_ranks: int
    max_ranks: int
    cluster: str


def torchrun_args(plan: Plan, elastic: Elastic | None = None) -> list[str]:
    """torchrun's own flags for `plan` (the script and its arguments not included); for
    an `elastic` job, `--nnodes MIN:MAX` hosts and restarts."""
    per_host = devices_per_host(plan)
    hosts = str(-(-plan.num_gpus // per_host))
    restarts: list[str] = []
    if elastic is not None:
        hosts = f"{-(-elastic.min_ranks // per_host)}:{-(-elastic.max_ranks // per_host)}"
        restarts = ["--max-restarts", str(ELASTIC_RESTARTS)]
    run_id = "tessel-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", plan.model).strip("-")
    return [
        "--nnodes", hosts, "--nproc-per-node", str(min(per_host, plan.num_gpus)), *restarts,
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


def allocator_environment(plan: Plan) -> dict[str, str]:
    """The allocator settings a launch of `plan` needs: expandable segments where the
    reserved estimate crosses the device (the caching allocator then maps and unmaps
    pages, not whole segments), and with CUDA graphs NCCL_GRAPH_REGISTER=0, without which
    Megatron-Core refuses expandable segments (`TECudaGraphHelper`, `CudaGraphManager`)."""
    if plan.predicted.reserved_fits:
        return {}
    environment = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    run = plan.run
    if run is not None and (run.cuda_graphs or run.cuda_graph_scope):
        environment["NCCL_GRAPH_REGISTER"] = "0"
    return environment


def allocator_exports(plan: Plan) -> list[str]:
    """`allocator_environment` as a launch script's exports, with why."""
    environment = allocator_environment(plan)
    if not environment:
        return []
    return ["# The caching allocator's reserved estimate crosses the device: expandable",
            "# segments give back what fragmentation would hold.",
            *(f"export {name}={value}" for name, value in environment.items())]
