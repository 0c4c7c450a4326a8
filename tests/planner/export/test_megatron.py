"""Megatron-LM launch flags: every line the planner emits must parse and validate.

`check_launch_line` holds a line to Megatron-LM's argument parser, read off into
`shared/reference/megatron_lm_arguments.json` (each flag exists, takes a value exactly
when its action does, of the right type and choice, once), and to the `validate_args`
rules of `shared/reference/README.md`. It is first shown to reject hand-made bad lines,
one rule each, so it cannot pass vacuously; then it checks the plans the Megatron search
picks across the model zoo, the CLI's JSON and a what-if configuration.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset, zoo_config
from planner.vocabulary.parallel import ParallelConfig
from planner.search import search
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.plan import Plan

REPO = Path(__file__).resolve().parents[3]
# The read-only shared inputs sit beside the checkout (../shared); TESSEL_SHARED names
# them elsewhere.
REFERENCE = next(
    (p / "reference" for p in (Path(os.environ.get("TESSEL_SHARED", REPO / "shared")),
                               REPO.parent / "shared", Path("/work/shared"))
     if (p / "reference" / "megatron_lm_arguments.json").is_file()),
    None,
)
if REFERENCE is None:
    pytest.skip("shared/reference/megatron_lm_arguments.json not found",
                allow_module_level=True)

CLUSTER = "dgx-a100-80g"
A100_BF16_PEAK_TFLOPS = 312.0

TP, PP, CP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
              "--context-parallel-size")
FIRST, LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
VPP = "--num-layers-per-virtual-pipeline-stage"
# The world size comes from the launcher (torchrun's WORLD_SIZE), never from a flag.
LAUNCHER_FLAGS = ("--world-size", "--nproc-per-node", "--nnodes")
PARSERS = {"int": int, "float": float}


# ---------------------------------------------------------------------------- the checker


@lru_cache(maxsize=1)
def megatron_options() -> dict[str, dict[str, Any]]:
    """Every option of Megatron-LM's parser, by each of its flag strings."""
    data = json.loads((REFERENCE / "megatron_lm_arguments.json").read_text())
    return {flag: option for option in data["options"] for flag in option["flags"]}


def _arity_ok(option: dict[str, Any], values: list[str]) -> bool:
    """Whether `values` is as many values as the option's action and nargs take."""
    if option["action"] != "_StoreAction":
        return not values
    nargs = option["nargs"]
    if nargs is None:
        return len(values) == 1
    if nargs in ("+", "*", "?"):
        return {"+": len(values) >= 1, "*": True, "?": len(values) <= 1}[nargs]
    return len(values) == int(nargs)


def _value_problems(flag: str, option: dict[str, Any], values: list[str]) -> list[str]:
    """Values that do not parse as the option's type or are not among its choices."""
    problems = []
    parse, choices = PARSERS.get(option["type"]), option["choices"]
    for value in values:
        if parse is not None:
            try:
                parse(value)
            except ValueError:
                problems.append(f"{flag} {value}: not of type {option['type']}")
        # An enum's choices print as 'AttnBackend.flash'; its handler reads 'flash'.
        names = [str(choice).rsplit(".", 1)[-1] if option["type"] == "enum_type_handler"
                 else str(choice) for choice in (choices or ())]
        if choices is not None and value not in names:
            problems.append(f"{flag} {value}: not one of {choices}")
    return problems


def parse_line(flags: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Each flag's values, and what is wrong with the flags taken one by one."""
    options, values, problems = megatron_options(), {}, []
    for item in flags:
        flag, *rest = item.split() or [""]
        if not flag.startswith("--"):
            problems.append(f"{item!r}: not a flag")
        elif flag in values:
            problems.append(f"{flag}: given twice")
        elif flag in LAUNCHER_FLAGS:
            problems.append(f"{flag}: the world size comes from the launcher, not a flag")
        elif flag not in options:
            problems.append(f"{flag}: no such option in Megatron-LM")
        elif not _arity_ok(options[flag], rest):
            takes = "a value" if options[flag]["action"] == "_StoreAction" else "no value"
            problems.append(f"{flag}: takes {takes}, got {rest}")
        else:
            problems += _value_problems(flag, options[flag], rest)
        values.setdefault(flag, rest)
    return values, problems


def _int(values: dict[str, list[str]], flag: str, default: int | None = 1) -> int | None:
    """The flag's integer value; `default` when absent (or malformed, reported apart)."""
    try:
        return int(values[flag][0])
    except (KeyError, IndexError, ValueError):
        return default


def _layer_problems(values: dict[str, list[str]], pipeline: int) -> list[str]:
    """Layers over pipeline stages, uneven first/last stages and virtual stages."""
    layers = _int(values, "--num-layers", None)
    if layers is None:
        return ["--num-layers: missing"]
    problems = []
    ends = [n for n in (_int(values, FIRST, None), _int(values, LAST, None)) if n is not None]
    middle, rest = pipeline - len(ends), layers - sum(ends)
    if not ends and layers % pipeline:
        problems.append(f"num layers {layers} not divisible by pipeline size {pipeline}")
    elif ends and (middle < 0 or rest < 0 or (rest % middle if middle else rest)):
        problems.append(f"{layers} layers less first/last stages {ends} do not divide over "
                        f"the {middle} middle pipeline stages")
    per_chunk = _int(values, VPP, None)
    if per_chunk is not None and pipeline == 1:
        problems.append(f"{VPP} needs pipeline size > 1")
    elif per_chunk is not None and (layers % pipeline or (layers // pipeline) % per_chunk):
        problems.append(f"virtual pipeline: {layers} / {pipeline} layers per stage not "
                        f"divisible by {VPP} {per_chunk}")
    return problems


def validate_args_problems(values: dict[str, list[str]], world_size: int) -> list[str]:
    """The rules of Megatron-LM's `validate_args` in the reference README."""
    tensor, pipeline, context = (_int(values, flag) for flag in (TP, PP, CP))
    model_parallel, problems = tensor * pipeline * context, []
    if world_size % model_parallel:
        problems.append(f"world size {world_size} not divisible by tensor x pipeline x "
                        f"context = {model_parallel}: no whole data-parallel size")
    else:
        data = world_size // model_parallel
        micro = _int(values, "--micro-batch-size")
        global_batch = _int(values, "--global-batch-size", micro * data)
        if global_batch % (micro * data):
            problems.append(f"global batch {global_batch} not divisible by micro batch "
                            f"{micro} x data-parallel {data}")
    problems += _layer_problems(values, pipeline)
    if "--sequence-parallel" in values and tensor == 1:
        problems.append("--sequence-parallel needs tensor parallel size > 1")
    if "--recompute-method" in values and values.get("--recompute-granularity") != ["full"]:
        problems.append("--recompute-method needs --recompute-granularity full")
    return problems


def check_launch_line(flags: list[str], world_size: int) -> list[str]:
    """What keeps `flags` from launching Megatron-LM on `world_size` GPUs; [] if nothing."""
    values, problems = parse_line(flags)
    return problems + validate_args_problems(values, world_size)


def launched_split(values: dict[str, list[str]]) -> list[int]:
    """Layers per pipeline stage that Megatron-LM runs for a valid line's flags."""
    layers, pipeline = _int(values, "--num-layers"), _int(values, PP)
    first, last = _int(values, FIRST, None), _int(values, LAST, None)
    middle = pipeline - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    split = [rest // middle if middle else 0] * pipeline
    split[0] = split[0] if first is None else first
    split[-1] = split[-1] if last is None else last
    return split


# ------------------------------------------------------------- the checker rejects bad lines

# Valid on 64 GPUs: t2 p4 -> data 8; 64 % (2 x 8) == 0; 32 / 4 = 8 layers per stage, 2 per
# virtual stage.
GOOD = {
    "--num-layers": "32", "--hidden-size": "4096", "--num-attention-heads": "32",
    "--bf16": "", TP: "2", PP: "4", CP: "1", "--micro-batch-size": "2",
    "--global-batch-size": "64", "--sequence-parallel": "", "--recompute-granularity": "full",
    "--recompute-method": "uniform", VPP: "2", "--hidden-dropout": "0.1",
}


def line(changes: dict[str, str | None] | None = None) -> list[str]:
    """GOOD with flags changed: a value sets the flag, "" makes it bare, None drops it."""
    flags = {**GOOD, **(changes or {})}
    return [f"{flag} {value}".strip() for flag, value in flags.items() if value is not None]


NO_VPP = {VPP: None}
THIRTY_LAYERS = {"--num-layers": "30", **NO_VPP}

# (flags, world size, a fragment of the one problem expected)
BAD_LINES = {
    "unknown-flag": (line({"--tensor-parallel-size": "2"}), 64, "no such option"),
    "value-missing": (line({"--hidden-size": ""}), 64, "takes a value"),
    "value-on-store-true": (line({"--bf16": "1"}), 64, "takes no value"),
    "value-on-store-false": (line({"--disable-bias-linear": "0"}), 64, "takes no value"),
    "not-an-int": (line({"--micro-batch-size": "2.5"}), 64, "not of type int"),
    "not-a-float": (line({"--hidden-dropout": "high"}), 64, "not of type float"),
    "not-a-choice": (line({"--recompute-method": "all"}), 64, "not one of"),
    "twice": (line() + ["--bf16"], 64, "given twice"),
    "world-size-flag": (line({"--world-size": "64"}), 64, "launcher"),
    "data-parallel-uneven": (line(), 60, "no whole data-parallel size"),
    "global-batch": (line({"--global-batch-size": "72"}), 64, "global batch 72"),
    "layers-over-pipeline": (line(THIRTY_LAYERS), 64, "not divisible by pipeline"),
    "first-last-uneven": (line({**THIRTY_LAYERS, FIRST: "2", LAST: "3"}), 64, "middle"),
    "virtual-uneven": (line({VPP: "3"}), 64, "virtual pipeline"),
    "virtual-without-pipeline": (line({PP: "1"}), 64, "pipeline size > 1"),
    "sequence-parallel-without-tensor": (line({TP: "1"}), 64, "needs tensor parallel"),
    "recompute-method-selective": (
        line({"--recompute-granularity": "selective"}), 64, "needs --recompute-granularity"),
    "recompute-method-alone": (
        line({"--recompute-granularity": None}), 64, "needs --recompute-granularity"),
}


def test_checker_accepts_good_lines() -> None:
    assert check_launch_line(line(), 64) == []
    uneven = line({**THIRTY_LAYERS, FIRST: "3", LAST: "3"})
    assert check_launch_line(uneven, 64) == []  # 3 + 12 + 12 + 3


@pytest.mark.parametrize("case", BAD_LINES)
def test_checker_rejects_each_rule_once(case: str) -> None:
    flags, world_size, fragment = BAD_LINES[case]
    problems = check_launch_line(flags, world_size)
    assert len(problems) == 1 and fragment in problems[0], problems


# ------------------------------------------------------------ the zoo's best plans launch

CUSTOM_GPT = {"num_layers": 30, "hidden_size": 3072, "num_attention_heads": 32,
              "seq_length": 2048, "vocab_size": 51200}

# (model, GPUs, global batch). The slowest, llama3-405b, searches ~10-15 s at any GPU count
# (its 126 layers split many ways over pipeline stages); gpt-1t ~8-11 s; the rest < 4 s.
ZOO = [
    ("gpt3-1.3b", 16, 512), ("gpt3-2.7b", 32, 512), ("gpt3-6.7b", 64, 1024),
    ("gpt3-13b", 128, 1024), ("gpt3-175b", 1024, 1536), ("gpt3-175b", 512, 1536),
    ("gpt-1t", 3072, 3072), ("llama3-8b", 64, 1024), ("llama3-70b", 512, 1024),
    ("llama3-405b", 1024, 1024), ("mixtral-8x7b", 256, 1024), ("gpt-30-layers", 64, 512),
]


def zoo_model(name: str):
    """A preset, or `gpt-30-layers`: a GPT whose 30 layers some pipeline sizes do not
    divide."""
    return zoo_config("gpt", CUSTOM_GPT) if name == "gpt-30-layers" else get_preset(name)


def searched_plans(
    name: str, gpus: int, global_batch: int, top: int | None = None, keep=lambda c: True,
) -> list:
    """Training plans of the fitting Megatron configurations the search ranks (the `top`
    best, or every one `keep` accepts), best first."""
    model, cluster = zoo_model(name), Cluster.load(CLUSTER).with_devices(gpus)
    result = search(model, cluster, global_batch, {}, "megatron")
    assert result.ranked, f"no plan fits {name} on {gpus} GPUs"
    ranked = [candidate for candidate, _ in result.ranked if keep(candidate)][:top]
    return [training_plan(name, model, cluster, candidate.parallel,
                          list(candidate.layers_per_stage), candidate.stages)
            for candidate in ranked]


def assert_launchable(plan, gpus: int) -> None:
    """The plan has Megatron-LM flags, they pass the checker and say the plan's degrees."""
    assert plan.megatron_flags is not None, plan.megatron_incompatibility
    assert check_launch_line(plan.megatron_flags, gpus) == []
    values, _ = parse_line(plan.megatron_flags)
    q = plan.parallel
    assert [_int(values, flag) for flag in (TP, PP, CP)] == [q.tensor, q.pipeline, q.context]
    assert _int(values, "--micro-batch-size") == plan.micro_batch_size
    assert _int(values, "--global-batch-size") == plan.global_batch_size
    assert launched_split(values) == [stop - start for start, stop in
                                      (stage.layers for stage in plan.stages)]
    assert plan.num_gpus == gpus


@pytest.mark.parametrize(("name", "gpus", "global_batch"), ZOO,
                         ids=[f"{n}-{g}gpus-gbs{b}" for n, g, b in ZOO])
def test_best_plans_launch(name: str, gpus: int, global_batch: int) -> None:
    for plan in searched_plans(name, gpus, global_batch, top=5):
        assert_launchable(plan, gpus)


def test_uneven_pipeline_splits_launch() -> None:
    """Every fitting plan of the 30-layer GPT on pipelines that do not divide 30 names its
    smaller first and last stages."""
    uneven = searched_plans("gpt-30-layers", 64, 512,
                            keep=lambda candidate: 30 % candidate.parallel.dims.pipeline)
    assert uneven
    for plan in uneven:
        assert_launchable(plan, 64)
        assert any(flag.startswith(FIRST) for flag in plan.megatron_flags)


def test_uneven_split_of_divisible_layers_is_launched_as_planned() -> None:
    """32 layers as 7 + 9 + 9 + 7: Megatron-LM would run 8 per stage unless told the first
    and last stage sizes, though 4 divides 32."""
    cluster = Cluster.load(CLUSTER).with_devices(64)
    parallel = ParallelConfig.of(tensor=2, pipeline=4, micro_batch_size=1, global_batch_size=512)
    plan = training_plan("gpt3-2.7b", get_preset("gpt3-2.7b"), cluster, parallel, [7, 9, 9, 7])
    assert_launchable(plan, 64)
    assert {f"{FIRST} 7", f"{LAST} 7"} <= set(plan.megatron_flags)


# ----------------------------------------------------------------------------- the CLI


def run_cli(argv: list[str], path: Path, capsys) -> tuple[int, str, dict[str, Any]]:
    """Exit status, printed output and JSON plan of `plan ARGV --json PATH`."""
    code = cli.main([*argv, "--json", str(path)])
    return code, capsys.readouterr().out, json.loads(path.read_text())


PLAN_KEYS = {"parallel", "micro_batch_size", "num_micro_batches", "recompute", "schedule",
             "stages", "predicted", "megatron_flags"}
PARALLEL_KEYS = {"data", "tensor", "pipeline", "context", "expert", "sequence_parallel",
                 "zero_stage", "virtual_pipeline"}
STAGE_KEYS = {"layers", "num_devices", "mesh_shape"}
PREDICTED_KEYS = {"step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                  "hardware_tflops_per_gpu", "mfu", "memory_gib_per_gpu", "breakdown"}


def test_cli_plan_prints_and_writes_launchable_flags(tmp_path: Path, capsys) -> None:
    argv = ["gpt3-175b", "--cluster", CLUSTER, "--gpus", "1024", "--global-batch-size", "1536"]
    code, output, data = run_cli(argv, tmp_path / "plan.json", capsys)
    assert code == 0
    assert "Megatron-LM flags" in output
    assert PLAN_KEYS <= data.keys()
    assert PARALLEL_KEYS <= data["parallel"].keys()
    assert data["stages"] and all(STAGE_KEYS <= stage.keys() for stage in data["stages"])
    assert sum(stage["num_devices"] for stage in data["stages"]) == 1024
    assert PREDICTED_KEYS <= data["predicted"].keys()
    assert check_launch_line(data["megatron_flags"], 1024) == []
    # The file reads back as the plan it was written from.
    loaded = Plan.from_json(tmp_path / "plan.json")
    assert loaded.model_dump(mode="json") == data


def test_cli_what_if_predicts_the_given_configuration(tmp_path: Path, capsys) -> None:
    """GPT-3 175B as Narayanan et al. train it: t8 p8 d8, micro-batch 2, full recompute."""
    argv = ["gpt", "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads",
            "96", "--seq-length", "2048", "--vocab-size", "51200", "--cluster", CLUSTER,
            "--gpus", "512", "--global-batch-size", "1536", "--tensor-model-parallel-size", "8",
            "--pipeline-model-parallel-size", "8", "--micro-batch-size", "2",
            "--recompute-granularity", "full"]
    code, _, data = run_cli(argv, tmp_path / "out.json", capsys)
    assert code == 0
    q = data["parallel"]
    assert (q["tensor"], q["pipeline"], q["data"], q["context"]) == (8, 8, 8, 1)
    assert (data["micro_batch_size"], data["num_micro_batches"]) == (2, 96)
    assert data["recompute"] == "full"
    assert "--recompute-granularity full" in data["megatron_flags"]
    assert check_launch_line(data["megatron_flags"], 512) == []
    predicted = data["predicted"]
    # Full recomputation runs the forward pass twice: more executed than model FLOPs.
    assert predicted["hardware_tflops_per_gpu"] > predicted["model_tflops_per_gpu"]
    assert predicted["mfu"] == pytest.approx(
        predicted["model_tflops_per_gpu"] / A100_BF16_PEAK_TFLOPS, abs=1e-6)


def test_hugging_face_families_launch_as_their_blocks_are_built() -> None:
    """Qwen2's q/k/v biases, GPT-NeoX-style partial rotary and Gemma's (1 + w) norms have
    Megatron-LM flags, and the line launches; a parallel residual, norms after each
    sublayer, soft-caps or scaled embeddings have none: no line, and the plan says why."""
    llama = get_preset("llama3-8b")
    cluster = Cluster.load("dgx-h100").with_devices(8)
    knobs = ParallelConfig.of(tensor=8, micro_batch_size=1, global_batch_size=8)
    qwen = llama.model_copy(update={"qkv_bias": True, "rotary_percent": 0.25,
                                    "apply_layernorm_1p": True})
    plan = training_plan("qwen-like", qwen, cluster, knobs)
    assert_launchable(plan, 8)
    assert {"--disable-bias-linear", "--add-qkv-bias", "--rotary-percent 0.25",
            "--apply-layernorm-1p"} <= set(plan.megatron_flags)
    for field, value, named in (("parallel_residual", True, "a parallel residual"),
                                ("sandwich_norms", True, "norms after each sublayer"),
                                ("final_logit_softcap", 30.0, "soft-capped logits")):
        other = training_plan("other", llama.model_copy(update={field: value}), cluster,
                              knobs)
        assert other.megatron_flags is None
        assert named in other.megatron_incompatibility


def test_a_knob_megatron_does_not_run_leaves_the_plan_without_a_line() -> None:
    """A knob the registry gives other engines only (torchtune's chunked loss,
    bitsandbytes' optimizers), off its default: no Megatron-LM line, the plan names it."""
    llama = get_preset("llama3-8b")
    cluster = Cluster.load("dgx-h100").with_devices(8)
    for knobs, named in ((dict(loss_chunks=8), "--loss-chunks (torchtitan only)"),
                         (dict(optimizer="adam8bit"), "--optimizer (torchtitan only)")):
        plan = training_plan("llama3-8b", llama, cluster, ParallelConfig.of(
            data=8, micro_batch_size=1, global_batch_size=8, engine="torchtitan", **knobs))
        assert plan.megatron_flags is None
        assert named in plan.megatron_incompatibility
