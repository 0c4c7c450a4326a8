"""Slurm: `slurm.sh`, an `sbatch` script around a Plan's torchrun line.

One Slurm task per host starts one torchrun agent, which starts the host's processes; the
rendezvous comes from Slurm's variables: the job's first host is `MASTER_ADDR`
(`scontrol show hostnames $SLURM_JOB_NODELIST`), `$SLURM_NNODES` hosts join, and the job
id names the rendezvous. Hosts are the plan's (`devices_per_host`: 8 GPUs on a DGX, 4 on
a GB200 compute tray), so consecutive ranks share a host as the plan's mesh assumes.

What torchrun starts is given by the caller (`planner.export.engines`): Megatron-LM's
`pretrain_gpt.py` with the plan's flags when Megatron-LM can run the plan, else the
PyTorch export's script. The tests hold the script to `sbatch`'s own option parser and
the torchrun line in it to torchrun's.
"""

from __future__ import annotations

import re
import shlex

from planner.vocabulary.plan import Plan

FILE = "slurm.sh"
RDZV_PORT = 29500


def hosts_and_devices(plan: Plan) -> tuple[int, int]:
    """(hosts, GPUs per host) of `plan`: one torchrun agent per host."""
    per_host = plan.devices_per_host or plan.devices_per_node
    return -(-plan.num_gpus // per_host), min(per_host, plan.num_gpus)


def sbatch_script(plan: Plan, command: list[str], env: dict[str, str] | None = None) -> str:
    """The sbatch script running `command` (the training script and its arguments) under
    torchrun on every host of `plan`, with `env` exported first."""
    hosts, per_host = hosts_and_devices(plan)
    name = "tessel-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", plan.model).strip("-") or "plan")
    torchrun = ["torchrun", "--nnodes", '"$SLURM_NNODES"', "--nproc-per-node", str(per_host),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f'"$MASTER_ADDR:{RDZV_PORT}"',
                "--rdzv-id", '"$SLURM_JOB_ID"']
    words = torchrun + [shlex.quote(word) for word in command]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={hosts}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_host}",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
        f"# {plan.model} on {plan.num_gpus} GPUs ({plan.cluster}), as Tessel planned it: "
        f"{hosts} hosts x {per_host} GPUs,",
        "# one torchrun agent per host (one Slurm task), rendezvous at the first host.",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in (env or {}).items()]
    lines += ["srun " + " ".join(words), ""]
    return "\n".join(lines)


def slurm_files(plan: Plan, command: list[str], env: dict[str, str] | None = None
                ) -> dict[str, str]:
    """{'slurm.sh': ...}: see `sbatch_script`."""
    return {FILE: sbatch_script(plan, command, env)}
