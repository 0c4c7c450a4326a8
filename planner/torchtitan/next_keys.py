"""TorchTitan 0.3's config fields by their dotted names, derived from 0.2's key table.

TorchTitan 0.3 (PyPI 0.3.0, after its config refactor, pytorch/torchtitan#2386) builds a
job as a `Trainer.Config` dataclass tree (torchtitan/trainer.py: `Trainer.Config`;
torchtitan/config/configs.py: `TrainingConfig`, `ParallelismConfig`, `CompileConfig`,
`CommConfig`, `DebugConfig`; torchtitan/distributed/activation_checkpoint.py: the
checkpointing policies), overridden on its command line by the same dotted names 0.2 used
(`--parallelism.tensor_parallel_degree 8`). Most fields kept their 0.2 section and name, so
`NEXT_KEYS` is 0.2's `JOB_CONFIG` with the differences written out:

- `RENAMED`: a field 0.3 holds under another name (its Key, read or refused, is 0.2's);
- `DROPPED`: a 0.2 key 0.3 no longer has, with where the setting went (refused by name);
- `ADDED`: a field new in 0.3, with its default and what Tessel does with it.

Sections that change neither time nor memory (`FREE_SECTIONS`: checkpoint, metrics,
profiler, dataloader, ...) take any field and are listed as ignored; TorchTitan itself
refuses a misspelt one. `model.*` is Tessel's own record of the config function's
`model_registry(...)` call: 0.3 keeps the model off its command line (`model_spec` is
`tyro.conf.Suppress`ed).
"""

from __future__ import annotations

from typing import Any

from planner.torchtitan.keys import IGNORED, JOB_CONFIG, READ, Key
from planner.vocabulary.knobs import KNOBS, spelt

RELEASE = "0.3"
SOURCE = "torchtitan 0.3.0 (PyPI)"
"""Where every field name here was checked: the released wheel's source."""

# Sections (or top-level fields) of Trainer.Config whose fields change neither time nor
# memory of a step: paths, logging, data, checkpoints, the learning rate.
FREE_SECTIONS = ("hf_assets_path", "dump_folder", "profiler", "metrics", "tokenizer",
                 "dataloader", "lr_scheduler", "checkpoint", "validator", "optimizer", "loss")
# Sections whose fields are checked by name, as TorchTitan's tyro parser checks them.
CHECKED_SECTIONS = ("training", "parallelism", "compile", "comm", "debug",
                    "activation_checkpoint")

RENAMED = {  # 0.3 key -> the 0.2 key of the same setting: the knobs' (the registry's
    # TorchTitan 0.3 spellings that are another field), and the others'
    **{next_key: KNOBS[name].torchtitan.key for name, spelling in spelt("torchtitan_next").items()
       if (next_key := spelling.key) != getattr(KNOBS[name].torchtitan, "key", next_key)
       and next_key.split(".")[0] in CHECKED_SECTIONS},
    "activation_checkpoint.force_recompute_mm_shapes_by_fqns":
        "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
}

DROPPED = {  # 0.2 key of a checked section -> where 0.3 holds the setting
    "parallelism.enable_async_tensor_parallel": "compile.enable_async_tensor_parallel",
    "parallelism.disable_loss_parallel": "nowhere: 0.3 always runs loss parallelism with "
                                         "tensor parallelism",
    "parallelism.pipeline_parallel_expert_parallel_overlap": "nowhere",
    "parallelism.context_parallel_rotate_method": "nowhere: 0.3 all-gathers keys and values",
    "parallelism.expert_tensor_parallel_degree": "nowhere: 0.3 runs experts without tensor "
                                                 "parallelism",
    "parallelism.expert_parallel_comm_backend": "model_registry(..., moe_comm_backend=...)",
    "activation_checkpoint.mode": "the policy's class: activation_checkpoint=SelectiveAC."
                                  "Config(), FullAC.Config() or None",
    "activation_checkpoint.selective_ac_option": "nowhere: SelectiveAC is op-level only",
    "activation_checkpoint.early_stop": "nowhere",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns":
        "activation_checkpoint.force_recompute_mm_shapes_by_fqns",
    "training.dataset": "dataloader.dataset",
    "training.dataset_path": "dataloader.dataset_path",
}


def _unpriced(default: Any, effect: str) -> Key:
    return Key(default, effect, (default,))


ADDED: dict[str, Key] = {
    # Read by planner.torchtitan.next_job: CUDA graphs of the forward-backward step
    # (Trainer.__init__: wrap_with_cuda_graph) and sequence parallelism's switch.
    "training.disable_cuda_graphs": Key(False),
    "parallelism.enable_sequence_parallel": Key(True),
    "parallelism.enable_fsdp_symm_mem": _unpriced(
        False, "FSDP2's collectives (symmetric-memory kernels)"),
    # DTensor or spmd_types carry the same collectives; the mask key picks a mask only.
    "parallelism.spmd_backend": Key("spmd_types", IGNORED),
    "parallelism.context_parallel_ptrr_mask_key": Key(None, IGNORED),
    "debug.spmd_typechecking": Key(False, IGNORED),
    "debug.detect_anomaly": _unpriced(False, "the step's time (autograd anomaly detection)"),
    "debug.batch_invariant": _unpriced(False, "the kernels (batch-invariant ops)"),
    "debug.print_config": Key(False, IGNORED),
    "debug.save_config_file": Key(None, IGNORED),
    "debug.enable_structured_logging": Key(True, IGNORED),
}

# Every 0.3 key of the checked sections -> (the 0.2 key it is read as, or None where
# `next_job` reads it itself; its Key).
NEXT_KEYS: dict[str, tuple[str | None, Key]] = {
    **{key: (key, spec) for key, spec in JOB_CONFIG.items()
       if key.split(".")[0] in CHECKED_SECTIONS and key not in DROPPED},
    **{new: (old, JOB_CONFIG[old]) for new, old in RENAMED.items()},
    **{key: (None, spec) for key, spec in ADDED.items()},
}
# Read for a mixture of experts, which 0.3 runs (0.2's Llama 3 had none: ignored there).
for _key in ("debug.moe_force_load_balance", "parallelism.expert_parallel_degree"):
    NEXT_KEYS[_key] = (_key, Key(JOB_CONFIG[_key].default))

# The activation checkpointing policies (activation_checkpoint.py: ActivationCheckpointing-
# Config): the class named in a config and its subcommand on the command line.
CHECKPOINTING = {"SelectiveAC": "selective", "FullAC": "full",
                 "MemoryBudgetAC": "memory_budget", None: "none"}


def is_read(key: str) -> bool:
    """Whether Tessel reads the 0.3 key (else it is ignored or at a neutral value)."""
    return key in NEXT_KEYS and NEXT_KEYS[key][1].effect == READ
