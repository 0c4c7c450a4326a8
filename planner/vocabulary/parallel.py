"""Every parallel knob of one training configuration, in Megatron-LM's vocabulary.

`ParallelConfig` is typed sections, as torchtitan's job config is: the degrees in one
`ParallelDims` (`-1` means "the rest of the GPUs", and one validation names every degree
when they do not multiply out, so a user sees the whole picture in one message), then the
batch, the pipeline schedule, recomputation, numerics, sharding, overlap, execution (the
engine and its kernels) and MoE dispatch. A knob keeps one name everywhere (`KNOB_NAMES`:
the field's name in its section, `FixedKnobs`' key, `planner.vocabulary.knobs`' entry),
and `ParallelConfig.of` / `.but` / `.knob` set and read knobs by that name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, get_args

from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.schedules import SCHEDULES, Schedule

# Each enumerated knob as a type (the Plan's fields refuse any other value on load) and
# as the tuple of its values (CLI choices, validation messages).
Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8", "fp32"]
AttentionBackend = Literal["auto", "flash", "fused", "unfused", "local"]
RecomputeMethod = Literal["uniform", "block"]
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise", "rowwise"]
MoeDispatcher = Literal["allgather", "alltoall", "flex"]
Engine = Literal["megatron", "torchtitan", "tessel"]
ReshardPolicy = Literal["default", "always", "never"]
RecomputeModule = Literal["core_attn", "mlp", "layernorm", "moe_act", "mla_up_proj", "moe",
                          "shared_experts"]
StateDtype = Literal["fp32", "bf16"]
Optimizer = Literal["adam", "adam8bit", "paged_adam8bit"]
CudaGraphScope = Literal["full", "attn", "mlp", "moe", "moe_router", "moe_preprocess",
                         "full_iteration"]
OffloadTarget = Literal["none", "cpu", "nvme"]
OffloadCopies = Literal["async", "blocking"]
Finetune = Literal["none", "full", "lora", "qlora"]
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]

_Frozen = TypeVar("_Frozen")
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
PRECISIONS: tuple[str, ...] = get_args(Precision)
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
RECOMPUTE_METHODS: tuple[str, ...] = get_args(RecomputeMethod)
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)
ENGINES: tuple[str, ...] = get_args(Engine)
RESHARD_POLICIES: tuple[str, ...] = get_args(ReshardPolicy)
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
STATE_DTYPES: tuple[str, ...] = get_args(StateDtype)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
CUDA_GRAPH_SCOPES: tuple[str, ...] = get_args(CudaGraphScope)
OFFLOAD_TARGETS: tuple[str, ...] = get_args(OffloadTarget)
OFFLOAD_COPIES: tuple[str, ...] = get_args(OffloadCopies)
FINETUNES: tuple[str, ...] = get_args(Finetune)
LORA_TARGETS: tuple[str, ...] = get_args(LoraTarget)
ADAPTER_FINETUNES: tuple[str, ...] = ("lora", "qlora")
"""The fine-tuning modes that train adapters over a frozen base."""
QLORA_PRECISIONS: tuple[str, ...] = ("bf16", "fp16")
"""The matmul precisions QLoRA's 4-bit base dequantizes to (bitsandbytes' and torchao's
NF4 take a 16-bit compute dtype)."""


@dataclass(frozen=True)
class Batch:
    """Sequences per step, as torchtitan's [training] section counts them."""

    micro_batch_size: int = 1
    """Sequences per micro-batch on one data-parallel rank (--micro-batch-size)."""
    global_batch_size: int = 1
    """Sequences per optimizer step over all data-parallel ranks (--global-batch-size)."""


@dataclass(frozen=True)
class Pipelining:
    """How the pipeline stages take turns (`planner.vocabulary.schedules`)."""

    schedule: Schedule = "1f1b"
    """Pipeline schedule: gpipe, 1f1b, interleaved (interleaved 1F1B with virtual
    stages) or dualpipev (DeepSeek's DualPipeV, torch's ScheduleDualPipeV: two chunks per
    rank in V order, the first going down the ranks and the second coming back, each
    steady-state step a forward of one chunk with a backward of the other; TorchTitan and
    Tessel run it, Megatron-LM does not)."""
    virtual_pipeline: int = 1
    """Model chunks per pipeline rank: for the interleaved schedule (Megatron-LM's
    --num-layers-per-virtual-pipeline-stage is num_layers / (pipeline x this)), and 2 for
    dualpipev."""


@dataclass(frozen=True)
class Recomputation:
    """Which activations are replayed in backward instead of kept."""

    recompute: Recompute = "none"
    """Activation recomputation: none, selective (attention core) or full
    (--recompute-granularity)."""
    recompute_method: RecomputeMethod = "uniform"
    """With full recomputation (--recompute-method): uniform checkpoints the input of every
    group of recompute_num_layers layers and replays them all; block replays only the first
    recompute_num_layers layers of each stage and keeps the others' activations."""
    recompute_num_layers: int = 1
    """Layers per checkpointed group (uniform) or recomputed layers per stage (block)
    (--recompute-num-layers)."""
    recompute_modules: tuple[RecomputeModule, ...] = ("core_attn",)
    """Under selective recomputation, the parts of each layer replayed in backward
    (Megatron-LM's --recompute-modules: core_attn, mlp, layernorm, moe_act (the experts'
    activation function), mla_up_proj (MLA's up projections and rotary), moe (the whole
    MoE MLP), shared_experts)."""
    recompute_every: int = 1
    """Under full recomputation, one block in every this many is checkpointed
    (TorchTitan's layer-level selective_ac_option = "k"); 1: every block."""


@dataclass(frozen=True)
class Numerics:
    """The precision of the matmuls, of the gathered weights and of the optimizer state."""

    precision: Precision = "bf16"
    """Matmul precision: bf16 (--bf16), fp16 (--fp16), fp8 (Transformer Engine's
    --fp8-format hybrid, with bf16 elsewhere; on devices with fp8 tensor cores) or fp32
    (Megatron-LM's default without either flag; what CPUs run)."""
    fp8_recipe: Fp8Recipe = "delayed"
    """How fp8 scales are found (--fp8-recipe): delayed (from an amax history), tensorwise
    (current scaling: one extra pass over each tensor), mxfp8 or blockwise (a scale per
    block, computed in the cast; mxfp8 needs Blackwell tensor cores), rowwise (torchao's
    per-row scaling, TorchTitan 0.3's float8)."""
    fp8_param_gather: bool = False
    """Gather fp8 weights rather than bf16 ones (Megatron-LM's --fp8-param-gather,
    TorchTitan's enable_fsdp_float8_all_gather)."""
    main_grads_dtype: StateDtype = "fp32"
    """Gradient buffer the optimizer reads (Megatron-LM's --main-grads-dtype; bf16 with
    --grad-reduce-in-bf16 or the precision-aware optimizer)."""
    exp_avg_dtype: StateDtype = "fp32"
    """Adam's two moments (Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype; bf16 with
    --use-precision-aware-optimizer)."""
    optimizer: Optimizer = "adam"
    """adam (Adam/AdamW, moments as exp_avg_dtype says), adam8bit (bitsandbytes' AdamW8bit:
    both moments quantized blockwise to 8 bits, the 16-bit weights stepped in place, no
    fp32 copy) or paged_adam8bit (bitsandbytes' PagedAdamW8bit: that state in CUDA unified
    memory, outside torch's allocator, paged to the host when the GPU is full and back
    for each step)."""
    fp8_output_proj: bool = False
    """Run the output layer (the LM head's logits projection) in fp8 too
    (--fp8-output-proj: Transformer Engine's linear under the MXFP8 recipe; otherwise
    Megatron-Core's output layer is a plain bf16 linear outside fp8). Needs fp8 with the
    mxfp8 recipe."""


@dataclass(frozen=True)
class Sharding:
    """What is split beyond the degrees: model state (ZeRO / FSDP) and the sequence."""

    zero_stage: int = 0
    """ZeRO stage 0-3; 1 is Megatron-LM's distributed optimizer
    (--use-distributed-optimizer)."""
    sequence_parallel: bool = False
    """Shard norms and dropout over the tensor-parallel group (--sequence-parallel)."""
    fsdp_reshard_after_forward: ReshardPolicy = "default"
    """TorchTitan's FSDP2 policy (parallelism.fsdp_reshard_after_forward): always frees
    gathered weights after each block's forward, never keeps them to backward, default
    reshards except under pipeline parallelism."""


@dataclass(frozen=True)
class Overlap:
    """Which collectives run under compute."""

    overlap_grad_reduce: bool = False
    """Reduce gradients in buckets during the backward pass (--overlap-grad-reduce);
    off, the reduction runs after the last micro-batch's backward."""
    overlap_param_gather: bool = False
    """All-gather the distributed optimizer's updated weights during the next forward
    pass (--overlap-param-gather); off, the gather runs after the optimizer step. Needs
    ZeRO stage 1 or more and --overlap-grad-reduce."""
    tp_comm_overlap: bool = False
    """Overlap tensor-parallel all-gathers and reduce-scatters with the matmuls they feed
    (--tp-comm-overlap: Transformer Engine's userbuffers). Needs sequence parallelism."""
    ddp_bucket_size: int | None = None
    """Parameters per gradient bucket of Megatron-LM's overlapped reduction
    (--ddp-bucket-size); None: its default, max(40M, 1M x data). Every engine's spelling:
    `planner.vocabulary.knobs`."""


@dataclass(frozen=True)
class Execution:
    """The engine that runs the plan and how it launches kernels."""

    engine: Engine = "megatron"
    """The engine that runs the plan, whose choices its memory follows: megatron
    (Megatron-LM / Megatron-Core with Transformer Engine), torchtitan (FSDP2, DTensor
    tensor parallelism, torch.distributed.pipelining) or tessel (Tessel's own runtime)."""
    attention_backend: AttentionBackend = "auto"
    """Attention kernels (--attention-backend): flash (FlashAttention) or fused (cuDNN's
    fused attention) keep no score matrix; local (Megatron-LM's own: batched matmuls and
    its fused scale-mask-softmax kernel) and unfused (Transformer Engine's: scale, mask and
    softmax as separate kernels) write the s x s scores; auto: flash where the device runs
    it, else local."""
    cuda_graphs: bool = False
    """Capture each layer's kernels in CUDA graphs (--cuda-graph-impl local): the host
    launches a graph, not each kernel, so small kernels are no longer bound by it."""
    cuda_graph_scope: tuple[CudaGraphScope, ...] = ()
    """Parts of each layer captured in CUDA graphs when not the whole layer
    (Megatron-LM's --cuda-graph-scope: attn, moe_router, moe_preprocess, ...);
    moe_preprocess runs the dispatcher without its device-to-host copy."""
    compile: bool = False
    """torch.compile of each block (TorchTitan's [compile] enable): elementwise chains are
    fused, so their intermediates are neither written nor kept."""
    compile_loss: bool = False
    """torch.compile of the loss (TorchTitan's "loss" in compile.components): the fp32
    cast, log-softmax and gather are fused, so the loss keeps the bf16 logits rather than
    an fp32 log-softmax of them."""
    optimizer_in_backward: bool = False
    """Step each parameter as soon as its gradient is made, and free the gradient
    (torchtune's optimizer_in_bwd, TorchTitan's optimizer step in backward; torch's
    register_post_accumulate_grad_hook): one gradient alive at a time. Needs one
    micro-batch per step and one pipeline stage."""
    loss_chunks: int = 1
    """The output layer and its loss made and scored in this many chunks of tokens
    (torchtune's LinearCrossEntropyLoss, num_output_chunks 8), every chunk's graph kept
    for the backward: what the loss keeps is unchanged, the gradient buffers of its
    backward are one chunk's."""


@dataclass(frozen=True)
class Moe:
    """How tokens reach their experts (mixture-of-experts models only)."""

    moe_token_dispatcher: MoeDispatcher = "allgather"
    """How tokens reach their experts (--moe-token-dispatcher-type): allgather (every rank
    gathers all tokens of its expert group), alltoall (each token sent to its experts'
    ranks) or flex (all-to-all through DeepEP's fused kernels)."""
    moe_router_force_load_balancing: bool = False
    """Route tokens evenly over the experts whatever the router says
    (--moe-router-force-load-balancing): every expert gets the same tokens, so dispatch
    bytes are known in advance. Benchmarks and plan checks use it."""
    moe_expert_capacity_factor: float | None = None
    """Tokens an expert takes, as a multiple of an even share (--moe-expert-capacity-factor);
    the rest are dropped. None: no cap (dropless)."""
    moe_pad_expert_input_to_capacity: bool = False
    """Pad each expert's (or rank's) tokens to the capacity (--moe-pad-expert-input-to-
    capacity; Megatron-Bridge's full-iteration CUDA graphs pad to a rank capacity of 1.5):
    static shapes, and the padding computed and sent as if it were tokens."""
    overlap_moe_expert_parallel_comm: bool = False
    """Overlap one micro-batch's dispatch and combine all-to-alls with another's compute
    (--overlap-moe-expert-parallel-comm, Megatron-Core's 1F1B A2A overlap)."""
    moe_expert_rank_capacity_factor: float | None = None
    """HybridEP's static budget of routed rows per rank, over an even share
    (--moe-expert-rank-capacity-factor; megatron/core/transformer/moe/token_dispatcher.py:
    num_permuted_tokens = tokens x top-k x factor): the experts' input buffers, and the
    activations they keep, are that many rows; the grouped GEMMs run the rows routed."""
    moe_paged_stash: bool = False
    """Keep the routed experts' saved activations in a paged buffer sized to the tokens
    actually routed rather than at the padded capacity (--moe-paged-stash, for full-
    iteration CUDA graphs whose expert inputs are padded to a fixed capacity)."""
    moe_paged_stash_buffer_factor: float = 1.1
    """The paged buffer's size over the expected (even-share) tokens
    (--moe-paged-stash-buffer-size-factor-cuda); negative: over the padded capacity."""
    delay_wgrad_compute: bool = False
    """Under the all-to-all overlap, run each slot's weight gradients apart from its input
    gradients (--delay-wgrad-compute), so the backward all-to-alls wait for the input
    gradients only and the weight gradients run beneath them."""
    moe_grouped_gemm: bool = True
    """Run a rank's experts as one grouped GEMM per projection (--moe-grouped-gemm:
    Megatron-Core's TEGroupedMLP; TorchTitan's grouped_mm), or, off (Megatron-LM's default),
    one expert after another (SequentialMLP): a GEMM and an activation kernel per expert."""


@dataclass(frozen=True)
class Offload:
    """Model state and activations kept in host memory or on NVMe instead of the GPU
    (`cost_models.offload` prices each transfer and the CPU's optimizer step)."""

    offload_optimizer: OffloadTarget = "none"
    """Where the optimizer's state (fp32 master weights and Adam's moments) lives and its
    step runs: none (the GPU), cpu (ZeRO-Offload, Megatron-LM's --optimizer-cpu-offload,
    FSDP2's CPUOffloadPolicy: gradients copied to the host, Adam on its cores, weights
    copied back) or nvme (ZeRO-Infinity: the state read from and written to NVMe each
    step)."""
    optimizer_offload_fraction: float = 1.0
    """The share of the optimizer's state and step on the CPU, the rest on the GPU
    (Megatron-LM's --optimizer-offload-fraction; DeepSpeed's offload_optimizer.ratio)."""
    offload_params: OffloadTarget = "none"
    """Where ZeRO-3's parameter shards live between uses (ZeRO-Infinity's offload_param):
    none (the GPU), cpu or nvme; each is fetched to the GPU for every forward and backward
    pass, behind the compute of the layers before it. Needs zero_stage 3."""
    offload_activation_layers: int = 0
    """Layers of each pipeline stage whose saved activations are copied to the host in
    forward and back in backward, behind the next layer's compute (Megatron-LM's
    --cpu-offloading-num-layers); 0: none."""
    offload_checkpoints: bool = False
    """Under full recomputation, every layer's checkpointed input kept in host memory:
    copied out as the forward makes it and back before the layer is recomputed (DeepSpeed's
    activation_checkpointing.cpu_checkpointing)."""
    offload_copies: OffloadCopies = "async"
    """How offload's copies to the host run: async (into pinned buffers, beside the
    compute) or blocking, as DeepSpeed before v0.15.4 copies: under ZeRO-3 each reduced
    gradient partition goes to the host before the next bucket is reduced (stage3.py's
    __partition_grads), so the reductions run one bucket at a time beside no compute; and
    cpu_checkpointing's .cpu() and .to(device) hold the stream, staged through pageable
    memory (checkpointing.py, until its async engine of 2026)."""


@dataclass(frozen=True)
class Finetuning:
    """What is trained: every weight (pre-training, full fine-tuning) or low-rank adapters
    beside frozen ones (LoRA, QLoRA) (`cost_models.adapters` prices them)."""

    finetune: Finetune = "none"
    """none (pre-training), full (supervised fine-tuning of every weight: priced as
    pre-training on packed sequences), lora (Hu et al. 2021: the base weights frozen in
    16 bits, rank-r adapters A and B beside each targeted linear trained) or qlora
    (Dettmers et al. 2023: LoRA over a base stored in 4-bit NF4 with double-quantized
    block scales, dequantized to bf16 for each matmul)."""
    lora_rank: int = 16
    """The adapters' rank r: each targeted linear of in x out gains r x (in + out)
    trained parameters."""
    lora_alpha: float = 32.0
    """The adapters' scale alpha / r on their output: no effect on time or memory."""
    lora_targets: tuple[LoraTarget, ...] = ("linear_qkv", "linear_proj", "linear_fc1",
                                            "linear_fc2")
    """The linears of each layer that get adapters, in Megatron-Bridge's names: linear_qkv
    (the query, key and value projections), linear_proj (attention's output), linear_fc1
    (the MLP's up and gate projections, the experts' too) and linear_fc2 (its down
    projection)."""

    @property
    def adapters(self) -> bool:
        """Whether adapters are trained over a frozen base (LoRA, QLoRA)."""
        return self.finetune in ADAPTER_FINETUNES


@dataclass(frozen=True)
class ParallelConfig:
    """How one training step is split over GPUs, in sections as torchtitan's job config
    has them; each knob's Megatron-LM flag in parentheses. A knob is read where it lives
    (``config.batch.micro_batch_size``) and set by its name (`of`, `but`), which is also
    its name in `FixedKnobs` and `planner.vocabulary.knobs`."""

    dims: ParallelDims = ParallelDims(data=-1)
    """The degrees: tensor (--tensor-model-parallel-size), pipeline
    (--pipeline-model-parallel-size), data (-1: the GPUs the others leave), context
    (--context-parallel-size), expert (--expert-model-parallel-size) and expert_tensor
    (--expert-tensor-parallel-size). Experts fold over a pipeline stage's tensor x
    context x data ranks (Megatron-Core's "parallel folding"); `ParallelDims` holds
    their rules."""
    batch: Batch = Batch()
    """Sequences per micro-batch and per step."""
    pipelining: Pipelining = Pipelining()
    """The pipeline schedule and chunks per rank."""
    recomputation: Recomputation = Recomputation()
    """Activation recomputation."""
    numerics: Numerics = Numerics()
    """Matmul, gather and optimizer-state precision."""
    sharding: Sharding = Sharding()
    """ZeRO stage, sequence parallelism and FSDP2's resharding."""
    overlap: Overlap = Overlap()
    """Collectives overlapped with compute."""
    execution: Execution = Execution()
    """The engine, attention kernels, CUDA graphs and torch.compile."""
    moe: Moe = Moe()
    """Token dispatch to experts."""
    offload: Offload = Offload()
    """Optimizer state, parameters and activations kept off the GPU."""
    finetuning: Finetuning = Finetuning()
    """Pre-training, full fine-tuning, or adapters over a frozen base."""

    @classmethod
    def of(cls, **knobs: Any) -> ParallelConfig:
        """The configuration with `knobs` by name (`KNOB_NAMES`: each goes to its section,
        a degree such as ``tensor`` to `dims`), data -1 unless given."""
        return cls().but(**knobs)

    def but(self, **changes: Any) -> ParallelConfig:
        """This configuration with `changes` by knob name; a section given by its name
        (``dims=ParallelDims(...)``) is taken whole."""
        sections: dict[str, Any] = {}
        knobs: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            section = SECTION_OF.get(name)
            if section is not None:
                knobs.setdefault(section, {})[name] = value
            elif name in SECTION_NAMES:
                sections[name] = value
            else:
                raise TypeError(f"{name} is no parallel knob")
        for section, values in knobs.items():
            sections[section] = _copy(sections.get(section, getattr(self, section)), values)
        return _copy(self, sections)

    def __hash__(self) -> int:
        # The search's memos key on configurations, thousands of times each: hash the
        # nested sections once per configuration, not field by field at every lookup.
        # (Kept out of pickles by __reduce__: another process hashes strings otherwise.)
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, name) for name in SECTION_NAMES))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __reduce__(self) -> tuple[type[ParallelConfig], tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in SECTION_NAMES)

    def knob(self, name: str) -> Any:
        """The value of the knob `name` (`KNOB_NAMES`)."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per step on each data-parallel rank."""
        return self.batch.global_batch_size // (self.batch.micro_batch_size * self.dims.data)

    def resolve(self, num_gpus: int) -> ParallelConfig:
        """This config with `data = -1` filled in for `num_gpus`; ValueError naming every
        degree when they do not fit."""
        problems = []
        for section in SECTION_NAMES[1:]:  # the degrees are ParallelDims' to check
            for name, value in vars(getattr(self, section)).items():
                if isinstance(value, int) and not isinstance(value, bool) \
                        and value < (name not in ("zero_stage", "offload_activation_layers")):
                    problems.append(f"{name} must be positive, got {value}")
        if self.sharding.zero_stage > 3:
            problems.append(f"zero_stage must be 0-3, got {self.sharding.zero_stage}")
        for name, allowed in (("recompute", RECOMPUTE), ("schedule", SCHEDULES),
                              ("precision", PRECISIONS),
                              ("attention_backend", ATTENTION_BACKENDS),
                              ("recompute_method", RECOMPUTE_METHODS),
                              ("fp8_recipe", FP8_RECIPES),
                              ("moe_token_dispatcher", MOE_DISPATCHERS),
                              ("engine", ENGINES),
                              ("fsdp_reshard_after_forward", RESHARD_POLICIES),
                              ("main_grads_dtype", STATE_DTYPES),
                              ("exp_avg_dtype", STATE_DTYPES),
                              ("optimizer", OPTIMIZERS),
                              ("offload_optimizer", OFFLOAD_TARGETS),
                              ("offload_params", OFFLOAD_TARGETS),
                              ("offload_copies", OFFLOAD_COPIES),
                              ("finetune", FINETUNES)):
            if self.knob(name) not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}")
        for name, allowed in (("cuda_graph_scope", CUDA_GRAPH_SCOPES),
                              ("recompute_modules", RECOMPUTE_MODULES),
                              ("lora_targets", LORA_TARGETS)):
            unknown = [m for m in self.knob(name) if m not in allowed]
            if unknown:
                problems.append(f"{name} must be among {', '.join(allowed)}, "
                                f"not {', '.join(unknown)}")
        overlap, moe, pipelining = self.overlap, self.moe, self.pipelining
        recompute = self.recomputation.recompute
        if overlap.overlap_param_gather and (
                self.sharding.zero_stage < 1 or not overlap.overlap_grad_reduce):
            problems.append("overlap_param_gather needs zero_stage >= 1 and overlap_grad_reduce")
        if overlap.tp_comm_overlap and not self.sharding.sequence_parallel:
            problems.append("tp_comm_overlap needs sequence_parallel")
        if moe.overlap_moe_expert_parallel_comm and (
                self.dims.expert == 1 or moe.moe_token_dispatcher == "allgather"
                or recompute == "full"
                or (self.dims.pipeline > 1 and pipelining.virtual_pipeline == 1)):
            # Megatron-LM's validate_args for the MoE all-to-all overlap.
            problems.append("overlap_moe_expert_parallel_comm needs expert > 1, the alltoall "
                            "or flex dispatcher, no full recomputation, and with pipeline "
                            "stages the interleaved schedule")
        if self.numerics.fp8_output_proj and (self.numerics.precision != "fp8"
                                              or self.numerics.fp8_recipe != "mxfp8"):
            # Megatron-Core's TransformerConfig.__post_init__ raises without both.
            problems.append("fp8_output_proj needs precision fp8 with the mxfp8 fp8_recipe")
        problems += self._offload_problems()
        if moe.delay_wgrad_compute and not moe.overlap_moe_expert_parallel_comm:
            # Megatron-Core's TransformerConfig.__post_init__ asserts it.
            problems.append("delay_wgrad_compute needs overlap_moe_expert_parallel_comm")
        if problems:
            raise ValueError("; ".join(problems) + ".")
        dims = self.dims.resolve(num_gpus)  # every degree's rule, in one message
        resolved, data, p = replace(self, dims=dims), dims.data, dims.pipeline
        micro, batch = self.batch.micro_batch_size, self.batch.global_batch_size
        if batch % (micro * data):
            raise ValueError(
                f"global batch ({batch}) must be a multiple of micro batch ({micro}) x data "
                f"({data}) = {micro * data}.")
        m = resolved.num_micro_batches
        schedule, v = pipelining.schedule, pipelining.virtual_pipeline
        if schedule == "dualpipev":
            # torch 2.13's ScheduleDualPipeV takes exactly two stages per rank ("ZBV
            # requires exactly 2 stages per rank") and refuses fewer micro-batches than
            # stages ("DualPipeV requires at least as many microbatches as stages"): m >=
            # 2 x pipeline (torch/distributed/pipelining/schedules.py).
            if p < 2 or v != 2 or m < 2 * p:
                raise ValueError(
                    f"the dualpipev schedule needs pipeline > 1 (got {p}), virtual_pipeline 2 "
                    f"(got {v}: two chunks per rank in V order) and at least 2 x pipeline = "
                    f"{2 * p} micro-batches per step (got {m}), as torch's ScheduleDualPipeV "
                    "asks.")
        elif schedule != "interleaved" and v != 1:
            raise ValueError("virtual_pipeline > 1 needs the interleaved schedule.")
        if self.execution.optimizer_in_backward and (m > 1 or p > 1):
            # A step in backward frees each gradient at once: nothing is left to accumulate
            # over micro-batches (torchtune refuses gradient_accumulation_steps > 1), and
            # torch.distributed.pipelining keeps a stage's gradients until the last one.
            raise ValueError(
                f"optimizer_in_backward needs one micro-batch per step and one pipeline "
                f"stage (got {m} micro-batches, pipeline {p}); set the micro-batch to the "
                f"global batch over data, or step after the backward.")
        if self.execution.engine == "megatron" and schedule == "interleaved" and v > 1 and m % p:
            # Megatron-LM's rule (torch's Interleaved1F1B runs other counts, in rounds).
            raise ValueError(
                f"the interleaved schedule needs the {m} micro-batches per step to be a "
                f"multiple of pipeline ({p}); change the batch or the pipeline.")
        return resolved


    def _offload_problems(self) -> list[str]:
        """The offload and fine-tuning rules (DeepSpeed's and Megatron-LM's)."""
        offload, tuning = self.offload, self.finetuning
        problems = []
        if not 0 <= offload.optimizer_offload_fraction <= 1:
            problems.append("optimizer_offload_fraction must be within [0, 1], got "
                            f"{offload.optimizer_offload_fraction}")
        elif offload.optimizer_offload_fraction < 1 and offload.offload_optimizer != "cpu":
            # Megatron-LM's HybridDeviceOptimizer splits the state between CPU and GPU;
            # nothing splits it between NVMe and the GPU.
            problems.append("optimizer_offload_fraction below 1 needs offload_optimizer cpu")
        if offload.offload_params != "none" and self.sharding.zero_stage != 3:
            # ZeRO-Infinity's offload_param is a ZeRO-3 option (DeepSpeed's config check).
            problems.append("offload_params needs zero_stage 3 (parameters sharded)")
        if offload.offload_activation_layers and (
                self.dims.pipeline > 1 or self.recomputation.recompute != "none"):
            # Megatron-Core's TransformerConfig.__post_init__ refuses both with CPU offloading.
            problems.append("offload_activation_layers needs one pipeline stage and no "
                            "recomputation")
        if offload.offload_checkpoints and self.recomputation.recompute != "full":
            # DeepSpeed offloads the inputs its checkpointed layers keep: no recomputation,
            # no checkpoints (its checkpointing.py).
            problems.append("offload_checkpoints needs full recomputation")
        if self.numerics.optimizer != "adam" and offload.offload_optimizer != "none":
            # bitsandbytes' optimizers step on the GPU; its paged one pages by itself.
            problems.append(f"optimizer {self.numerics.optimizer} steps on the GPU: "
                            "offload_optimizer must be none")
        if tuning.adapters and not tuning.lora_targets:
            problems.append("lora_targets must name at least one linear")
        if tuning.finetune == "qlora" and self.numerics.precision not in QLORA_PRECISIONS:
            problems.append("qlora dequantizes its 4-bit base to bf16 or fp16 for each "
                            f"matmul; precision {self.numerics.precision} has no 4-bit path")
        return problems


class FixedKnobs(Mapping[str, Any]):
    """The knobs a user fixed, by `ParallelConfig` field name; a knob not given (or given
    as None) is searched. A name that is no knob is refused, so a misspelt knob never
    silently becomes "search it". Read like a mapping: ``"tensor" in fixed``,
    ``fixed.get("zero_stage")`` (None: searched)."""

    __slots__ = ("_given",)

    def __init__(self, knobs: Mapping[str, Any] | None = None, **more: Any) -> None:
        given = {**(knobs or {}), **more}
        unknown = sorted(set(given) - KNOB_NAMES)
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)} is no parallel knob; the knobs are "
                f"{', '.join(sorted(KNOB_NAMES))}."
            )
        self._given = {name: value for name, value in given.items() if value is not None}

    def __getitem__(self, name: str) -> Any:
        return self._given[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)

    # The search reads knobs in its innermost loops: the dict's own lookups, not
    # Mapping's generic ones (which go through __getitem__ and KeyError).
    def __contains__(self, name: object) -> bool:
        return name in self._given

    def get(self, name: str, default: Any = None) -> Any:
        return self._given.get(name, default)

    def __repr__(self) -> str:
        return f"FixedKnobs({self._given!r})"

    def but(self, **changes: Any) -> FixedKnobs:
        """These knobs with `changes` (None: searched again)."""
        return FixedKnobs({**self._given, **changes})


def _copy(value: _Frozen, changes: dict[str, Any]) -> _Frozen:
    """`dataclasses.replace(value, **changes)` for a frozen section or configuration whose
    `changes` name its fields, without running `__init__` again (these have no
    `__post_init__`): the search builds configurations in its innermost loops."""
    copy = object.__new__(type(value))
    fields_ = copy.__dict__
    fields_.update(vars(value))
    fields_.pop("_hash", None)  # ParallelConfig's cached hash is the old value's
    fields_.update(changes)
    return copy


SECTION_OF: dict[str, str] = {
    knob.name: section.name
    for section in fields(ParallelConfig)
    for knob in fields(section.default)
}
"""Each knob's name -> the `ParallelConfig` section that holds it (`dims` for a degree)."""
SECTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ParallelConfig))
"""The names of `ParallelConfig`'s sections, in order."""
DEGREE_NAMES = frozenset(f.name for f in fields(ParallelDims))
"""The degrees, which `ParallelConfig` holds in its `dims` (`ParallelDims` validates them)."""
KNOB_NAMES = frozenset(SECTION_OF)
"""Every knob a plan can fix, by name: the degrees and every section's fields."""
OFFLOAD_KNOBS = frozenset(name for name, section in SECTION_OF.items() if section == "offload")
"""The knobs of what is kept off the GPU (the `offload` section)."""
