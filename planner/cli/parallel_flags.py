"""Parallel knobs on the command line, under Megatron-LM's flag names.

A knob given on the command line is fixed; the search chooses the rest, also when the
degrees and micro-batch are all given (`plan predict` prices a launch line with
Megatron-LM's literal defaults). Every knob flag, its type, choices and help come from the
knob registry (`planner.vocabulary.knobs`); the rules of the flags that take another
quantity than the knob's (layers per virtual stage, Megatron-LM's distributed optimizer
switch) are here.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.cli.errors import UsageError
from planner.cli.parsing import number, training_only, whole
from planner.cli.run_flags import positive
from planner.vocabulary.cluster import MAX_DEVICES
from planner.vocabulary.knobs import KNOBS, Knob, Spelling, knob_value
from planner.vocabulary.parallel import FixedKnobs
from planner.search.megatron_space import MAX_GPUS, SEARCH_SPACES
from planner.vocabulary.schedules import V_SHAPED

# Largest global batch: 16M sequences, far past any run (Llama 3 405B: 16M tokens).
MAX_GLOBAL_BATCH = KNOBS["global_batch_size"].most or 1 << 24
# Most plans --top lists.
MAX_TOP = 100

# Knobs with a flag that are not fixed knobs: the global batch is always given.
_NOT_FIXED = frozenset({"global_batch_size"})
# The knobs that are flags here, in the registry's order.
_FLAGGED = tuple(knob for knob in KNOBS.values()
                 if knob.cli is not None and knob.name not in _NOT_FIXED)


def _dest(knob: Knob) -> str:
    """The namespace attribute of a knob's flag: the knob's name, or where the flag takes
    another quantity than the knob (a table or a rule of its own), the flag's words."""
    assert knob.cli is not None
    return knob.cli.name if knob.cli.table or knob.cli.engine else knob.name


def _options(knob: Knob) -> dict[str, Any]:
    """argparse options of a knob's flag: its type, choices and help, default None
    (searched)."""
    options: dict[str, Any] = dict(dest=_dest(knob), default=None, help=knob.rule)
    if knob.type == "bool" and not knob.choices:
        return options | dict(action=argparse.BooleanOptionalAction if knob.negatable
                              else "store_true")
    if knob.type == "tuple":
        return options | dict(nargs="+", choices=knob.choices)
    if knob.choices:
        return options | dict(type=int if knob.type == "int" else None, choices=knob.choices)
    if knob.type == "float" and knob.span is not None:
        return options | dict(type=number(*knob.span))
    if knob.type == "float":
        return options | dict(type=positive)
    return options | dict(type=whole(1, knob.most or MAX_DEVICES))


def _megatron_switch(knob: Knob) -> tuple[Spelling, Any] | None:
    """(Megatron-LM's switch, the knob's value it sets) where Megatron-LM spells one value
    of the knob as a switch of its own (--use-distributed-optimizer: ZeRO stage 1)."""
    spelling = knob.megatron
    if knob.cli is None or spelling is None or not (spelling.switch and spelling.table) \
            or spelling.key == knob.cli.key:
        return None
    return spelling, knob_value(spelling, True)


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
                       help=KNOBS["global_batch_size"].rule)
    for knob in _FLAGGED:
        assert knob.cli is not None
        add(knob.cli.key, **_options(knob))
        switch = _megatron_switch(knob)
        if switch is not None:
            spelling, value = switch
            add(spelling.key, dest=spelling.name, action="store_true",
                help=f"{knob.cli.key} {value}, as Megatron-LM spells it")
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
        "--space", choices=SEARCH_SPACES, default="auto",
        help="auto: stages may differ in size and mesh (Alpa); megatron: only layouts "
        "Megatron-LM runs",
    )
    training_only(parser, *actions)


def training_flags_given(args: argparse.Namespace) -> list[str]:
    """The training-plan flags the command line set, as typed (their long form)."""
    return [flag for flag, dest, default in args.training_flags
            if getattr(args, dest) != default]


def fixed_knobs(args: argparse.Namespace, num_layers: int) -> FixedKnobs:
    """The ParallelConfig fields the command line fixed (the others searched)."""
    knobs: dict[str, Any] = {}
    for knob in _FLAGGED:
        assert knob.cli is not None
        value = getattr(args, _dest(knob))
        if value is None or knob.cli.engine:  # searched, or read by a rule below
            continue
        knobs[knob.name] = knob_value(knob.cli, tuple(value) if knob.type == "tuple"
                                      else value)
    if args.use_distributed_optimizer:
        if args.zero_stage not in (None, 1):
            raise UsageError(
                f"--use-distributed-optimizer is ZeRO stage 1 but --zero-stage is "
                f"{args.zero_stage}; give one of the two"
            )
        knobs["zero_stage"] = 1
    chunk = args.num_layers_per_virtual_pipeline_stage
    if chunk is not None:
        pipeline = args.pipeline
        if not pipeline:
            raise UsageError(
                "--num-layers-per-virtual-pipeline-stage needs "
                "--pipeline-model-parallel-size; give both"
            )
        per_stage, rest = divmod(num_layers, pipeline)
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
    if args.schedule in V_SHAPED:  # two chunks per stage, in V order
        knobs["virtual_pipeline"] = 2
    return FixedKnobs(knobs)
