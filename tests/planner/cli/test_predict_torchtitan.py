"""`plan predict --torchtitan JOB.toml`: a TorchTitan 0.2 job config in, the prediction of
exactly that run out, priced as TorchTitan runs it.

- Job configs of Llama 3 8B, 70B and 405B with FSDP, tensor, pipeline (1F1B and
  Interleaved1F1B) and context parallelism, float8 and compile predict what `plan`'s
  predictor gives the configuration TorchTitan runs (written out here, key by key).
- Every plan's emitted TOML round-trips: `plan --engine torchtitan ... --emit torchtitan`
  and the search's best plans under TorchTitan, read back, predict the same step time and
  memory; TorchTitan's own ConfigManager reads each file.
- The search's best plan comes with the TOML keys that change.
- A bad job config is one line and exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.export.engines import Refusal, engine_files
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan
from planner.search.megatron_space import search_megatron
from planner.plans.transformer_plan import training_plan

CLUSTER = "dgx-h100"


def titan(**knobs: Any) -> ParallelConfig:
    """A configuration as TorchTitan runs it: FSDP2 (or DDP) overlapping its collectives,
    sequence parallelism with tensor parallelism, fp8 scaled per tensor."""
    zero = knobs.setdefault("zero_stage", 3)
    knobs.setdefault("sequence_parallel", knobs.get("tensor", 1) > 1)
    return ParallelConfig.of(engine="torchtitan", overlap_grad_reduce=True,
                          overlap_param_gather=zero >= 1, fp8_recipe="tensorwise", **knobs)


def parts(counts: list[int]) -> str:
    """module_fqns_per_model_part of parts holding `counts` blocks, as TOML."""
    names, layer = [], 0
    for index, count in enumerate(counts):
        part = ["tok_embeddings"] if index == 0 else []
        part += [f"layers.{i}" for i in range(layer, layer + count)]
        part += ["norm", "output"] if index == len(counts) - 1 else []
        names.append(part)
        layer += count
    return json.dumps(names)


FP8 = '[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n' \
      'precompute_float8_dynamic_scale_for_fsdp = true\n'

# name -> (the job config, --gpus or None, the configuration TorchTitan runs, layers per
# stage, chunk layers)
CASES: dict[str, tuple[str, int | None, ParallelConfig, list[int] | None, list[int] | None]] = {
    # TorchTitan's Llama 3.1 8B benchmark (docs/performance.md, table 1 row 1).
    "8b-fsdp-op-checkpointing": (
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\n'
        'seq_len = 8192\n[activation_checkpoint]\nmode = "selective"\n'
        'selective_ac_option = "op"\n', 8,
        titan(data=8, micro_batch_size=2, global_batch_size=16, recompute="selective"),
        None, None),
    # Table 1 row 3: float8 with fp8 all-gathers, compiled.
    "8b-fsdp-float8-compile": (
        '[model]\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n[training]\n'
        'local_batch_size = 2\nseq_len = 8192\n[activation_checkpoint]\nmode = "selective"\n'
        'selective_ac_option = "op"\n[compile]\nenable = true\n' + FP8, 8,
        titan(data=8, micro_batch_size=2, global_batch_size=16, recompute="selective",
              precision="fp8", compile=True, compile_loss=True, fp8_param_gather=True), None, None),
    "8b-context-parallel-every-2nd-block": (
        '[model]\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 32\n'
        'seq_len = 32768\n[parallelism]\ncontext_parallel_degree = 4\n'
        "data_parallel_shard_degree = 4\n", None,
        titan(context=4, data=4, micro_batch_size=1, global_batch_size=32, recompute="full",
              recompute_every=2), None, None),
    "8b-ddp": (
        '[model]\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 4096\n'
        "[parallelism]\ndata_parallel_replicate_degree = 16\ndata_parallel_shard_degree = 1\n"
        '[activation_checkpoint]\nmode = "full"\n', None,
        titan(data=16, zero_stage=0, micro_batch_size=1, global_batch_size=16,
              recompute="full"), None, None),
    # TorchTitan's own 70B preset (train_configs/llama3_70b.toml) on 64 GPUs.
    "70b-fsdp-tp8": (
        '[model]\nname = "llama3"\nflavor = "70B"\n[training]\nlocal_batch_size = 8\n'
        "seq_len = 8192\n[parallelism]\ndata_parallel_shard_degree = -1\n"
        'tensor_parallel_degree = 8\n[activation_checkpoint]\nmode = "full"\n', 64,
        titan(tensor=8, data=8, micro_batch_size=8, global_batch_size=64, recompute="full"),
        None, None),
    # 1F1B on TorchTitan's own split: 82 weighted layers over 4 stages.
    "70b-tp8-pp4-1f1b": (
        '[model]\nflavor = "70B"\n[training]\nlocal_batch_size = 8\nseq_len = 8192\n'
        "[parallelism]\ntensor_parallel_degree = 8\npipeline_parallel_degree = 4\n"
        'data_parallel_shard_degree = 2\npipeline_parallel_schedule = "1F1B"\n'
        '[activation_checkpoint]\nmode = "full"\n', None,
        titan(tensor=8, pipeline=4, data=2, micro_batch_size=1, global_batch_size=16,
              recompute="full"), [20, 21, 20, 19], None),
    # The 405B run: FSDP8 x TP8 x PP8, 1F1B, full checkpointing, float8.
    "405b-fsdp8-tp8-pp8-1f1b-float8": (
        '[model]\nflavor = "405B"\nconverters = ["quantize.linear.float8"]\n[training]\n'
        "local_batch_size = 16\nseq_len = 8192\n[parallelism]\ndata_parallel_shard_degree = 8\n"
        "tensor_parallel_degree = 8\npipeline_parallel_degree = 8\n"
        'enable_async_tensor_parallel = true\n[activation_checkpoint]\nmode = "full"\n'
        "[compile]\nenable = true\n" + FP8, 512,
        titan(tensor=8, pipeline=8, data=8, micro_batch_size=1, global_batch_size=128,
              recompute="full", precision="fp8", compile=True, compile_loss=True,
              fp8_param_gather=True, tp_comm_overlap=True), [15, 16, 16, 16, 16, 16, 16, 15], None),
    # Interleaved1F1B with the parts given, context parallelism and parameters kept
    # gathered.
    "405b-interleaved-context-parallel": (
        '[model]\nflavor = "405B"\n[training]\nlocal_batch_size = 8\nseq_len = 16384\n'
        "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 8\n"
        "context_parallel_degree = 2\npipeline_parallel_degree = 7\n"
        'pipeline_parallel_schedule = "Interleaved1F1B"\n'
        'fsdp_reshard_after_forward = "never"\n'
        f"module_fqns_per_model_part = {parts([9] * 14)}\n"
        '[activation_checkpoint]\nmode = "full"\n', None,
        titan(tensor=8, pipeline=7, context=2, data=4, micro_batch_size=1,
              global_batch_size=32, recompute="full", schedule="interleaved",
              virtual_pipeline=2, fsdp_reshard_after_forward="never"), None, None),
}


def predict(argv: list[str], tmp_path: Path, capsys) -> tuple[dict, str]:
    path = tmp_path / "predict.json"
    assert cli.main(["predict", "--cluster", CLUSTER, "--json", str(path), *argv]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def job_file(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def cluster_of(gpus: int) -> Cluster:
    return Cluster.load(CLUSTER).with_devices(gpus)


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_config_predicts_the_configuration_torchtitan_runs(
        case: str, tmp_path: Path, capsys) -> None:
    text, gpus, expected, layers, chunks = CASES[case]
    argv = ["--torchtitan", job_file(tmp_path, text), "--no-search"]
    report, output = predict(argv + (["--gpus", str(gpus)] if gpus else []), tmp_path, capsys)
    launched = report["job_config"]
    preset = launched["model"]
    model = get_preset(preset).model_copy(update={
        "seq_length": int(text.split("seq_len = ")[1].split("\n")[0])})
    world = expected.dims.model_parallel * expected.dims.data
    planned = training_plan(preset, model, cluster_of(world), expected, layers,
                            chunk_layers=chunks)
    assert launched["predicted"] == json.loads(planned.to_json())["predicted"]
    assert launched["run"] == json.loads(planned.to_json())["run"]
    assert [s["layers"] for s in launched["stages"]] == [list(s.layers) for s in planned.stages]
    p = planned.predicted
    assert f"{p.step_time_s:.3f}" in output
    assert f"{p.memory_gib_per_gpu:.1f} GiB allocated, {p.reserved_gib_per_gpu:.1f} GiB " \
           "reserved per GPU" in " ".join(output.split())
    # 8B under DDP: 16 bytes a weight; 8B at batch 2 on 8 H100 80 GB: reserved too much.
    assert ("out of memory: the run needs" in output) == (not p.fits)
    assert ("reserves does not fit" in output) == (p.fits and not p.reserved_fits)
    assert report["best"] == [] and report["speed_up"] is None


def test_torchtitans_8b_benchmark_is_predicted_within_ten_percent(
        tmp_path: Path, capsys) -> None:
    """TorchTitan's Llama 3.1 8B on 8 H100: 82.4 GiB reserved at its peak (table 1 row 1;
    ../shared/calibration/published_memory.csv)."""
    text = CASES["8b-fsdp-op-checkpointing"][0]
    report, _ = predict(["--torchtitan", job_file(tmp_path, text), "--gpus", "8",
                         "--no-search"], tmp_path, capsys)
    assert report["job_config"]["predicted"]["reserved_gib_per_gpu"] == pytest.approx(
        82.4, rel=0.10)


def test_the_defaults_and_ignored_keys_are_said(tmp_path: Path, capsys) -> None:
    text = ('[job]\ndump_folder = "./outputs"\n[model]\nflavor = "8B"\n'
            'hf_assets_path = "./assets/hf/Llama-3.1-8B"\n[optimizer]\nlr = 3e-4\n')
    report, output = predict(["--torchtitan", job_file(tmp_path, text), "--gpus", "8",
                              "--no-search"], tmp_path, capsys)
    assert report["ignored_keys"] == ["job.dump_folder", "model.hf_assets_path",
                                      "optimizer.lr"]
    flat = " ".join(output.split())
    assert "ignored 3 keys that change neither time nor memory" in flat
    assert "note: training.seq_len 2048 (TorchTitan's default)" in flat
    assert 'selective_ac_option "2"' in flat


# ------------------------------------------------------------------------- round trips


@lru_cache(maxsize=1)
def config_manager() -> Any:
    """TorchTitan 0.2's ConfigManager, or None where it does not import (its package
    imports triton MoE kernels no config code calls: stubbed, as test_engines does)."""
    if importlib.util.find_spec("torchtitan") is None:
        return None
    kernels = types.ModuleType("torchtitan.models.moe.kernels")
    kernels.generate_permute_indices = None
    sys.modules.setdefault(kernels.__name__, kernels)
    try:
        from torchtitan.config import ConfigManager
    except ImportError:
        return None
    return ConfigManager


def round_trip(plan: Plan, tmp_path: Path, capsys) -> dict:
    """The plan's emitted TOML, checked by TorchTitan's ConfigManager where it imports,
    predicted by `plan predict --torchtitan` (without --gpus: the file gives them)."""
    files = engine_files("torchtitan", plan, get_preset(plan.model))
    path = job_file(tmp_path, files["torchtitan.toml"], "torchtitan.toml")
    manager = config_manager()
    if manager is not None:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*is annotated with type.*")
            manager().parse_args(["--job.config_file", path])
    report, _ = predict(["--torchtitan", path, "--no-search"], tmp_path, capsys)
    return report["job_config"]


def same_prediction(read: dict, plan: Plan) -> None:
    planned = json.loads(plan.to_json())
    assert read["predicted"]["step_time_s"] == planned["predicted"]["step_time_s"]
    assert read["predicted"]["memory_gib_per_gpu"] == planned["predicted"]["memory_gib_per_gpu"]
    assert read["predicted"] == planned["predicted"]
    assert read["run"] == planned["run"] and read["parallel"] == planned["parallel"]
    assert [s["layers"] for s in read["stages"]] == [s["layers"] for s in planned["stages"]]


# name -> (preset, GPUs, the configuration planned)
PLANNED = {
    "8b-ddp": ("llama3-8b", 8, titan(data=8, zero_stage=0, micro_batch_size=2,
                                     global_batch_size=64)),
    "8b-fsdp-every-3rd-block-never-reshard": (
        "llama3-8b", 16, titan(tensor=2, data=8, micro_batch_size=1, global_batch_size=64,
                               recompute="full", recompute_every=3,
                               fsdp_reshard_after_forward="never")),
    "70b-interleaved-context": (
        "llama3-70b", 128, titan(tensor=8, pipeline=4, context=2, data=2,
                                 micro_batch_size=1, global_batch_size=32, recompute="full",
                                 schedule="interleaved", virtual_pipeline=2)),
    "70b-gpipe-op-checkpointing": (
        "llama3-70b", 64, titan(tensor=8, pipeline=2, data=4, micro_batch_size=1,
                                global_batch_size=32, recompute="selective",
                                schedule="gpipe")),
    "70b-loss-compiled": (
        "llama3-70b", 64, titan(tensor=8, pipeline=1, data=8, micro_batch_size=1,
                                global_batch_size=32, recompute="selective",
                                compile_loss=True)),
    "405b-float8-compile-async-tp": (
        "llama3-405b", 512, titan(tensor=8, pipeline=8, data=8, micro_batch_size=1,
                                  global_batch_size=128, recompute="full", precision="fp8",
                                  compile=True, compile_loss=True, fp8_param_gather=True,
                                  tp_comm_overlap=True)),
}


@pytest.mark.parametrize("case", list(PLANNED))
def test_a_planned_configuration_round_trips(case: str, tmp_path: Path, capsys) -> None:
    preset, gpus, parallel = PLANNED[case]
    plan = training_plan(preset, get_preset(preset), cluster_of(gpus), parallel)
    same_prediction(round_trip(plan, tmp_path, capsys), plan)


def test_the_searchs_best_plans_round_trip(tmp_path: Path, capsys) -> None:
    """The first plans of the search under TorchTitan, with and without compile and fp8
    all-gathers, each read back to the same prediction."""
    from planner.plans.transformer_plan import ranked_plans
    from planner.vocabulary.parallel import FixedKnobs

    model = get_preset("llama3-70b")
    cluster = cluster_of(64)
    for fixed in ({"engine": "torchtitan", "precision": "bf16"},
                  {"engine": "torchtitan", "precision": "fp8", "compile": True,
                   "fp8_param_gather": True}):
        result = search_megatron(model, cluster, 128, FixedKnobs(fixed))
        for plan in ranked_plans("llama3-70b", model, cluster, result, 3):
            same_prediction(round_trip(plan, tmp_path, capsys), plan)


@pytest.mark.parametrize("version, config", [
    ("0.3", "torchtitan_config.py:tessel_plan"), ("0.2", "torchtitan.toml")])
def test_plan_emit_torchtitan_round_trips(version: str, config: str, tmp_path: Path,
                                          capsys) -> None:
    out, plan_json = tmp_path / "out", tmp_path / "plan.json"
    assert cli.main(["llama3-8b", "--gpus", "16", "--global-batch-size", "64", "--cluster",
                     CLUSTER, "--engine", "torchtitan", "--space", "megatron", "--top", "1",
                     "--emit", "torchtitan", str(out), "--torchtitan-version", version,
                     "--json", str(plan_json)]) == 0
    capsys.readouterr()
    planned = json.loads(plan_json.read_text())
    report, _ = predict(["--torchtitan", str(out / config), "--no-search"], tmp_path, capsys)
    read = report["job_config"]
    assert read["run"]["engine"] == planned["run"]["engine"] == "torchtitan"
    assert read["predicted"] == planned["predicted"]
    assert read["run"] == planned["run"] and read["parallel"] == planned["parallel"]


def test_a_torchtitan_plan_torchtitan_would_run_otherwise_is_refused() -> None:
    plan = training_plan("llama3-8b", get_preset("llama3-8b"), cluster_of(16),
                         titan(tensor=2, data=8, global_batch_size=64).but(
                             zero_stage=1, overlap_param_gather=True))
    with pytest.raises(Refusal, match="not ZeRO-1; plan with --zero-stage 3"):
        engine_files("torchtitan", plan, get_preset("llama3-8b"))


# ---------------------------------------------------------------------------- the search


def test_the_best_plan_comes_with_the_keys_that_change(tmp_path: Path, capsys) -> None:
    text = ('[model]\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 64\n'
            'seq_len = 8192\n[parallelism]\ntensor_parallel_degree = 8\n'
            "data_parallel_shard_degree = 2\n[activation_checkpoint]\nmode = \"full\"\n")
    report, output = predict(["--torchtitan", job_file(tmp_path, text), "--top", "2"],
                             tmp_path, capsys)
    launched, best = report["job_config"], report["best"][0]
    assert len(report["best"]) == 2
    assert all(plan["run"]["engine"] == "torchtitan" for plan in report["best"])
    assert best["precision"] == "bf16"
    assert report["speed_up"] == pytest.approx(
        launched["predicted"]["step_time_s"] / best["predicted"]["step_time_s"])
    assert report["speed_up"] > 1
    changed = {c["key"]: (c["job_config"], c["best"]) for c in report["keys_changed"]}
    assert changed["parallelism.tensor_parallel_degree"][0] == 8
    assert changed["parallelism.tensor_parallel_degree"][1] == best["parallel"]["tensor"]
    flat = " ".join(output.split())
    assert "keys that change: " in flat
    assert "parallelism.tensor_parallel_degree 8 -> " in flat
    assert "Megatron-LM flags:" not in flat  # the best plan is for TorchTitan


# --------------------------------------------------------------------------- bad inputs

GOOD = '[model]\nflavor = "8B"\n[training]\nseq_len = 8192\n'
BAD = {
    "unknown flavor": ('[model]\nflavor = "7B"\n', ["--gpus", "8"],
                       ['model.flavor = "7B" is not a Llama 3 flavor of TorchTitan 0.2']),
    "degrees not multiplying to the GPUs": (
        GOOD + "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 4\n",
        ["--gpus", "8"], ["= 16 GPUs, but --gpus is 8; make them agree or drop --gpus"]),
    "not TOML": ("--num-layers 32 --hidden-size 4096\n", ["--gpus", "8"],
                 ["is not TOML (", "give the job config TorchTitan reads"]),
    "unknown key": (GOOD + "[parallelism]\npipeline_parallel_degre = 2\n", ["--gpus", "8"],
                    ["parallelism.pipeline_parallel_degre is not a key of TorchTitan 0.2's "
                     "job config (did you mean parallelism.pipeline_parallel_degree?)"]),
    "unknown table": (GOOD + "[float8]\nenable_fsdp_float8_all_gather = true\n",
                      ["--gpus", "8"], ["(did you mean [quantize.linear.float8]?)"]),
    "unpriced key": (GOOD + "gc_debug = true\n", ["--gpus", "8"],
                     ["training.gc_debug = true changes the step's time"]),
    "no GPU count": (GOOD, [], ["data_parallel_shard_degree is -1", "add --gpus N"]),
    "float8 on an A100": (
        GOOD.replace('"8B"\n', '"8B"\nconverters = ["quantize.linear.float8"]\n'),
        ["--gpus", "8", "--cluster", "dgx-a100-80g"],
        ['model.converters ["quantize.linear.float8"] needs fp8 tensor cores']),
    "Megatron-LM flags too": (GOOD, ["--gpus", "8", "--", "--num-layers", "2"],
                              ["give one of the two"]),
    "auto space": (GOOD, ["--gpus", "8", "--space", "auto"], ["drop --space"]),
}


@pytest.mark.parametrize("case", [*BAD, "missing file"])
def test_a_bad_job_config_is_one_line_and_exit_2(case: str, one_line_error, monkeypatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    if case == "missing file":
        path, argv, fragments = "nowhere.toml", ["--gpus", "8"], [
            "--torchtitan 'nowhere.toml' cannot be read"]
    else:
        text, argv, fragments = BAD[case]
        path = job_file(tmp_path, text)
    cluster = [] if "--cluster" in argv else ["--cluster", CLUSTER]
    output = one_line_error(["predict", *cluster, "--torchtitan", path, *argv])
    assert output.startswith("error: ")
    for fragment in fragments:
        assert fragment in output
