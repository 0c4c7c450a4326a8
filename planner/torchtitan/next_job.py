"""What a TorchTitan 0.3 config runs, in Tessel's vocabulary: `next_job`; and `load_job`,
which reads `--torchtitan` in any of its forms.

`--torchtitan` names a job as TorchTitan runs it:

- a name (`llama3_8b`): a config function of TorchTitan's registries (`--module llama3
  --config llama3_8b`), one of `registry.CONFIGS`;
- `FILE.py:FUNCTION` (or `FILE.py` with one function): a config module of one's own,
  read with `ast` (`config_module`);
- `FILE.toml`: TorchTitan 0.2's job config (`job`);

and the words after `--` are TorchTitan's command-line overrides (`overrides`).

A 0.3 config is read through 0.2's reader: its fields are mapped onto 0.2's keys
(`next_keys`), the rules and defaults are `parallel_config`'s. What 0.3 added is read
here: the checkpointing policy's class, the model_registry(...) call (the model, its
attention kernel, its converters) and its CUDA graphs.
"""

from __future__ import annotations

import difflib
from typing import Any

from planner.torchtitan.config_module import read_config_module
from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.job import (
    TorchTitanJob,
    load_job_config,
    torchtitan_job,
    training_steps,
)
from planner.torchtitan.keys import JOB_CONFIG, READ, flatten, shown
from planner.torchtitan.next_keys import (
    CHECKPOINTING,
    FREE_SECTIONS,
    NEXT_KEYS,
    RELEASE,
    RENAMED,
)
from planner.torchtitan.overrides import parse_overrides
from planner.torchtitan.parallel_config import parallel_config
from planner.torchtitan.registry import CONFIGS, MODELS, model_name

# The attention kernels of 0.3's language models (models/common/config_utils.py:
# get_attention_config), all masked block-causally by document.
ATTENTION = ("flex", "flex_flash", "varlen")


def load_job(spec: str, overrides: list[str], gpus: int | None) -> TorchTitanJob:
    """The job `--torchtitan spec` names, with TorchTitan's command-line `overrides`, on
    `gpus` GPUs (None: the degrees give them). JobConfigError (one line) otherwise."""
    if spec.endswith(".toml"):
        tables = load_job_config(spec)
        for key, value in parse_overrides(overrides, JOB_CONFIG, (), "0.2").items():
            *sections, name = key.split(".")
            holder = tables
            for section in sections:
                holder = holder.setdefault(section, {})
            holder[name] = value
        return torchtitan_job(tables, gpus, spec)
    if spec.endswith(".py") or ".py:" in spec:
        settings, source = read_config_module(spec)
    elif spec in CONFIGS:
        settings, source = dict(CONFIGS[spec].settings), spec
    else:
        near = difflib.get_close_matches(spec, list(CONFIGS), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise JobConfigError(
            f"--torchtitan {spec!r} is not a config Tessel knows{hint}: give one of "
            f"{', '.join(CONFIGS)}, a config module (FILE.py:FUNCTION) or a TorchTitan 0.2 "
            "job config (FILE.toml)")
    keys = {key: spec_ for key, (_, spec_) in NEXT_KEYS.items()}
    settings |= parse_overrides(overrides, keys, FREE_SECTIONS, RELEASE)
    return next_job(settings, gpus, source)


def next_job(settings: dict[str, Any], gpus: int | None, source: str) -> TorchTitanJob:
    """What TorchTitan 0.3 runs for a config's `settings` (0.3 dotted keys, as
    `registry.CONFIGS` holds them) on `gpus` GPUs; JobConfigError naming `source` and the
    field for what TorchTitan refuses or Tessel cannot price."""
    notes: list[str] = []
    module, flavor, model = _model(settings, source, notes)
    tables = _tables(settings, source, notes)
    try:
        keys = flatten(tables, source)
        parallel, layers, chunks = parallel_config(keys, model, gpus, source, notes)
    except JobConfigError as error:
        raise JobConfigError(_renamed(str(error))) from None
    _check_graphs(settings, parallel.dims.pipeline, parallel.dims.tensor, source, notes)
    steps = training_steps(settings.get("training.steps",
                                        JOB_CONFIG["training.steps"].default), source)
    ignored = [key for key in settings if _ignored(key)]
    dims = parallel.dims
    return TorchTitanJob(flavor, model, parallel, layers, chunks,
                         dims.model_parallel * dims.data, steps, notes, ignored,
                         model_name(module, flavor), RELEASE)


def _model(settings: dict[str, Any], source: str, notes: list[str]) -> tuple[str, str, Any]:
    """(module, flavor, Tessel's model at training.seq_len)."""
    from planner.models.presets import zoo_config

    module, flavor = settings.get("model.module"), settings.get("model.flavor")
    if module is None:
        raise JobConfigError(f"{source}: the config sets no model_spec; give "
                             'model_spec=model_registry("8B") of a TorchTitan model')
    if (module, flavor) not in MODELS:
        known = ", ".join(f"{m} {f}" for m, f in MODELS)
        raise JobConfigError(f'{source}: {module} model_registry("{flavor}") is not a model '
                             f"Tessel predicts; use one of {known}")
    attention = settings.get("model.attn_backend", "flex")
    if attention not in ATTENTION:
        raise JobConfigError(f'{source}: attn_backend="{attention}" is not an attention '
                             f"kernel of TorchTitan {RELEASE} (it has {', '.join(ATTENTION)})")
    notes.append(f'attn_backend "{attention}": TorchTitan masks attention block-causally by '
                 "document; Tessel prices causal attention over the whole sequence, as "
                 "flash attention runs it (an upper bound where documents are short)")
    backend = settings.get("model.moe_comm_backend", "standard")
    if backend != "standard":
        raise JobConfigError(f'{source}: moe_comm_backend="{backend}" changes how tokens '
                             "reach their experts, which Tessel cannot price yet; use "
                             '"standard" (all-to-all)')
    for name in ("tp_gemm_backend", "non_blocking_capacity_factor"):
        value = settings.get(f"model.{name}")
        if value not in (None, "default"):
            raise JobConfigError(f"{source}: model_registry {name}={value!r} changes the "
                                 "kernels, which Tessel cannot price yet; remove it")
    seq = settings.get("training.seq_len", JOB_CONFIG["training.seq_len"].default)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise JobConfigError(f"{source}: training.seq_len = {shown(seq)} must be a whole "
                             "number >= 1")
    if "training.seq_len" not in settings:
        notes.append(f"training.seq_len {seq} (TorchTitan's default)")
    preset, shape = MODELS[(module, flavor)]
    mtp = settings.get("model.num_mtp_layers")
    shape = shape | ({"mtp_num_layers": mtp} if mtp is not None else {})
    try:
        return module, flavor, zoo_config(preset, shape | {"seq_length": seq})
    except ValueError as error:
        raise JobConfigError(f"{source}: {error}") from None


def _tables(settings: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """The settings as TorchTitan 0.2's tables, which `flatten` and `parallel_config`
    read; the fields 0.3 added that change nothing checked here."""
    keys: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in NEXT_KEYS:
            continue
        old, spec = NEXT_KEYS[key]
        if spec.effect not in (READ, "ignored") and value not in spec.neutral:
            raise JobConfigError(
                f"{source}: {key} = {shown(value)} changes {spec.effect}, which Tessel "
                f"cannot price yet; remove it (TorchTitan's default is {shown(spec.default)})")
        if old is not None:
            keys[old] = value
    parts = keys.get("parallelism.module_fqns_per_model_part")
    if isinstance(parts, list):  # 0.3 names the output layer lm_head, 0.2 output
        keys["parallelism.module_fqns_per_model_part"] = [
            ["output" if name == "lm_head" else name for name in part]
            if isinstance(part, list) else part for part in parts]
    keys |= _checkpointing(settings, source)
    keys |= _converters(settings.get("model.converters") or [], source)
    if settings.get("loss") == "ChunkedLossWrapper":
        notes.append("loss ChunkedLossWrapper: TorchTitan computes the loss a chunk of "
                     "the sequence at a time; Tessel prices the whole logits (their memory "
                     "an upper bound)")
    tables: dict[str, Any] = {}
    for key, value in keys.items():
        *sections, name = key.split(".")
        holder = tables
        for section in sections:
            holder = holder.setdefault(section, {})
        holder[name] = value
    return tables


def _checkpointing(settings: dict[str, Any], source: str) -> dict[str, Any]:
    """0.2's [activation_checkpoint] mode of 0.3's policy class (default SelectiveAC:
    Trainer.Config's activation_checkpoint)."""
    policy = str(settings.get("activation_checkpoint", "selective")).replace("-", "_")
    if policy not in CHECKPOINTING.values():
        raise JobConfigError(f"{source}: activation_checkpoint:{policy} is not a policy of "
                             f"TorchTitan {RELEASE} (selective, full, memory-budget, none)")
    if policy == "memory_budget":
        raise JobConfigError(f"{source}: MemoryBudgetAC lets the compiler choose what to "
                             "save, which Tessel cannot price; use SelectiveAC, FullAC or "
                             "none")
    if policy == "selective":  # SelectiveAC is 0.2's op-level selective checkpointing
        return {"activation_checkpoint.mode": "selective",
                "activation_checkpoint.selective_ac_option": "op"}
    return {"activation_checkpoint.mode": policy}


def _converters(converters: list[Any], source: str) -> dict[str, Any]:
    """0.2's model.converters and quantize tables of 0.3's converter configs
    (components/quantization: Float8LinearConverter scales per row only, MXFP8's per
    32-element block)."""
    keys: dict[str, Any] = {}
    for converter in converters:
        if not (isinstance(converter, (list, tuple)) and len(converter) == 2):
            raise JobConfigError(f"{source}: converters must be converter configs, e.g. "
                                 "[MXFP8LinearConverter.Config()]")
        name, fields = converter
        if name == "Float8LinearConverter":
            # 0.2's float8 table, at 0.3's only scalings (rowwise, rowwise_with_gw_hp),
            # the output layer named as 0.2 names it.
            keys |= {"model.converters": ["quantize.linear.float8"],
                     "quantize.linear.float8.recipe_name": fields.get("recipe_name",
                                                                      "rowwise"),
                     "quantize.linear.float8.filter_fqns": [
                         "output" if fqn == "lm_head" else fqn
                         for fqn in fields.get("filter_fqns", [])]}
            continue
        if name == "LoRAConverter":
            raise JobConfigError(f"{source}: LoRAConverter gives the fused wqkv one adapter "
                                 "where Tessel prices one per projection, which Tessel "
                                 "cannot price yet; remove it (plan --finetune lora, "
                                 "--emit pytorch, writes LoRA of its own)")
        if name != "MXFP8LinearConverter":
            raise JobConfigError(f"{source}: {name} changes matmuls Tessel cannot price yet "
                                 "(it prices fp8 linears of MXFP8LinearConverter); remove it")
        if fields.get("fqns"):
            raise JobConfigError(f"{source}: MXFP8LinearConverter fqns {shown(fields['fqns'])} "
                                 "converts only some linears; Tessel prices every linear in "
                                 "fp8: leave fqns empty")
        keys |= {"model.converters": ["quantize.linear.mx"],
                 "quantize.linear.mx.recipe_name": "mxfp8_cublas",
                 "quantize.linear.mx.filter_fqns": []}
    return keys


def _check_graphs(settings: dict[str, Any], pipeline: int, tensor: int, source: str,
                  notes: list[str]) -> None:
    """CUDA graphs of the step (Trainer.Config._validate_cuda_graphs: none under pipeline
    parallelism) and sequence parallelism's switch (on with tensor parallelism)."""
    if not settings.get("parallelism.enable_sequence_parallel", True) and tensor > 1:
        raise JobConfigError(f"{source}: parallelism.enable_sequence_parallel = False runs "
                             "tensor parallelism without sequence parallelism, which Tessel "
                             "prices for Megatron-LM only; remove it")
    if settings.get("training.disable_cuda_graphs", False):
        return
    if pipeline > 1:
        raise JobConfigError(f"{source}: CUDA graphs do not support pipeline parallelism "
                             "(TorchTitan raises); add --training.disable_cuda_graphs")
    notes.append("training.disable_cuda_graphs False (TorchTitan's default): TorchTitan "
                 "captures each forward-backward in a CUDA graph; Tessel prices it eager, its "
                 "launch gaps counted and the graph's memory pool not (add "
                 "--training.disable_cuda_graphs to predict exactly)")


def _ignored(key: str) -> bool:
    """Whether a setting is one that changes neither time nor memory."""
    if key in NEXT_KEYS:
        return NEXT_KEYS[key][1].effect != READ
    return key.split(".")[0] in FREE_SECTIONS and key not in ("optimizer.name", "loss")


def _renamed(message: str) -> str:
    """0.2's reader's message in 0.3's names."""
    for new, old in RENAMED.items():
        message = message.replace(old, new)
    return message.replace("TorchTitan 0.2", f"TorchTitan {RELEASE}")
