"""Parallel knobs on the command line, under Megatron-LM's flag names.

A knob given on the command line is fixed; the search chooses the rest, also when the
degrees and micro-batch are all given (`plan predict` prices a launch line with
Megatron-LM's literal defaults).
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.cli.errors import UsageError
from planner.cli.parsing import whole
from planner.cli.run_flags import positive
from planner.vocabulary.cluster import MAX_DEVICES
from planner.search.knobs import FLAG
from planner.vocabulary.parallel import (
    ATTENTION_BACKENDS,
    CUDA_GRAPH_SCOPES,
    ENGINES,
    FixedKnobs,
    FP8_RECIPES,
    MOE_DISPATCHERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    SCHEDULES,
)
from planner.search.megatron_space import MAX_GPUS

# Largest global batch: 16M sequences, far past any run (Llama 3 405B: 16M tokens).
MAX_GLOBAL_BATCH = 1 << 24
# Most plans --top lists.
MAX_TOP = 100

# Megatron-LM flag -> ParallelConfig field, for the knobs that take a number.
_NUMBER_FLAGS = {
    FLAG[field]: field for field in ("tensor", "pipeline", "context", "expert", "micro_batch_size")
}


# The dataclass's attribute docstrings, which argparse cannot read, as CLI help.
_FIELD_HELP = {
    "tensor": "Tensor-parallel degree.",
    "pipeline": "Pipeline-parallel degree.",
    "context": "Context-parallel degree (the sequence split over GPUs).",
    "expert": "Expert-parallel degree for mixture-of-experts layers.",
    "micro_batch_size": "Sequences per micro-batch on one data-parallel rank.",
}


def add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    """Cluster size, batch and every parallel knob, each defaulting to 'search it'."""
    group = parser.add_argument_group(
        "training plan (give --gpus; knobs given are fixed, the rest are searched)"
    )
    actions: list[argparse.Action] = []

    def add(*names: str, **options: Any) -> None:
        actions.append(group.add_argument(*names, **options))

    add("--gpus", type=whole(1, MAX_GPUS),
                       help="GPUs to train on (from --cluster's nodes)")
    add("--global-batch-size", type=whole(1, MAX_GLOBAL_BATCH),
                       help="sequences per optimizer step")
    for flag, name in _NUMBER_FLAGS.items():
        add(flag, dest=name, type=whole(1, MAX_DEVICES), default=None,
                           help=_FIELD_HELP[name])
    add(
        "--zero-stage", dest="zero_stage", type=int, choices=(0, 1, 2, 3), default=None,
        help="ZeRO stage 0-3 (1 is Megatron-LM's distributed optimizer)",
    )
    add(
        "--recompute-granularity", dest="recompute", choices=RECOMPUTE, default=None,
        help="activation recomputation: none, selective (attention core) or full",
    )
    add(
        "--sequence-parallel", dest="sequence_parallel", action=argparse.BooleanOptionalAction,
        default=None, help="shard norms and dropout over the tensor-parallel group (--no-... "
        "fixes it off)",
    )
    add(
        "--use-distributed-optimizer", dest="distributed_optimizer", action="store_true",
        help="shard optimizer state over data-parallel ranks (ZeRO stage 1)",
    )
    add(
        "--num-layers-per-virtual-pipeline-stage", dest="layers_per_virtual_stage",
        type=whole(1, MAX_DEVICES),
        help="layers per model chunk: the interleaved 1F1B schedule",
    )
    add("--schedule", choices=SCHEDULES, help="pipeline schedule")
    add(
        "--overlap-grad-reduce", dest="overlap_grad_reduce",
        action=argparse.BooleanOptionalAction, default=None,
        help="reduce gradients in buckets during the backward pass (--no-... fixes it off)",
    )
    add(
        "--precision", choices=PRECISIONS, default=None,
        help="matmul precision (default bf16, fp16 on a device without bf16 such as V100; "
        "fp8 needs fp8 tensor cores, e.g. H100)",
    )
    add(
        "--overlap-param-gather", dest="overlap_param_gather",
        action=argparse.BooleanOptionalAction, default=None,
        help="gather the distributed optimizer's weights during the next forward (--no-... "
        "fixes it off)",
    )
    add(
        "--tp-comm-overlap", dest="tp_comm_overlap", action=argparse.BooleanOptionalAction,
        default=None, help="overlap tensor-parallel communication with matmuls (Transformer "
        "Engine userbuffers; needs --sequence-parallel; --no-... fixes it off)",
    )
    add(
        "--attention-backend", dest="attention_backend", choices=ATTENTION_BACKENDS,
        default=None, help="attention kernels: flash or fused keep no score matrix; local "
        "(Megatron-LM's own, fused softmax) and unfused write the s x s scores; auto "
        "(default): flash where the device runs it",
    )
    add(
        "--recompute-method", dest="recompute_method", choices=RECOMPUTE_METHODS,
        default=None, help="with --recompute-granularity full: uniform (every group of "
        "--recompute-num-layers layers checkpointed) or block (only that many layers per "
        "stage recomputed)",
    )
    add(
        "--recompute-num-layers", dest="recompute_num_layers", type=whole(1, MAX_DEVICES),
        default=None, help="layers per checkpointed group (uniform) or recomputed layers "
        "per stage (block)",
    )
    add(
        "--fp8-recipe", dest="fp8_recipe", choices=FP8_RECIPES, default=None,
        help="with --precision fp8: how scales are found (delayed, tensorwise = current "
        "scaling, mxfp8 on Blackwell, blockwise)",
    )
    add(
        "--moe-token-dispatcher-type", dest="moe_token_dispatcher", choices=MOE_DISPATCHERS,
        default=None, help="how tokens reach their experts (default: searched)",
    )
    add(
        "--moe-router-force-load-balancing", dest="moe_router_force_load_balancing",
        action="store_true", default=None,
        help="route tokens to experts evenly by a fixed rule, whatever the router scores "
        "(all-to-all bytes then known in advance; plan check compares them exactly)",
    )
    add(
        "--expert-tensor-parallel-size", dest="expert_tensor", type=whole(1, MAX_DEVICES),
        default=None, help="tensor-parallel degree inside each expert (default: searched; "
        "the tensor degree, or 1 with experts folded over the stage's ranks)",
    )
    add(
        "--overlap-moe-expert-parallel-comm", dest="overlap_moe_expert_parallel_comm",
        action="store_true", default=None,
        help="overlap each micro-batch's expert all-to-alls with another's compute "
        "(needs --expert-model-parallel-size above 1, the alltoall or flex dispatcher and, "
        "with pipeline stages, the interleaved schedule)",
    )
    add(
        "--moe-expert-capacity-factor", dest="moe_expert_capacity_factor",
        type=positive, default=None,
        help="tokens an expert takes, as a multiple of an even share; the rest are dropped "
        "(default: no cap)",
    )
    add(
        "--cuda-graph-scope", dest="cuda_graph_scope", nargs="+", choices=CUDA_GRAPH_SCOPES,
        default=None, help="parts of each layer in CUDA graphs (Megatron-LM's; "
        "moe_preprocess runs the dispatcher without its host copy)",
    )
    add(
        "--cuda-graph-impl", dest="cuda_graph_impl",
        choices=("none", "local", "transformer_engine"), default=None,
        help="capture each layer in CUDA graphs (local or transformer_engine), so small "
        "kernels are not bound by the host's launches; none (default) leaves them eager",
    )
    add(
        "--engine", choices=ENGINES, default=None,
        help="the engine that will run the plan, whose choices its time and memory follow "
        "(default megatron; torchtitan: FSDP2, sequence parallelism with tensor "
        "parallelism, per-tensor fp8, so that --emit torchtitan writes what was priced)",
    )
    add(
        "--intra-op", choices=("analytic", "ilp"), default="analytic",
        help="how a zoo or hf: transformer is planned: analytic (Megatron-LM's layouts, "
        "priced by the transformer's shape) or ilp (its traced graph planned as any "
        "model's: each layer's operators sharded by the intra-op ILP on every logical "
        "mesh, stages chosen by the stage DP)",
    )
    add("--top", type=whole(1, MAX_TOP), default=5,
                       help="plans to list (default 5)")
    add(
        "--space", choices=("auto", "megatron"), default="auto",
        help="auto: stages may differ in size and mesh (Alpa); megatron: only layouts "
        "Megatron-LM runs",
    )
    # (flag, dest, default) of each, so that a plan on --mesh can refuse them by name.
    parser.set_defaults(training_flags=tuple(
        (action.option_strings[0], action.dest, action.default) for action in actions
    ))


def training_flags_given(args: argparse.Namespace) -> list[str]:
    """The training-plan flags the command line set, as typed (their long form)."""
    return [flag for flag, dest, default in args.training_flags
            if getattr(args, dest) != default]


def fixed_knobs(args: argparse.Namespace, num_layers: int) -> FixedKnobs:
    """The ParallelConfig fields the command line fixed (the others searched)."""
    knobs = {name: getattr(args, name) for name in _NUMBER_FLAGS.values()}
    knobs["zero_stage"] = args.zero_stage
    knobs["recompute"] = args.recompute
    knobs["sequence_parallel"] = args.sequence_parallel
    knobs["schedule"] = args.schedule
    knobs["overlap_grad_reduce"] = args.overlap_grad_reduce
    knobs["precision"] = args.precision
    for name in ("overlap_param_gather", "tp_comm_overlap", "attention_backend",
                 "recompute_method", "recompute_num_layers", "fp8_recipe",
                 "moe_token_dispatcher", "moe_router_force_load_balancing", "engine",
                 "expert_tensor", "overlap_moe_expert_parallel_comm",
                 "moe_expert_capacity_factor"):
        knobs[name] = getattr(args, name)
    if args.cuda_graph_scope is not None:
        knobs["cuda_graph_scope"] = tuple(args.cuda_graph_scope)
    if args.cuda_graph_impl is not None:
        knobs["cuda_graphs"] = args.cuda_graph_impl != "none"
    if args.distributed_optimizer:
        if args.zero_stage not in (None, 1):
            raise UsageError(
                f"--use-distributed-optimizer is ZeRO stage 1 but --zero-stage is "
                f"{args.zero_stage}; give one of the two"
            )
        knobs["zero_stage"] = 1
    if args.layers_per_virtual_stage is not None:
        pipeline = args.pipeline
        if not pipeline:
            raise UsageError(
                "--num-layers-per-virtual-pipeline-stage needs "
                "--pipeline-model-parallel-size; give both"
            )
        per_stage, rest = divmod(num_layers, pipeline)
        chunk = args.layers_per_virtual_stage
        if rest or per_stage % chunk or per_stage == chunk:
            raise UsageError(
                f"--num-layers-per-virtual-pipeline-stage {chunk} must divide the "
                f"{num_layers} / {pipeline} layers of each stage into two or more chunks"
            )
        if args.schedule not in (None, "interleaved"):
            raise UsageError(
                f"--num-layers-per-virtual-pipeline-stage is the interleaved schedule, not "
                f"--schedule {args.schedule}; give one of the two"
            )
        knobs["virtual_pipeline"] = per_stage // chunk
        knobs["schedule"] = "interleaved"
    if args.schedule == "dualpipev":  # two chunks per stage, in V order
        knobs["virtual_pipeline"] = 2
    return FixedKnobs(knobs)
