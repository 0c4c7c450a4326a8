"""DeepSpeed: `ds_config.json` and its launch line (`deepspeed.sh`) for a Plan.

DeepSpeed on its own runs data parallelism with ZeRO: the config carries the ZeRO stage,
the precision, the micro-batch, the gradient accumulation and the train batch, which
DeepSpeed requires to agree (train batch = micro-batch x accumulation x data-parallel
ranks, checked by its `DeepSpeedConfig` in the tests). A plan with tensor, pipeline,
context or expert parallelism is refused in one line: DeepSpeed's pipeline engine needs
the model rewritten as a `PipelineModule` and it has no tensor- or context-parallel
training layers of its own (Megatron-DeepSpeed adds them with Megatron-LM's flags of a
2023 fork; the Megatron-LM export runs such plans). So is fp8: its config has no fp8
training. The Plan has no offload knob, so the config offloads nothing. Each knob's key is
the knob registry's (`planner.vocabulary.knobs`); ZeRO 1-3 also carry the gradient
overlap and every other knob a zero_optimization key spells, where the plan sets it.

Recomputation is the model's business under DeepSpeed (`deepspeed.checkpointing` or
`torch.utils.checkpoint` around each block); the launch script says which the plan uses.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from planner.vocabulary.knobs import KNOBS, engine_value, plan_value, spelt
from planner.vocabulary.plan import Plan

# The knobs DeepSpeed's config keys spell (the knob registry's: `planner.vocabulary.knobs`),
# and those of its zero_optimization section `ds_config` places nowhere else (ZeRO 1-3).
KEY = {name: spelling.key for name, spelling in spelt("deepspeed").items()}
_OTHER_ZERO_KNOBS = tuple(
    name for name, spelling in spelt("deepspeed").items() if not spelling.engine
    and spelling.key.startswith("zero_optimization.")
    and name not in ("zero_stage", "overlap_grad_reduce"))

CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "deepspeed.sh"
MASTER_PORT = 29500
TRAIN_SCRIPT = "train.py"
"""The user's training script: it calls `deepspeed.initialize(config=...)` on its model."""


def deepspeed_incompatibility(plan: Plan) -> str | None:
    """Why DeepSpeed alone cannot run `plan` (one line), or None."""
    q = plan.parallel
    if q is None or plan.micro_batch_size is None or plan.global_batch_size is None:
        return "it is an operator-level plan (no data-parallel degree or batch)"
    if plan.mesh_axes == ["device"]:
        return "its pipeline stages run on different meshes"
    model_parallel = {"tensor": q.tensor, "pipeline": q.pipeline, "context": q.context,
                      "expert": q.expert}
    used = [f"{name} {size}" for name, size in model_parallel.items() if size > 1]
    if used:
        return (f"DeepSpeed alone runs data parallelism and ZeRO, not {' x '.join(used)} "
                "parallelism (its pipeline needs a PipelineModule rewrite and it has no "
                "tensor-parallel layers): use --emit megatron")
    if plan.precision == "fp8":
        return "DeepSpeed's config has no fp8 training: plan with --precision bf16"
    return None


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed config of a data-parallel plan (see `deepspeed_incompatibility`)."""
    q, run = plan.parallel, plan.run
    assert q is not None and plan.micro_batch_size and plan.global_batch_size
    accumulation = plan.global_batch_size // (plan.micro_batch_size * q.data)
    zero: dict[str, Any] = {_zero_key("zero_stage"): q.zero_stage}
    if q.zero_stage:
        # Overlap the reduce-scatter with backward as the plan's --overlap-grad-reduce does.
        zero |= {_zero_key("overlap_grad_reduce"): bool(run and run.overlap_grad_reduce),
                 "contiguous_gradients": True}
        # Every other knob a zero_optimization key spells, where the plan sets it.
        for name in _OTHER_ZERO_KNOBS:
            value = plan_value(plan, name)
            if value is not None and value != KNOBS[name].default:
                zero[_zero_key(name)] = engine_value(spelt("deepspeed")[name], value)
    config: dict[str, Any] = {
        KEY["global_batch_size"]: plan.global_batch_size,
        KEY["micro_batch_size"]: plan.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10,
    }
    if plan.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    return config


def _zero_key(name: str) -> str:
    """The key of knob `name` in the config's zero_optimization section (ZeRO 1-3 only,
    where DeepSpeed's buckets and overlap apply)."""
    return KEY[name].removeprefix("zero_optimization.")


def launch_words(plan: Plan) -> list[str]:
    """The `deepspeed` launcher's command line (its runner's flags, then the script)."""
    per_host = plan.devices_per_host or plan.devices_per_node
    hosts = -(-plan.num_gpus // per_host)
    words = ["deepspeed", "--num_nodes", str(hosts), "--num_gpus", str(min(per_host,
             plan.num_gpus))]
    if hosts > 1:
        words += ["--hostfile", "hostfile", "--master_addr", "$MASTER_ADDR",
                  "--master_port", str(MASTER_PORT)]
    return [*words, TRAIN_SCRIPT, "--deepspeed", "--deepspeed_config", CONFIG_FILE]


def deepspeed_files(plan: Plan) -> dict[str, str]:
    """{'ds_config.json': ..., 'deepspeed.sh': ...}; ValueError (one line) when DeepSpeed
    alone cannot run `plan`."""
    why = deepspeed_incompatibility(plan)
    if why:
        raise ValueError(f"DeepSpeed cannot run this plan: {why}")
    q = plan.parallel
    assert q is not None
    words = launch_words(plan)
    line = " ".join(w if w.startswith("$") else shlex.quote(w) for w in words)
    recompute = {"none": "no recomputation",
                 "selective": "selective recomputation (the attention core of each block)",
                 "full": "full recomputation (wrap each block in deepspeed.checkpointing."
                         "checkpoint)"}[plan.recompute]
    script = [
        "#!/bin/bash",
        f"# DeepSpeed: {plan.model} on {plan.num_gpus} GPUs ({plan.cluster}), as Tessel "
        f"planned it: ZeRO-{q.zero_stage},",
        f"# data {q.data}, micro-batch {plan.micro_batch_size}, global batch "
        f"{plan.global_batch_size}, {plan.precision}, {recompute}.",
        f"# {TRAIN_SCRIPT} is your script: it passes {CONFIG_FILE} to deepspeed.initialize.",
    ]
    if "--hostfile" in words:
        script += ["# hostfile: one line per node, 'HOSTNAME slots=GPUS'; MASTER_ADDR: the "
                   "first node."]
    script += ["set -euo pipefail", line, ""]
    return {CONFIG_FILE: json.dumps(ds_config(plan), indent=2) + "\n",
            LAUNCH_FILE: "\n".join(script)}
