"""The Plan: the one artifact every step after the search reads (lowering, runtime, `plan
check`, exporters, reports); none of them calls back into the search.

One versioned schema for both kinds of plan:

- a training plan (`plan MODEL --gpus N ...`): the device mesh with named axes (`pp`, `dp`,
  `cp`, `tp`, DeviceMesh's and torchtitan's names), the parallel degrees, the pipeline
  stages (layers, devices, logical mesh, virtual chunks), micro-batching, schedule, ZeRO
  stage, recomputation, precision, the predictions and the Megatron-LM launch flags;
- an operator-level plan (`plan MODEL --mesh 2x2`): the one-stage case, whose stage holds
  the intra-op ILP's choice for every node of the traced graph (`Stage.operators`).

Placements use DTensor's short form (`S(0)`, `R`, `P`, one per mesh axis: `S(0)R`) and are
validated on load, as are collective kinds. A version-1 file (either of the two schemas
Tessel wrote before) is migrated on load; any other version is refused in one line.
"""

from __future__ import annotations

import json
import math
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.vocabulary.evidence import Band
from planner.vocabulary.placement_text import placement_pieces
from planner.models.config import TransformerConfig
from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.plan_migration import migrate_v1
from planner.vocabulary.parallel import (
    AttentionBackend,
    ParallelConfig,
    CudaGraphScope,
    Engine,
    Finetune,
    Fp8Recipe,
    LoraTarget,
    MoeDispatcher,
    OffloadCopies,
    OffloadTarget,
    Optimizer,
    Precision,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
    ReshardPolicy,
    Schedule,
    StateDtype,
)

SCHEMA_VERSION = 2
PHASES = ("forward", "backward", "gradient_sync")
COLLECTIVE_KINDS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)
"""Collectives the cost model prices (`cost_models.comm`) and the runtime counts."""
COMMUNICATION_KINDS = (*COLLECTIVE_KINDS, "send", "recv")
"""Kinds a plan's communication tables hold: the cost model's collectives, and point-to-
point transfers counted per side, as `plan check` measures them."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectiveStats(_Model):
    count: int = Field(ge=0, description="Number of collectives of this kind in one step.")
    bytes: int = Field(ge=0, description="Summed payload bytes per rank (the larger of each "
                       "collective's local input and output buffers).")


class NodeSharding(_Model):
    """The strategy chosen for one graph node."""

    op: str = Field(description="The aten op, e.g. 'aten.addmm.default'.")
    module: str = Field(default="", description="Module path the node came from.")
    phase: str = Field(default="forward", description="'forward' or 'backward'.")
    inputs: list[str] = Field(description="Placement each tensor input is moved to.")
    outputs: list[str | None] = Field(description="Placement of each output.")
    produced: str | None = Field(
        default=None,
        description="Placement the op itself produces (a partial sum) when the node "
        "reduces its output at once to outputs[0].",
    )


class GradientBucket(_Model):
    """Gradients (and possibly the loss) all-reduced together in one flat buffer."""

    members: list[str] = Field(description="Parameter FQNs, or 'loss'.")
    mesh_dims: list[list[int]] = Field(description="One all-reduce per entry, over these axes.")
    dtype: str = Field(description="Element type of the flat buffer.")
    nbytes: int = Field(ge=0, description="Bytes of the flat buffer.")
    placements_before: list[str] = Field(description="Each member's placement before.")
    placements_after: list[str] = Field(description="Each member's placement after.")


class FallbackOp(_Model):
    node: str = Field(description="Graph node name.")
    op: str = Field(description="The aten op that has no sharding rule.")
    module: str = Field(default="", description="Module path the node came from.")


class SolverReport(_Model):
    backend: str = Field(description="OR-Tools backend that solved the ILP.")
    status: str = Field(
        description="'OPTIMAL', 'FEASIBLE' (time limit hit) or 'GREEDY' (time limit hit "
        "before the ILP had a solution: the greedy incumbent, gap unknown, reported as 1)."
    )
    gap: float = Field(ge=0, description="Relative optimality gap (0 when optimal).")
    solve_time_s: float = Field(ge=0, description="Wall time of the solve.")
    num_variables: int = Field(ge=0, description="Variables in the ILP.")


class OperatorShardings(_Model):
    """What the intra-op ILP chose for a stage's traced training step."""

    graph_fingerprint: str = Field(
        description="Hash of the traced graph; the shardings only apply to the graph they "
        "were chosen for."
    )
    inputs: dict[str, str] = Field(description="Input name -> placement.")
    nodes: dict[str, NodeSharding] = Field(description="Graph node -> chosen strategy.")
    gradient_buckets: list[GradientBucket] = Field(default_factory=list)
    communication_by_phase: dict[str, dict[str, CollectiveStats]] = Field(
        description="The stage's collectives of one step, split into forward, backward and "
        "gradient_sync."
    )
    fallback_ops: list[FallbackOp] = Field(
        default_factory=list, description="Ops with no sharding rule, run replicated."
    )
    replicated: str = Field(
        default="", description="Where every rank computes the whole step (every value "
        "replicated, no collective): why, in the ILP's own prices; empty otherwise.")
    solver: SolverReport


class StageMemory(_Model):
    """Bytes of model state one rank of a stage holds during a step, counted over its
    local shards."""

    parameters_bytes: int = Field(ge=0, description="Parameters as held from forward to "
                                  "backward: gathered over the data axis under ZeRO-0/1/2, "
                                  "this rank's shard under ZeRO-3.")
    gradients_bytes: int = Field(ge=0, description="Gradients after backward: whole under "
                                 "ZeRO-0/1, this rank's shard under ZeRO-2/3.")
    optimizer_bytes: int = Field(ge=0, description="Optimizer state (Adam's two moments, and "
                                 "fp32 master weights under mixed precision): sharded under "
                                 "ZeRO-1/2/3.")


class Stage(_Model):
    """One pipeline stage: its layers, its devices and the logical mesh it runs on."""

    layers: tuple[int, int] = Field(description="Layers [first, last) of the stage.")
    first_device: int = Field(default=0, ge=0, description="First global rank of the stage; "
                              "it runs on ranks first_device .. first_device + num_devices - 1.")
    num_devices: int = Field(ge=1, description="Devices the stage runs on.")
    pool: str | None = Field(default=None, description="The pool of a mixed cluster whose "
                             "machines the stage runs on (`plan` with a cluster file of "
                             "pools); None on a cluster of one kind.")
    mesh_axes: list[str] = Field(description="Names of the stage mesh's axes, outermost first.")
    mesh_shape: list[int] = Field(description="Logical mesh of the stage, e.g. [data, tensor].")
    virtual_chunks: int = Field(default=1, ge=1, description="Model chunks the stage holds "
                                "(interleaved 1F1B).")
    chunks: list[tuple[int, int]] = Field(
        default_factory=list,
        description="Layers [first, last) of each model chunk the stage holds, in model order. "
        "One chunk, `layers`, without interleaving; with v chunks per stage, Megatron-LM's "
        "order: the layers cut into pipeline x v equal chunks, chunk c on stage c % pipeline "
        "(`layers` is then the stage's share of the layers, not a range it holds).",
    )
    parameters: dict[str, str] = Field(
        default_factory=dict, description="Parameter FQN -> placement on the stage mesh "
        "(an expert's parameter under expert parallelism lives whole on one rank of each "
        "expert group: R on the data axis).",
    )
    communication: dict[str, CollectiveStats] = Field(
        default_factory=dict, description="Collectives one rank of the stage issues in one "
        "training step, by kind (point-to-point as send and recv), as `plan check` "
        "measures them.",
    )
    communication_once: dict[str, CollectiveStats] = Field(
        default_factory=dict, description="Collectives a rank of the stage issues once, in "
        "its first step: the pipeline schedule's agreement on tensor shapes.",
    )
    memory: StageMemory | None = Field(
        default=None, description="Model state one rank of the stage holds (training plans).",
    )
    saved_activation_bytes: list[int] = Field(
        default_factory=list, description="Training plans run by Tessel's runtime (engine "
        "tessel): bytes one rank of the stage saves for backward per micro-batch in each "
        "chunk it holds, in `chunks` order (the blocks, and on the first and last chunk the "
        "embedding, head and loss), as `plan check` measures them "
        "(`cost_models.saved_activations.tessel_stage`). Empty where not predicted.",
    )
    phases_s: dict[str, float] = Field(
        default_factory=dict, description="Training plans: the seconds one micro-batch "
        "spends in the stage (all its chunks) by phase, as the step-time model priced them: "
        "forward, backward, recompute, forward_communication, backward_communication, "
        "transfer (one chunk's pipeline sends and receives).",
    )
    peak_memory_gib: dict[str, float] = Field(
        default_factory=dict, description="Training plans: one GPU of the stage at its "
        "peak, GiB, by kind (weights, gradients, optimizer, activations, working buffers, "
        "outside the allocator), and what the caching allocator reserves then (reserved).",
    )
    operators: OperatorShardings | None = Field(
        default=None, description="The intra-op ILP's choice for every node, where it chose."
    )
    layer_operators: list[OperatorShardings] = Field(
        default_factory=list, description="Graph plans: each layer's own shardings, where "
        "the stage runs its layers as programs of their own in turn (each layer's outputs "
        "moved to replicated and handed to the next, as between stages, the layer table's "
        "solves as they are); empty where it runs them as one program (`operators`).",
    )
    recompute: bool = Field(
        default=False, description="Graph plans: the stage keeps of each micro-batch in "
        "flight only its incoming tensors and runs its first pass again (without sending) "
        "before that micro-batch's backward.",
    )

    @property
    def shardings(self) -> list[OperatorShardings]:
        """What the intra-op ILP chose for the stage: its one program's (`operators`) or
        each layer's (`layer_operators`); empty where it chose nothing."""
        return [self.operators] * (self.operators is not None) + self.layer_operators


class ParallelDegrees(_Model):
    """The plan's degrees (`planner.vocabulary.parallel_dims.ParallelDims`, `dims`) with the knobs
    that shape its stages: sequence parallelism, ZeRO and the chunks per rank."""

    data: int = Field(ge=1, description="Data-parallel degree.")
    tensor: int = Field(ge=1, description="Tensor-parallel degree.")
    pipeline: int = Field(ge=1, description="Pipeline-parallel degree.")
    context: int = Field(ge=1, description="Context-parallel degree.")
    expert: int = Field(ge=1, description="Expert-parallel degree.")
    expert_tensor: int | None = Field(
        default=None, ge=1, description="Tensor-parallel degree inside each expert (MoE "
        "plans; with the expert degree, folded over a stage's tensor x context x data "
        "ranks).")
    sequence_parallel: bool = Field(description="Sequence parallelism over the tensor group.")
    zero_stage: int = Field(ge=0, le=3, description="ZeRO stage; 1 = distributed optimizer.")
    virtual_pipeline: int = Field(ge=1, description="Model chunks per pipeline rank.")

    @property
    def dims(self) -> ParallelDims:
        """The degrees as the one degrees type has them."""
        return ParallelDims(pipeline=self.pipeline, data=self.data, context=self.context,
                            tensor=self.tensor, expert=self.expert,
                            expert_tensor=self.expert_tensor)

    @classmethod
    def of(cls, config: ParallelConfig, moe: bool) -> ParallelDegrees:
        """The plan's record of `config`'s degrees and stage-shaping knobs (the expert
        tensor degree written out for MoE)."""
        dims = config.dims
        return cls(data=dims.data, tensor=dims.tensor, pipeline=dims.pipeline,
                   context=dims.context, expert=dims.expert,
                   expert_tensor=dims.expert_tensor_degree if moe else None,
                   sequence_parallel=config.sharding.sequence_parallel,
                   zero_stage=config.sharding.zero_stage,
                   virtual_pipeline=config.pipelining.virtual_pipeline)


class RunSettings(_Model):
    """How the kernels and collectives of a training plan run, beyond its degrees (each a
    Megatron-LM flag: `planner.vocabulary.parallel.ParallelConfig` says what each one does)."""

    attention_backend: AttentionBackend = Field(
        default="auto", description="Attention kernels: auto, flash, fused, unfused or local.")
    overlap_grad_reduce: bool = Field(default=False, description="Gradients reduced in "
                                      "buckets during the backward pass.")
    overlap_param_gather: bool = Field(default=False, description="The distributed "
                                       "optimizer's weights gathered during the forward.")
    tp_comm_overlap: bool = Field(default=False, description="Tensor-parallel collectives "
                                  "overlapped with matmuls.")
    recompute_method: RecomputeMethod = Field(default="uniform", description="Full "
                                              "recomputation: uniform or block.")
    recompute_num_layers: int = Field(default=1, ge=1, description="Layers per checkpointed "
                                      "group (uniform) or recomputed per stage (block).")
    fp8_recipe: Fp8Recipe = Field(default="delayed", description="fp8 scaling recipe.")
    moe_token_dispatcher: MoeDispatcher = Field(
        default="allgather", description="How tokens reach their experts: allgather, "
        "alltoall or flex (DeepEP).")
    moe_router_force_load_balancing: bool = Field(
        default=False, description="Routers assign tokens to experts evenly by a fixed rule "
        "(--moe-router-force-load-balancing): dispatch bytes known in advance.")
    moe_expert_capacity_factor: float | None = Field(
        default=None, gt=0, description="Tokens an expert takes over an even share; None: "
        "no cap.")
    moe_pad_expert_input_to_capacity: bool = Field(
        default=False, description="Expert inputs padded to the capacity factor.")
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False, description="Expert all-to-alls overlapped with another "
        "micro-batch's compute.")
    delay_wgrad_compute: bool = Field(
        default=False, description="Weight gradients computed apart from input gradients, "
        "beneath the expert all-to-alls.")
    moe_grouped_gemm: bool = Field(
        default=True, description="A rank's experts run as one grouped GEMM per "
        "projection; false: one GEMM per expert in turn.")
    cuda_graphs: bool = Field(default=False, description="Layers captured in CUDA graphs.")
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        default=(), description="Parts of each layer in CUDA graphs, when not whole layers.")
    engine: Engine = Field(
        default="megatron", description="The engine that runs the plan, whose memory "
        "rules its prediction follows.")
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=("core_attn",), description="Selective recomputation: the parts of each "
        "layer replayed (core_attn, mlp, layernorm, moe_act, mla_up_proj, moe, "
        "shared_experts).")
    main_grads_dtype: StateDtype = Field(default="fp32", description="The optimizer's "
                                         "gradient buffer.")
    exp_avg_dtype: StateDtype = Field(default="fp32", description="Adam's moments.")
    fsdp_reshard_after_forward: ReshardPolicy = Field(
        default="default", description="TorchTitan's FSDP2 resharding after forward.")
    recompute_every: int = Field(default=1, ge=1, description="Full recomputation: one "
                                 "block in every this many checkpointed.")
    compile: bool = Field(default=False, description="Blocks compiled by torch.compile.")
    compile_loss: bool = Field(default=False, description="The loss compiled by "
                               "torch.compile.")
    optimizer: Optimizer = Field(default="adam", description="adam, bitsandbytes' "
                                 "adam8bit, or its paged_adam8bit.")
    optimizer_in_backward: bool = Field(default=False, description="Each parameter "
                                        "stepped as its gradient is made.")
    loss_chunks: int = Field(default=1, ge=1, description="Chunks of tokens the output "
                             "layer and its loss run in (torchtune's chunked loss).")
    fp8_param_gather: bool = Field(default=False, description="fp8 weights gathered.")
    fp8_output_proj: bool = Field(default=False, description="The output layer's matmul "
                                  "in fp8 (MXFP8).")
    moe_expert_rank_capacity_factor: float | None = Field(
        default=None, gt=0, description="HybridEP's static budget of a rank's routed rows "
        "over an even share; None: sized to the tokens.")
    moe_paged_stash: bool = Field(default=False, description="Experts' saved activations "
                                  "kept in a paged buffer of the tokens routed.")
    moe_paged_stash_buffer_factor: float = Field(
        default=1.1, description="The paged buffer over the expected tokens (negative: "
        "over the padded capacity).")
    ddp_bucket_size: int | None = Field(
        default=None, ge=1, description="Parameters per gradient bucket of the overlapped "
        "reduction; None: Megatron-LM's default, max(40M, 1M x data).")
    offload_optimizer: OffloadTarget = Field(
        default="none", description="Where the optimizer's state lives and its step runs: "
        "none (the GPU), cpu or nvme.")
    optimizer_offload_fraction: float = Field(
        default=1.0, ge=0, le=1, description="The share of the optimizer's state and step "
        "on the CPU (offload_optimizer cpu).")
    offload_params: OffloadTarget = Field(
        default="none", description="Where ZeRO-3's parameter shards live between uses.")
    offload_activation_layers: int = Field(
        default=0, ge=0, description="Layers per stage whose saved activations go to the "
        "host.")
    offload_checkpoints: bool = Field(
        default=False, description="Every layer's checkpointed input kept in host memory "
        "(DeepSpeed's cpu_checkpointing; full recomputation).")
    offload_copies: OffloadCopies = Field(
        default="async", description="How offload's copies to the host run: async or "
        "blocking (DeepSpeed before v0.15.4).")
    finetune: Finetune = Field(
        default="none", description="none (pre-training), full, lora or qlora.")
    lora_rank: int = Field(default=16, ge=1, description="The adapters' rank.")
    lora_alpha: float = Field(default=32.0, description="The adapters' scale alpha / rank.")
    lora_targets: tuple[LoraTarget, ...] = Field(
        default=("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"),
        description="The linears of each layer that get adapters.")


class Breakdown(_Model):
    compute_s: float = Field(description="Kernel time of the slowest stage.")
    tensor_parallel_comm_s: float = Field(description="Tensor/context-parallel collectives.")
    pipeline_comm_s: float = Field(description="Stage-to-stage transfers.")
    data_parallel_comm_s: float = Field(description="Exposed gradient reduction.")
    bubble_s: float = Field(description="Pipeline fill and drain.")
    optimizer_s: float = Field(description="Optimizer update.")
    offload_s: float = Field(default=0.0, description="What offload adds: the CPU's Adam "
                             "step, NVMe swaps, copies compute does not hide.")


class Predicted(_Model):
    """What the cost model predicts of one optimizer step."""

    step_time_s: float = Field(ge=0, description="Predicted time of one optimizer step.")
    compute_s: float = Field(ge=0, description="Kernel time (of the slowest stage).")
    communication_s: float = Field(ge=0, description="Collectives and transfers not hidden "
                                   "behind compute.")
    memory_gib_per_gpu: float = Field(ge=0, description="Peak memory of the fullest device, "
                                      "GiB: parameters, gradients, optimizer state and saved "
                                      "activations.")
    fits: bool = Field(default=True, description="Whether that peak fits in device memory.")
    reserved_gib_per_gpu: float | None = Field(
        default=None, ge=0, description="What the caching allocator holds on that device at "
        "its peak, GiB (max_memory_reserved, what TorchTitan logs and nvidia-smi shows).")
    reserved_fits: bool = Field(default=True, description="Whether the reserved memory fits "
                                "too; if not, fragmentation may run the plan out of memory "
                                "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps).")
    memory_breakdown_gib: dict[str, float] = Field(
        default_factory=dict, description="The fullest device's peak by kind, GiB.")
    tokens_per_s: float | None = Field(default=None, description="Tokens per second over the "
                                       "cluster (training plans).")
    model_tflops_per_gpu: float | None = Field(
        default=None, description="Model TFLOP/s per GPU, FLOPs counted as flops_count says.")
    hardware_tflops_per_gpu: float | None = Field(
        default=None, description="TFLOP/s per GPU the priced kernels execute: causal "
        "attention's unmasked half, sliding windows' bands, the router, recomputation "
        "included (training plans).")
    mfu: float | None = Field(
        default=None,
        description="Model FLOPs utilization of the dense peak at the matmul precision, "
        "model FLOPs counted as flops_count says.",
    )
    flops_count: str | None = Field(
        default=None, description="How model_tflops_per_gpu and mfu count FLOPs: "
        "'megatron-lm causal' (training plans: Megatron-LM's num_floating_point_operations "
        "since commit 8873b55d6a, attention scores halved for the causal mask, no router, "
        "what NeMo and Megatron-Bridge report) or 'traced' (graph plans: 3x the traced "
        "forward's matmuls and elementwise ops).")
    host_memory_gib_per_host: float = Field(
        default=0.0, ge=0, description="Host memory one host's offloaded state and "
        "activations take, GiB.")
    nvme_gb_per_step: float = Field(
        default=0.0, ge=0, description="Bytes one host reads from and writes to NVMe per "
        "step, GB.")
    pcie_gb_per_step: float = Field(
        default=0.0, ge=0, description="Bytes one GPU moves over its host link per step, "
        "GB.")
    breakdown: Breakdown | None = Field(default=None, description="Where the step time goes.")
    step_time_band_s: tuple[float, float] | None = Field(
        default=None, description="The step time a run may measure, [low, high]: the "
        "prediction times the band of measured over predicted step time that the published "
        "runs of its kind (engine x model family x GPU generation) leave when each is held "
        "out of the fit that predicts it (`band`).",
    )
    tokens_per_s_band: tuple[float, float] | None = Field(
        default=None, description="Tokens per second over the same band, [low, high].",
    )
    band: Band | None = Field(
        default=None, description="The evidence the band rests on: the kind of run, its "
        "published runs and how the band was drawn from their held-out errors, or the "
        "measured kind it was borrowed from (`plan calibration` lists every kind).",
    )

    @property
    def memory_bytes_per_device(self) -> float:
        return self.memory_gib_per_gpu * 2**30

    def with_band(self, band: Band) -> Predicted:
        """This prediction with `band` (measured over predicted step time in [low, high])
        and the step time and tokens per second it spans."""
        low, high = band.low, band.high
        update: dict = {"step_time_band_s": (self.step_time_s * low, self.step_time_s * high),
                        "band": band}
        if self.tokens_per_s is not None:
            update["tokens_per_s_band"] = (self.tokens_per_s / high, self.tokens_per_s / low)
        return self.model_copy(update=update)


class Provenance(_Model):
    """Where a plan came from."""

    model_spec: str = Field(description="The model as named (preset, file.py:function, ...).")
    model_shape: dict[str, Any] = Field(
        default_factory=dict,
        description="The shape flags a zoo or hf: model was given, as its config's fields "
        "(num_layers, seq_length, ...): with model_spec, what a launch file builds it by.",
    )
    cluster: str = Field(description="Cluster preset or file.")
    cost_source: str = Field(
        default="analytical",
        description="Where op and collective times came from: 'analytical' (the cluster's "
        "roofline and alpha-beta models) or 'profile:PATH' (a `plan profile` database, "
        "analytical where it has no measurement).",
    )
    calibration: str = Field(
        default="uncalibrated", description="What the cluster's efficiency was fitted to, or "
        "'uncalibrated' (typical values; the prediction's band is then wide).",
    )
    tessel_version: str = Field(description="The Tessel release that made the plan.")
    launch_argv: list[str] | None = Field(
        default=None, description="`plan predict`: the training command's words as read from "
        "the launch line or script (launcher, script and flags), as bash expands them.",
    )


def tied_parameters(stages: Sequence[Iterable[str]]) -> dict[str, tuple[int, ...]]:
    """FQN -> the stages holding it (in order), for each parameter more than one stage
    holds (a tied weight, `planner.search.tied`)."""
    holders: dict[str, list[int]] = {}
    for k, fqns in enumerate(stages):
        for fqn in fqns:
            holders.setdefault(fqn, []).append(k)
    return {fqn: tuple(ks) for fqn, ks in holders.items() if len(ks) > 1}


def tessel_version() -> str:
    try:
        return metadata.version("tessel")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


class TrainingTotals(_Model):
    """A whole run: time, GPU-hours, money, energy; and what failures make of them."""

    steps: int = Field(description="Optimizer steps of the run.")
    days: float = Field(description="Wall-clock days without failures.")
    gpu_hours: float = Field(description="GPU-hours without failures.")
    cost_usd: float = Field(description="GPU-hours at the price per GPU-hour, USD.")
    gpu_hour_usd: float = Field(description="The price per GPU-hour used.")
    energy_kwh: float = Field(description="Energy drawn from the grid, kWh (GPUs at the "
                              "plan's utilisation, host overhead, x PUE).")
    mttf_hours: float = Field(description="Mean time between job-stopping failures.")
    checkpoint_bytes: float = Field(description="Weights and optimizer state of the whole "
                                    "model: one checkpoint.")
    checkpoint_blocking_s: float = Field(description="Training time one checkpoint takes.")
    checkpoint_interval_s: float = Field(description="Compute time between checkpoints "
                                         "that maximises goodput (Young/Daly).")
    ettr: float = Field(description="Effective training time ratio: useful over expected "
                        "wall time, with failures, checkpoints and restarts.")
    expected_days: float = Field(description="Expected wall-clock days with failures.")
    expected_gpu_hours: float = Field(description="Expected GPU-hours with failures.")
    expected_cost_usd: float = Field(description="Expected cost with failures, USD.")


class BandwidthPoint(_Model):
    """The plan's step at one bandwidth of one tier."""

    bandwidth_gbs: float = Field(description="The tier's bandwidth, GB/s per GPU and direction.")
    factor: float = Field(description="That bandwidth over the cluster's.")
    step_s: float = Field(description="The predicted step there.")
    exposed_s: float = Field(description="The step less the step with the tier unbounded.")


class TierSweep(_Model):
    """One tier of the fabric swept (`plan --bandwidth-sweep`, `cost_models.bandwidth_sweep`)."""

    tier: str = Field(description="The cluster's link: intra_node, inter_node, tiers.N.")
    name: str = Field(description="How it is called: scale-up, scale-out, leaf, spine, ...")
    cluster_gbs: float = Field(description="Its bandwidth in the cluster, GB/s per GPU.")
    unbounded_step_s: float = Field(description="The step with the tier unbounded.")
    points: list[BandwidthPoint] = Field(description="The step at 1/8x to 8x its bandwidth.")
    hides_at_gbs: float | None = Field(description="The least bandwidth whose step is within "
                                       "1% of the unbounded one; None: nothing the step "
                                       "waits on crosses the tier.")


class Plan(_Model):
    """How to train one model: stages over a device mesh, and what that is predicted to do."""

    version: Literal[2] = Field(default=SCHEMA_VERSION, description="Schema version.")
    model: str = Field(description="What was planned (a model spec or class name).")
    architecture: TransformerConfig | None = Field(
        default=None, description="The transformer's shape, for training plans of zoo and "
        "hf: transformers: attention (heads, MLA ranks, windows), experts (routed, shared, "
        "which layers), multi-token prediction, in Megatron-LM's vocabulary.")
    cluster: str = Field(description="Cluster preset or file the costs come from.")
    num_gpus: int = Field(ge=1, description="Devices the plan runs on.")
    devices_per_host: int | None = Field(default=None, ge=1, description="Devices of one "
                                         "host, the processes a launcher starts per machine "
                                         "(None: a node is one host).")
    devices_per_node: int = Field(default=1, ge=1, description="Devices of one node (scale-up "
                                  "domain): consecutive ranks share a node, so a launcher "
                                  "starts this many processes per machine.")
    mesh_axes: list[str] = Field(description="Names of the device mesh's axes, outermost "
                                 "first: pp, dp, cp, tp for a training plan whose stages share "
                                 "one layout; 'device' when stages differ (each has its own).")
    mesh_shape: list[int] = Field(description="Sizes of those axes.")
    parallel: ParallelDegrees | None = Field(
        default=None, description="Parallel degrees (as the first stage sees them); None for "
        "an operator-level plan, whose shardings are chosen per node."
    )
    run: RunSettings | None = Field(default=None, description="How kernels and collectives "
                                   "run (training plans of zoo transformers).")
    global_batch_size: int | None = Field(default=None, ge=1,
                                          description="Sequences per optimizer step.")
    micro_batch_size: int | None = Field(default=None, ge=1, description="Sequences per "
                                         "micro-batch on one data-parallel replica.")
    num_micro_batches: int = Field(default=1, ge=1,
                                   description="Micro-batches per step per pipeline.")
    recompute: Recompute = Field(default="none",
                                 description="Activation recomputation: none, selective, full.")
    schedule: Schedule | None = Field(default=None, description="Pipeline schedule: gpipe, "
                                      "1f1b, interleaved, dualpipev; None for one stage.")
    precision: Precision = Field(default="fp32", description="Matmul precision: fp32, bf16, fp16, "
                           "fp8.")
    stages: list[Stage] = Field(min_length=1, description="Pipeline stages in order.")
    layer_cuts: list[int] | None = Field(
        default=None, description="Graph plans: positions in the model's traced forward "
        "(its ops in graph order) where each layer begins, and the number of ops; stages "
        "hold layers of these.",
    )
    communication: dict[str, CollectiveStats] = Field(
        default_factory=dict, description="Collectives one rank issues in one step, by kind "
        "(as `plan check` measures them)."
    )
    predicted: Predicted
    training: TrainingTotals | None = Field(
        default=None, description="The whole run (--train-tokens or --train-iters): days, "
        "GPU-hours, cost, energy, and with failures, checkpoints and restarts.",
    )
    network: list[TierSweep] = Field(
        default_factory=list, description="--bandwidth-sweep: the step and exposed "
        "communication as each tier of the fabric's bandwidth varies, and where its "
        "communication hides; empty unless asked for.")
    megatron_flags: list[str] | None = Field(
        default=None, description="Megatron-LM launch flags, when Megatron-LM can run it."
    )
    megatron_incompatibility: str | None = Field(
        default=None, description="Why Megatron-LM cannot run the plan, if it cannot."
    )
    provenance: Provenance

    @property
    def num_devices(self) -> int:
        return self.num_gpus

    @property
    def parameters(self) -> dict[str, str]:
        """Every stage's parameter placements, by FQN."""
        return {fqn: p for stage in self.stages for fqn, p in stage.parameters.items()}

    def tie_groups(self) -> dict[str, list[int]]:
        """Graph plans: each weight several stages hold (tied across them) -> the global
        ranks of those stages, which sum its gradient once per step."""
        tied = tied_parameters([stage.parameters for stage in self.stages])
        return {fqn: [r for k in holders
                      for r in range(self.stages[k].first_device,
                                     self.stages[k].first_device + self.stages[k].num_devices)]
                for fqn, holders in tied.items()}

    @property
    def operators(self) -> OperatorShardings:
        """The node shardings of an operator-level (one-stage) plan."""
        if len(self.stages) != 1 or self.stages[0].operators is None:
            raise ValueError(
                "this plan has no operator shardings (a training plan of "
                f"{len(self.stages)} stages); plan with --mesh for them"
            )
        return self.stages[0].operators

    def replicated_notes(self) -> list[str]:
        """Why each stage whose every rank computes all of it does so (the ILP's
        `OperatorShardings.replicated`), 'stage i: ' first where there are several stages."""
        notes = []
        for index, stage in enumerate(self.stages):
            shardings = stage.shardings
            if shardings and all(operators.replicated for operators in shardings):
                prefix = f"stage {index}: " if len(self.stages) > 1 else ""
                notes.append(prefix + shardings[0].replicated)
        return notes

    @property
    def cost_source(self) -> str:
        return self.provenance.cost_source

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if len(self.mesh_axes) != len(self.mesh_shape) or any(s < 1 for s in self.mesh_shape):
            raise ValueError(
                f"mesh_axes {self.mesh_axes} and mesh_shape {self.mesh_shape} must be as "
                "long as each other, with positive sizes"
            )
        if math.prod(self.mesh_shape) != self.num_gpus:
            raise ValueError(f"mesh_shape {self.mesh_shape} does not hold {self.num_gpus} "
                             "devices")
        for index, stage in enumerate(self.stages):
            _check_stage(index, stage)
        kinds = [k for k in self.communication] + [
            k for stage in self.stages
            for k in [*stage.communication, *stage.communication_once]
        ] + [
            k for stage in self.stages
            for operators in stage.shardings
            for table in operators.communication_by_phase.values() for k in table
        ]
        for kind in kinds:
            if kind not in COMMUNICATION_KINDS:
                raise ValueError(
                    f"unknown collective kind {kind!r}; known: {', '.join(COMMUNICATION_KINDS)}"
                )
        return self

    def to_json(self, path: str | Path | None = None) -> str:
        text = self.model_dump_json(indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Plan:
        """Load and validate a plan from JSON text or a file path; a version-1 plan is
        migrated, anything else that is not a plan is refused with one sentence."""
        text = str(text_or_path)
        where = "the plan"
        if not text.lstrip().startswith(("{", "[")):
            path = Path(text_or_path)
            text, where = path.read_text(), str(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not JSON ({error.msg} at line {error.lineno}).") \
                from None
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a Tessel plan (a JSON object).")
        version = data.get("version", 1)
        if version == 1:
            data = migrate_v1(data, SCHEMA_VERSION)
        elif version != SCHEMA_VERSION:
            raise ValueError(
                f"{where} is a version-{version} plan; this Tessel reads versions 1 and "
                f"{SCHEMA_VERSION}: plan again with it."
            )
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "plan"
            raise ValueError(
                f"{where} is not a valid plan: {field}: "
                f"{first['msg'].removeprefix('Value error, ')}."
            ) from None


def _check_stage(index: int, stage: Stage) -> None:
    where = f"stage {index}"
    if stage.chunks and len(stage.chunks) != stage.virtual_chunks:
        raise ValueError(f"{where}: {len(stage.chunks)} chunks listed for virtual_chunks "
                         f"{stage.virtual_chunks}")
    if len(stage.mesh_axes) != len(stage.mesh_shape) or math.prod(stage.mesh_shape) != \
            stage.num_devices:
        raise ValueError(
            f"{where}: mesh_axes {stage.mesh_axes} x mesh_shape {stage.mesh_shape} must "
            f"name and hold its {stage.num_devices} devices"
        )
    if stage.layer_operators and len(stage.layer_operators) != stage.layers[1] - stage.layers[0]:
        raise ValueError(f"{where}: {len(stage.layer_operators)} layer_operators listed for "
                         f"layers {list(stage.layers)}")
    placements = list(stage.parameters.items())
    for operators in stage.shardings:
        placements += list(operators.inputs.items())
        for node, sharding in operators.nodes.items():
            placements += [(f"{node} input", p) for p in sharding.inputs]
            placements += [(f"{node} output", p) for p in sharding.outputs if p is not None]
    for name, text in placements:
        try:
            parsed = placement_pieces(text)
        except ValueError as error:
            raise ValueError(f"{where}: {name}: {error}") from None
        if len(parsed) != len(stage.mesh_shape):
            raise ValueError(
                f"{where}: {name}: placement {text!r} has {len(parsed)} entries, the mesh "
                f"{stage.mesh_shape} has {len(stage.mesh_shape)} axes"
            )
