"""TorchTitan 0.3: a config function (`torchtitan_config.py`) and its launch line
(`torchtitan.sh`), the form `plan --emit torchtitan` writes by default.

TorchTitan 0.3 runs a `Trainer.Config` returned by a Python function, selected with
`--module M --config F` (torchtitan/config/manager.py: `ConfigManager._load_config`; the
launch as run_train.sh writes it: `torchrun ... -m torchtitan.train --module ... --config
...`). The module written here is that function, `tessel_plan()`, in the form of
TorchTitan's own `config_registry.py` functions, holding exactly what Tessel priced; the
launch script puts its folder on PYTHONPATH so that `--module torchtitan_config` imports it.

The settings are the 0.2 writer's (`planner.export.torchtitan.job_config`: one mapping of
a plan to TorchTitan's keys), renamed to 0.3's fields (`planner.torchtitan.next_keys`),
with what 0.3 changed:

- activation checkpointing is a policy's class: FullAC, SelectiveAC (op-level) or None;
  0.3 has no layer-level "every k-th block" option, so such a plan is refused;
- float8 in 0.3 scales per row only, which Tessel does not price: an fp8 plan is written
  with MXFP8LinearConverter (mxfp8 recipe) or refused;
- CUDA graphs of the step are on by default in 0.3 and Tessel prices the step eager:
  `disable_cuda_graphs=True` is written;
- the loss is plain cross-entropy (CrossEntropyLoss), as priced (the registry's
  ChunkedLossWrapper keeps less of the logits);
- FSDP2's CPU offload keeps 0.2's name: `TrainingConfig(enable_cpu_offload=True)`
  (torchtitan/config/configs.py), applied in `apply_fsdp_to_decoder` as CPUOffloadPolicy.

`plan predict --torchtitan torchtitan_config.py` reads the file back (with `ast`, as any
config module) to the plan's prediction.
"""

from __future__ import annotations

import json
from typing import Any

from planner.export.torchtitan import (
    job_config, launch_script, launch_words, torchtitan_incompatibility,
)
from planner.models.config import TransformerConfig
from planner.torchtitan.next_keys import RELEASE, RENAMED
from planner.vocabulary.plan import Plan

CONFIG_FILE = "torchtitan_config.py"
MODULE = CONFIG_FILE.removesuffix(".py")
FUNCTION = "tessel_plan"
LAUNCH_FILE = "torchtitan.sh"
# 0.2's key -> 0.3's, where 0.3 renamed it.
_NEW_NAME = {old: new for new, old in RENAMED.items()}
# What each section's constructor is imported from (torchtitan 0.3.0).
IMPORTS = {
    "CrossEntropyLoss": "torchtitan.components.loss",
    "default_adamw": "torchtitan.components.optimizer",
    "MXFP8LinearConverter": "torchtitan.components.quantization",
    "Float8LinearConverter": "torchtitan.components.quantization",
    "CompileConfig": "torchtitan.config", "ParallelismConfig": "torchtitan.config",
    "TrainingConfig": "torchtitan.config",
    "FullAC": "torchtitan.distributed.activation_checkpoint",
    "SelectiveAC": "torchtitan.distributed.activation_checkpoint",
    "HuggingFaceTextDataLoader": "torchtitan.hf_datasets.text_datasets",
    "decoder_vocab_size": "torchtitan.models.common.config_utils",
    "model_registry": "torchtitan.models.llama3",
    "Trainer": "torchtitan.trainer",
}


def next_incompatibility(plan: Plan, model: TransformerConfig | None) -> str | None:
    """Why TorchTitan 0.3 cannot run `plan` as priced (one line), or None."""
    why = torchtitan_incompatibility(plan, model)
    if why is not None:
        return why
    run = plan.run
    if plan.recompute == "full" and run is not None and run.recompute_every > 1:
        return (f"TorchTitan {RELEASE} checkpoints every block or none, not one in every "
                f"{run.recompute_every}; emit with --torchtitan-version 0.2")
    if plan.precision == "fp8" and (run is None or run.fp8_recipe not in ("mxfp8", "rowwise")):
        return (f"TorchTitan {RELEASE} scales float8 per row (or per MX block), not per "
                "tensor; plan with --fp8-recipe rowwise (mxfp8 on Blackwell), or emit with "
                "--torchtitan-version 0.2")
    return None


def next_settings(plan: Plan, model: TransformerConfig) -> dict[str, Any]:
    """The plan's config in 0.3's dotted keys (see `next_incompatibility` first): each
    section's fields, the checkpointing policy under "activation_checkpoint", the model
    under "model.*"."""
    tables = job_config(plan, model)
    settings: dict[str, Any] = {
        "model.module": "llama3", "model.flavor": tables["model"]["flavor"],
        "hf_assets_path": tables["model"]["hf_assets_path"], "loss": "CrossEntropyLoss",
        "optimizer.name": "AdamW", "optimizer.lr": tables["optimizer"]["lr"],
        "dataloader.dataset": "c4",
    }
    if tables["model"].get("converters"):
        compiled = "model" in tables.get("compile", {}).get("components", [])
        converter = "MXFP8LinearConverter" if plan.run and plan.run.fp8_recipe == "mxfp8" \
            else "Float8LinearConverter"
        fields: dict[str, Any] = {"model_compile_enabled": compiled}
        if converter == "Float8LinearConverter":
            fields["recipe_name"] = "rowwise"
        settings["model.converters"] = [(converter, fields)]
    for section in ("training", "parallelism", "compile"):
        for name, value in tables.get(section, {}).items():
            key = f"{section}.{name}"
            if key == "parallelism.module_fqns_per_model_part":
                value = [["lm_head" if n == "output" else n for n in part] for part in value]
            settings[_NEW_NAME.get(key, key)] = value
    # 0.3 graphs the step by default; the plan is priced eager (and pipelines refuse
    # graphs).
    settings["training.disable_cuda_graphs"] = True
    mode = tables["activation_checkpoint"]["mode"]
    settings["activation_checkpoint"] = "selective" if mode == "selective" else mode
    return settings


def config_text(plan: Plan, settings: dict[str, Any]) -> str:
    """The Python module of `settings`: one function returning the Trainer.Config."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        section, _, name = key.partition(".")
        if name and section in ("training", "parallelism", "compile"):
            sections.setdefault(section, {})[name] = value
    constructors = {"training": "TrainingConfig", "parallelism": "ParallelismConfig",
                    "compile": "CompileConfig"}
    converters = settings.get("model.converters", [])
    model_args = [_literal(settings["model.flavor"], 4)] + (
        [f"converters=[{_call(name + '.Config', fields)}]" for name, fields in converters])
    policy = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()",
              "none": "None"}[settings["activation_checkpoint"]]
    fields = [
        f"hf_assets_path={_literal(settings['hf_assets_path'], 8)}",
        "model_spec=model_spec",
        "loss=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(model_spec))",
        f"optimizer=default_adamw(lr={settings['optimizer.lr']!r})",
        "dataloader=" + _call("HuggingFaceTextDataLoader.Config",
                              {"dataset": settings["dataloader.dataset"]}),
        *(f"{section}={_call(constructors[section], values)}"
          for section, values in sections.items()),
        f"activation_checkpoint={policy}",
    ]
    used = {"Trainer", "model_registry", "CrossEntropyLoss", "decoder_vocab_size",
            "default_adamw", "HuggingFaceTextDataLoader",
            *(constructors[s] for s in sections), *(name for name, _ in converters)}
    if policy != "None":
        used.add(policy.split(".")[0])
    lines = [
        f'"""TorchTitan {RELEASE} config: {plan.model} on {plan.num_gpus} GPUs '
        f'({plan.cluster}), as Tessel planned it.',
        "",
        f"Run with {LAUNCH_FILE} (torchrun ... -m torchtitan.train --module {MODULE} "
        f"--config {FUNCTION}).",
        "hf_assets_path: the tokenizer (and weights) of the model, downloaded with "
        "TorchTitan's scripts/download_hf_assets.py.",
        '"""',
        "",
    ]
    by_module: dict[str, list[str]] = {}
    for name in sorted(used):
        by_module.setdefault(IMPORTS[name], []).append(name)
    lines += [f"from {module} import {', '.join(names)}"
              for module, names in sorted(by_module.items())]
    lines += ["", "", f"def {FUNCTION}() -> Trainer.Config:",
              f"    model_spec = model_registry({', '.join(model_args)})",
              "    return Trainer.Config("]
    lines += [f"        {field}," for field in fields]
    lines += ["    )", ""]
    return "\n".join(lines)


def _call(constructor: str, fields: dict[str, Any], indent: int = 8) -> str:
    """`Constructor(name=value, ...)` on one line where it fits, else one argument a line
    (a list of model parts one part a line), at `indent` spaces."""
    args = [f"{name}={_literal(value, indent + 4)}" for name, value in fields.items()]
    one_line = f"{constructor}({', '.join(args)})"
    if len(one_line) + indent <= 88 and "\n" not in one_line:
        return one_line
    inner = "".join(f"\n{' ' * (indent + 4)}{arg}," for arg in args)
    return f"{constructor}({inner}\n{' ' * indent})"


def _literal(value: Any, indent: int) -> str:
    """A Python literal of `value`, strings in double quotes; a list of lists one item a
    line."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list) and value and isinstance(value[0], list):
        items = "".join(f"\n{' ' * (indent + 4)}{_literal(item, indent + 4)},"
                        for item in value)
        return f"[{items}\n{' ' * indent}]"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item, indent) for item in value) + "]"
    return repr(value)


def torchtitan_next_files(plan: Plan, model: TransformerConfig | None) -> dict[str, str]:
    """{'torchtitan_config.py': ..., 'torchtitan.sh': ...}; ValueError (one line) when
    TorchTitan 0.3 cannot run `plan` as priced."""
    why = next_incompatibility(plan, model)
    if why:
        raise ValueError(f"TorchTitan cannot run this plan: {why}")
    assert model is not None
    words = launch_words(plan)
    words = words[:words.index("--job.config_file")] + ["--module", MODULE,
                                                        "--config", FUNCTION]
    setup = (f"# --module {MODULE}: {CONFIG_FILE}, next to this script.",
             'export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"')
    return {CONFIG_FILE: config_text(plan, next_settings(plan, model)),
            LAUNCH_FILE: launch_script(plan, words, RELEASE, setup)}
