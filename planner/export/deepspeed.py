"""DeepSpeed: `ds_config.json` and its launch line (`deepspeed.sh`) for a Plan.

DeepSpeed on its own runs data parallelism with ZeRO and its offload, and Ulysses sequence
parallelism for a plan's context degree. The config carries the ZeRO stage, the precision,
the micro-batch, the gradient accumulation and the train batch, which DeepSpeed requires
to agree (train batch = micro-batch x accumulation x data-parallel ranks, checked by its
`DeepSpeedConfig` in the tests); each knob's key is the knob registry's
(`planner.vocabulary.knobs`), and ZeRO 1-3 carry the gradient overlap and every other knob
a zero_optimization key spells, where the plan sets it.

- Offload is ZeRO-Offload's and ZeRO-Infinity's: `offload_optimizer` and `offload_param`
  with the plan's device, pinned host buffers, and for NVMe a placeholder path
  (`NVME_PATH`) with DeepSpeed's default buffer counts and sizes.
- Checkpoint offload (`offload_checkpoints`) is DeepSpeed's activation checkpointing with
  `cpu_checkpointing`: the blocks run under `deepspeed.checkpointing.checkpoint`, whose
  checkpointed inputs go to the host.
- A context degree is Ulysses (Jacobs et al. 2023, `sequence_parallel_size`; the model's
  attention wrapped in `deepspeed.sequence.layer.DistributedAttention`, as Snowflake's
  Arctic long-sequence training runs it beside ZeRO-3 and offload). Tessel prices it as
  Megatron-LM's ring exchange of keys and values, which moves bytes of the same order per
  layer; the band does not know the difference.
- Tensor, pipeline and expert parallelism are refused in one line: DeepSpeed's pipeline
  engine needs the model rewritten as a `PipelineModule`, and its AutoTP training and
  expert layers need the model's code (the Megatron-LM export runs such plans). So is fp8
  (its config has no fp8 training), and so are LoRA adapters (they are the model's, `peft`).

Recomputation is the model's business under DeepSpeed (`deepspeed.checkpointing` or
`torch.utils.checkpoint` around each block); the launch script says which the plan uses.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from planner.export.plan_config import one_layout_problem
from planner.vocabulary.knobs import KNOBS, engine_value, plan_value, spelt
from planner.vocabulary.parallel import ADAPTER_FINETUNES
from planner.vocabulary.plan import Plan, RunSettings

# The knobs DeepSpeed's config keys spell (the knob registry's: `planner.vocabulary.knobs`),
# and those of its zero_optimization section `ds_config` places nowhere else (ZeRO 1-3).
KEY = {name: spelling.key for name, spelling in spelt("deepspeed").items()}
_OTHER_ZERO_KNOBS = tuple(
    name for name, spelling in spelt("deepspeed").items() if not spelling.engine
    and spelling.key.startswith("zero_optimization.")
    and name not in ("zero_stage", "overlap_grad_reduce", "optimizer_offload_fraction"))
NVME_PATH = "/local_nvme"
"""Where the NVMe offload's swap files go: a placeholder for the node's NVMe mount."""

CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "deepspeed.sh"
MASTER_PORT = 29500
TRAIN_SCRIPT = "train.py"
"""The user's training script: it calls `deepspeed.initialize(config=...)` on its model."""


def deepspeed_incompatibility(plan: Plan) -> str | None:
    """Why DeepSpeed alone cannot run `plan` (one line), or None."""
    problem = one_layout_problem(plan)
    if problem:
        return problem
    q = plan.parallel
    assert q is not None
    model_parallel = {"tensor": q.tensor, "pipeline": q.pipeline, "expert": q.expert}
    used = [f"{name} {size}" for name, size in model_parallel.items() if size > 1]
    if used:
        return (f"DeepSpeed alone runs data parallelism and ZeRO, not {' x '.join(used)} "
                "parallelism (its pipeline needs a PipelineModule rewrite, its AutoTP and "
                "expert layers the model's code): use --emit megatron")
    if plan.precision == "fp8":
        return "DeepSpeed's config has no fp8 training: plan with --precision bf16"
    run = plan.run
    if run is not None and run.offload_activation_layers:
        return "activation offload is Megatron-LM's (--cpu-offloading-num-layers)"
    if run is not None and run.offload_optimizer != "none" and q.zero_stage == 0:
        return "ZeRO-Offload needs ZeRO stage 1 or more: plan with --zero-stage 1"
    if run is not None and run.finetune in ADAPTER_FINETUNES:
        return (f"{run.finetune} adapters are the model's (peft), not DeepSpeed's config: "
                "use --emit pytorch")
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
    if run is not None:
        zero |= _offload_sections(run)
    config: dict[str, Any] = {
        KEY["global_batch_size"]: plan.global_batch_size,
        KEY["micro_batch_size"]: plan.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10,
    }
    if run is not None and run.offload_checkpoints:
        # deepspeed.checkpointing keeps each checkpointed block's input on the host; the
        # launch script wraps the blocks in it (deepspeed.checkpointing.configure reads
        # this section).
        config[KEY["offload_checkpoints"].split(".")[0]] = {
            "partition_activations": False, "cpu_checkpointing": True}
    if q.context > 1:
        # Ulysses: each sequence split over `context` ranks, attention's heads exchanged by
        # all-to-alls (deepspeed.sequence.layer.DistributedAttention); DeepSpeed's data-
        # parallel world is the ranks over this degree.
        config["sequence_parallel_size"] = q.context
    if plan.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    return config


def _offload_sections(run: RunSettings) -> dict[str, Any]:
    """zero_optimization's offload_optimizer and offload_param sections of the plan's
    offload (DeepSpeed's DeepSpeedZeroOffloadOptimizerConfig and ...ParamConfig): pinned
    host memory, NVMe swap files under `NVME_PATH`, DeepSpeed's default buffers."""
    sections: dict[str, Any] = {}
    if run.offload_optimizer != "none":
        section: dict[str, Any] = {"device": run.offload_optimizer, "pin_memory": True}
        if run.offload_optimizer == "nvme":
            section |= {"nvme_path": NVME_PATH, "buffer_count": 4}
        if run.optimizer_offload_fraction < 1:
            section["ratio"] = run.optimizer_offload_fraction
        sections[_zero_key("offload_optimizer")] = section
    if run.offload_params != "none":
        section = {"device": run.offload_params, "pin_memory": True}
        if run.offload_params == "nvme":
            section |= {"nvme_path": NVME_PATH, "buffer_count": 5, "buffer_size": 100_000_000,
                        "max_in_cpu": 1_000_000_000}
        sections[_zero_key("offload_params")] = section
    return sections


def _zero_key(name: str) -> str:
    """The key of knob `name` in the config's zero_optimization section (ZeRO 1-3 only,
    where DeepSpeed's buckets and overlap apply)."""
    return KEY[name].removeprefix("zero_optimization.").removesuffix(".device")


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
