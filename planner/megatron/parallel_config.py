"""The parallel configuration a Megatron-LM launch line runs, as Tessel's `ParallelConfig`.

The degrees, batches, pipeline stages (even, or sized by --decoder-first/last-pipeline-
num-layers), interleaving, recomputation, overlaps, precision, attention kernels and CUDA
graphs, with Megatron-LM's defaults for absent flags and the rules of its
`validate_args`, each error naming the flags as typed. Where Megatron-LM adjusts a
setting (with a warning) rather than refusing it, the same adjustment is made and said
in a note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.megatron.errors import LaunchLineError
from planner.megatron.pipeline_layout import chunk_layers
from planner.vocabulary.knobs import KNOBS, knob_value, spelt
from planner.vocabulary.parallel import CUDA_GRAPH_SCOPES, ParallelConfig

if TYPE_CHECKING:
    from planner.megatron.arguments import MegatronArgs
    from planner.models.config import TransformerConfig

def parallel_config(
    args: MegatronArgs, model: TransformerConfig, world: int, notes: list[str]
) -> tuple[ParallelConfig, list[int] | None, list[int] | None]:
    """The parallel configuration, resolved for `world` GPUs, the stages' layers and, where
    the embedding or the loss take a layer's place, each model chunk's layers in model
    order (chunk c on pipeline rank c % pipeline)."""
    v = args.values
    t, p, c, e = (_plain(args, name) for name in _DEGREE_KNOBS)
    data = _data_parallel(args, model, world, t, p, c, e)
    # A flag of the experts on a model without any is ignored by Megatron-LM: the knob
    # keeps its default, as a plan of the model has it.
    plain = {name: _plain(args, name) for name in PLAIN if name not in _DEGREE_KNOBS
             and (KNOBS[name].needs != "experts" or model.num_experts)}
    plain["sequence_parallel"] = _sequence_parallel(args, t, notes)
    micro = plain["micro_batch_size"]
    batch = args.count("global_batch_size") or micro * data  # Megatron-LM's default
    if not args.given("global_batch_size"):
        # validate_args: "setting global batch size to {micro x data}".
        notes.append(f"no {args.flag('global_batch_size')}: Megatron-LM takes micro batch "
                     f"{micro} x data-parallel size {data} = {batch}")
    if batch % (micro * data):
        raise LaunchLineError(
            f"{args.flag('global_batch_size')} {batch} must be divisible by "
            f"{args.flag('micro_batch_size')} {micro} x data-parallel size {data} = "
            f"{micro * data} ({world} GPUs / (tensor {t} x pipeline {p} x context {c})); "
            "change the batch or a degree")
    layers, chunks, virtual = _pipeline_split(args, model, p, batch // (micro * data))
    _check_overlaps(args, t, e, plain["sequence_parallel"])
    if args.values.delay_wgrad_compute and not args.values.overlap_moe_expert_parallel_comm:
        # megatron/core/transformer/transformer_config.py, __post_init__: "overlap_moe_
        # expert_parallel_comm must be enabled when enabling delay_wgrad_compute".
        raise LaunchLineError(
            f"{args.flag('delay_wgrad_compute')} delays weight gradients under the expert "
            "all-to-all overlap, which Megatron-Core requires with it; add "
            "--overlap-moe-expert-parallel-comm or drop it")
    dispatcher = _dispatcher(args, model, e, p, virtual)
    recompute, method, recompute_layers = _recomputation(
        args, layers or [model.num_layers // p], notes)
    _note_renamed_flags(args, notes)
    grads, moments = _optimizer_state(args)
    # The knobs a flag spells with its value (`PLAIN`), and those Megatron-LM's rules set
    # (the registry's engine spellings, each read below).
    config = ParallelConfig.of(
        **plain, tensor=t, pipeline=p, data=data, context=c, expert=e,
        expert_tensor=_expert_tensor(args, model, t), global_batch_size=batch,
        recompute=recompute, recompute_method=method, recompute_num_layers=recompute_layers,
        schedule="interleaved" if virtual > 1 else "1f1b", virtual_pipeline=virtual,
        precision=_precision(args, notes),
        fp8_recipe=v.fp8_recipe if v.fp8 is not None else "delayed",
        attention_backend=_attention(args),
        moe_token_dispatcher=dispatcher, cuda_graphs=_cuda_graphs(args),
        moe_expert_capacity_factor=_capacity(args),
        moe_pad_expert_input_to_capacity=bool(v.moe_pad_expert_input_to_capacity)
        and _capacity(args) is not None,
        cuda_graph_scope=_graph_scope(args),
        recompute_modules=tuple(v.recompute_modules or ("core_attn",)),
        main_grads_dtype=grads, exp_avg_dtype=moments,
        offload_optimizer=_optimizer_offload(args),
        offload_activation_layers=_offloaded_layers(args, model),
        fp8_param_gather=bool(v.fp8_param_gather) and v.fp8 is not None,
    )
    try:
        return config.resolve(world), layers, chunks
    except ValueError as error:
        raise LaunchLineError(f"the launch line's configuration on {world} GPUs: {error}") \
            from None


PLAIN = {name: spelling for name, spelling in spelt("megatron").items() if not spelling.engine}
"""The knobs a Megatron-LM flag spells by its value or a table of values (the registry's);
the others' flags are read by Megatron-LM's rules, below."""
_DEGREE_KNOBS = ("tensor", "pipeline", "context", "expert")


def _plain(args: MegatronArgs, name: str) -> Any:
    """Knob `name` as its flag gives it (`PLAIN`): a count bounded as `plan` bounds it, a
    switch, or a value; absent, the knob's default (Megatron-LM's too)."""
    spelling, knob = PLAIN[name], KNOBS[name]
    if knob.type == "int" and not spelling.switch:
        value = args.count(spelling.name, knob.most)
        return knob.default if value is None else value
    return knob_value(spelling, getattr(args.values, spelling.name))


def _expert_tensor(args: MegatronArgs, model: TransformerConfig, t: int) -> int | None:
    """--expert-tensor-parallel-size (Megatron-LM: the tensor size when absent); only a
    model with experts has one."""
    etp = args.count("expert_tensor_parallel_size")
    if etp is None:
        return None
    if not model.num_experts:
        raise LaunchLineError(
            f"{args.flag('expert_tensor_parallel_size')} {etp} splits experts, and the model "
            "has none; add --num-experts or drop it")
    return None if etp == t else etp


def _capacity(args: MegatronArgs) -> float | None:
    """--moe-expert-capacity-factor: a negative factor is Megatron-Core's "no cap"
    (TransformerConfig.__post_init__ sets it to None)."""
    factor = args.values.moe_expert_capacity_factor
    if factor is None or factor < 0 or not args.values.num_experts:
        return None
    if factor == 0:
        raise LaunchLineError(f"{args.flag('moe_expert_capacity_factor')} 0 drops every "
                              "token; give a positive factor (or none: dropless)")
    return factor


def _dispatcher(args: MegatronArgs, model: TransformerConfig, e: int, p: int,
                virtual: int) -> str:
    """--moe-token-dispatcher-type, with the legacy --moe-enable-deepep (flex through
    DeepEP) and Megatron-Core's rules for the flex backends and for
    --overlap-moe-expert-parallel-comm (megatron/core/transformer/transformer_config.py,
    __post_init__)."""
    v = args.values
    dispatcher = v.moe_token_dispatcher_type
    if v.moe_enable_deepep and model.num_experts:
        if dispatcher != "flex":
            raise LaunchLineError(
                f"{args.flag('moe_enable_deepep')} runs DeepEP, which Megatron-Core reaches "
                "only through --moe-token-dispatcher-type flex; add it")
        if v.moe_flex_dispatcher_backend == "hybridep" and args.given(
                "moe_flex_dispatcher_backend"):
            raise LaunchLineError(
                f"{args.flag('moe_enable_deepep')} and {args.flag('moe_flex_dispatcher_backend')}"
                " hybridep name two backends; keep --moe-flex-dispatcher-backend")
    if not v.overlap_moe_expert_parallel_comm or not model.num_experts:
        return dispatcher
    flag = args.flag("overlap_moe_expert_parallel_comm")
    problems = [why for broken, why in (
        (e == 1, "expert parallelism (--expert-model-parallel-size above 1)"),
        (dispatcher not in ("alltoall", "flex"), "the alltoall or flex token dispatcher"),
        (v.recompute_granularity == "full", "no full recomputation"),
        ("moe" in (v.recompute_modules or ()), "no moe among --recompute-modules"),
        (not (v.bf16 or v.fp16), "--bf16 or --fp16"),
        (p > 1 and virtual == 1 and not args.given("num_layers_per_virtual_pipeline_stage")
         and not args.given("num_virtual_stages_per_pipeline_rank")
         and not args.given("pipeline_model_parallel_layout"),
         "virtual pipeline stages when the pipeline is split"),
        (model.mtp_num_layers > 1, "at most one --mtp-num-layers"),
    ) if broken]
    if problems:
        raise LaunchLineError(f"{flag} needs {'; '.join(problems)}, as Megatron-Core requires; "
                              "change the line or drop it")
    return dispatcher


_DEGREES = tuple(PLAIN[name].name for name in _DEGREE_KNOBS)


def _data_parallel(
    args: MegatronArgs, model: TransformerConfig, world: int, t: int, p: int, c: int, e: int
) -> int:
    """Megatron-LM's data-parallel size, the degrees checked as it checks them."""
    tf, pf, cf, ef = (args.flag(dest) for dest in _DEGREES)
    if world % (t * p * c):
        raise LaunchLineError(
            f"the {world} GPUs are not divisible by {tf} {t} x {pf} {p} x {cf} {c} = "
            f"{t * p * c} (Megatron-LM's data-parallel size must be whole); change a degree "
            "or the GPU count")
    if e > 1 and not model.num_experts:
        raise LaunchLineError(f"{ef} {e} needs experts; add --num-experts or drop it")
    if e > 1 and model.num_experts and model.num_experts % e:
        raise LaunchLineError(
            f"{ef} {e} must divide --num-experts {model.num_experts}; choose a divisor")
    if c > 1 and model.seq_length % (2 * c):
        raise LaunchLineError(
            f"--seq-length {model.seq_length} must be a multiple of 2 x {cf} {c} = {2 * c}, "
            "which Megatron-LM requires; change either")
    return world // (t * p * c)


def _sequence_parallel(args: MegatronArgs, t: int, notes: list[str]) -> bool:
    """--sequence-parallel as Megatron-LM runs it: off at tensor size 1, with a note
    (megatron/training/arguments.py, validate_args: "Disabling sequence parallelism
    because tensor model parallelism is disabled"), which NVIDIA's own
    examples/llama/train_llama3_8b_h100_fp8.sh relies on."""
    if not args.values.sequence_parallel or t > 1:
        return bool(args.values.sequence_parallel)
    notes.append(f"{args.flag('sequence_parallel')} is off: Megatron-LM turns it off at "
                 f"{args.flag('tensor_model_parallel_size')} 1 (it shards over the "
                 "tensor-parallel group)")
    return False


def _check_overlaps(args: MegatronArgs, t: int, e: int, sequence_parallel: bool) -> None:
    """Sequence parallelism (`sequence_parallel`, as `_sequence_parallel` left it) and the
    overlaps, by Megatron-LM's rules."""
    v, tf = args.values, args.flag("tensor_model_parallel_size")
    if e > 1 and t > 1 and not sequence_parallel:
        raise LaunchLineError(
            f"{args.flag('expert_model_parallel_size')} {e} with {tf} {t} needs "
            "--sequence-parallel, which Megatron-LM requires with expert and tensor "
            "parallelism; add it")
    overlap = args.flag("tp_comm_overlap")
    if v.tp_comm_overlap and v.sequence_parallel and not sequence_parallel:
        raise LaunchLineError(
            f"{overlap} needs sequence parallelism, which Megatron-LM turns off at {tf} 1; "
            "drop the overlap or raise the tensor size")
    if v.tp_comm_overlap and not sequence_parallel:
        raise LaunchLineError(
            f"{overlap} needs --sequence-parallel (Megatron-LM overlaps its all-gathers and "
            "reduce-scatters only); add it or drop the overlap")
    if v.overlap_param_gather and not (v.use_distributed_optimizer and v.overlap_grad_reduce):
        raise LaunchLineError(
            f"{args.flag('overlap_param_gather')} needs --use-distributed-optimizer and "
            "--overlap-grad-reduce, as Megatron-LM requires; add them or drop it")


def _stage_layers(args: MegatronArgs, num_layers: int, p: int) -> list[int] | None:
    """Each stage's layers when --decoder-first/last-pipeline-num-layers make them uneven
    (the rest split evenly over the middle stages); None for Megatron-LM's even split."""
    first = args.count("decoder_first_pipeline_num_layers")
    last = args.count("decoder_last_pipeline_num_layers")
    pipeline = args.flag("pipeline_model_parallel_size")
    if first is None and last is None:
        if num_layers % p:
            raise LaunchLineError(
                f"--num-layers {num_layers} must be divisible by {pipeline} {p}, unless "
                "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers "
                "size the end stages; change one")
        return None
    given = [f for f in (first, last) if f is not None]
    ends = " and ".join(args.flag(d) for d in ("decoder_first_pipeline_num_layers",
                                                "decoder_last_pipeline_num_layers")
                        if args.given(d))
    middle_stages, middle_layers = p - len(given), num_layers - sum(given)
    if p == 1 or middle_layers < 0 or bool(middle_stages) != bool(middle_layers) or (
            middle_stages and middle_layers % middle_stages):
        raise LaunchLineError(
            f"{ends} leave {middle_layers} of --num-layers {num_layers} for "
            f"{middle_stages} middle stages of {pipeline} {p}; Megatron-LM needs them to "
            "split evenly (and a pipeline to split); change the stage sizes")
    middle = [middle_layers // middle_stages] * middle_stages if middle_stages else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None
                                                              else [])


def _pipeline_split(
    args: MegatronArgs, model: TransformerConfig, p: int, micro_batches: int
) -> tuple[list[int] | None, list[int] | None, int]:
    """(layers per stage, layers per model chunk, virtual stages): from the layout string,
    the embedding and loss counted as layers, or the end stages' sizes; None for
    Megatron-LM's even split (and chunks of equal size)."""
    num_layers = model.num_layers
    if args.given("pipeline_model_parallel_layout"):
        chunks = _layout_chunks(args, model, p)
        virtual = len(chunks) // p
        if virtual > 1:
            _check_interleaving(args, "pipeline_model_parallel_layout", p, micro_batches)
        return [sum(chunks[rank::p]) for rank in range(p)], chunks, virtual
    slots = num_layers + _accounted(args)
    if slots == num_layers:
        layers = _stage_layers(args, num_layers, p)
        return layers, None, _virtual_stages(args, slots, p, layers, micro_batches)
    virtual = _virtual_stages(args, slots, p, None, micro_batches)
    chunks = _accounted_chunks(args, num_layers, p, virtual)
    return [sum(chunks[rank::p]) for rank in range(p)], chunks, virtual


def _layout_chunks(args: MegatronArgs, model: TransformerConfig, p: int) -> list[int]:
    """Each model chunk's layers as --pipeline-model-parallel-layout gives them, checked
    as Megatron-LM checks them (the MTP layers, `m`, as many as --mtp-num-layers, in the
    last chunk)."""
    num_layers = model.num_layers
    flag = args.flag("pipeline_model_parallel_layout")
    layout = args.values.pipeline_model_parallel_layout
    others = [args.flag(dest) for dest in (
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
        *_ACCOUNTED, "num_layers_per_virtual_pipeline_stage",
        "num_virtual_stages_per_pipeline_rank") if args.given(dest)]
    if others:
        raise LaunchLineError(f"{flag} places every layer, so {' and '.join(others)} cannot "
                              "split them too, as Megatron-LM requires; keep the layout")
    try:
        chunks = chunk_layers(layout, model.mtp_num_layers)
    except ValueError as error:
        raise LaunchLineError(f"{flag} {layout!r} {error}; fix the layout") from None
    pipeline = args.flag("pipeline_model_parallel_size")
    if len(chunks) % p:
        raise LaunchLineError(
            f"{flag} {layout!r} has {len(chunks)} stages, not a multiple of {pipeline} {p}; "
            "give one group of layers per pipeline stage and virtual stage")
    if sum(chunks) != num_layers:
        raise LaunchLineError(
            f"{flag} {layout!r} places {sum(chunks)} transformer layers, not --num-layers "
            f"{num_layers}; make them agree")
    return chunks


_ACCOUNTED = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def _accounted(args: MegatronArgs) -> int:
    """Pipeline slots the embedding and the loss take (Megatron-Core counts each as one
    layer of the first and the last model chunk when its flag is given)."""
    return sum(bool(getattr(args.values, dest)) for dest in _ACCOUNTED)


def _accounted_chunks(args: MegatronArgs, num_layers: int, p: int, virtual: int) -> list[int]:
    """Each model chunk's decoder layers when the embedding and/or loss count as layers
    (Megatron-Core's `get_num_layers_to_build`): the layers plus those slots split evenly
    over pipeline x virtual chunks, the first chunk one short for the embedding and the
    last one short for the loss."""
    given = [args.flag(dest) for dest in _ACCOUNTED if getattr(args.values, dest)]
    ends = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
    sized = [args.flag(dest) for dest in ends if args.given(dest)]
    if sized:
        raise LaunchLineError(
            f"{' and '.join(given)} with {' and '.join(sized)} size the end stages twice, "
            "which Megatron-LM refuses; keep one")
    slots = num_layers + len(given)
    chunks = p * virtual
    if slots % chunks:
        pipeline = args.flag("pipeline_model_parallel_size")
        raise LaunchLineError(
            f"--num-layers {num_layers} plus the {len(given)} layer(s) {' and '.join(given)} "
            f"add(s) must split evenly over {pipeline} {p} x {virtual} virtual stage(s), as "
            "Megatron-LM requires; change the layers, the pipeline or the virtual stages")
    size = slots // chunks
    sizes = [size] * chunks
    if args.values.account_for_embedding_in_pipeline_split:
        sizes[0] -= 1
    if args.values.account_for_loss_in_pipeline_split:
        sizes[-1] -= 1
    return sizes


def _virtual_stages(
    args: MegatronArgs, num_layers: int, p: int, layers: list[int] | None, micro_batches: int
) -> int:
    """Model chunks per pipeline rank (1: no interleaving), by Megatron-LM's rules."""
    per_chunk = args.count("num_layers_per_virtual_pipeline_stage")
    chunks = args.count("num_virtual_stages_per_pipeline_rank")
    if per_chunk is None and chunks is None:
        return 1
    flag = args.flag("num_layers_per_virtual_pipeline_stage" if per_chunk is not None
                     else "num_virtual_stages_per_pipeline_rank")
    if per_chunk is not None and chunks is not None:
        raise LaunchLineError(
            "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-"
            "rank both set the virtual stages, and Megatron-LM takes one; keep one")
    if layers is not None:
        raise LaunchLineError(
            f"{flag} with uneven stages (--decoder-first/last-pipeline-num-layers) is not "
            "priced by Tessel yet; drop one of the two")
    per_stage = num_layers // p
    if per_chunk is not None:
        if per_stage % per_chunk:
            raise LaunchLineError(
                f"{flag} {per_chunk} must divide the {per_stage} layers of each of the "
                f"{p} pipeline stages; choose a divisor of {per_stage}")
        chunks = per_stage // per_chunk
    assert chunks is not None
    if chunks == 1:
        return 1  # one chunk per rank: Megatron-LM runs plain 1F1B
    if per_stage % chunks:
        raise LaunchLineError(
            f"{flag} {chunks} must divide the {per_stage} layers of each pipeline stage; "
            f"choose a divisor of {per_stage}")
    _check_interleaving(args, "num_layers_per_virtual_pipeline_stage" if per_chunk is not None
                        else "num_virtual_stages_per_pipeline_rank", p, micro_batches)
    return chunks


def _check_interleaving(args: MegatronArgs, dest: str, p: int, micro_batches: int) -> None:
    """Megatron-LM's rules for the interleaved schedule that `dest` asked for."""
    flag = args.flag(dest)
    least = 2 if args.values.overlap_p2p_comm else 3
    if p < least:
        raise LaunchLineError(
            f"{flag} interleaves pipeline stages, and --pipeline-model-parallel-size {p} "
            f"needs to be at least {least}"
            + ("" if args.values.overlap_p2p_comm else " without p2p overlap")
            + f"; raise it or drop {flag}")
    if micro_batches % p:
        raise LaunchLineError(
            f"{flag}: the interleaved schedule needs the {micro_batches} micro-batches per "
            f"step (global batch / (micro batch x data-parallel size)) to be a multiple of "
            f"--pipeline-model-parallel-size {p}; change the batch or the pipeline")


def _recomputation(
    args: MegatronArgs, stage_layers: list[int], notes: list[str]
) -> tuple[str, str, int]:
    """(recompute, method, layers) as Megatron-LM's recomputation flags set them."""
    v = args.values
    granularity = v.recompute_granularity
    selective = args.flag("recompute_activations")
    overridden = bool(v.recompute_activations) and granularity == "full"
    if v.recompute_activations:
        # validate_args: --recompute-activations sets the granularity to selective, over
        # whatever --recompute-granularity says.
        if overridden:
            notes.append(f"{selective} makes the recomputation selective, over "
                         f"{args.flag('recompute_granularity')} full, as Megatron-LM does")
        granularity = "selective"
    method, count = v.recompute_method, v.recompute_num_layers
    if granularity != "full":
        for dest, value in (("recompute_method", method), ("recompute_num_layers", count)):
            if value is not None:
                raise LaunchLineError(
                    f"{args.flag(dest)} applies only with --recompute-granularity full, "
                    + (f"which {selective} turns selective, as Megatron-LM does; drop one "
                       "of them" if overridden
                       else "which Megatron-LM requires; add it or drop the flag"))
        return granularity or "none", "uniform", 1
    if method is None or count is None:
        raise LaunchLineError(
            f"{args.flag('recompute_granularity')} full needs --recompute-method (uniform or "
            "block) and --recompute-num-layers N, which Megatron-LM requires; add both, e.g. "
            "--recompute-method uniform --recompute-num-layers 1")
    most = min(stage_layers)
    if not 1 <= count <= most:
        raise LaunchLineError(
            f"{args.flag('recompute_num_layers')} {count} must be from 1 to the {most} "
            "layers of a pipeline stage; change it")
    return "full", method, count


def _offloaded_layers(args: MegatronArgs, model: TransformerConfig) -> int:
    """--cpu-offloading-num-layers: 0 (Megatron-LM's default) offloads none; Megatron-Core
    takes fewer than the model's layers (TransformerConfig.__post_init__)."""
    layers = args.values.cpu_offloading_num_layers or 0
    if not 0 <= layers < model.num_layers:
        raise LaunchLineError(
            f"{args.flag('cpu_offloading_num_layers')} {layers} must be from 0 to "
            f"{model.num_layers - 1} (fewer than the model's layers)")
    return layers


def _optimizer_offload(args: MegatronArgs) -> str:
    """--optimizer-cpu-offload: the optimizer's state and step on the CPU, which Megatron-LM
    runs only with --use-precision-aware-optimizer (validate_args)."""
    if not args.values.optimizer_cpu_offload:
        return "none"
    if not args.values.use_precision_aware_optimizer:
        raise LaunchLineError(
            f"{args.flag('optimizer_cpu_offload')} needs --use-precision-aware-optimizer, "
            "whose code path Megatron-LM's hybrid device optimizer reuses; add it")
    return "cpu"


def _optimizer_state(args: MegatronArgs) -> tuple[str, str]:
    """(main-gradient dtype, Adam-moment dtype), as --grad-reduce-in-bf16 and the
    precision-aware optimizer's dtype flags set them (Megatron-LM reads the dtypes only
    with --use-precision-aware-optimizer)."""
    v = args.values
    typed = [args.flag(d) for d in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
             if args.given(d) and getattr(v, d) != args.defaults.get(d)]
    if typed and not v.use_precision_aware_optimizer:
        raise LaunchLineError(
            f"{' and '.join(typed)} apply only with --use-precision-aware-optimizer, which "
            "Megatron-LM requires; add it or drop them")
    if v.exp_avg_dtype != v.exp_avg_sq_dtype:
        raise LaunchLineError(
            f"{args.flag('exp_avg_dtype')} {v.exp_avg_dtype} and {args.flag('exp_avg_sq_dtype')} "
            f"{v.exp_avg_sq_dtype} differ; Tessel prices both moments in one dtype, give both "
            "the same")
    grads = "bf16" if v.grad_reduce_in_bf16 or v.main_grads_dtype == "bf16" else "fp32"
    return grads, v.exp_avg_dtype


# Deprecated flags Megatron-LM still reads, with a warning, as the newer flag's value.
_RENAMED = {
    # validate_args
    "enable_cuda_graph": "--cuda-graph-impl local",
    "external_cuda_graph": "--cuda-graph-impl transformer_engine",
    "cuda_graph_scope_deprecated": "--cuda-graph-modules",
    # megatron/core/transformer/transformer_config.py, __post_init__
    "moe_enable_deepep": "--moe-flex-dispatcher-backend deepep",
}


def _note_renamed_flags(args: MegatronArgs, notes: list[str]) -> None:
    """A note for each deprecated flag given, read as Megatron-LM reads it (`_RENAMED`),
    and for the retired "full" CUDA-graph scope (TransformerConfig.__post_init__: "full
    scope is deprecated", the whole layer either way)."""
    for dest, newer in _RENAMED.items():
        if getattr(args.values, dest):
            notes.append(f"{args.flag(dest)} is deprecated: Megatron-LM reads it as {newer}")
    if "full" in (args.values.cuda_graph_scope_deprecated or ()):
        notes.append(f"{args.flag('cuda_graph_scope_deprecated')} full is deprecated: "
                     "Megatron-LM graphs whole layers, as with no scope")


def _precision(args: MegatronArgs, notes: list[str]) -> str:
    v = args.values
    if v.bf16 and v.fp16:
        raise LaunchLineError("--bf16 and --fp16 both given, which Megatron-LM refuses; "
                              "keep one")
    if v.fp8 is not None:
        if not v.bf16:
            raise LaunchLineError(
                f"{args.flag('fp8')} {v.fp8} without --bf16: Tessel prices fp8 matmuls with "
                "bf16 elsewhere; add --bf16")
        return "fp8"
    if v.bf16:
        return "bf16"
    if v.fp16:
        return "fp16"
    notes.append("no --bf16 or --fp16: Megatron-LM trains in fp32")
    return "fp32"


def _attention(args: MegatronArgs) -> str:
    v = args.values
    backend = v.attention_backend
    if v.use_flash_attn:
        if backend not in ("auto", "flash"):
            raise LaunchLineError(
                f"{args.flag('use_flash_attn')} and {args.flag('attention_backend')} "
                f"{backend} name two attention kernels; keep one")
        return "flash"
    if backend == "auto" and v.transformer_impl == "local":
        return "local"  # Megatron-LM's own layers compute attention with its own kernels
    return backend


def _cuda_graphs(args: MegatronArgs) -> bool:
    v = args.values
    legacy = [args.flag(d) for d in ("enable_cuda_graph", "external_cuda_graph")
              if getattr(v, d)]
    if len(legacy) == 2 or (legacy and v.cuda_graph_impl != "none"):
        others = legacy + ([args.flag("cuda_graph_impl")] if v.cuda_graph_impl != "none"
                           else [])
        raise LaunchLineError(
            f"{' and '.join(others)} each choose CUDA graphs, which Megatron-LM refuses "
            "together; keep one")
    return (bool(legacy) or v.cuda_graph_impl != "none") and not _graph_scope(args)


def _graph_scope(args: MegatronArgs) -> tuple[str, ...]:
    """--cuda-graph-modules' parts of a layer (or the deprecated --cuda-graph-scope's,
    which validate_args copies into it), where they are not whole layers ("full" or
    "full_iteration", or none, graph whole layers)."""
    dest = "cuda_graph_modules" if args.given("cuda_graph_modules") \
        else "cuda_graph_scope_deprecated"
    scope = tuple(getattr(args.values, dest) or ())
    if not scope or {"full", "full_iteration"} & set(scope):
        return ()
    unknown = [part for part in scope if part not in CUDA_GRAPH_SCOPES]
    if unknown:
        raise LaunchLineError(
            f"{args.flag(dest)} {' '.join(unknown)} is not a part "
            f"Tessel prices; use {', '.join(CUDA_GRAPH_SCOPES)}")
    return scope
