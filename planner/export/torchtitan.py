"""TorchTitan: a job config (`torchtitan.toml`) and its launch line (`torchtitan.sh`).

Written for TorchTitan 0.2 (0.2.0-0.2.2), the last release whose `JobConfig` reads a TOML
file (`--job.config_file`); every key can also be overridden on the command line with the
same dotted name (`--parallelism.tensor_parallel_degree 8`). TorchTitan 0.3 replaced the
file with Python config registries (`--module llama3 --config llama3_70b` plus the same
`--parallelism.*` / `--training.*` overrides) whose import needs triton, datasets and
wandb, too heavy to check here without a GPU; the 0.2 file is what the tests can hold to
TorchTitan's own `ConfigManager` and `ParallelDims`.

TorchTitan builds its own models, not an arbitrary shape: the plan's model must be one of
its Llama 3 flavors (8B, 70B, 405B); anything else is refused in one line. How the plan
maps:

- data parallelism is FSDP2 (`data_parallel_shard_degree`), or DDP
  (`data_parallel_replicate_degree`) for a ZeRO-0 plan with nothing but data parallelism.
- the pipeline split is the plan's, exactly: `module_fqns_per_model_part` names each model
  chunk's modules (chunk c on pipeline rank c % pipeline, as in Megatron-LM; under
  DualPipeV TorchTitan places them in V order itself, rank r holding chunks r and
  2 pipeline - 1 - r); the plan's micro-batches are the schedule's
  (`pipeline_parallel_microbatch_size`).
- recomputation: full -> `full` (every k-th block: layer-level selective "k");
  selective -> per-op selective (`op`); none -> `none`.
- tensor parallelism always runs with sequence parallelism in TorchTitan.
- offload: FSDP2's CPUOffloadPolicy (`training.enable_cpu_offload`) where the plan offloads
  both the optimizer and the parameters to the CPU (ZeRO-3); one without the other, NVMe,
  a fraction of the optimizer or activations are refused, and so are LoRA and QLoRA
  adapters (0.2 has none; 0.3's LoRAConverter adapts the fused wqkv with one adapter where
  Tessel prices one per projection): `--emit pytorch` writes them.

A plan priced as TorchTitan runs it (engine "torchtitan": `plan --engine torchtitan`)
holds only what TorchTitan runs, and its file carries every knob (FSDP2's reshard policy,
compile, fp8 all-gathers, the checkpointing frequency): `plan predict --torchtitan` reads
it back to the same prediction; one that holds anything else is refused in one line
(`torchtitan_incompatibility`). A plan priced for another engine is translated: ZeRO-3
reshards parameters after forward, ZeRO-1/2 keep them gathered until backward, ZeRO-0 with
other parallelism runs as FSDP2 (TorchTitan's DDP does not compose with it), delayed fp8
scaling as tensorwise; its TOML runs what TorchTitan runs, which is not what was priced.
"""

from __future__ import annotations

import shlex
from typing import Any

from planner.export.plan_config import one_layout_problem
from planner.export.fsdp_offload import fsdp2_offload_refusal
from planner.export.torchrun import RDZV_PORT, allocator_exports
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import KNOBS, engine_value, plan_value, spelt
from planner.vocabulary.parallel import ADAPTER_FINETUNES
from planner.vocabulary.plan import Plan, RunSettings
from planner.torchtitan.rules import DDP, FSDP, zero_stages

CONFIG_FILE = "torchtitan.toml"
LAUNCH_FILE = "torchtitan.sh"
RELEASE = "0.2"
DEFAULT_STEPS = 1000
# TorchTitan 0.2's Llama 3 flavors, by the shape fields that tell them apart.
LLAMA3_FLAVORS = {  # (layers, hidden, heads, kv heads, ffn) -> flavor
    (32, 4096, 32, 8, 14336): "8B",
    (80, 8192, 64, 8, 28672): "70B",
    (126, 16384, 128, 8, 53248): "405B",
}
# The knobs TorchTitan's keys spell, and its schedules' names (the knob registry's).
KEY = {name: spelling.key for name, spelling in spelt("torchtitan").items()}
_SCHEDULE = spelt("torchtitan")["schedule"]
FP8_RECIPES = {  # the plan's recipe -> (TorchTitan's converter, its recipe name)
    "delayed": ("quantize.linear.float8", "tensorwise"),
    "tensorwise": ("quantize.linear.float8", "tensorwise"),
    "mxfp8": ("quantize.linear.mx", "mxfp8_cublas"),
    "rowwise": ("quantize.linear.float8", "rowwise"),
}
"""TorchTitan 0.2 scales fp8 per tensor at each step (torchao dropped delayed scaling), or
per 32-element block with MX formats; it has no 128-element blockwise recipe."""


def llama3_flavor(model: TransformerConfig) -> str | None:
    """TorchTitan's Llama 3 flavor of this shape, or None."""
    if (model.norm, model.activation, model.position_embedding, model.bias,
            model.is_moe) != ("rmsnorm", "swiglu", "rope", False, False):
        return None
    key = (model.num_layers, model.hidden_size, model.num_attention_heads,
           model.num_kv_heads, model.ffn_size)
    return LLAMA3_FLAVORS.get(key)


def torchtitan_incompatibility(plan: Plan, model: TransformerConfig | None) -> str | None:
    """Why TorchTitan cannot run `plan` of `model` (one line), or None."""
    q = plan.parallel
    if q is None or plan.micro_batch_size is None or plan.global_batch_size is None:
        return "it is an operator-level plan"
    if model is None:
        return "the plan's model shape is unknown (plan a preset or give its shape flags)"
    if llama3_flavor(model) is None:
        return (f"TorchTitan {RELEASE} builds Llama 3 8B, 70B and 405B (and its own "
                f"DeepSeek-V3, Qwen3 and Llama 4), not {plan.model}'s shape")
    problem = one_layout_problem(plan)
    if problem:
        return problem
    if plan.precision == "fp16":
        return "TorchTitan trains in bf16 or fp32, not fp16"
    if plan.precision == "fp8" and plan.run and plan.run.fp8_recipe not in FP8_RECIPES:
        return f"TorchTitan {RELEASE} has no {plan.run.fp8_recipe} fp8 recipe"
    why = _offload_or_adapters(plan.run)
    if why is not None:
        return why
    if plan.run is not None and plan.run.engine == "torchtitan":
        return _not_as_torchtitan_runs(plan)
    return None


def _offload_or_adapters(run: RunSettings | None) -> str | None:
    """Why TorchTitan cannot run the plan's offload or adapters (one line), or None. Its
    one offload is FSDP2's CPUOffloadPolicy (training.enable_cpu_offload, applied in
    apply_fsdp: `planner.export.fsdp_offload`)."""
    why = fsdp2_offload_refusal(run)
    if run is None or why is not None:
        return why
    if run.finetune in ADAPTER_FINETUNES:
        # 0.2 has no adapters; 0.3's LoRAConverter gives the fused wqkv one adapter where
        # Tessel prices one per projection, and adapts no grouped experts.
        return (f"{run.finetune} adapters are not written for TorchTitan (0.2 has none; "
                "0.3's LoRAConverter adapts its fused wqkv with one adapter, not one per "
                "projection as priced): use --emit pytorch")
    return None


def _not_as_torchtitan_runs(plan: Plan) -> str | None:
    """Why a plan priced as TorchTitan runs it holds something TorchTitan would run
    otherwise (so its file would not predict as the plan did), with the flag that fixes
    it; None when TorchTitan runs exactly the plan."""
    q, run = plan.parallel, plan.run
    assert q is not None and run is not None
    allowed = zero_stages(q.tensor, q.context, q.pipeline, q.data)
    if q.zero_stage not in allowed:
        kinds = {FSDP: "FSDP2 (ZeRO-3)", DDP: "DDP (ZeRO-0)"}
        return (f"TorchTitan runs this layout's data parallelism as "
                f"{' or '.join(kinds[z] for z in allowed)}, not ZeRO-{q.zero_stage}; plan "
                f"with --zero-stage {allowed[-1]}")
    if q.sequence_parallel != (q.tensor > 1):
        return ("TorchTitan runs tensor parallelism with sequence parallelism, and none "
                "without it; plan with --sequence-parallel exactly where tensor parallelism is")
    if run.recompute_method != "uniform" or run.recompute_num_layers != 1:
        return ("TorchTitan checkpoints every block or every k-th one, not Megatron-LM's "
                "--recompute-method / --recompute-num-layers groups")
    if not run.overlap_grad_reduce or run.overlap_param_gather != (q.zero_stage >= 1):
        return ("FSDP2 and DDP always overlap the gradient reduction (and FSDP2 the weights' "
                "gathers) with compute; plan with --overlap-grad-reduce"
                + (" --overlap-param-gather" if q.zero_stage >= 1 else ""))
    if run.tp_comm_overlap and not run.compile:
        return ("TorchTitan's async tensor parallelism is a torch.compile pass, and the plan "
                "is not compiled; plan with --no-tp-comm-overlap")
    if plan.precision == "fp8" and run.fp8_recipe == "delayed":
        return "TorchTitan scales fp8 per tensor; plan with --fp8-recipe tensorwise"
    if run.fp8_param_gather and not (q.zero_stage == FSDP and q.data > 1):
        return "TorchTitan gathers fp8 weights only under FSDP2 over two or more data ranks"
    if run.cuda_graphs or run.attention_backend != "auto" or (
            run.main_grads_dtype, run.exp_avg_dtype) != ("fp32", "fp32"):
        return ("TorchTitan runs no CUDA graphs, SDPA's own attention kernels and fp32 "
                "gradients and Adam moments")
    if run.optimizer != "adam" or run.optimizer_in_backward:
        return ("TorchTitan steps torch's Adam after the backward here, not bitsandbytes' "
                "8-bit optimizers or a step in backward: plan without --optimizer and "
                "--optimizer-in-backward")
    if run.loss_chunks > 1:
        return ("TorchTitan's ChunkedLossWrapper runs each chunk's backward at once, not "
                "torchtune's chunked loss (--loss-chunks) this plan prices: plan without it")
    # The knobs the registry gives other engines only, at another value than their default.
    for name, knob in KNOBS.items():
        if "torchtitan" not in knob.engines and plan_value(plan, name) != knob.default:
            flag = knob.cli.key if knob.cli else name
            return f"TorchTitan has no {flag} ({' and '.join(knob.engines)} only); plan without it"
    return None


def _key(name: str) -> str:
    """The key of knob `name` in TorchTitan's [parallelism] table."""
    return KEY[name].removeprefix("parallelism.")


def _training_key(name: str) -> str:
    """The key of knob `name` in TorchTitan's [training] table."""
    return KEY[name].removeprefix("training.")


def model_parts(plan: Plan) -> list[list[str]]:
    """Module FQNs of every model chunk, in model order (TorchTitan's Llama 3 names)."""
    chunks = sorted(chunk for stage in plan.stages for chunk in (stage.chunks or [stage.layers]))
    last = len(chunks) - 1
    parts = []
    for index, (start, stop) in enumerate(chunks):
        names = ["tok_embeddings"] if index == 0 else []
        names += [f"layers.{layer}" for layer in range(start, stop)]
        names += ["norm", "output"] if index == last else []
        parts.append(names)
    return parts


def job_config(plan: Plan, model: TransformerConfig) -> dict[str, dict[str, Any]]:
    """The TOML tables of `plan` (see `torchtitan_incompatibility` first)."""
    q, run = plan.parallel, plan.run
    assert q is not None and plan.micro_batch_size and plan.global_batch_size
    flavor = llama3_flavor(model)
    only_data = q.tensor == q.pipeline == q.context == 1
    ddp = q.zero_stage == 0 and only_data
    titan = run is not None and run.engine == "torchtitan"
    if titan:  # the plan's own policy, as it was priced
        assert run is not None
        reshard = run.fsdp_reshard_after_forward
    else:  # ZeRO-3 frees gathered weights after forward; ZeRO-1/2 keep them
        reshard = "always" if q.zero_stage == 3 else "never"
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": q.data if ddp else 1,
        "data_parallel_shard_degree": 1 if ddp else q.data,
        _key("fsdp_reshard_after_forward"): reshard,
        _key("tensor"): q.tensor,
        _key("context"): q.context,
        _key("pipeline"): q.pipeline,
    }
    # Without a pipeline, every micro-batch is one step of gradient accumulation; with
    # one, the schedule runs all of a step's micro-batches.
    local_batch = plan.micro_batch_size
    if q.pipeline > 1:
        local_batch = plan.micro_batch_size * plan.num_micro_batches
        parallelism |= {
            _key("schedule"): engine_value(_SCHEDULE, plan.schedule or "1f1b"),
            "pipeline_parallel_microbatch_size": plan.micro_batch_size,
            "module_fqns_per_model_part": model_parts(plan),
        }
    if run is not None and run.tp_comm_overlap and q.tensor > 1:
        parallelism[_key("tp_comm_overlap")] = True
    activation = _activation_checkpoint(plan.recompute,
                                        run.recompute_every if run is not None else 1)
    steps = plan.training.steps if plan.training is not None else DEFAULT_STEPS
    tables: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs",
                "description": f"Tessel plan: {plan.model} on {plan.num_gpus} GPUs"},
        "model": {"name": "llama3", "flavor": flavor,
                  "hf_assets_path": f"./assets/hf/Llama-3.1-{flavor}"},
        "optimizer": {"name": "AdamW", "lr": 3e-4},
        "training": {
            "local_batch_size": local_batch, "global_batch_size": plan.global_batch_size,
            "seq_len": model.seq_length, "steps": steps,
            "mixed_precision_param": "float32" if plan.precision == "fp32" else "bfloat16",
        },
        "parallelism": parallelism,
        "activation_checkpoint": activation,
    }
    if run is not None and run.offload_optimizer == run.offload_params == "cpu":
        # FSDP2's CPUOffloadPolicy: sharded parameters, gradients and optimizer step on
        # the host (the plan holds both offloads, under FSDP2: ZeRO-3).
        tables["training"][_training_key("offload_optimizer")] = True
    async_tp = run is not None and run.tp_comm_overlap and q.tensor > 1
    # Each block compiled (async tensor parallelism is a compile pass), the loss compiled.
    components = (["model"] if async_tp or (run is not None and run.compile) else []) \
        + (["loss"] if run is not None and run.compile_loss else [])
    if components:
        tables["compile"] = {"enable": True, "components": components}
    if plan.precision == "fp8":
        assert run is not None
        tables["model"]["converters"] = [FP8_RECIPES[run.fp8_recipe][0]]
        tables |= _fp8_tables(run.fp8_recipe, run.fp8_param_gather)
    return tables


def _activation_checkpoint(recompute: str, every: int) -> dict[str, Any]:
    """[activation_checkpoint]: full checkpointing of every k-th block is TorchTitan's
    layer-level selective mode "k"; selective recomputation its op-level one."""
    if recompute == "full" and every > 1:
        return {"mode": "selective", "selective_ac_option": str(every)}
    if recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": recompute}


def _fp8_tables(recipe: str, gather: bool) -> dict[str, dict[str, Any]]:
    """The converter's table. Float8: tensorwise is its default without a recipe name,
    and fp8 all-gathers need the name unset (Float8LinearConverter refuses the two
    together); every linear in fp8, as Tessel prices it (MX's default keeps the output
    layer out)."""
    converter, name = FP8_RECIPES[recipe]
    if converter == "quantize.linear.mx":
        return {converter: {"recipe_name": name, "filter_fqns": []}}
    if gather:
        return {converter: {"enable_fsdp_float8_all_gather": True,
                            "precompute_float8_dynamic_scale_for_fsdp": True}}
    return {converter: {"recipe_name": name}}


def toml_text(tables: dict[str, dict[str, Any]]) -> str:
    """TOML of string, number, boolean and (nested) list values, one table each."""
    lines = []
    for name, table in tables.items():
        if not table:
            continue
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def launch_words(plan: Plan) -> list[str]:
    """torchrun starting TorchTitan's trainer on this config, one agent per host."""
    per_host = plan.devices_per_host or plan.devices_per_node
    hosts = -(-plan.num_gpus // per_host)
    return ["torchrun", "--nnodes", str(hosts), "--nproc-per-node",
            str(min(per_host, plan.num_gpus)), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"$MASTER_ADDR:{RDZV_PORT}", "--rdzv-id", "tessel-torchtitan",
            "-m", "torchtitan.train", "--job.config_file", CONFIG_FILE]


def torchtitan_files(plan: Plan, model: TransformerConfig | None) -> dict[str, str]:
    """{'torchtitan.toml': ..., 'torchtitan.sh': ...}; ValueError (one line) when
    TorchTitan cannot run `plan`."""
    why = torchtitan_incompatibility(plan, model)
    if why:
        raise ValueError(f"TorchTitan cannot run this plan: {why}")
    assert model is not None
    header = (f"# TorchTitan {RELEASE} job config: {plan.model} on {plan.num_gpus} GPUs "
              f"({plan.cluster}), as Tessel planned it.\n"
              "# hf_assets_path: the tokenizer (and weights) of the model, downloaded with "
              "TorchTitan's scripts/download_hf_assets.py.\n\n")
    return {CONFIG_FILE: header + toml_text(job_config(plan, model)),
            LAUNCH_FILE: launch_script(plan, launch_words(plan), RELEASE)}


def launch_script(plan: Plan, words: list[str], release: str, setup: tuple[str, ...] = ()
                  ) -> str:
    """The launch file of TorchTitan `release`: run on every node, the allocator settings
    the plan was priced with, `setup` lines, then the torchrun line `words`."""
    return "\n".join([
        "#!/bin/bash",
        f"# TorchTitan {release}: run on every node, MASTER_ADDR set to the first node's "
        "address.",
        "set -euo pipefail",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the first node\'s address}"',
        *setup,
        *allocator_exports(plan),
        " ".join(w if w.startswith("$") else shlex.quote(w) for w in words),
        "",
    ])
