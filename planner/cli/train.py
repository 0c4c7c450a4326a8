"""`plan MODEL --cluster C --gpus N --global-batch-size B [knobs]`: the training plan.

With tensor, pipeline and micro-batch size given, the configuration is predicted as is
(a what-if); otherwise the search chooses the knobs not given. Either way the output is a
table of plans with their predicted numbers, the best plan's Megatron-LM launch flags, and
with --json the `Plan` of the best (`planner/vocabulary/plan.py`).
"""

from __future__ import annotations

import itertools
import argparse
import shlex
from typing import TYPE_CHECKING, Callable

from rich.console import Console
from rich.table import Table

from planner.cli.emit_flags import check_emit_flags
from planner.cli.errors import UsageError
from planner.cli.model_args import load
from planner.cli.output import shell_lines
from planner.cli.parallel_flags import fixed_knobs
from planner.cli.network_report import print_network, with_network_if_asked
from planner.cli.report_flags import write_report_if_asked
from planner.cli.run_flags import objective_key, wants_totals
from planner.cli.whole_run import emit_totals_and_json, fewer_gpu_plans, with_totals
from planner.vocabulary.cluster import Cluster
from planner.search.knobs import FLAG, check_knobs, default_precision
from planner.vocabulary.parallel import (
    ADAPTER_FINETUNES,
    KNOB_NAMES,
    OFFLOAD_KNOBS,
    FixedKnobs,
    ParallelConfig,
)
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import plan_value
from planner.vocabulary.plan import Plan
from planner.plans.transformer_plan import plan_training

if TYPE_CHECKING:
    from planner.models.sources import LoadedModel
    from planner.search.megatron_space import SearchResult


def run_training(args: argparse.Namespace, cluster: Cluster, console: Console) -> int:
    """Predict (all of tensor, pipeline and micro-batch given) or search, print the plans
    and write the best as JSON. Every knob is checked against the model and the cluster
    before any search; UsageError when the best plan does not fit or nothing does."""
    check_emit_flags(args)
    loaded = load(args)
    # A model of one's own, or a transformer whose operators the intra-op ILP shards: its
    # traced graph is planned.
    if loaded.config is None or args.intra_op == "ilp":
        from planner.cli.graph import run_graph_training

        return run_graph_training(args, loaded, cluster, console)
    if args.engine == "tessel":  # Tessel's runtime trains the model transformers builds
        loaded = as_transformers_build_it(loaded, console)
    plans, model, _ = plan_from_flags(args, cluster, console, loaded=loaded)
    totals = wants_totals(args)
    if totals:
        plans = with_totals(plans, model, cluster, args)

        def search(gpus: int) -> tuple[list[Plan], TransformerConfig]:
            fewer = argparse.Namespace(**{**vars(args), "gpus": gpus})
            found, shape, _ = plan_from_flags(fewer, cluster, console, loaded=loaded)
            return found, shape

        plans += fewer_gpu_plans(args, cluster, search)
        if args.objective:
            plans = sorted(plans, key=objective_key(args.objective))[:args.top]
    print_training_plans(plans, console)
    warn_slow_nvme(plans[0], cluster, console)
    plans[0] = with_network_if_asked(args, plans[0], model, cluster)
    emit_totals_and_json(args, plans, model, console, totals)
    _refuse_what_does_not_fit(plans[0], cluster.with_devices(args.gpus))
    write_report_if_asked(args, plans, model, cluster, console, layout)
    print_network(plans[0], console)
    return 0


def plan_from_flags(
    args: argparse.Namespace, cluster: Cluster, console: Console, top: int | None = None,
    loaded: LoadedModel | None = None,
) -> tuple[list[Plan], TransformerConfig, LoadedModel]:
    """The best plans (at most `top`, default --top) for the command line's model, cluster
    and knobs, best first, the model's shape and the model as loaded."""
    if args.global_batch_size is None:
        raise UsageError("--gpus needs --global-batch-size (sequences per optimizer step)")
    try:
        cluster = cluster.with_devices(args.gpus)
    except ValueError as error:
        raise UsageError(f"--gpus {args.gpus}: {error}") from None
    loaded = loaded or load(args)
    model = transformer_config(loaded)
    knobs = deepspeed_degrees(args, fixed_knobs(args, model.num_layers), console)
    check_knobs(knobs, model, cluster, args.global_batch_size, args.space)
    if "precision" not in knobs:
        knobs = knobs.but(precision=default_precision(cluster))
    # Knobs not given are searched, also when the degrees and micro-batch are all given
    # (`plan predict` is where a launch line's literal defaults are priced).
    plans, result = _plan_with_progress(args, model, cluster, knobs, top or args.top,
                                        _parameter_names(loaded), console)
    if not plans:
        raise UsageError(_no_fit(args, model, cluster, knobs)
                         + _cheapest_relaxation(args, model, cluster, knobs))
    console.print(f"searched {result.evaluated:,} configurations in "
                  + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s"
                              for k, v in result.timings.items()),
                  highlight=False)
    return plans, model, loaded


def deepspeed_degrees(args: argparse.Namespace, knobs: FixedKnobs,
                      console: Console) -> FixedKnobs:
    """`knobs`, with tensor, pipeline and expert parallelism fixed off where `--emit`
    writes DeepSpeed's files and no engine's that run them: DeepSpeed alone runs data
    parallelism, ZeRO (with its offload) and Ulysses sequence parallelism
    (`planner.export.deepspeed`), so that is the space searched; UsageError where such a
    degree was given above 1."""
    engines = args.emit[0] if getattr(args, "emit", None) else []
    if "deepspeed" not in engines or {"megatron", "torchtitan"} & set(engines):
        return knobs
    given = [f"{FLAG[name]} {knobs[name]}" for name in ("tensor", "pipeline", "expert")
             if knobs.get(name, 1) > 1]
    if given:
        raise UsageError(f"--emit deepspeed runs data parallelism, ZeRO and Ulysses sequence "
                         f"parallelism, not {', '.join(given)}; drop it or add megatron to "
                         "--emit")
    console.print("--emit deepspeed: searching what DeepSpeed runs (data parallelism, ZeRO "
                  "with offload, Ulysses sequence parallelism)", highlight=False)
    return knobs.but(**{name: knobs.get(name, 1) for name in ("tensor", "pipeline", "expert")})


def _refuse_what_does_not_fit(plan: Plan, cluster: Cluster) -> None:
    if not plan.predicted.fits:
        raise UsageError(
            f"the configuration asked for needs {plan.predicted.memory_gib_per_gpu:.1f} "
            f"GiB per GPU, more than the {cluster.device.memory_gib:g} GiB of a "
            f"{cluster.device.name}; relax a knob (recomputation, micro-batch, ZeRO stage) or "
            "leave it to the search"
        )


def as_transformers_build_it(loaded: LoadedModel, console: Console) -> LoadedModel:
    """An hf: model as transformers' own causal LM builds it, which is what Tessel's
    runtime trains (`planner.models.hf_shape.as_transformers_builds`), with a note where
    that leaves part of the config out of the plan; any other model as it is."""
    from dataclasses import replace as with_fields

    from planner.models.hf_shape import as_transformers_builds

    if loaded.hf_path is None:
        return loaded
    built, note = as_transformers_builds(loaded.config)
    if not note:
        return loaded
    console.print(f"note: {note}", highlight=False, soft_wrap=True)
    return with_fields(loaded, config=built)


def transformer_config(loaded: LoadedModel) -> TransformerConfig:
    """The zoo shape of a model, for training plans; UsageError for other models."""
    if isinstance(loaded.config, TransformerConfig):
        return loaded.config
    if loaded.config is not None:
        from planner.models.hf_shape import to_transformer_config

        shape = to_transformer_config(loaded.config, loaded.seq_length)
        # --num-layers rebuilt the model at that depth; plan that depth.
        return shape.model_copy(update={"num_layers": loaded.num_layers or shape.num_layers})
    raise UsageError(
        f"--gpus plans a transformer given by its shape (a preset, gpt/llama/mixtral flags "
        f"or hf:config.json); for {loaded.name}, plan operator shardings with --mesh"
    )


def _parameter_names(loaded: LoadedModel) -> Callable[[str], str] | None:
    """A Hugging Face model's own parameter names for the zoo's, where they map."""
    if loaded.config is None or isinstance(loaded.config, TransformerConfig):
        return None
    from planner.models.hf_shape import parameter_namer

    return parameter_namer(loaded.config)


def _plan_with_progress(
    args: argparse.Namespace, model: TransformerConfig, cluster: Cluster,
    knobs: FixedKnobs, top: int, names: Callable[[str], str] | None, console: Console,
) -> tuple[list[Plan], SearchResult]:
    """`planner.plans.transformer_plan.plan_training`, with a progress bar."""
    from rich.progress import Progress

    # A progress bar only where someone watches: piped, it would leave a blank line.
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"searching {args.space} space", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return plan_training(args.model, model, cluster, args.global_batch_size, knobs,
                             args.space, top, names, advance)


# Fixed knobs a refusal may suggest giving up, each named by its flag (planner.search.knobs.FLAG).
_RELAXABLE = ("micro_batch_size", "recompute", "zero_stage", "sequence_parallel",
              "pipeline", "tensor", "context", "schedule", "virtual_pipeline",
              "recompute_method", "recompute_num_layers")
# The schedule and the virtual stages fix each other (`fixed_knobs`: --num-layers-per-
# virtual-pipeline-stage is the interleaved schedule, dualpipev two chunks per stage), so
# they are released together, once.
_PIPELINE_SCHEDULE = ("schedule", "virtual_pipeline")


def _cheapest_relaxation(
    args: argparse.Namespace, model: TransformerConfig, cluster: Cluster, knobs: FixedKnobs
) -> str:
    """'; ...' naming the fixed knob whose release makes the fastest plan fit, and the
    value the search then takes for it; '' where none does (or none was fixed)."""
    from planner.search import search

    best: tuple[float, str, str] | None = None
    for name in _RELAXABLE:
        if name not in knobs or (name == "virtual_pipeline" and "schedule" in knobs):
            continue
        released = _PIPELINE_SCHEDULE if name in _PIPELINE_SCHEDULE else (name,)
        relaxed = knobs.but(**dict.fromkeys(released))
        result = search(model, cluster, args.global_batch_size, relaxed, args.space)
        if result.ranked:
            candidate, prediction = result.ranked[0]
            if best is None or prediction.step_time_s < best[0]:
                best = (prediction.step_time_s, _as_typed(name, knobs, args),
                        _taken(name, candidate.parallel))
    if best is None:
        return ""
    step_s, given, taken = best
    return (f"; or, on these {cluster.num_devices} GPUs, leave {given} to the "
            f"search: the fastest plan then takes {taken} ({step_s:.3f} s a step)")


def _as_typed(name: str, knobs: FixedKnobs, args: argparse.Namespace) -> str:
    """The fixed knob `name` as the command line gave it: '--zero-stage 1'; the virtual
    stages by the flag that set them (layers per chunk, or the schedule)."""
    chunk = args.num_layers_per_virtual_pipeline_stage
    if name in _PIPELINE_SCHEDULE and chunk is not None:
        return f"{FLAG['virtual_pipeline']} {chunk}"
    if name in _PIPELINE_SCHEDULE:
        return f"{FLAG['schedule']} {knobs.get('schedule', 'interleaved')}"
    return f"{FLAG[name]} {f'{knobs[name]}'.lower()}"


def _taken(name: str, parallel: ParallelConfig) -> str:
    """What the search takes for the released knob `name`: its value, or for the
    schedule the schedule with its virtual stages ('the interleaved schedule, 2 virtual
    stages')."""
    if name not in _PIPELINE_SCHEDULE:
        return f"{parallel.knob(name)}".lower()
    virtual = parallel.knob("virtual_pipeline")
    stages = f", {virtual} virtual stages" if virtual > 1 else ""
    return f"the {parallel.knob('schedule')} schedule{stages}"


def _no_fit(
    args: argparse.Namespace, model: TransformerConfig, cluster: Cluster, knobs: FixedKnobs
) -> str:
    from planner.search.megatron_space import MAX_GPUS, devices_needed

    needed = devices_needed(model, cluster, args.global_batch_size, knobs)
    more = (f"it needs at least {needed} GPUs of this kind" if needed
            else f"no cluster of this kind up to {MAX_GPUS} GPUs fits it")
    if needed is None and "schedule" in knobs:
        # A fixed schedule can rule out every size whatever the memory: interleaving and
        # dualpipev need the layers split evenly into pipeline x virtual stages (DeepSeek-
        # V3's 61 layers never are) and enough micro-batches. Say that it is the schedule,
        # and what the model needs without it (on these GPUs the relaxation that follows
        # says what it takes).
        from planner.search import search

        freed = knobs.but(**dict.fromkeys(_PIPELINE_SCHEDULE))
        fits_here = search(model, cluster, args.global_batch_size, freed, args.space).ranked
        least = None if fits_here else devices_needed(
            model, cluster, args.global_batch_size, freed)
        if fits_here or least:
            more = (f"with {_as_typed('schedule', knobs, args)} no cluster of this kind up "
                    f"to {MAX_GPUS} GPUs fits it"
                    + (f", without it at least {least} GPUs do" if least else ""))
    from planner.search import offload_candidates

    if offload_candidates(cluster, knobs):
        # The search tried offload too; the GPU count is what the model needs without it.
        more = ("even with its state offloaded to the host and NVMe; without offload "
                + more.removeprefix("it "))
    return (
        f"no plan fits: {args.model} does not fit on {cluster.num_devices} x "
        f"{cluster.device.name} ({cluster.device.memory_gib:g} GiB) with global batch "
        f"{args.global_batch_size}; {more}"
    )


def layout(plan: Plan) -> str:
    """'t8 p8 d8 mb2', with cp/ep/sp/zero/virtual stages (v: interleaved 1F1B) only where
    they are used, and the schedule where it is gpipe or dualpipev; 'stages' when stages
    differ in mesh."""
    q = plan.parallel
    if len({tuple(stage.mesh_shape) for stage in plan.stages}) > 1:
        meshes = "+".join(f"{s.layers[1] - s.layers[0]}L:{'x'.join(map(str, s.mesh_shape))}"
                          for s in plan.stages)
        return f"stages {meshes} mb{plan.micro_batch_size}"
    parts = [f"t{q.tensor}", f"p{q.pipeline}", f"d{q.data}", f"mb{plan.micro_batch_size}"]
    parts += [f"cp{q.context}"] if q.context > 1 else []
    parts += [f"ep{q.expert}"] if q.expert > 1 else []
    parts += ["sp"] if q.sequence_parallel else []
    parts += [f"zero{q.zero_stage}"] if q.zero_stage else []
    parts += [f"v{q.virtual_pipeline}"] if q.virtual_pipeline > 1 \
        and plan.schedule != "dualpipev" else []
    parts += [plan.schedule] if plan.schedule in ("gpipe", "dualpipev") else []
    parts += [split] if (split := _layer_split(plan)) else []
    return " ".join(parts)


def _layer_split(plan: Plan) -> str:
    """'L3,9x6,4': each stage's layers, first to last, repeats counted, where the stages
    hold different numbers of layers ('' where they hold the same)."""
    counts = [stage.layers[1] - stage.layers[0] for stage in plan.stages]
    if len(set(counts)) <= 1:
        return ""
    runs = [(count, len(list(run))) for count, run in itertools.groupby(counts)]
    return "L" + ",".join(f"{count}x{times}" if times > 1 else str(count)
                          for count, times in runs)


def distinct_layouts(plans: list[Plan]) -> list[str]:
    """Each plan's `layout`, with the knobs that tell apart plans whose layouts read the
    same ('moe_token_dispatcher=alltoall'; offload has a column of its own), so that no
    two rows of a table print alike."""
    labels = [layout(plan) for plan in plans]
    rows = [(label, plan.recompute) for label, plan in zip(labels, plans)]
    for row in set(rows):
        same = [i for i, other in enumerate(rows) if other == row]
        if len(same) < 2:
            continue
        names = [name for name in sorted(KNOB_NAMES - OFFLOAD_KNOBS)
                 if len({repr(plan_value(plans[i], name)) for i in same}) > 1]
        for i in same:
            labels[i] += "".join(f" {name}={_shown(plan_value(plans[i], name))}"
                                 for name in names)
    return labels


def _shown(value: object) -> str:
    """A knob's value as a table cell: tuples joined by commas, None as 'none'."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def print_training_plans(plans: list[Plan], console: Console, megatron: bool = True) -> None:
    """The plans' table, best first; the best's summary (`print_summary`), and (unless
    `megatron` is off: plans for another engine) its Megatron-LM flags and launch
    command."""
    best = plans[0]
    table = Table(title=f"{best.model} on {best.num_gpus} x {best.cluster}, global batch "
                        f"{best.global_batch_size}")
    columns = ("#", "layout", "recompute", "step s", "MFU", "GiB/GPU")
    if any(offloaded(plan) for plan in plans):
        columns += ("offload",)
    for column in columns:
        justify = "left" if column in ("layout", "recompute") else "right"
        # The layout wraps at its spaces; the numbers never do.
        table.add_column(column, justify=justify, no_wrap=column != "layout")
    for rank, (plan, label) in enumerate(zip(plans, distinct_layouts(plans)), 1):
        p = plan.predicted
        cells = [str(rank), label, plan.recompute, f"{p.step_time_s:.3f}", f"{p.mfu:.1%}",
                 f"{p.memory_gib_per_gpu:.1f}" + ("" if p.fits else " !")]
        table.add_row(*cells, *([offloaded(plan, short=True) or "-"]
                                if "offload" in columns else []))
    console.print(table)
    print_summary(best, console)
    p = best.predicted
    if not p.fits:
        console.print(f"[red]does not fit:[/red] {p.memory_gib_per_gpu:.1f} GiB per GPU")
    elif p.reserved_gib_per_gpu is not None:
        console.print(f"memory per GPU: {p.memory_gib_per_gpu:.1f} GiB allocated at the peak, "
                      f"{p.reserved_gib_per_gpu:.1f} GiB reserved by the caching allocator",
                      highlight=False)
        if not p.reserved_fits:
            console.print("[yellow]fits allocated, not reserved:[/yellow] fragmentation may "
                          "run it out of memory; it may need "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", highlight=False)
        _note_faster_past_the_reserve(plans, console)
    if best.run is not None and (offloaded(best) or best.run.finetune in ADAPTER_FINETUNES):
        print_offload(best, console)
    if not megatron:
        return
    if best.megatron_flags:
        from planner.export.torchrun import torchrun_command

        console.print("Megatron-LM flags:", highlight=False)
        words = [word for flag in best.megatron_flags for word in shlex.split(flag)]
        console.print(shell_lines(words), highlight=False, soft_wrap=True, markup=False)
        console.print("launch on every node (MASTER_ADDR: the first node's address):",
                      highlight=False)
        console.print(shell_lines(shlex.split(torchrun_command(best))), highlight=False,
                      soft_wrap=True, markup=False)
    else:
        console.print(f"not runnable by Megatron-LM: {best.megatron_incompatibility}")


def offloaded(plan: Plan, short: bool = False) -> str:
    """What `plan` keeps off the GPU, in a few words ('optimizer: cpu, activations: 4
    layers'), or `short` for a table cell ('opt:cpu act:4'); '' where nothing."""
    run = plan.run
    if run is None:
        return ""
    parts = []
    if run.offload_optimizer != "none":
        share = f" ({run.optimizer_offload_fraction:.0%})" \
            if run.optimizer_offload_fraction < 1 else ""
        parts.append(("opt:", "optimizer: ", f"{run.offload_optimizer}{share}"))
    if run.optimizer == "paged_adam8bit":
        parts.append(("opt:", "optimizer: ", "paged"))
    if run.offload_params != "none":
        parts.append(("par:", "parameters: ", run.offload_params))
    if run.offload_activation_layers:
        layers = run.offload_activation_layers
        parts.append(("act:", "activations: ", f"{layers}" if short else f"{layers} layers"))
    if run.offload_checkpoints:
        parts.append(("ckpt:", "checkpoints: ", "cpu"))
    if short:
        return " ".join(tag + value.replace(" ", "") for tag, _, value in parts)
    return ", ".join(word + value for _, word, value in parts)


def print_offload(plan: Plan, console: Console) -> None:
    """The best plan's memory per GPU by kind (frozen weights and adapters apart under
    LoRA), and where its offloaded state goes with what it moves per step."""
    p = plan.predicted
    kinds = ", ".join(f"{kind} {gib:.1f}" for kind, gib in p.memory_breakdown_gib.items()
                      if gib >= 0.05)
    console.print(f"memory per GPU by kind (GiB): {kinds}", highlight=False)
    where = offloaded(plan)
    if where:
        breakdown = p.breakdown
        assert breakdown is not None
        console.print(
            f"offload: {where}; host memory {p.host_memory_gib_per_host:.0f} GiB per host, "
            f"NVMe {p.nvme_gb_per_step:.0f} GB per host and PCIe {p.pcie_gb_per_step:.1f} "
            f"GB per GPU a step; it adds {breakdown.offload_s:.3f} s a step",
            highlight=False)


def warn_slow_nvme(plan: Plan, cluster: Cluster, console: Console) -> None:
    """A warning (not a refusal) where `plan` offloads to NVMe on hosts whose drives read
    below `offload.NVME_MIN_READ_GBS`: what the offload adds to each step, and its share."""
    from cost_models.offload import NVME_MIN_READ_GBS

    run, host, breakdown = plan.run, cluster.host, plan.predicted.breakdown
    if run is None or host is None or breakdown is None or host.nvme_read_gbs is None:
        return
    if "nvme" not in (run.offload_optimizer, run.offload_params) \
            or host.nvme_read_gbs >= NVME_MIN_READ_GBS:
        return
    share = breakdown.offload_s / plan.predicted.step_time_s
    console.print(f"[yellow]warning:[/yellow] {cluster.name}'s NVMe reads "
                  f"{host.nvme_read_gbs:g} GB/s per host, below the {NVME_MIN_READ_GBS:g} GB/s "
                  f"NVMe offload needs: it adds {breakdown.offload_s:.2f} s to each step "
                  f"({share:.0%} of it)", highlight=False)


def _note_faster_past_the_reserve(plans: list[Plan], console: Console) -> None:
    """One line on the fastest plan of the table that is faster than the best but ranks
    below it because what the caching allocator would reserve exceeds the device."""
    best = plans[0].predicted
    faster = [(rank, plan) for rank, plan in enumerate(plans, 1)
              if not plan.predicted.reserved_fits and plan.predicted.fits
              and plan.predicted.step_time_s < best.step_time_s]
    if not best.reserved_fits or not faster:
        return
    rank, plan = min(faster, key=lambda item: item[1].predicted.step_time_s)
    p = plan.predicted
    console.print(
        f"faster but ranked below: #{rank} ({p.step_time_s:.3f} s) allocates "
        f"{p.memory_gib_per_gpu:.1f} GiB and would reserve {p.reserved_gib_per_gpu:.1f} GiB, "
        "more than the device holds: it may run out of memory through fragmentation (try it "
        "with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)", highlight=False)


def print_summary(plan: Plan, console: Console, label: str = "best") -> None:
    """One line, `label` first: the plan's tokens/s, micro-batches, step-time breakdown and
    model (and hardware) TFLOP/s per GPU."""
    p = plan.predicted
    b = p.breakdown
    assert b is not None
    console.print(
        f"{label}: {p.tokens_per_s:,.0f} tokens/s, {plan.num_micro_batches} "
        f"micro-batches; step {p.step_time_s:.3f} s = compute {b.compute_s:.3f} + "
        f"tensor/context comm {b.tensor_parallel_comm_s:.3f} + pipeline comm "
        f"{b.pipeline_comm_s:.3f} + bubble {b.bubble_s:.3f} + exposed data-parallel comm "
        f"{b.data_parallel_comm_s:.3f} + optimizer {b.optimizer_s:.3f}"
        + (f" + offload {b.offload_s:.3f}" if b.offload_s else "") + "; "
        f"{p.model_tflops_per_gpu:.0f} model TFLOP/s per GPU "
        f"({p.hardware_tflops_per_gpu:.0f} executed, recomputation included)",
        highlight=False,
    )
    if p.step_time_band_s is not None and p.band is not None:
        low, high = p.step_time_band_s
        console.print(
            f"expect a measured step of {low:.3f}-{high:.3f} s "
            f"({p.model_tflops_per_gpu * p.step_time_s / high:.0f}-"
            f"{p.model_tflops_per_gpu * p.step_time_s / low:.0f} model TFLOP/s per GPU): "
            f"{p.band.words()} (`plan calibration`)",
            highlight=False,
        )
