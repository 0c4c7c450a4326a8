"""planner.vocabulary.knobs: one registry of every knob's Plan field, flag and engine
spellings, held to what each reader and writer does with it.

Every knob an engine spells round-trips: a configuration holding a value of it other than
its default is written by that engine's writer (Megatron-LM's launch flags, TorchTitan's
job config, DeepSpeed's ds_config.json, the Plan, Tessel's runtime spec) and read back by
its reader to the same value. The registry covers every knob; every spelling names a flag
or key the engine has; the unpriced Megatron-LM flags are refused by name; and the tables
generated from it (the `plan` flags, docs/cli.md) are current.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from planner.cli.main import build_parsers
from planner.export.deepspeed import deepspeed_incompatibility, ds_config
from planner.export.megatron import megatron_flags
from planner.export.plan_config import parallel_config as plan_parallel_config
from planner.export.torchtitan import job_config, toml_text, torchtitan_incompatibility
from planner.megatron.arguments import megatron_parser, parse_megatron_flags
from planner.megatron.errors import LaunchLineError
from planner.megatron.run import megatron_run
from planner.megatron.unpriced import UNPRICED
from planner.models.presets import zoo_config
from planner.plans.transformer_plan import training_plan
from planner.search.knobs import FLAG
from planner.torchtitan.job import torchtitan_job
from planner.torchtitan.keys import JOB_CONFIG, READ
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.knobs import (
    DOCS_BEGIN,
    DOCS_END,
    KNOBS,
    REGISTRY,
    UNPRICED_FLAGS,
    Knob,
    engine_value,
    knob_value,
    markdown,
    spelt,
)
from planner.vocabulary.parallel import KNOB_NAMES, ParallelConfig
from planner.vocabulary.plan import ParallelDegrees, Plan, RunSettings
from runtime.spec import from_training_plan

REPO = Path(__file__).resolve().parents[3]
DENSE = zoo_config("llama3-8b", {"seq_length": 2048})
MOE = zoo_config("mixtral-8x7b", {"seq_length": 2048})
# Knobs that need a model with experts to mean anything.
MOE_KNOBS = {"expert", "expert_tensor", "moe_token_dispatcher", "moe_router_force_load_balancing",
             "overlap_moe_expert_parallel_comm", "moe_expert_capacity_factor",
             "moe_pad_expert_input_to_capacity", "delay_wgrad_compute", "moe_paged_stash",
             "moe_paged_stash_buffer_factor", "moe_expert_rank_capacity_factor"}


def other_value(knob: Knob) -> Any:
    """A value of `knob` other than its default: the next choice, on, two, 1.5."""
    if knob.type == "tuple":
        return (knob.choices[1],)
    if knob.type == "bool":
        return True
    if knob.choices:
        return next(c for c in knob.choices if c != knob.default)
    return {"int": 2, "float": 1.5}[knob.type]


# What each knob needs beside itself to be written and read as it is (Megatron-LM's and the
# engines' rules), and the value tried where the next choice is not one the engine runs.
MEGATRON_CASES: dict[str, dict[str, Any]] = {
    "sequence_parallel": dict(tensor=2),
    "tp_comm_overlap": dict(tensor=2, sequence_parallel=True),
    "virtual_pipeline": dict(pipeline=4, schedule="interleaved", virtual_pipeline=2),
    "schedule": dict(pipeline=4, schedule="interleaved", virtual_pipeline=2),
    "overlap_param_gather": dict(zero_stage=1, overlap_grad_reduce=True),
    "recompute_method": dict(recompute="full", recompute_method="block"),
    "recompute_num_layers": dict(recompute="full", recompute_num_layers=2),
    "recompute_modules": dict(recompute="selective"),
    "fp8_recipe": dict(precision="fp8"),
    "fp8_param_gather": dict(precision="fp8"),
    "expert_tensor": dict(tensor=2, expert_tensor=1),
    "overlap_moe_expert_parallel_comm": dict(expert=2, moe_token_dispatcher="alltoall"),
    "delay_wgrad_compute": dict(expert=2, moe_token_dispatcher="alltoall",
                                overlap_moe_expert_parallel_comm=True),
    "fp8_output_proj": dict(precision="fp8", fp8_recipe="mxfp8"),
    "moe_pad_expert_input_to_capacity": dict(moe_expert_capacity_factor=1.5),
    "cuda_graph_scope": dict(cuda_graph_scope=("attn",)),
    "global_batch_size": dict(global_batch_size=32),
    "ddp_bucket_size": dict(ddp_bucket_size=10_000_000, overlap_grad_reduce=True),
    "optimizer_offload_fraction": dict(offload_optimizer="cpu", optimizer_offload_fraction=0.5),
    "offload_params": dict(zero_stage=3),
    "offload_checkpoints": dict(zero_stage=3, recompute="full", engine="tessel"),
    "offload_copies": dict(offload_copies="blocking", engine="tessel"),
    "optimizer_in_backward": dict(engine="torchtitan", micro_batch_size=2),
}
TORCHTITAN_CASES: dict[str, dict[str, Any]] = {
    "tensor": dict(tensor=2, sequence_parallel=True),
    "sequence_parallel": dict(tensor=2),
    "tp_comm_overlap": dict(tensor=2, sequence_parallel=True, compile=True),
    "pipeline": dict(pipeline=2),
    "virtual_pipeline": dict(pipeline=2, schedule="interleaved", virtual_pipeline=2),
    "schedule": dict(pipeline=2, schedule="gpipe"),
    "precision": dict(precision="fp8"),
    "fp8_recipe": dict(precision="fp8", fp8_recipe="mxfp8"),
    "fp8_param_gather": dict(precision="fp8"),
    "recompute_every": dict(recompute="full"),
    "zero_stage": dict(zero_stage=3),
    "data": dict(data=4, tensor=2, sequence_parallel=True),
    "global_batch_size": dict(global_batch_size=32),
    "offload_optimizer": dict(offload_params="cpu", zero_stage=3),
    "offload_params": dict(offload_optimizer="cpu", zero_stage=3),
}
# The settings TorchTitan runs whatever the knobs (its FSDP2 overlaps everything).
TORCHTITAN_BASE = dict(engine="torchtitan", zero_stage=3, overlap_grad_reduce=True,
                       overlap_param_gather=True, fp8_recipe="tensorwise")


def configured(name: str, cases: dict[str, dict[str, Any]], base: dict[str, Any] | None = None,
               gpus: int = 8) -> tuple[ParallelConfig, int]:
    """A configuration with a non-default value of knob `name` (and what it needs), its
    other degrees such that `gpus` divide, and the GPU count it runs on."""
    knobs = {**(base or {}), "global_batch_size": 16, name: other_value(KNOBS[name]),
             **cases.get(name, {})}
    if knobs.get("precision") == "fp8" and base is None:
        knobs.setdefault("fp8_recipe", "tensorwise")
    config = ParallelConfig.of(**knobs)
    model_parallel = config.dims.tensor * config.dims.pipeline * config.dims.context
    if config.dims.data == -1:
        config = config.but(data=max(1, gpus // model_parallel))
    return config, config.dims.world_size


def cluster_of(gpus: int) -> Cluster:
    return Cluster.load("dgx-h100").with_devices(gpus)


def test_the_registry_covers_every_knob_once() -> None:
    assert set(KNOBS) == KNOB_NAMES
    assert not set(KNOBS) & set(UNPRICED_FLAGS)
    assert all(name.startswith("--") and not knob.priced for name, knob in UNPRICED_FLAGS.items())
    assert all(knob.priced for knob in KNOBS.values())
    assert REGISTRY == {**KNOBS, **UNPRICED_FLAGS}


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was in it)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), type(None) in args
    return annotation, False


def test_each_knob_has_its_plan_field_and_type() -> None:
    sections = {"parallel": ParallelDegrees, "run": RunSettings}
    hints = {}  # every knob's annotation, from the section that holds it
    for section in dataclasses.fields(ParallelConfig):
        hints.update(typing.get_type_hints(type(section.default)))
    for name, knob in KNOBS.items():
        section, _, field = (knob.plan_field or "").rpartition(".")
        model = sections[section] if section else Plan
        assert field in model.model_fields, f"{name}: the Plan has no {knob.plan_field}"
        kind, optional = _without_none(hints[name])
        assert knob.optional == optional, name
        recorded, _ = _without_none(model.model_fields[field].annotation)
        if knob.type == "str":
            assert set(knob.choices) == set(typing.get_args(kind)), name
            assert set(typing.get_args(recorded)) == set(knob.choices), name
        elif knob.type == "tuple":
            assert typing.get_origin(kind) is tuple, name
            assert set(knob.choices) == set(typing.get_args(typing.get_args(kind)[0])), name
        else:
            assert kind is {"int": int, "float": float, "bool": bool}[knob.type], name
            assert recorded is kind, name
        assert knob.default == ParallelConfig().knob(name)


def test_every_megatron_spelling_is_a_flag_megatron_lm_has() -> None:
    parser = megatron_parser()
    for knob in REGISTRY.values():
        spelling = knob.megatron
        if spelling is None:
            continue
        assert parser.dest_of.get(spelling.key) == spelling.name, spelling.key
        missing = [dest for dest in spelling.reads if dest not in parser.defaults_of]
        assert not missing, f"{knob.name} reads {missing}, which Megatron-LM does not have"


def test_every_torchtitan_key_is_one_the_reader_reads() -> None:
    for name, spelling in spelt("torchtitan").items():
        for key in (spelling.key, *spelling.reads):
            assert key in JOB_CONFIG and JOB_CONFIG[key].effect == READ, (name, key)
        nxt = KNOBS[name].torchtitan_next
        assert nxt is None or nxt.key != spelling.key, f"{name}: 0.3+ spells it as 0.2 does"


def test_the_command_line_flags_are_the_registrys() -> None:
    parser = build_parsers()[""]
    options = {option: action for action in parser._actions for option in action.option_strings}
    for name, spelling in spelt("cli").items():
        action = options[spelling.key]
        assert action.help == KNOBS[name].rule, name
        assert FLAG[name] == spelling.key
    assert options["--use-distributed-optimizer"].dest == "use_distributed_optimizer"


def test_converters_read_back_what_they_write() -> None:
    for knob in REGISTRY.values():
        for engine in ("cli", "megatron", "torchtitan", "deepspeed", "tessel"):
            spelling = knob.spelling(engine)
            if spelling is None:
                continue
            for value, _ in spelling.table:
                written = engine_value(spelling, value)
                assert knob_value(spelling, written) == value or (
                    engine == "tessel" and value == "flex"), (knob.name, engine, value)


# -- round trips ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(spelt("megatron")))
def test_megatron_launch_flags_round_trip(name: str) -> None:
    model = MOE if name in MOE_KNOBS else DENSE
    config, gpus = configured(name, MEGATRON_CASES)
    layers = [model.num_layers // config.dims.pipeline] * config.dims.pipeline
    flags = megatron_flags(model, config, layers)
    assert len({flag.split()[0] for flag in flags}) == len(flags), flags  # each flag once
    run = megatron_run(parse_megatron_flags(shlex.split(" ".join(flags))), gpus)
    assert run.parallel.knob(name) == config.knob(name), flags


@pytest.mark.parametrize("name", sorted(spelt("torchtitan")))
def test_torchtitan_job_config_round_trips(name: str) -> None:
    config, gpus = configured(name, TORCHTITAN_CASES, TORCHTITAN_BASE)
    plan = training_plan("llama3-8b", DENSE, cluster_of(gpus), config)
    assert torchtitan_incompatibility(plan, DENSE) is None
    tables = tomllib.loads(toml_text(job_config(plan, DENSE)))
    job = torchtitan_job(tables, None, "torchtitan.toml")
    assert job.parallel.knob(name) == config.knob(name), tables


def deepspeed_read(config: dict[str, Any], name: str) -> Any:
    """Knob `name` of a ds_config.json, at the registry's key (Tessel has no DeepSpeed
    reader: this is the one its writer is held to)."""
    spelling = spelt("deepspeed")[name]
    if name == "precision":  # bf16.enabled or fp16.enabled, else fp32
        return next((p for p in ("bf16", "fp16") if config.get(p, {}).get("enabled")), "fp32")
    value: Any = config
    for part in spelling.key.split("."):
        value = value[part]
    return knob_value(spelling, value)


@pytest.mark.parametrize("name", sorted(spelt("deepspeed")))
def test_deepspeed_config_round_trips(name: str) -> None:
    cases = {"precision": dict(precision="fp16"), "overlap_grad_reduce": dict(zero_stage=1),
             "global_batch_size": dict(global_batch_size=32),
             "ddp_bucket_size": dict(zero_stage=1, overlap_grad_reduce=True,
                                     ddp_bucket_size=10_000_000),
             "offload_optimizer": dict(zero_stage=1),
             "offload_params": dict(zero_stage=3),
             "offload_checkpoints": dict(zero_stage=3, recompute="full"),
             "optimizer_offload_fraction": dict(zero_stage=3, offload_optimizer="cpu",
                                                optimizer_offload_fraction=0.5)}
    config, gpus = configured(name, cases)
    plan = training_plan("llama3-8b", DENSE, cluster_of(gpus), config)
    assert deepspeed_incompatibility(plan) is None
    written = json.loads(json.dumps(ds_config(plan)))
    assert deepspeed_read(written, name) == config.knob(name), written


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_the_plan_records_every_knob(name: str) -> None:
    titan = KNOBS[name].megatron is None and KNOBS[name].torchtitan is not None
    model = MOE if name in MOE_KNOBS else DENSE
    config, gpus = (configured(name, TORCHTITAN_CASES, TORCHTITAN_BASE) if titan
                    else configured(name, MEGATRON_CASES))
    if name in ("data", "engine"):
        config = config.but(**{name: {"data": 4, "engine": "tessel"}[name]})
        gpus = config.dims.world_size
    plan = Plan.model_validate_json(training_plan("m", model, cluster_of(gpus), config)
                                    .model_dump_json())
    assert plan_parallel_config(plan).knob(name) == config.knob(name)


@pytest.mark.parametrize("name", sorted(spelt("tessel")))
def test_tessels_runtime_spec_holds_every_knob_it_spells(name: str) -> None:
    model = MOE if name in MOE_KNOBS else DENSE
    config, gpus = configured(name, {**MEGATRON_CASES, "expert": dict(expert=2),
                                     "data": dict(data=4, tensor=2)})
    spec = from_training_plan(training_plan("m", model, cluster_of(gpus), config))
    spelling = KNOBS[name].tessel
    assert spelling is not None
    value: Any = spec
    for part in spelling.key.split("."):
        value = getattr(value, part)
    assert knob_value(spelling, value) == config.knob(name)


# -- the unpriced flags -----------------------------------------------------------------

BASE_LINE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
             "--max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 --bf16")
NEEDS = {"fp8": " --fp8-format hybrid", "experts": " --num-experts 4 --moe-router-topk 2",
         "context parallelism": " --context-parallel-size 2"}


def refused_value(dest: str, neutral: tuple[Any, ...]) -> str | None:
    """A value of Megatron-LM's option `dest` that is neither its default nor `neutral`,
    as the launch line writes it ('' for a switch); None where every value is neutral."""
    option = next(o for o in json.loads((REPO.parent / "shared" / "reference" /
                                         "megatron_lm_arguments.json").read_text())["options"]
                  if o["dest"] == dest)
    if option["action"] in ("_StoreTrueAction", "_StoreFalseAction"):
        return ""
    quiet = {str(option["default"]), *map(str, neutral)}
    if option["choices"]:
        return next((str(c) for c in option["choices"] if str(c) not in quiet), None)
    return {"int": "2", "float": "0.5"}.get(option["type"], "x")


@pytest.mark.parametrize("flag", sorted(UNPRICED_FLAGS))
def test_the_megatron_reader_refuses_every_unpriced_flag_by_name(flag: str) -> None:
    knob = UNPRICED_FLAGS[flag]
    assert knob.megatron is not None and knob.megatron.name in UNPRICED
    value = refused_value(knob.megatron.name, knob.neutral)
    if value is None:
        pytest.skip(f"every value Megatron-LM takes for {flag} is one Tessel prices")
    line = BASE_LINE + NEEDS.get(knob.needs, "") + f" {flag} {value}"
    with pytest.raises(LaunchLineError, match=flag.removeprefix("--")) as refused:
        megatron_run(parse_megatron_flags(shlex.split(line)), 2)
    assert "does not price" in str(refused.value) or "Tessel" in str(refused.value)


# -- the generated docs -----------------------------------------------------------------

def flag_row(action: argparse.Action) -> str:
    """One row of docs/cli.md's flag tables, as they are written from the parsers."""
    first = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        usage = f"`{first}` (`{action.option_strings[1]}`)"
    elif action.nargs == 0:
        usage = f"`{first}`"
    else:
        choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
        usage = f"`{first} {action.metavar or choices or action.dest.upper()}`"
    return f"| {usage} | {action.help} |"


def test_docs_knob_table_is_current() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    table = text[text.index(DOCS_BEGIN) + len(DOCS_BEGIN):text.index(DOCS_END)]
    assert table.strip() == markdown().strip(), (
        "docs/cli.md's knob table is stale: paste `python -m planner.vocabulary.knobs "
        "--markdown` between its markers")


def test_docs_training_flag_table_is_the_parsers() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    group = next(g for g in build_parsers()[""]._action_groups
                 if g.title and g.title.startswith("training plan"))
    head = f"{group.title}:\n\n| flag | meaning |\n|---|---|\n"
    start = text.index(head) + len(head)
    rows = text[start:text.index("\n\n", start)].splitlines()
    assert rows == [flag_row(action) for action in group._group_actions]
