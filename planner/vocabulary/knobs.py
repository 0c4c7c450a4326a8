"""Every knob of a training plan, once: its Plan field, its flag, and each engine's spelling.

`KNOBS` holds one `Knob` per name of `KNOB_NAMES` (a degree, a batch, a schedule, a
recomputation or kernel setting): where the Plan records it (a dotted path of the Plan's
JSON), its type, the `plan` flag that fixes it, how Megatron-LM's launch line, TorchTitan's
job config (0.2's TOML, and the Python config of its releases since the config refactor
where that spells it otherwise), DeepSpeed's `ds_config.json` and Tessel's runtime
(`runtime.spec.RunSpec`) spell it, whether it changes the step's time or memory, and its
rule (the flag's help). It also holds the Megatron-LM flags Tessel knows but does not price
(`priced=False`, keyed by the flag), each with the values that change nothing.

What is generated from it, so that a knob is spelt here and nowhere else:

- the `plan` command line's knob flags (`planner.cli.parallel_flags`) and the flag every
  message names (`planner.search.knobs.FLAG`);
- the readers' and writers' flag and key tables: Megatron-LM's launch line
  (`planner.megatron.parallel_config` reads, `planner.megatron.run` lists what is read,
  `planner.export.megatron` writes), TorchTitan's job config (`planner.torchtitan`,
  `planner.export.torchtitan`) and DeepSpeed's (`planner.export.deepspeed`);
- the Megatron-LM flags refused as unpriced (`planner.megatron.unpriced.UNPRICED`);
- the knob table of docs/cli.md (`python -m planner.vocabulary.knobs --markdown`).

A spelling is data: the engine's key, and where the engine writes another value than the
knob's, a table of (knob value, engine value) pairs read by two converters
(`engine_value`, `knob_value`). A spelling that needs more than a table (other knobs, the
model, several flags) is marked `engine=True`: the engine's own module holds that rule,
under the knob's name, and the round-trip test (tests/planner/vocabulary/test_knobs.py)
holds every spelling to its reader and writer.

Nothing of Tessel above `planner.vocabulary` is imported here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable

from planner.vocabulary.parallel import (
    ATTENTION_BACKENDS,
    CUDA_GRAPH_SCOPES,
    ENGINES,
    FINETUNES,
    FP8_RECIPES,
    LORA_TARGETS,
    MOE_DISPATCHERS,
    OFFLOAD_COPIES,
    OFFLOAD_TARGETS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    RESHARD_POLICIES,
    STATE_DTYPES,
    ParallelConfig,
)
from planner.vocabulary.schedules import SCHEDULE_TABLE, SCHEDULES

TORCHTITAN_NEXT = "0.3"
"""TorchTitan's releases since its config refactor (pytorch/torchtitan#2386, commit 9810191,
February 2026): a job is a `Trainer.Config` dataclass from a model's `config_registry`,
overridden on the command line by the same dotted names (`--parallelism.tensor_parallel_
degree 8`); quantization moved from `model.converters` names to converter configs in
`model_converters.converters`."""


@dataclass(frozen=True)
class Spelling:
    """How one engine (or Tessel's command line) spells one knob."""

    key: str
    """The flag (`--tensor-model-parallel-size`), the dotted key of a config file
    (`parallelism.tensor_parallel_degree`), or the runtime's attribute (`degrees.tensor`)."""
    table: tuple[tuple[Any, Any], ...] = ()
    """(knob value, engine value) pairs where the engine holds another value than the
    knob's: a knob value's first pair is what is written, every pair is read. Empty: the
    value itself."""
    switch: bool = False
    """A flag without a value: given means true (the table's knob value for true)."""
    engine: bool = False
    """Spelt by rules beyond a value or a table (other knobs, the model, several keys):
    the engine's own reader and writer hold them, under the knob's name."""
    always: bool = False
    """Written even at the knob's default (Megatron-LM's degrees and batches)."""
    reads: tuple[str, ...] = ()
    """The engine's other names its reading consults (older spellings, flags it needs)."""
    dest: str | None = None
    """Megatron-LM's argparse dest, where it is not the flag's words (`name`)."""
    note: str = ""
    """Where the spelling is conditional or implied, in a few words (the docs table)."""

    @property
    def name(self) -> str:
        """Megatron-LM's dest of the flag (`--ddp-bucket-size` -> ddp_bucket_size)."""
        return self.dest or self.key.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Knob:
    """One knob (or one Megatron-LM flag Tessel refuses), spelt everywhere."""

    name: str
    """The knob's name (`KNOB_NAMES`); an unpriced flag's entry is named by the flag."""
    plan_field: str | None
    """Where the Plan's JSON records it: `parallel.X`, `run.X` or a top-level field."""
    type: str
    """int, float, bool, str (one of `choices`) or tuple (of `choices`), as the Plan types it."""
    rule: str
    """What it does and what it needs, in a sentence: the flag's help."""
    cli: Spelling | None = None
    """The `plan` flag that fixes it (most are Megatron-LM's flags, read as Megatron-LM
    reads them)."""
    megatron: Spelling | None = None
    """Megatron-LM's flag (pretrain_gpt.py's arguments)."""
    torchtitan: Spelling | None = None
    """TorchTitan 0.2's job-config key (its TOML and its `--section.key` overrides)."""
    torchtitan_next: Spelling | None = None
    """TorchTitan 0.3+'s (`TORCHTITAN_NEXT`), where it differs from 0.2's."""
    deepspeed: Spelling | None = None
    """DeepSpeed's `ds_config.json` key."""
    tessel: Spelling | None = None
    """Tessel's runtime's attribute of `runtime.spec.RunSpec`."""
    time: bool = True
    """Whether it changes the predicted step time."""
    memory: bool = True
    """Whether it changes the predicted memory."""
    choices: tuple[Any, ...] = ()
    """The values a str or tuple knob takes (an int knob's, where they are few)."""
    optional: bool = False
    """Whether None is a value (the engine's own default applies)."""
    negatable: bool = False
    """A bool flag with a --no- spelling that fixes it off; otherwise given means on."""
    most: int | None = None
    """The largest value of an int knob on the command line; None: the most devices."""
    span: tuple[float, float] | None = None
    """The range of a float knob's values on the command line; None: any positive."""
    engines: tuple[str, ...] = ENGINES
    """The engines that run it at a value other than its default: a knob fixed under
    another engine is refused by `planner.search.knobs.check_knobs`, and one off its
    default refused by TorchTitan's writer. (Every engine, for the knobs whose engine
    rules live in the engines' own modules.)"""
    priced: bool = True
    """False for a Megatron-LM flag that changes time or memory in a way Tessel does not
    price: its reader refuses the flag given at any value but its default and `neutral`."""
    neutral: tuple[Any, ...] = ()
    """Unpriced flags: Megatron-LM values besides its default that change nothing."""
    needs: str = ""
    """What the flag acts on, without which Megatron-LM ignores it (fp8, experts, context
    parallelism): an unpriced flag is then not refused, a knob of the experts not read;
    empty: always."""

    @property
    def default(self) -> Any:
        """The knob's default (`ParallelConfig`'s)."""
        return _DEFAULT.knob(self.name)

    def spelling(self, engine: str) -> Spelling | None:
        """Its spelling in `engine`: cli, megatron, torchtitan, torchtitan_next (0.2's
        key where 0.3+ spells it the same), deepspeed or tessel."""
        if engine == "torchtitan_next":
            return self.torchtitan_next or self.torchtitan
        return getattr(self, engine)


_DEFAULT = ParallelConfig()


def engine_value(spelling: Spelling, value: Any) -> Any:
    """The value the engine holds for the knob's `value` (a switch: whether it is given);
    ValueError where the engine has no spelling of `value`."""
    for knob, engine in spelling.table:
        if knob == value and type(knob) is type(value):
            return engine
    if spelling.table:
        raise ValueError(f"{spelling.key} has no spelling of {value!r}")
    return value


def knob_value(spelling: Spelling, raw: Any) -> Any:
    """The knob's value for the engine's `raw` one (a switch: whether it is given);
    ValueError where `raw` is none of the table's."""
    for knob, engine in spelling.table:
        if engine == raw and type(engine) is type(raw):
            return knob
    if spelling.table:
        raise ValueError(f"{spelling.key} {raw!r} is no value Tessel reads")
    return raw


# -- spellings --------------------------------------------------------------------------

def _flag(key: str, **more: Any) -> Spelling:
    return Spelling(key, **more)


def _switch(key: str, **more: Any) -> Spelling:
    return Spelling(key, switch=True, **more)


def _engine(key: str, note: str = "", **more: Any) -> Spelling:
    return Spelling(key, engine=True, note=note, **more)


_CUDA_GRAPH_IMPL = ((False, "none"), (True, "local"), (True, "transformer_engine"))
# TorchTitan names torch.distributed.pipelining's schedule classes without "Schedule".
_TORCHTITAN_SCHEDULES = tuple((name, SCHEDULE_TABLE[name].torch_class.removeprefix("Schedule"))
                              for name in SCHEDULES)
_TT = "parallelism."


def _knobs(*knobs: Knob) -> dict[str, Knob]:
    return {knob.name: knob for knob in knobs}


KNOBS: dict[str, Knob] = _knobs(
    # The knobs the command line fixes, in its order; then the others.
    Knob("tensor", "parallel.tensor", "int", "Tensor-parallel degree.",
         cli=_flag("--tensor-model-parallel-size"),
         megatron=_flag("--tensor-model-parallel-size", always=True),
         torchtitan=_flag(_TT + "tensor_parallel_degree"),
         tessel=_flag("degrees.tensor")),
    Knob("pipeline", "parallel.pipeline", "int", "Pipeline-parallel degree.",
         cli=_flag("--pipeline-model-parallel-size"),
         megatron=_flag("--pipeline-model-parallel-size", always=True),
         torchtitan=_flag(_TT + "pipeline_parallel_degree"),
         tessel=_flag("degrees.pipeline")),
    Knob("context", "parallel.context", "int",
         "Context-parallel degree (the sequence split over GPUs).",
         cli=_flag("--context-parallel-size"),
         megatron=_flag("--context-parallel-size", always=True),
         torchtitan=_flag(_TT + "context_parallel_degree"),
         tessel=_flag("degrees.context")),
    Knob("expert", "parallel.expert", "int",
         "Expert-parallel degree for mixture-of-experts layers.",
         cli=_flag("--expert-model-parallel-size"),
         megatron=_flag("--expert-model-parallel-size"),
         tessel=_flag("degrees.expert")),
    Knob("micro_batch_size", "micro_batch_size", "int",
         "Sequences per micro-batch on one data-parallel rank.",
         cli=_flag("--micro-batch-size"),
         megatron=_flag("--micro-batch-size", always=True),
         torchtitan=_engine("training.local_batch_size", "under pipelining, "
                            "pipeline_parallel_microbatch_size",
                            reads=(_TT + "pipeline_parallel_microbatch_size",)),
         deepspeed=_flag("train_micro_batch_size_per_gpu"),
         tessel=_flag("micro_batch_size")),
    Knob("zero_stage", "parallel.zero_stage", "int",
         "ZeRO stage 0-3 (1 is Megatron-LM's distributed optimizer)", choices=(0, 1, 2, 3),
         cli=_flag("--zero-stage"),
         megatron=_switch("--use-distributed-optimizer", table=((1, True), (0, False))),
         torchtitan=_engine(_TT + "data_parallel_shard_degree", "FSDP2 (3) over shard "
                            "ranks, or DDP (0) over data_parallel_replicate_degree",
                            reads=(_TT + "data_parallel_replicate_degree",)),
         deepspeed=_flag("zero_optimization.stage"),
         tessel=_flag("zero_stage")),
    Knob("recompute", "recompute", "str",
         "activation recomputation: none, selective (attention core) or full",
         choices=RECOMPUTE, cli=_flag("--recompute-granularity"),
         megatron=_engine("--recompute-granularity", "none: absent",
                          table=(("none", None), ("selective", "selective"),
                                 ("full", "full")),
                          reads=("recompute_activations",)),
         torchtitan=_engine("activation_checkpoint.mode", "selective: op-level",
                            reads=("activation_checkpoint.selective_ac_option",)),
         tessel=_flag("recompute")),
    Knob("sequence_parallel", "parallel.sequence_parallel", "bool",
         "shard norms and dropout over the tensor-parallel group (--no-... fixes it off)",
         negatable=True, cli=_flag("--sequence-parallel"),
         megatron=_switch("--sequence-parallel"),
         torchtitan=_engine(_TT + "tensor_parallel_degree",
                            "implied: on exactly with tensor parallelism"),
         tessel=_flag("sequence_parallel")),
    Knob("virtual_pipeline", "parallel.virtual_pipeline", "int",
         "layers per model chunk: the interleaved 1F1B schedule",
         cli=_engine("--num-layers-per-virtual-pipeline-stage", "layers per chunk"),
         megatron=_engine("--num-layers-per-virtual-pipeline-stage", "layers per chunk, "
                          "or --num-virtual-stages-per-pipeline-rank",
                          reads=("num_virtual_stages_per_pipeline_rank",
                                 "pipeline_model_parallel_layout",
                                 "account_for_embedding_in_pipeline_split",
                                 "account_for_loss_in_pipeline_split", "overlap_p2p_comm")),
         torchtitan=_engine(_TT + "module_fqns_per_model_part", "model parts per rank"),
         tessel=_flag("virtual_pipeline")),
    Knob("schedule", "schedule", "str", "pipeline schedule", choices=SCHEDULES,
         cli=_flag("--schedule"),
         megatron=_engine("--num-layers-per-virtual-pipeline-stage",
                          "implied: interleaved with virtual stages, else 1f1b"),
         torchtitan=_flag(_TT + "pipeline_parallel_schedule", table=_TORCHTITAN_SCHEDULES),
         tessel=_flag("schedule")),
    Knob("overlap_grad_reduce", "run.overlap_grad_reduce", "bool",
         "reduce gradients in buckets during the backward pass (--no-... fixes it off)",
         negatable=True, memory=False, cli=_flag("--overlap-grad-reduce"),
         megatron=_switch("--overlap-grad-reduce"),
         deepspeed=_flag("zero_optimization.overlap_comm", note="ZeRO 1-3")),
    Knob("precision", "precision", "str",
         "matmul precision (default bf16, fp16 on a device without bf16 such as V100; "
         "fp8 needs fp8 tensor cores, e.g. H100)", choices=PRECISIONS,
         cli=_flag("--precision"),
         megatron=_engine("--bf16", "--bf16, --fp16, or --fp8-format hybrid with --bf16; "
                          "none: fp32", reads=("fp16", "fp8")),
         torchtitan=_engine("model.converters", "a float8 or mx converter for fp8; "
                            "training.mixed_precision_param",
                            reads=("training.mixed_precision_param",)),
         torchtitan_next=_engine("model_registry(converters=...)",
                                 "Float8LinearConverter.Config() or MXFP8LinearConverter."
                                 "Config() for fp8; training.mixed_precision_param"),
         deepspeed=_engine("bf16.enabled", "or fp16.enabled", reads=("fp16.enabled",))),
    Knob("overlap_param_gather", "run.overlap_param_gather", "bool",
         "gather the distributed optimizer's weights during the next forward (--no-... "
         "fixes it off)", negatable=True, memory=False,
         cli=_flag("--overlap-param-gather"), megatron=_switch("--overlap-param-gather")),
    Knob("tp_comm_overlap", "run.tp_comm_overlap", "bool",
         "overlap tensor-parallel communication with matmuls (Transformer Engine "
         "userbuffers; needs --sequence-parallel; --no-... fixes it off)",
         negatable=True, memory=False, cli=_flag("--tp-comm-overlap"),
         megatron=_switch("--tp-comm-overlap"),
         torchtitan=_engine(_TT + "enable_async_tensor_parallel",
                            "with tensor parallelism, compiled"),
         torchtitan_next=_engine("compile.enable_async_tensor_parallel",
                                 "with tensor parallelism, compiled")),
    Knob("attention_backend", "run.attention_backend", "str",
         "attention kernels: flash or fused keep no score matrix; local (Megatron-LM's own, "
         "fused softmax) and unfused write the s x s scores; auto (default): flash where "
         "the device runs it", choices=ATTENTION_BACKENDS,
         cli=_flag("--attention-backend"),
         megatron=_engine("--attention-backend", "or --use-flash-attn; auto with "
                          "--transformer-impl local: local",
                          reads=("use_flash_attn", "transformer_impl"))),
    Knob("recompute_method", "run.recompute_method", "str",
         "with --recompute-granularity full: uniform (every group of "
         "--recompute-num-layers layers checkpointed) or block (only that many layers per "
         "stage recomputed)", choices=RECOMPUTE_METHODS,
         cli=_flag("--recompute-method"),
         megatron=_engine("--recompute-method", "with full recomputation")),
    Knob("recompute_num_layers", "run.recompute_num_layers", "int",
         "layers per checkpointed group (uniform) or recomputed layers per stage (block)",
         cli=_flag("--recompute-num-layers"),
         megatron=_engine("--recompute-num-layers", "with full recomputation")),
    Knob("fp8_recipe", "run.fp8_recipe", "str",
         "with --precision fp8: how scales are found (delayed, tensorwise = current "
         "scaling, mxfp8 on Blackwell, blockwise, rowwise = torchao's per-row scaling, "
         "TorchTitan's)", choices=FP8_RECIPES, memory=False,
         cli=_flag("--fp8-recipe"),
         megatron=_engine("--fp8-recipe", "with fp8"),
         torchtitan=_engine("quantize.linear.float8.recipe_name", "tensorwise: float8's "
                            "converter; mxfp8: mx's", reads=("quantize.linear.mx.recipe_name",)),
         torchtitan_next=_engine("model_registry(converters=...)",
                                 "rowwise: Float8LinearConverter.Config(recipe_name); mxfp8: "
                                 "MXFP8LinearConverter.Config(); no per-tensor scaling")),
    Knob("moe_token_dispatcher", "run.moe_token_dispatcher", "str",
         "how tokens reach their experts (default: searched)", choices=MOE_DISPATCHERS,
         cli=_flag("--moe-token-dispatcher-type"),
         megatron=_engine("--moe-token-dispatcher-type", "MoE models; or --moe-enable-deepep",
                          reads=("moe_enable_deepep",)),
         tessel=_flag("expert_dispatcher", table=(("allgather", "allgather"),
                                                  ("alltoall", "alltoall"),
                                                  ("flex", "alltoall")))),
    Knob("moe_router_force_load_balancing", "run.moe_router_force_load_balancing", "bool",
         "route tokens to experts evenly by a fixed rule, whatever the router scores "
         "(all-to-all bytes then known in advance; plan check compares them exactly)",
         memory=False, cli=_flag("--moe-router-force-load-balancing"),
         megatron=_switch("--moe-router-force-load-balancing"),
         tessel=_flag("force_balance")),
    Knob("expert_tensor", "parallel.expert_tensor", "int",
         "tensor-parallel degree inside each expert (default: searched; the tensor "
         "degree, or 1 with experts folded over the stage's ranks)", optional=True,
         cli=_flag("--expert-tensor-parallel-size"),
         megatron=_engine("--expert-tensor-parallel-size", "MoE models, where it is not "
                          "the tensor degree")),
    Knob("overlap_moe_expert_parallel_comm", "run.overlap_moe_expert_parallel_comm", "bool",
         "overlap each micro-batch's expert all-to-alls with another's compute (needs "
         "--expert-model-parallel-size above 1, the alltoall or flex dispatcher and, with "
         "pipeline stages, the interleaved schedule)", memory=False,
         cli=_flag("--overlap-moe-expert-parallel-comm"),
         megatron=_switch("--overlap-moe-expert-parallel-comm")),
    Knob("delay_wgrad_compute", "run.delay_wgrad_compute", "bool",
         "under the expert all-to-all overlap, compute weight gradients apart from input "
         "gradients, so the backward all-to-alls wait for the input gradients only and "
         "run beside the weight gradients", memory=False,
         megatron=_switch("--delay-wgrad-compute")),
    Knob("moe_grouped_gemm", "run.moe_grouped_gemm", "bool",
         "run a rank's experts as one grouped GEMM per projection; off, one expert after "
         "another (a GEMM and an activation kernel each)", memory=False, needs="experts",
         megatron=_switch("--moe-grouped-gemm")),
    Knob("moe_paged_stash", "run.moe_paged_stash", "bool",
         "keep the experts' saved activations in a paged buffer sized to the tokens routed, "
         "not the padded capacity (full-iteration CUDA graphs)", time=False,
         megatron=_switch("--moe-paged-stash")),
    Knob("moe_paged_stash_buffer_factor", "run.moe_paged_stash_buffer_factor", "float",
         "with --moe-paged-stash: the buffer over the expected tokens (negative: over the "
         "padded capacity)", time=False,
         megatron=_flag("--moe-paged-stash-buffer-size-factor-cuda")),
    Knob("fp8_output_proj", "run.fp8_output_proj", "bool",
         "run the output layer's logits projection in MXFP8 too (needs the mxfp8 recipe): "
         "its saved input is fp8", time=False,
         megatron=_switch("--fp8-output-proj")),
    Knob("moe_expert_capacity_factor", "run.moe_expert_capacity_factor", "float",
         "tokens an expert takes, as a multiple of an even share; the rest are dropped "
         "(default: no cap)", optional=True, cli=_flag("--moe-expert-capacity-factor"),
         megatron=_engine("--moe-expert-capacity-factor", "MoE models; negative: no cap")),
    Knob("moe_expert_rank_capacity_factor", "run.moe_expert_rank_capacity_factor", "float",
         "HybridEP's static budget of a rank's routed rows, over an even share: the experts' "
         "input buffers and kept activations are that size (default: sized to the tokens)",
         optional=True, time=False,
         megatron=_flag("--moe-expert-rank-capacity-factor", note="flex dispatcher, hybridep")),
    Knob("cuda_graph_scope", "run.cuda_graph_scope", "tuple",
         "parts of each layer in CUDA graphs (Megatron-LM's; moe_preprocess runs the "
         "dispatcher without its host copy)", choices=CUDA_GRAPH_SCOPES,
         cli=_flag("--cuda-graph-scope"),
         megatron=_engine("--cuda-graph-scope", "with --cuda-graph-impl transformer_engine; "
                          "read from --cuda-graph-modules too, its current spelling",
                          dest="cuda_graph_scope_deprecated", reads=("cuda_graph_modules",))),
    Knob("cuda_graphs", "run.cuda_graphs", "bool",
         "capture each layer in CUDA graphs (local or transformer_engine), so small kernels "
         "are not bound by the host's launches; none (default) leaves them eager",
         choices=("none", "local", "transformer_engine"),
         cli=_flag("--cuda-graph-impl", table=_CUDA_GRAPH_IMPL),
         megatron=_engine("--cuda-graph-impl", "or --enable-cuda-graph / "
                          "--external-cuda-graph", table=_CUDA_GRAPH_IMPL,
                          reads=("enable_cuda_graph", "external_cuda_graph"))),
    Knob("engine", "run.engine", "str",
         "the engine that will run the plan, whose choices its time and memory follow "
         "(default megatron; torchtitan: FSDP2, sequence parallelism with tensor "
         "parallelism, per-tensor fp8, so that --emit torchtitan writes what was priced)",
         choices=ENGINES, cli=_flag("--engine")),
    Knob("ddp_bucket_size", "run.ddp_bucket_size", "int",
         "parameters per gradient bucket of Megatron-LM's overlapped reduction (default: "
         "max(40M, 1M x data-parallel size)); the last bucket's reduction is not hidden",
         optional=True, memory=False, most=1 << 40, engines=("megatron",),
         cli=_flag("--ddp-bucket-size"), megatron=_flag("--ddp-bucket-size"),
         deepspeed=_flag("zero_optimization.reduce_bucket_size", note="ZeRO 1-3")),
    Knob("offload_optimizer", "run.offload_optimizer", "str",
         "where the optimizer's state lives and its step runs: none (the GPU), cpu "
         "(gradients to the host, Adam on its cores, weights back) or nvme (the state read "
         "from and written to NVMe every step)", choices=OFFLOAD_TARGETS,
         cli=_flag("--offload-optimizer"),
         megatron=_engine("--optimizer-cpu-offload", "cpu only; with "
                          "--use-precision-aware-optimizer", switch=True,
                          table=(("cpu", True), ("none", False)),
                          reads=("use_precision_aware_optimizer",)),
         torchtitan=_engine("training.enable_cpu_offload", "cpu, with offload_params cpu: "
                            "FSDP2's CPUOffloadPolicy moves both"),
         deepspeed=_engine("zero_optimization.offload_optimizer.device",
                           "with pin_memory, nvme_path, buffer sizes")),
    Knob("optimizer_offload_fraction", "run.optimizer_offload_fraction", "float",
         "with --offload-optimizer cpu: the share of the optimizer's state and step on the "
         "CPU, the rest on the GPU, within [0, 1]", span=(0.0, 1.0),
         cli=_flag("--optimizer-offload-fraction"),
         megatron=_flag("--optimizer-offload-fraction"),
         deepspeed=_flag("zero_optimization.offload_optimizer.ratio", note="ZeRO-3")),
    Knob("offload_params", "run.offload_params", "str",
         "where ZeRO-3's parameter shards live between uses: none (the GPU), cpu or nvme, "
         "fetched for every forward and backward pass (needs --zero-stage 3)",
         choices=OFFLOAD_TARGETS, cli=_flag("--offload-params"),
         torchtitan=_engine("training.enable_cpu_offload", "cpu, with offload_optimizer "
                            "cpu: FSDP2's CPUOffloadPolicy moves both"),
         deepspeed=_engine("zero_optimization.offload_param.device",
                           "with pin_memory, nvme_path, buffer sizes")),
    Knob("offload_activation_layers", "run.offload_activation_layers", "int",
         "layers whose saved activations are copied to the host in forward and back in "
         "backward, behind the next layer's compute (one pipeline stage, no recomputation; "
         "under --engine torchtitan every layer, as torchtune's enable_activation_offloading "
         "does)",
         most=1 << 20, engines=("megatron", "torchtitan"),
         cli=_flag("--cpu-offloading-num-layers"),
         megatron=_engine("--cpu-offloading-num-layers", "0: none")),
    Knob("offload_checkpoints", "run.offload_checkpoints", "bool",
         "with --recompute-granularity full: every layer's checkpointed input kept in host "
         "memory, copied out in forward and back before its recomputation (DeepSpeed's "
         "cpu_checkpointing)",
         engines=("tessel",), cli=_flag("--offload-checkpoints"),
         deepspeed=_engine("activation_checkpointing.cpu_checkpointing",
                           "the model's blocks under deepspeed.checkpointing")),
    Knob("offload_copies", "run.offload_copies", "str",
         "how offload's copies to the host run: async (pinned, beside the compute) or "
         "blocking, as DeepSpeed before v0.15.4 copies (ZeRO-3's reduced gradients one "
         "bucket at a time, cpu_checkpointing's checkpoints through pageable memory)",
         choices=OFFLOAD_COPIES, engines=("tessel",), memory=False,
         cli=_flag("--offload-copies")),
    Knob("finetune", "run.finetune", "str",
         "none (pre-training), full (every weight fine-tuned), lora (rank-r adapters over "
         "a frozen 16-bit base) or qlora (adapters over a 4-bit NF4 base)",
         choices=FINETUNES, cli=_flag("--finetune"), tessel=_flag("finetuning.finetune")),
    Knob("lora_rank", "run.lora_rank", "int",
         "with --finetune lora or qlora: the adapters' rank (at least 1, at most the "
         "hidden size)", cli=_flag("--lora-rank"), tessel=_flag("finetuning.lora_rank"),
         most=1 << 20),
    Knob("lora_alpha", "run.lora_alpha", "float",
         "with --finetune lora or qlora: the adapters' scale alpha / rank (no effect on "
         "time or memory)", time=False, memory=False, cli=_flag("--lora-alpha"),
         tessel=_flag("finetuning.lora_alpha")),
    Knob("lora_targets", "run.lora_targets", "tuple",
         "with --finetune lora or qlora: the linears of each layer that get adapters "
         "(default all four: attention's qkv and output projections, the MLP's fc1 and "
         "fc2)", choices=LORA_TARGETS, cli=_flag("--lora-targets"),
         tessel=_flag("finetuning.lora_targets")),
    # Knobs without a flag of `plan`'s own.
    Knob("data", "parallel.data", "int",
         "Data-parallel degree; -1: the GPUs the other degrees leave (--gpus sets them).",
         torchtitan=_engine(_TT + "data_parallel_shard_degree", "or "
                            "data_parallel_replicate_degree (DDP)",
                            reads=(_TT + "data_parallel_replicate_degree",)),
         tessel=_flag("degrees.data")),
    Knob("global_batch_size", "global_batch_size", "int",
         "sequences per optimizer step", most=1 << 24,
         cli=_flag("--global-batch-size"),
         megatron=_engine("--global-batch-size", "absent: micro batch x data",
                          always=True),
         torchtitan=_engine("training.global_batch_size", "-1: local batch x data"),
         deepspeed=_flag("train_batch_size"),
         tessel=_flag("global_batch_size")),
    Knob("moe_pad_expert_input_to_capacity", "run.moe_pad_expert_input_to_capacity", "bool",
         "pad each expert's tokens to the capacity: static shapes, the padding computed "
         "and sent as if it were tokens",
         megatron=_engine("--moe-pad-expert-input-to-capacity", "with a capacity factor",
                          switch=True)),
    Knob("recompute_modules", "run.recompute_modules", "tuple",
         "under selective recomputation, the parts of each layer replayed in backward",
         choices=RECOMPUTE_MODULES,
         megatron=_engine("--recompute-modules", "with selective recomputation")),
    Knob("main_grads_dtype", "run.main_grads_dtype", "str",
         "the gradient buffer the optimizer reads", choices=STATE_DTYPES,
         megatron=_engine("--grad-reduce-in-bf16", "or --main-grads-dtype with "
                          "--use-precision-aware-optimizer", switch=True,
                          table=(("bf16", True), ("fp32", False)),
                          reads=("main_grads_dtype", "use_precision_aware_optimizer"))),
    Knob("exp_avg_dtype", "run.exp_avg_dtype", "str", "Adam's two moments",
         choices=STATE_DTYPES,
         megatron=_engine("--exp-avg-dtype", "with --exp-avg-sq-dtype and "
                          "--use-precision-aware-optimizer",
                          reads=("exp_avg_sq_dtype", "use_precision_aware_optimizer"))),
    Knob("fsdp_reshard_after_forward", "run.fsdp_reshard_after_forward", "str",
         "when FSDP2 frees gathered weights: always after each block's forward, never "
         "before backward, or by default except under pipeline parallelism",
         choices=RESHARD_POLICIES,
         torchtitan=_flag(_TT + "fsdp_reshard_after_forward")),
    Knob("recompute_every", "run.recompute_every", "int",
         "under full recomputation, one block in every this many is checkpointed",
         torchtitan=_engine("activation_checkpoint.selective_ac_option", '"k": mode '
                            "selective, layer-level")),
    Knob("compile", "run.compile", "bool",
         "torch.compile of each block: elementwise chains fused, their intermediates "
         "neither written nor kept",
         torchtitan=_engine("compile.enable", '"model" in compile.components',
                            reads=("compile.components",))),
    Knob("compile_loss", "run.compile_loss", "bool",
         "torch.compile of the loss: it keeps the bf16 logits, not an fp32 log-softmax",
         torchtitan=_engine("compile.components", '"loss" among them, compile.enable',
                            reads=("compile.enable",))),
    Knob("optimizer", "run.optimizer", "str",
         "adam; adam8bit (bitsandbytes' AdamW8bit: 8-bit blockwise moments, the 16-bit "
         "weights stepped in place); paged_adam8bit (its PagedAdamW8bit: that state in CUDA "
         "unified memory, paged to the host and back for each step)",
         cli=_flag("--optimizer"), choices=OPTIMIZERS, engines=("torchtitan",)),
    Knob("optimizer_in_backward", "run.optimizer_in_backward", "bool",
         "step each parameter as its gradient is made and free the gradient (torchtune's "
         "optimizer_in_bwd): one micro-batch per step, one pipeline stage",
         cli=_flag("--optimizer-in-backward"), engines=("torchtitan",)),
    Knob("loss_chunks", "run.loss_chunks", "int",
         "the output layer and its loss in this many chunks of tokens, every chunk's graph "
         "kept for the backward (torchtune's LinearCrossEntropyLoss): the loss backward's "
         "buffers are one chunk's",
         cli=_flag("--loss-chunks"), time=False, most=1 << 20, engines=("torchtitan",)),
    Knob("fp8_param_gather", "run.fp8_param_gather", "bool",
         "gather fp8 weights rather than bf16 ones",
         megatron=_engine("--fp8-param-gather", "with fp8", switch=True),
         torchtitan=_engine("quantize.linear.float8.enable_fsdp_float8_all_gather",
                            "FSDP2 over two or more shards, tensorwise"),
         torchtitan_next=_engine("none", "0.3's row-wise float8 gathers 16-bit weights")),
)

# The Megatron-LM flags Tessel knows but does not price: each refused when given at a
# value that changes the run, with what it changes (the rule), rather than silently
# predicting another run. Megatron-LM's default and `neutral` change nothing.


def _unpriced(flag: str, what: str, *neutral: Any, dest: str | None = None,
              needs: str = "") -> Knob:
    return Knob(flag, None, "", what, megatron=Spelling(flag, dest=dest), priced=False,
                neutral=neutral, needs=needs)


UNPRICED_FLAGS: dict[str, Knob] = _knobs(
    # Layouts and shardings the cost model has no term for.
    _unpriced("--tensor-parallel-num-weight-shards", "tensor-parallel weight sharding (GTP)", 1),
    _unpriced("--expert-tensor-parallel-num-weight-shards", "expert weight sharding (GTP)", 1),
    _unpriced("--hierarchical-context-parallel-sizes", "hierarchical context parallelism"),
    _unpriced("--hybrid-context-parallel", "hybrid context parallelism"),
    _unpriced("--cp-comm-type", "context-parallel exchange other than the p2p ring", ["p2p"],
              needs="context parallelism"),
    _unpriced("--microbatch-group-size-per-virtual-pipeline-stage",
              "micro-batch groups other than the pipeline size",
              dest="microbatch_group_size_per_vp_stage"),
    _unpriced("--num-distributed-optimizer-instances", "several distributed-optimizer instances"),
    _unpriced("--use-megatron-fsdp", "Megatron FSDP (parameters and gradients sharded)"),
    _unpriced("--use-torch-fsdp2", "torch FSDP2 (parameters and gradients sharded)"),
    _unpriced("--overlap-param-gather-with-optimizer-step",
              "the parameter all-gather overlapped with the optimizer step"),
    _unpriced("--mlp-chunks-for-training", "the MLP computed in chunks", 1),
    # Precision and optimizer state other than mixed-precision Adam with fp32 main grads.
    _unpriced("--fp4-format", "fp4 matmuls", dest="fp4"),
    _unpriced("--fp4-param-gather", "fp4 parameter all-gathers"),
    _unpriced("--first-last-layers-bf16", "bf16 first and last layers in an fp8 run",
              needs="fp8"),
    _unpriced("--no-fp8-wgrad", "weight gradients outside fp8", dest="fp8_wgrad", needs="fp8"),
    _unpriced("--main-grads-dtype", "main gradients other than fp32 or bf16", "bf16"),
    _unpriced("--main-params-dtype", "main parameters other than fp32"),
    _unpriced("--exp-avg-dtype", "Adam moments other than fp32 or bf16", "bf16"),
    _unpriced("--exp-avg-sq-dtype", "Adam moments other than fp32 or bf16", "bf16"),
    _unpriced("--optimizer", "an optimizer other than Adam (its state differs)"),
    # Activations kept elsewhere, or recomputed beyond Tessel's three modes.
    _unpriced("--fine-grained-activation-offloading", "activations offloaded to the CPU"),
    _unpriced("--offload-modules", "activations offloaded to the CPU"),
    _unpriced("--distribute-saved-activations",
              "recomputed activations split over tensor ranks"),
    _unpriced("--moe-layer-recompute", "recomputation of MoE layers", needs="experts"),
    # Architectures the zoo's decoder does not describe.
    _unpriced("--experimental-attention-variant", "an experimental attention variant"),
    _unpriced("--attention-output-gate", "a gated attention output"),
    _unpriced("--linear-attention-freq", "linear-attention layers"),
    _unpriced("--no-rope-freq", "layers without rotary embeddings"),
    _unpriced("--hybrid-layer-pattern", "a hybrid (Mamba) model"),
    _unpriced("--hybrid-override-pattern", "a hybrid (Mamba) model"),
    _unpriced("--is-hybrid-model", "a hybrid (Mamba) model"),
    _unpriced("--heterogeneous-layers-config-path", "layers that differ in shape"),
    _unpriced("--heterogeneous-layers-config-encoded-json", "layers that differ in shape"),
    _unpriced("--spec", "a custom layer spec"),
    _unpriced("--yaml-cfg", "a YAML config that replaces the flags"),
    _unpriced("--enable-mhc-connections", "multi-stream residual connections"),
    _unpriced("--fp32-residual-connection", "fp32 residual activations"),
    _unpriced("--moe-latent-size", "MoE latent projections", needs="experts"),
    _unpriced("--encoder-num-layers",
              "an encoder; give --num-layers for a decoder-only model"),
    _unpriced("--decoder-num-layers", "an encoder-decoder split; give --num-layers"),
    _unpriced("--encoder-seq-length", "an encoder's sequence; give --seq-length"),
    _unpriced("--decoder-seq-length", "a decoder sequence of its own; give --seq-length"),
    _unpriced("--vision-pretraining", "a vision model"),
    _unpriced("--perform-rl-step", "reinforcement-learning steps (generation included)"),
)

REGISTRY: dict[str, Knob] = {**KNOBS, **UNPRICED_FLAGS}
"""Every entry: the knobs (`KNOBS`, by knob name) and the unpriced Megatron-LM flags
(`UNPRICED_FLAGS`, by flag)."""

def plan_value(plan: Any, name: str) -> Any:
    """Knob `name` as a Plan (`planner.vocabulary.plan.Plan`) records it, at its
    `plan_field`; the knob's default where the plan has no such section (no `run`)."""
    knob = KNOBS[name]
    *sections, field = (knob.plan_field or "").split(".")
    holder = plan
    for section in sections:
        holder = getattr(holder, section)
        if holder is None:
            return knob.default
    return getattr(holder, field)


def unmapped_knob(plan: Any, spelt_otherwise: Iterable[str]) -> str | None:
    """The first priced knob `plan` sets away from its default that an engine has no key
    for (it spells the knobs in `spelt_otherwise` its own way or leaves them to its
    compiler), as 'FLAG (plan.field = value)'; None when there is none."""
    skipped = set(spelt_otherwise)
    for name, knob in KNOBS.items():
        if not knob.priced or name in skipped:
            continue
        value = plan_value(plan, name)
        if value != knob.default:
            flag = knob.cli.key if knob.cli else (knob.megatron.key if knob.megatron else name)
            return f"{flag} ({knob.plan_field} = {value!r})"
    return None


def spelt(engine: str) -> dict[str, Spelling]:
    """Knob name -> its spelling in `engine` (cli, megatron, torchtitan, torchtitan_next,
    deepspeed, tessel), for the knobs `engine` spells."""
    return {name: s for name, knob in KNOBS.items()
            if (s := knob.spelling(engine)) is not None}


# -- the docs table ---------------------------------------------------------------------

_COLUMNS = (("cli", "`plan` flag"), ("megatron", "Megatron-LM"),
            ("torchtitan", "TorchTitan 0.2"), ("torchtitan_next", f"TorchTitan {TORCHTITAN_NEXT}"),
            ("deepspeed", "DeepSpeed"), ("tessel", "Tessel runtime"))


def _cell(knob: Knob, engine: str) -> str:
    spelling = getattr(knob, engine)
    if spelling is None:
        return "as 0.2" if engine == "torchtitan_next" and knob.torchtitan else ""
    text = f"`{spelling.key}`"
    if spelling.table and not spelling.engine:
        pairs = ", ".join(f"{k}: {e}" for k, e in spelling.table)
        text += f" ({pairs})"
    if spelling.note:
        text += f" ({spelling.note})"
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/cli.md's knob table: every knob's Plan field, flag and engine spellings, what
    it changes; then the Megatron-LM flags refused as unpriced."""
    head = ("| knob | Plan field | " + " | ".join(title for _, title in _COLUMNS)
            + " | changes |")
    rows = [head, "|" + "---|" * (len(_COLUMNS) + 3)]
    for knob in KNOBS.values():
        changes = " and ".join(what for what, yes in (("time", knob.time),
                                                       ("memory", knob.memory)) if yes)
        rows.append(f"| `{knob.name}` | `{knob.plan_field}` | "
                    + " | ".join(_cell(knob, engine) for engine, _ in _COLUMNS)
                    + f" | {changes} |")
    rows += ["", "| Megatron-LM flag, refused | what it changes | also accepted |",
             "|---|---|---|"]
    for knob in UNPRICED_FLAGS.values():
        neutral = ", ".join(f"`{value}`" for value in knob.neutral)
        needs = f" (with {knob.needs} only)" if knob.needs else ""
        rows.append(f"| `{knob.name}` | {knob.rule}{needs} | {neutral} |")
    return "\n".join(rows) + "\n"


DOCS_BEGIN = "<!-- knob table: python -m planner.vocabulary.knobs --markdown -->"
DOCS_END = "<!-- end of knob table -->"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m planner.vocabulary.knobs --markdown")
    sys.stdout.write(markdown())
