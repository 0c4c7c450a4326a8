"""Every key of TorchTitan 0.2's job config, its default, and what Tessel does with it.

`JOB_CONFIG` lists the keys of TorchTitan 0.2's `JobConfig` (torchtitan/config/job_config.py,
0.2.0-0.2.2) by their dotted names, the names TorchTitan's own command line overrides them
by (`--parallelism.tensor_parallel_degree 8`), each with TorchTitan's default and one of:

- read: `planner.torchtitan.parallel_config` / `job` map it to Tessel's vocabulary;
- ignored: it changes neither time nor memory of a training step (paths, logging,
  checkpoint folders, metrics, the learning rate and the optimizer's hyperparameters);
- what it changes, for a key that changes time or memory in a way Tessel has no term for:
  refused unless at a value that changes nothing (`Key.neutral`, the default first).

`flatten` walks the file's tables against that list: a key or table TorchTitan does not
have is refused by name (with the nearest it has), as TorchTitan's `ConfigManager` refuses
it, and an unpriced key at another value is refused with what it changes.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from planner.torchtitan.errors import JobConfigError

RELEASE = "0.2"
READ = "read"
IGNORED = "ignored"


@dataclass(frozen=True)
class Key:
    """One key of the job config."""

    default: Any
    """TorchTitan 0.2's default (None where its field is optional)."""
    effect: str = READ
    """READ, IGNORED, or (refused keys) what a value off `neutral` changes."""
    neutral: tuple[Any, ...] = ()
    """Refused keys: the values that change nothing Tessel prices, the default first."""


def _read(default: Any) -> Key:
    return Key(default)


def _ignored(default: Any) -> Key:
    return Key(default, IGNORED)


def _unpriced(default: Any, effect: str, *also: Any) -> Key:
    return Key(default, effect, (default, *also))


JOB_CONFIG: dict[str, Key] = {
    # [job]: where outputs go and what the run is called.
    "job.config_file": _ignored(None),
    "job.dump_folder": _ignored("./outputs"),
    "job.description": _ignored("default job"),
    "job.print_config": _ignored(False),
    "job.save_config_file": _ignored(None),
    "job.custom_config_module": _ignored(""),
    # [profiling] and [metrics]: traces and logs, outside the step's kernels.
    "profiling.enable_profiling": _ignored(False),
    "profiling.save_traces_folder": _ignored("profile_traces"),
    "profiling.profile_freq": _ignored(10),
    "profiling.profiler_active": _ignored(1),
    "profiling.profiler_warmup": _ignored(3),
    "profiling.enable_memory_snapshot": _ignored(False),
    "profiling.save_memory_snapshot_folder": _ignored("memory_snapshot"),
    "metrics.log_freq": _ignored(10),
    "metrics.enable_tensorboard": _ignored(False),
    "metrics.disable_color_printing": _ignored(False),
    "metrics.save_tb_folder": _ignored("tb"),
    "metrics.save_for_all_ranks": _ignored(False),
    "metrics.enable_wandb": _ignored(False),
    # [model]: the model is the flavor; converters change its matmuls.
    "model.name": _read("llama3"),
    "model.flavor": _read("debugmodel"),
    "model.hf_assets_path": _ignored("./tests/assets/tokenizer"),
    "model.tokenizer_path": _ignored(None),
    "model.converters": _read([]),
    "model.print_after_conversion": _ignored(False),
    # [optimizer]: its kind sets the state; the hyperparameters change no byte or second.
    "optimizer.name": _read("AdamW"),
    "optimizer.lr": _ignored(8e-4),
    "optimizer.beta1": _ignored(0.9),
    "optimizer.beta2": _ignored(0.95),
    "optimizer.eps": _ignored(1e-8),
    "optimizer.weight_decay": _ignored(0.1),
    "optimizer.implementation": _unpriced(
        "fused", "the optimizer's kernels (Tessel prices the fused Adam step)"),
    "optimizer.early_step_in_backward": _unpriced(
        False, "when gradients are freed (each parameter stepped during backward)"),
    "lr_scheduler.warmup_steps": _ignored(200),
    "lr_scheduler.total_steps": _ignored(None),
    "lr_scheduler.decay_ratio": _ignored(None),
    "lr_scheduler.decay_type": _ignored("linear"),
    "lr_scheduler.min_lr_factor": _ignored(0.0),
    # [training]: the batch and sequence, the precision; data and clipping change nothing.
    "training.dataset": _ignored("c4_test"),
    "training.dataset_path": _ignored(None),
    "training.local_batch_size": _read(8),
    "training.global_batch_size": _read(-1),
    "training.seq_len": _read(2048),
    "training.max_norm": _ignored(1.0),
    "training.steps": _read(10000),
    # FSDP2's CPUOffloadPolicy (apply_fsdp): parameters, gradients and the optimizer step
    # on the host, read as offload_optimizer and offload_params cpu.
    "training.enable_cpu_offload": _read(False),
    "training.dtype": _unpriced(
        "float32", "the bytes of parameters, gradients and optimizer state (all in bf16, "
        "no fp32 copy)"),
    "training.mixed_precision_param": _read("bfloat16"),
    "training.mixed_precision_reduce": _unpriced(
        "float32", "the gradient reduction's dtype"),
    "training.gc_freq": _ignored(50),
    "training.gc_debug": _unpriced(False, "the step's time (a garbage collection each step)"),
    "training.dataloader.num_workers": _ignored(0),
    "training.dataloader.persistent_workers": _ignored(False),
    "training.dataloader.pin_memory": _ignored(False),
    "training.dataloader.prefetch_factor": _ignored(None),
    # [parallelism]: read, except the MoE keys (Llama 3 is dense: no effect, as
    # TorchTitan's docstrings say) and a schedule given as a file.
    "parallelism.data_parallel_replicate_degree": _read(1),
    "parallelism.data_parallel_shard_degree": _read(-1),
    "parallelism.fsdp_reshard_after_forward": _read("default"),
    "parallelism.tensor_parallel_degree": _read(1),
    "parallelism.disable_loss_parallel": _read(False),
    "parallelism.enable_async_tensor_parallel": _read(False),
    "parallelism.pipeline_parallel_degree": _read(1),
    "parallelism.module_fqns_per_model_part": _read(None),
    "parallelism.pipeline_parallel_first_stage_less_layers": _read(1),
    "parallelism.pipeline_parallel_last_stage_less_layers": _read(1),
    "parallelism.pipeline_parallel_layers_per_stage": _read(None),
    "parallelism.pipeline_parallel_schedule": _read("1F1B"),
    "parallelism.pipeline_parallel_schedule_csv": _unpriced(
        "", "the pipeline's order (a schedule read from a file)", None),
    "parallelism.pipeline_parallel_microbatch_size": _read(1),
    "parallelism.pipeline_parallel_expert_parallel_overlap": _ignored(True),
    "parallelism.context_parallel_degree": _read(1),
    "parallelism.context_parallel_load_balancer": _read("headtail"),
    "parallelism.context_parallel_rotate_method": _read("allgather"),
    "parallelism.expert_parallel_degree": _ignored(1),
    "parallelism.expert_tensor_parallel_degree": _ignored(1),
    "parallelism.expert_parallel_comm_backend": _ignored("standard"),
    # [checkpoint]: saves and loads between steps, not a step's time or memory.
    "checkpoint.enable": _ignored(False),
    "checkpoint.enable_ft_dataloader_checkpoints": _ignored(True),
    "checkpoint.folder": _ignored("checkpoint"),
    "checkpoint.interval": _ignored(500),
    "checkpoint.initial_load_path": _ignored(None),
    "checkpoint.initial_load_model_only": _ignored(True),
    "checkpoint.initial_load_in_hf": _ignored(False),
    "checkpoint.initial_load_in_hf_quantized": _ignored(False),
    "checkpoint.last_save_model_only": _ignored(True),
    "checkpoint.last_save_in_hf": _ignored(False),
    "checkpoint.export_dtype": _ignored("float32"),
    "checkpoint.async_mode": _ignored("disabled"),
    "checkpoint.keep_latest_k": _ignored(10),
    "checkpoint.load_step": _ignored(-1),
    "checkpoint.exclude_from_loading": _ignored([]),
    "checkpoint.enable_first_step_checkpoint": _ignored(False),
    "checkpoint.create_seed_checkpoint": _ignored(False),
    "checkpoint.load_only": _ignored(False),
    # [activation_checkpoint]: mode and option read; the rest changes what is replayed.
    "activation_checkpoint.mode": _read("selective"),
    "activation_checkpoint.selective_ac_option": _read("2"),
    # Matmuls of these shapes are recomputed by op-level checkpointing; Llama 3 has no
    # router, so the default (and an empty list) changes nothing.
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": _unpriced(
        ["moe.router.gate"], "which matmul outputs op-level checkpointing saves", []),
    "activation_checkpoint.early_stop": _unpriced(
        False, "how much of the forward is replayed (recomputation stopped early)"),
    "activation_checkpoint.memory_budget": _ignored(0.5),  # mode "memory_budget" is refused
    "activation_checkpoint.visualize_memory_budget_pareto": _ignored(False),
    "activation_checkpoint.preserve_rng_state": _ignored(True),
    "activation_checkpoint.determinism_check": _ignored("default"),
    "activation_checkpoint.debug": _unpriced(False, "the replay's time (debug capture)"),
    # [compile]
    "compile.enable": _read(False),
    "compile.components": _read(["model", "loss"]),
    "compile.backend": _unpriced("inductor", "the compiled kernels (Tessel prices "
                                 "inductor's)"),
    # [quantize]: float8 and MX linears read; grouped GEMMs are MoE-only.
    "quantize.linear.float8.enable_fsdp_float8_all_gather": _read(False),
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": _read(False),
    "quantize.linear.float8.recipe_name": _read(None),
    "quantize.linear.float8.filter_fqns": _read([]),
    "quantize.linear.float8.emulate": _unpriced(False, "the matmuls' time (fp8 emulated)"),
    # One cast of each input either way; which kernel casts is below the model's grain.
    "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice": _ignored("triton"),
    "quantize.linear.mx.recipe_name": _read("mxfp8_cublas"),
    "quantize.linear.mx.filter_fqns": _read(["output"]),
    "quantize.grouped_mm.float8.fqns": _ignored([]),
    "quantize.grouped_mm.mx.recipe_name": _ignored("mxfp8"),
    "quantize.grouped_mm.mx.fqns": _ignored([]),
    # [comm]: timeouts and traces; a fake backend is no run at all.
    "comm.init_timeout_seconds": _ignored(300),
    "comm.train_timeout_seconds": _ignored(100),
    "comm.trace_buf_size": _ignored(20000),
    "comm.save_traces_folder": _ignored("comm_traces"),
    "comm.save_traces_file_prefix": _ignored("rank_"),
    "comm.mode": _unpriced("default", "what runs (a dry run or one simulated process, not "
                           "the training run)"),
    "memory_estimation.enable": _ignored(False),
    "memory_estimation.disable_fake_mode": _ignored(False),
    # [fault_tolerance]: TorchFT's replica groups are HSDP; the rest apply only with it.
    "fault_tolerance.enable": _unpriced(False, "the data-parallel layout (TorchFT's "
                                        "replica groups)"),
    "fault_tolerance.process_group": _ignored("gloo"),
    "fault_tolerance.process_group_timeout_ms": _ignored(10000),
    "fault_tolerance.replica_id": _ignored(0),
    "fault_tolerance.group_size": _ignored(0),
    "fault_tolerance.min_replica_size": _ignored(1),
    "fault_tolerance.semi_sync_method": _ignored(None),
    "experimental.custom_import": _ignored(""),
    "experimental.custom_args_module": _ignored(""),
    # [validation]: forward passes between steps, with less memory than a training step.
    "validation.enable": _ignored(False),
    "validation.dataset": _ignored("c4_validation"),
    "validation.dataset_path": _ignored(None),
    "validation.local_batch_size": _ignored(8),
    "validation.seq_len": _ignored(2048),
    "validation.freq": _ignored(10),
    "validation.steps": _ignored(-1),
    "validation.dataloader.num_workers": _ignored(0),
    "validation.dataloader.persistent_workers": _ignored(False),
    "validation.dataloader.pin_memory": _ignored(False),
    "validation.dataloader.prefetch_factor": _ignored(None),
    "debug.seed": _ignored(None),
    "debug.deterministic": _unpriced(False, "the kernels (deterministic algorithms)"),
    "debug.deterministic_warn_only": _ignored(False),
    "debug.moe_force_load_balance": _ignored(False),
}

# Every table of the job config ("quantize", "quantize.linear", ...).
TABLES = frozenset(
    key.rsplit(".", i)[0] for key in JOB_CONFIG for i in range(1, key.count(".") + 1)
)


@dataclass(frozen=True)
class Flattened:
    """A job config's keys, each with the value TorchTitan runs."""

    values: dict[str, Any]
    """Every key of `JOB_CONFIG`: the file's value, else TorchTitan's default."""
    given: frozenset[str]
    """The keys the file sets."""

    @property
    def ignored(self) -> list[str]:
        """The keys the file sets that Tessel does not read (they change neither time nor
        memory, or are at a value that changes nothing), in `JOB_CONFIG`'s order."""
        return [key for key, spec in JOB_CONFIG.items()
                if key in self.given and spec.effect != READ]


def flatten(tables: dict[str, Any], source: str) -> Flattened:
    """The file's keys, checked against TorchTitan 0.2's job config: JobConfigError (one
    line, naming `source` and the key) for a key or table it does not have, and for a key
    Tessel cannot price at a value that changes the run."""
    given: dict[str, Any] = {}
    _walk(tables, "", given, source)
    for key, value in given.items():
        spec = JOB_CONFIG[key]
        if spec.effect in (READ, IGNORED) or value in spec.neutral:
            continue
        raise JobConfigError(
            f"{source}: {key} = {shown(value)} changes {spec.effect}, which Tessel cannot "
            f"price yet; remove it (TorchTitan's default is {shown(spec.default)})"
        )
    values = {key: given.get(key, spec.default) for key, spec in JOB_CONFIG.items()}
    return Flattened(values, frozenset(given))


def _walk(table: dict[str, Any], prefix: str, given: dict[str, Any], source: str) -> None:
    for name, value in table.items():
        path = prefix + name
        if path in JOB_CONFIG:
            given[path] = value
        elif path in TABLES and isinstance(value, dict):
            _walk(value, path + ".", given, source)
        elif path in TABLES:
            raise JobConfigError(f"{source}: [{path}] is a table of TorchTitan's job "
                                 f"config, not a value; write it as [{path}] with its keys")
        else:
            kind = "table" if isinstance(value, dict) else "key"
            raise JobConfigError(
                f"{source}: {'[' + path + ']' if kind == 'table' else path} is not a {kind} "
                f"of TorchTitan {RELEASE}'s job config{_nearest(path, value)}; fix or "
                "remove it")



def _nearest(path: str, value: Any) -> str:
    """' (did you mean X?)' for the known key or table (`value` a table) nearest to
    `path`, or ''."""
    table = isinstance(value, dict)
    known = sorted(TABLES) if table else list(JOB_CONFIG)
    leaf = path.rsplit(".", 1)[-1]
    # A right name in the wrong table first ([float8] of TorchTitan 0.1: the table holding
    # most of its keys), then spelling.
    same_leaf = sorted((k for k in known if k.rsplit(".", 1)[-1] == leaf),
                       key=lambda k: -sum(f"{k}.{name}" in JOB_CONFIG for name in value)
                       if table else 0)
    close = same_leaf or difflib.get_close_matches(path, known, n=1, cutoff=0.75)
    if not close:
        return ""
    return f" (did you mean {'[' + close[0] + ']' if table else close[0]}?)"


def shown(value: Any) -> str:
    """A value as TOML writes it (unset: TorchTitan's None)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    return repr(value)
