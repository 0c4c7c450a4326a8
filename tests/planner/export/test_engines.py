"""Launch files for the engines people run, each read back by that engine's own code.

A dozen plans (zoo presets from 8 to 8,192 GPUs, MoE with expert parallelism, context
parallelism, ZeRO-3, the interleaved schedule, fp8, an uneven pipeline split, GB200 hosts
of 4 GPUs, and stages on different meshes) go through every exporter. Each emitted file
is checked by:

- Megatron-LM: torchrun's own argument parser on the line, the shared option list and
  `validate_args` rules (`test_megatron.check_launch_line`), and, where megatron-core is
  installed, Megatron-LM's own `parse_args` + `validate_args` (`megatron_validate.py`);
- TorchTitan 0.2: `tomllib`, then (where installed) its `ConfigManager` and `ParallelDims`;
- DeepSpeed: (where installed) `DeepSpeedConfig` on the JSON, told the data-parallel
  world size, and its launcher's `parse_args` on the launch line;
- PyTorch: torch itself: the script is imported and rank 0 builds its DeviceMesh,
  parallelized chunks and pipeline schedule on a fake process group of the plan's size;
- Slurm: `sbatch`'s own option parser (where slurm-client is installed), and torchrun's
  parser on the `srun torchrun` line with Slurm's variables filled in;
- Ray Train: (where installed) the script's `TorchTrainer` built with Ray's classes.

A validator that is not installed skips with the reason; the structural checks still run.
A plan an engine cannot run is refused with one line and no file.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.run import get_args_parser

from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.export.engines import ENGINES, Refusal, engine_files
from planner.models.presets import get_preset, zoo_config
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan
from planner.plans.transformer_plan import training_plan
from tests.planner.export.emitted_script import built_on_rank_0, imported

HERE = Path(__file__).resolve().parent

try:  # the shared Megatron-LM option list and validate_args rules (skips without them)
    from test_megatron import check_launch_line
except (ImportError, pytest.skip.Exception):  # pragma: no cover - no shared reference
    check_launch_line = None


# ----------------------------------------------------------------------------- the plans


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    gpus: int
    knobs: dict[str, Any] = field(default_factory=dict)
    layers: tuple[int, ...] | None = None
    stages: tuple[tuple[int, int, int], ...] | None = None  # (layers, tensor, data)


FULL = {"recompute": "full", "zero_stage": 1, "micro_batch_size": 1}
CASES = {
    "gpt3-1.3b-8gpus-data-parallel": Case(
        "gpt3-1.3b", "dgx-a100-80g", 8, {"micro_batch_size": 4, "global_batch_size": 256,
                                         "zero_stage": 1}),
    "gpt3-2.7b-16gpus-tp2-sp-zero0": Case(
        "gpt3-2.7b", "dgx-a100-80g", 16, {"tensor": 2, "sequence_parallel": True,
                                          "micro_batch_size": 2, "global_batch_size": 128,
                                          "recompute": "selective"}),
    "llama3-8b-8gpus-zero3": Case(
        "llama3-8b", "dgx-h100", 8, {**FULL, "zero_stage": 3, "global_batch_size": 64}),
    "llama3-8b-64gpus-interleaved": Case(
        "llama3-8b", "dgx-h100", 64, {**FULL, "tensor": 2, "pipeline": 4,
                                      "sequence_parallel": True, "global_batch_size": 256,
                                      "schedule": "interleaved", "virtual_pipeline": 2}),
    "llama3-8b-32gpus-dualpipev": Case(
        "llama3-8b", "dgx-h100", 32, {**FULL, "tensor": 2, "pipeline": 4, "zero_stage": 3,
                                      "sequence_parallel": True, "global_batch_size": 64,
                                      "schedule": "dualpipev", "virtual_pipeline": 2,
                                      "engine": "torchtitan", "overlap_grad_reduce": True,
                                      "overlap_param_gather": True}),
    "llama3-70b-256gpus-context-parallel": Case(
        "llama3-70b", "dgx-h100", 256, {**FULL, "tensor": 8, "pipeline": 2, "context": 2,
                                        "sequence_parallel": True, "global_batch_size": 256}),
    "mixtral-8x7b-64gpus-expert-parallel": Case(
        "mixtral-8x7b", "dgx-h100", 64, {**FULL, "tensor": 2, "pipeline": 2, "expert": 4,
                                         "sequence_parallel": True, "global_batch_size": 256,
                                         "moe_token_dispatcher": "alltoall"}),
    "gpt3-175b-1024gpus-t8p8": Case(
        "gpt3-175b", "dgx-a100-80g", 1024, {**FULL, "tensor": 8, "pipeline": 8,
                                            "sequence_parallel": True,
                                            "global_batch_size": 1536}),
    "llama3-405b-8192gpus": Case(
        "llama3-405b", "dgx-h100", 8192, {**FULL, "tensor": 8, "pipeline": 16,
                                          "sequence_parallel": True,
                                          "global_batch_size": 4096}),
    "gpt-1t-3072gpus-p64": Case(
        "gpt-1t", "dgx-a100-80g", 3072, {**FULL, "tensor": 8, "pipeline": 64,
                                         "sequence_parallel": True,
                                         "global_batch_size": 3072}),
    "llama3-70b-256-gb200-hosts-of-4": Case(
        "llama3-70b", "gb200-nvl72", 256, {**FULL, "tensor": 4, "pipeline": 4,
                                           "sequence_parallel": True,
                                           "global_batch_size": 512}),
    "llama3-8b-16gpus-fp8": Case(
        "llama3-8b", "dgx-h100", 16, {**FULL, "global_batch_size": 128, "precision": "fp8",
                                      "fp8_recipe": "tensorwise"}),
    "gpt-30-layers-64gpus-uneven": Case(
        "gpt-30-layers", "dgx-a100-80g", 64, {**FULL, "tensor": 2, "pipeline": 4,
                                              "sequence_parallel": True,
                                              "global_batch_size": 256},
        layers=(6, 9, 9, 6)),
    "llama3-8b-16gpus-stages-on-two-meshes": Case(
        "llama3-8b", "dgx-h100", 16, {**FULL, "tensor": 4, "data": 2, "pipeline": 2,
                                      "micro_batch_size": 2, "global_batch_size": 64},
        stages=((16, 4, 2), (16, 2, 4))),
}
CUSTOM_GPT = {"num_layers": 30, "hidden_size": 3072, "num_attention_heads": 32,
              "seq_length": 2048, "vocab_size": 51200}


def shape(name: str):
    return zoo_config("gpt", CUSTOM_GPT) if name == "gpt-30-layers" else get_preset(name)


@lru_cache(maxsize=None)
def plan_of(case_id: str) -> Plan:
    """The case's plan, predicted as given (no search)."""
    case = CASES[case_id]
    cluster = Cluster.load(case.cluster).with_devices(case.gpus)
    stages = None
    if case.stages:
        from cost_models.pipeline_memory import StageLayout

        stages = tuple(StageLayout(*stage) for stage in case.stages)
    return training_plan(case.model, shape(case.model), cluster, ParallelConfig.of(**case.knobs),
                         list(case.layers) if case.layers else None, stages)


@lru_cache(maxsize=None)
def files_of(case_id: str, engine: str) -> dict[str, str] | str:
    """The engine's files for the case, or its one-line refusal."""
    try:
        return engine_files(engine, plan_of(case_id), shape(CASES[case_id].model))
    except Refusal as why:
        return str(why)


def emitted(case_id: str, engine: str) -> dict[str, str]:
    """The engine's files, skipping (with its one line) where the engine refuses."""
    files = files_of(case_id, engine)
    if isinstance(files, str):
        assert "\n" not in files and files.strip(), files
        pytest.skip(f"refused, as it should be: {files}")
    return files


@pytest.fixture(params=list(CASES))
def case_id(request) -> str:
    return request.param


# --------------------------------------------------------------- what each engine refuses

# Which engines run which case: every other engine must refuse it in one line.
RUNS = {
    "gpt3-1.3b-8gpus-data-parallel": {"megatron", "deepspeed", "pytorch", "slurm", "ray",
                                      "maxtext"},
    "gpt3-2.7b-16gpus-tp2-sp-zero0": {"megatron", "pytorch", "slurm", "ray", "maxtext"},
    "llama3-8b-8gpus-zero3": {"torchtitan", "deepspeed", "pytorch", "slurm", "ray", "maxtext"},
    "llama3-8b-64gpus-interleaved": {"megatron", "torchtitan", "pytorch", "slurm", "ray"},
    # DualPipeV: TorchTitan's; Megatron-LM has no such schedule, the PyTorch script lays
    # chunks out in loop order only.
    "llama3-8b-32gpus-dualpipev": {"torchtitan"},
    "llama3-70b-256gpus-context-parallel": {"megatron", "torchtitan", "slurm", "ray"},
    "mixtral-8x7b-64gpus-expert-parallel": {"megatron", "slurm", "ray"},
    "gpt3-175b-1024gpus-t8p8": {"megatron", "slurm", "ray"},
    "llama3-405b-8192gpus": {"megatron", "torchtitan", "pytorch", "slurm", "ray"},
    "gpt-1t-3072gpus-p64": {"megatron", "slurm", "ray"},
    "llama3-70b-256-gb200-hosts-of-4": {"megatron", "torchtitan", "pytorch", "slurm", "ray"},
    "llama3-8b-16gpus-fp8": {"megatron", "torchtitan", "slurm", "ray"},
    "gpt-30-layers-64gpus-uneven": {"megatron", "slurm", "ray"},
    "llama3-8b-16gpus-stages-on-two-meshes": set(),
}


def test_each_engine_runs_or_refuses_each_plan_in_one_line(case_id: str) -> None:
    """Checks: every engine either writes files or answers with one non-empty line that
    names it, never both, and exactly the engines expected run each plan."""
    runs = set()
    for engine in ENGINES:
        files = files_of(case_id, engine)
        if isinstance(files, str):
            assert files.strip() and "\n" not in files, (engine, files)
            assert "cannot run" in files or "runs this plan" in files, files
        else:
            assert files and all(text.strip() for text in files.values())
            runs.add(engine)
    assert runs == RUNS[case_id]


# ---------------------------------------------------------------------------- torchrun


def torchrun_args(line: str, **env: str):
    """torchrun's own parser on a shell line (variables filled in from `env`)."""
    for name, value in {"MASTER_ADDR": "node0", **env}.items():
        line = line.replace(f"${name}", value)
    words = shlex.split(line)
    start = words.index("torchrun")
    return get_args_parser().parse_args(words[start + 1:])


def launch_line(text: str, first_word: str) -> str:
    return next(line for line in text.splitlines() if line.split()[:1] == [first_word])


def assert_hosts(args, plan: Plan) -> None:
    per_host = plan.devices_per_host or plan.devices_per_node
    assert int(args.nproc_per_node) == min(per_host, plan.num_gpus)
    assert int(args.nnodes) * int(args.nproc_per_node) == plan.num_gpus
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "node0:29500"


# ---------------------------------------------------------------------------- Megatron-LM


def flag_items(words: list[str]) -> list[str]:
    """['--a', '1', '--b'] -> ['--a 1', '--b']."""
    items: list[str] = []
    for word in words:
        if word.startswith("--") or not items:
            items.append(word)
        else:
            items[-1] += " " + word
    return items


def test_megatron_script_passes_torchrun_and_the_shared_option_list(case_id: str) -> None:
    """Checks: megatron.sh's torchrun line parses with torchrun's parser, starts the
    plan's hosts x GPUs on pretrain_gpt.py, passes the plan's flags unchanged, and every
    flag on it passes the shared Megatron-LM option list and validate_args rules."""
    text = emitted(case_id, "megatron")["megatron.sh"]
    plan = plan_of(case_id)
    args = torchrun_args(launch_line(text, "torchrun"))
    assert_hosts(args, plan)
    assert args.training_script == "pretrain_gpt.py"
    items = flag_items(args.training_script_args)
    assert items[:len(plan.megatron_flags)] == plan.megatron_flags
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text.splitlines()
    if check_launch_line is None:
        pytest.skip("shared/reference/megatron_lm_arguments.json not found")
    assert check_launch_line(items, plan.num_gpus) == []


def _megatron_installed() -> str | None:
    """Why Megatron-LM's own parser cannot run here, or None."""
    if importlib.util.find_spec("megatron") is None or \
            importlib.util.find_spec("megatron.training") is None:
        return ("megatron-core >= 0.17 (its megatron.training package) is not installed: "
                "make test installs it")
    return None


def _megatron_requests() -> list[tuple[str, dict]]:
    requests = []
    for case_id in CASES:
        files = files_of(case_id, "megatron")
        if isinstance(files, str):
            continue
        text, plan = files["megatron.sh"], plan_of(case_id)
        line = launch_line(text, "torchrun")
        words = shlex.split(line.replace("$MASTER_ADDR", "node0"))
        script = words.index("pretrain_gpt.py")
        env = dict(re.findall(r"^export (\w+)=(\S+)$", text, re.MULTILINE))
        requests.append((case_id, {"argv": words[script:], "env": {
            **env, "WORLD_SIZE": str(plan.num_gpus), "RANK": "0", "LOCAL_RANK": "0"}}))
    return requests


# A line Megatron-LM must refuse (30 layers on 4 pipeline stages, no uneven split given),
# so that its check cannot pass vacuously.
BAD_MEGATRON = {"argv": ["pretrain_gpt.py", "--num-layers", "30", "--hidden-size", "1024",
                         "--num-attention-heads", "16", "--seq-length", "1024",
                         "--max-position-embeddings", "1024", "--micro-batch-size", "1",
                         "--pipeline-model-parallel-size", "4", "--train-iters", "10",
                         "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer",
                         "--vocab-size", "1024"],
                "env": {"WORLD_SIZE": "8"}}

# Megatron-LM's import takes ~10 s: its validation of every plan's line starts in its own
# process as this module loads and is collected when the test asks.
_MEGATRON_JOB = None
if _megatron_installed() is None:
    _MEGATRON_REQUESTS = [*_megatron_requests(), ("refused-line", BAD_MEGATRON)]
    _MEGATRON_JOB = subprocess.Popen(
        [sys.executable, str(HERE / "megatron_validate.py")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=str(HERE), env={**os.environ, "PYTHONWARNINGS": "ignore"})
    _MEGATRON_JOB.stdin.write(json.dumps([request for _, request in _MEGATRON_REQUESTS]))
    _MEGATRON_JOB.stdin.close()


@lru_cache(maxsize=1)
def megatron_results() -> dict[str, dict]:
    assert _MEGATRON_JOB is not None
    output = _MEGATRON_JOB.stdout.read()
    assert _MEGATRON_JOB.wait(timeout=240) == 0, "megatron_validate.py failed"
    results = json.loads(output)
    return {case_id: result for (case_id, _), result in zip(_MEGATRON_REQUESTS, results)}


# ---------------------------------------------------------------------------- TorchTitan


@lru_cache(maxsize=1)
def torchtitan() -> types.SimpleNamespace | str:
    """TorchTitan 0.2's ConfigManager and ParallelDims, or why they cannot be imported.

    TorchTitan's package imports its MoE kernels, written in triton (a GPU package), for
    fp8 grouped matmuls; neither the config nor ParallelDims calls them, so that one
    module is left uncompiled here."""
    if importlib.util.find_spec("torchtitan") is None:
        return "torchtitan 0.2 is not installed: make test installs it"
    from importlib.metadata import version

    if not version("torchtitan").startswith("0.2"):
        return f"torchtitan {version('torchtitan')} is installed; these files are for 0.2"
    kernels = types.ModuleType("torchtitan.models.moe.kernels")
    kernels.generate_permute_indices = None
    sys.modules.setdefault(kernels.__name__, kernels)
    try:
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as error:
        return f"torchtitan does not import: {error}"
    return types.SimpleNamespace(ConfigManager=ConfigManager, ParallelDims=ParallelDims)


def read_job_config(titan: types.SimpleNamespace, path: Path):
    """TorchTitan's ConfigManager on the file. It refuses unknown keys itself; a value
    outside a field's declared type (tyro only warns) is made an error too."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is annotated with type.*")
        return titan.ConfigManager().parse_args(["--job.config_file", str(path)])


def test_torchtitan_config_passes_its_config_manager_and_parallel_dims(
        case_id: str, tmp_path: Path) -> None:
    """Checks: torchtitan.toml is TOML; its pipeline parts hold every layer once, in order,
    with the plan's split; the batch meets the trainer's rule (global a multiple of local
    x data-parallel); TorchTitan's ConfigManager reads the file and ParallelDims accepts
    its degrees on the plan's GPUs; the launch line parses with torchrun's parser."""
    files = emitted(case_id, "torchtitan")
    plan = plan_of(case_id)
    config = tomllib.loads(files["torchtitan.toml"])
    parallel, training = config["parallelism"], config["training"]
    q = plan.parallel
    if q.pipeline > 1:
        parts = parallel["module_fqns_per_model_part"]
        layers = [name for part in parts for name in part if name.startswith("layers.")]
        assert layers == [f"layers.{i}" for i in range(shape(plan.model).num_layers)]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        assert len(parts) == q.pipeline * q.virtual_pipeline
    data = parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"]
    assert data == q.data
    assert training["global_batch_size"] % (training["local_batch_size"] * data) == 0
    assert torchrun_args(launch_line(files["torchtitan.sh"], "torchrun")).training_script \
        == "torchtitan.train"
    titan = torchtitan()
    if isinstance(titan, str):
        pytest.skip(titan)
    path = tmp_path / "torchtitan.toml"
    path.write_text(files["torchtitan.toml"])
    job = read_job_config(titan, path)
    p = job.parallelism
    assert (job.model.name, job.training.seq_len) == ("llama3", shape(plan.model).seq_length)
    dims = titan.ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree, world_size=plan.num_gpus)
    assert (dims.tp, dims.pp, dims.cp) == (q.tensor, q.pipeline, q.context)


def test_a_dualpipev_plan_is_torchtitan_s_dualpipev_and_not_megatron_s() -> None:
    """Checks: the TOML names TorchTitan's "DualPipeV", lists the parts in model order
    (TorchTitan places them in V order itself), and reads back as the plan's schedule;
    Megatron-LM, which has no DualPipe schedule, refuses it whatever else the plan holds."""
    from planner.export.megatron import megatron_incompatibility
    from planner.torchtitan import torchtitan_job

    plan = plan_of("llama3-8b-32gpus-dualpipev")
    toml = emitted("llama3-8b-32gpus-dualpipev", "torchtitan")["torchtitan.toml"]
    config = tomllib.loads(toml)
    assert config["parallelism"]["pipeline_parallel_schedule"] == "DualPipeV"
    assert len(config["parallelism"]["module_fqns_per_model_part"]) == 8
    run = torchtitan_job(config, plan.num_gpus, "torchtitan.toml")
    pipelining = run.parallel.pipelining
    assert (pipelining.schedule, pipelining.virtual_pipeline) == ("dualpipev", 2)
    assert (run.parallel.dims.pipeline, run.parallel.dims.tensor) == (4, 2)
    megatron_knobs = ParallelConfig.of(tensor=2, pipeline=4, global_batch_size=64,
                                    schedule="dualpipev", virtual_pipeline=2).resolve(32)
    assert "DualPipeV" in megatron_incompatibility(megatron_knobs, [8, 8, 8, 8])
    one_f_one_b = ParallelConfig.of(tensor=2, pipeline=4, global_batch_size=64).resolve(32)
    assert megatron_incompatibility(one_f_one_b, [8, 8, 8, 8]) is None


# ---------------------------------------------------------------------------- DeepSpeed


def test_deepspeed_config_passes_deepspeed_config_and_its_launcher(
        case_id: str, monkeypatch) -> None:
    """Checks: ds_config.json's batch triple multiplies out over the plan's data-parallel
    ranks; DeepSpeed's own DeepSpeedConfig, told that world size, accepts it with the
    plan's ZeRO stage, micro-batch, accumulation and precision; and the deepspeed
    launcher's parse_args reads the launch line (hosts, GPUs per host, script)."""
    files = emitted(case_id, "deepspeed")
    plan = plan_of(case_id)
    config = json.loads(files["ds_config.json"])
    q = plan.parallel
    assert config["train_batch_size"] == plan.global_batch_size == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
        * q.data)
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed: make test installs it")
    import deepspeed.runtime.config as ds
    from deepspeed.launcher.runner import parse_args

    monkeypatch.setattr(ds.dist, "get_world_size", lambda group=None: q.data)
    monkeypatch.setattr(ds.dist, "get_rank", lambda group=None: 0)
    checked = ds.DeepSpeedConfig(config)
    assert checked.world_size == q.data
    assert checked.zero_optimization_stage == q.zero_stage
    assert checked.gradient_accumulation_steps == plan.num_micro_batches
    assert checked.bfloat16_config.enabled == (plan.precision == "bf16")
    words = shlex.split(launch_line(files["deepspeed.sh"], "deepspeed")
                        .replace("$MASTER_ADDR", "node0"))
    launch = parse_args(words[1:])
    per_host = plan.devices_per_host or plan.devices_per_node
    assert (launch.num_nodes, launch.num_gpus) == (-(-plan.num_gpus // per_host),
                                                   min(per_host, plan.num_gpus))
    assert launch.user_script == "train.py"
    assert launch.user_args[-2:] == ["--deepspeed_config", "ds_config.json"]


# ---------------------------------------------------------------------------- PyTorch


def test_pytorch_script_builds_rank_0_with_torch_itself(case_id: str, tmp_path: Path) -> None:
    """Checks: pytorch_train.py compiles; imported, it builds rank 0's DeviceMesh with the
    plan's pp x dp x tp, its model chunks (the plan's layers, parallelize_module and
    fully_shard applied by torch) and the plan's torch.distributed.pipelining schedule, on a
    fake process group of the plan's size."""
    plan = plan_of(case_id)
    script = imported(emitted(case_id, "pytorch")["pytorch_train.py"], tmp_path,
                      case_id.replace("-", "_"))
    mesh, mine, chunks, schedule = built_on_rank_0(script, plan.num_gpus)
    q = plan.parallel
    assert tuple(mesh.shape) == (q.pipeline, q.data, q.tensor)
    assert mine == list(range(0, q.pipeline * q.virtual_pipeline, q.pipeline))
    first = plan.stages[0].chunks or [plan.stages[0].layers]
    assert [sorted(int(i) for i in chunk.layers) for chunk in chunks] == \
        [list(range(*c)) for c in first]
    expected = {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                "gpipe": "ScheduleGPipe"}
    assert type(schedule).__name__ == (expected[plan.schedule] if q.pipeline > 1
                                       else "NoneType")


# ---------------------------------------------------------------------------- Slurm


def _slurm_conf(folder: Path, hosts: int, per_host: int) -> Path:
    """A cluster description for sbatch with enough hosts, answering at once when no
    controller listens."""
    conf = folder / "slurm.conf"
    conf.write_text(
        "ClusterName=tessel\nSlurmctldHost=localhost\nGresTypes=gpu\nMessageTimeout=1\n"
        f"NodeName=node[1-{max(hosts, 2)}] CPUs=64 Gres=gpu:{per_host} State=UNKNOWN\n"
        "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
    return conf


def test_slurm_script_passes_sbatch_and_torchrun(case_id: str, tmp_path: Path) -> None:
    """Checks: slurm.sh asks for the plan's hosts and GPUs per host in #SBATCH lines, one
    task per host; its srun torchrun line (Slurm's variables filled in) parses with
    torchrun's parser and starts the workload; sbatch --test-only accepts every option
    (its own parser; with no controller to ask it then says it cannot contact one)."""
    text = emitted(case_id, "slurm")["slurm.sh"]
    plan = plan_of(case_id)
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)$", text, re.MULTILINE))
    per_host = plan.devices_per_host or plan.devices_per_node
    hosts = -(-plan.num_gpus // per_host)
    assert (options["nodes"], options["ntasks-per-node"]) == (str(hosts), "1")
    assert options["gpus-per-node"] == str(min(per_host, plan.num_gpus))
    line = launch_line(text, "srun").replace('"', "")
    args = torchrun_args(line, SLURM_NNODES=str(hosts), SLURM_JOB_ID="42")
    assert_hosts(args, plan)
    assert args.rdzv_id == "42"
    assert args.training_script == ("pretrain_gpt.py" if plan.megatron_flags
                                    else "pytorch_train.py")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        pytest.skip("sbatch not found: `apt-get install slurm-client` (Debian) to check "
                    "slurm.sh with sbatch's own parser")
    script = tmp_path / "slurm.sh"
    script.write_text(text)
    env = {**os.environ, "SLURM_CONF": str(_slurm_conf(tmp_path, hosts, per_host))}
    done = subprocess.run([sbatch, "--test-only", str(script)], capture_output=True,
                          text=True, env=env, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode == 0 or "Unable to contact slurm controller" in said, said
    assert "unrecognized option" not in said and "invalid" not in said.lower(), said


# ---------------------------------------------------------------------------- Ray Train


def test_ray_script_builds_its_trainer_with_ray(case_id: str, tmp_path: Path) -> None:
    """Checks: ray_train.py compiles and runs the plan's workload; where Ray Train is
    installed, importing it and calling trainer() builds Ray's TorchTrainer with a
    ScalingConfig of one GPU worker per plan GPU."""
    text = emitted(case_id, "ray")["ray_train.py"]
    plan = plan_of(case_id)
    tree = ast.parse(text)
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    assert values["SCRIPT"] == ("pretrain_gpt.py" if plan.megatron_flags
                                else "pytorch_train.py")
    if plan.megatron_flags:
        assert flag_items(values["ARGS"])[:len(plan.megatron_flags)] == plan.megatron_flags
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray[train] is not installed (about 500 MB with pyarrow and pandas; "
                    "make test leaves it out)")
    try:
        import ray.train  # noqa: F401
    except ImportError as error:
        pytest.skip(f"ray.train does not import: {error}")
    path = tmp_path / "ray_train.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("emitted_ray_train", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    trainer = script.trainer()
    scaling = getattr(trainer, "scaling_config", None) or trainer._scaling_config
    assert scaling.num_workers == plan.num_gpus and scaling.use_gpu


# ---------------------------------------------------------------------------- the CLI


def test_cli_emit_writes_every_engine_or_says_why(tmp_path: Path, capsys) -> None:
    """Checks: `plan ... --emit all DIR` writes the engines' files into DIR and prints one
    line per engine: 'wrote ...' or 'no file: ...' with the reason."""
    argv = ["llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--micro-batch-size", "1", "--zero-stage", "3", "--recompute-granularity", "full",
            "--emit", "all", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.split(":")[0] in ENGINES]
    assert [line.split(":")[0] for line in lines] == list(ENGINES)
    assert lines[0].startswith("megatron: no file: Megatron-LM cannot run this plan: ZeRO")
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(["ds_config.json", "deepspeed.sh", "pytorch_train.py",
                              "ray_train.py", "slurm.sh", "torchtitan.sh",
                              "torchtitan_config.py", "maxtext.sh", "maxtext.yml"])


@pytest.mark.parametrize(("engines", "fragment"), [
    ("megatron,sglang", "unknown engine 'sglang'"),
    (",", "empty engine name"),
])
def test_cli_emit_refuses_an_unknown_engine_in_one_line(
        engines: str, fragment: str, tmp_path: Path, capsys) -> None:
    """Checks: an unknown engine exits 2 with one line naming it, before any planning."""
    argv = ["llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
            "--emit", engines, str(tmp_path)]
    assert cli.main(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "--emit" in out[0] and fragment in out[0], out


def test_cli_emit_refuses_a_folder_it_cannot_write(tmp_path: Path, capsys) -> None:
    """Checks: a DIR that is a file exits 2 with one line naming it."""
    (tmp_path / "file").write_text("")
    argv = ["llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
            "--emit", "megatron", str(tmp_path / "file")]
    assert cli.main(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "is a file" in out[0], out


# Last, so that Megatron-LM's own check (its own process) runs while the others do.


def test_megatron_script_passes_megatron_lms_own_parse_args_and_validate_args(
        case_id: str) -> None:
    """Checks: the arguments after pretrain_gpt.py, with the script's exports and
    torchrun's WORLD_SIZE, pass Megatron-LM's own parse_args and validate_args, which
    derive the plan's data-parallel size."""
    emitted(case_id, "megatron")
    why = _megatron_installed()
    if why:
        pytest.skip(why)
    result = megatron_results()[case_id]
    assert result["ok"], result["error"]
    plan = plan_of(case_id)
    assert result["world_size"] == plan.num_gpus
    assert result["data_parallel_size"] == plan.parallel.data


def test_the_validators_refuse_broken_files(tmp_path: Path, monkeypatch) -> None:
    """Checks that each installed validator is not vacuous: Megatron-LM refuses 30 layers
    on 4 pipeline stages, DeepSpeedConfig a batch that does not multiply out, TorchTitan's
    ConfigManager a misspelt key and a value outside its type, ParallelDims degrees that do
    not fill the GPUs, and sbatch an unknown option."""
    checked = []
    if _megatron_installed() is None:
        result = megatron_results()["refused-line"]
        assert not result["ok"] and "pipeline" in result["error"], result
        checked.append("megatron")
    if importlib.util.find_spec("deepspeed") is not None:
        import deepspeed.runtime.config as ds

        monkeypatch.setattr(ds.dist, "get_world_size", lambda group=None: 8)
        monkeypatch.setattr(ds.dist, "get_rank", lambda group=None: 0)
        config = json.loads(emitted("gpt3-1.3b-8gpus-data-parallel", "deepspeed")
                            ["ds_config.json"])
        with pytest.raises(AssertionError):
            ds.DeepSpeedConfig({**config, "train_batch_size": config["train_batch_size"] + 8})
        checked.append("deepspeed")
    titan = torchtitan()
    if not isinstance(titan, str):
        for text in ("[parallelism]\ntensor_paralel_degree = 2\n",
                     '[activation_checkpoint]\nmode = "fulll"\n'):
            (tmp_path / "bad.toml").write_text(text)
            with pytest.raises((ValueError, UserWarning)):
                read_job_config(titan, tmp_path / "bad.toml")
        with pytest.raises(AssertionError):
            titan.ParallelDims(dp_replicate=1, dp_shard=3, cp=1, tp=2, pp=1, ep=1, etp=1,
                               world_size=8)
        checked.append("torchtitan")
    sbatch = shutil.which("sbatch")
    if sbatch is not None:
        script = tmp_path / "bad.sh"
        script.write_text("#!/bin/bash\n#SBATCH --nodez=2\nsrun true\n")
        env = {**os.environ, "SLURM_CONF": str(_slurm_conf(tmp_path, 2, 8))}
        done = subprocess.run([sbatch, "--test-only", str(script)], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode != 0 and "unrecognized option" in done.stderr
        checked.append("sbatch")
    if not checked:
        pytest.skip("no engine validator is installed (make test installs DeepSpeed, "
                    "TorchTitan 0.2 and megatron-core)")


def test_a_plan_whose_reserved_estimate_crosses_the_device_launches_with_expandable_segments(
) -> None:
    # Megatron-Bridge's Llama 3 70B SFT layout with its MLP in CUDA graphs: it fits
    # allocated, not reserved (`cost_models.graph_pool`), so every launch of it sets
    # expandable segments and, for the graphs, NCCL_GRAPH_REGISTER=0.
    cluster = Cluster.load("dgx-h100").with_devices(32)
    knobs = dict(tensor=4, pipeline=4, data=2, sequence_parallel=True, zero_stage=1,
                 schedule="interleaved", virtual_pipeline=5, precision="fp8",
                 fp8_recipe="tensorwise", fp8_param_gather=True, main_grads_dtype="bf16",
                 recompute="selective", micro_batch_size=1, global_batch_size=32,
                 cuda_graph_scope=("mlp",))
    model = get_preset("llama3-70b").model_copy(update={"seq_length": 4096})
    plan = training_plan("llama3-70b", model, cluster, ParallelConfig.of(**knobs))
    assert plan.predicted.fits and not plan.predicted.reserved_fits
    exports = ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
               "export NCCL_GRAPH_REGISTER=0"]
    script = engine_files("megatron", plan, model)["megatron.sh"].splitlines()
    assert all(line in script for line in exports)
    assert script.index(exports[0]) < next(
        i for i, line in enumerate(script) if line.startswith("torchrun"))
    slurm = engine_files("slurm", plan, model)
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
               for text in slurm.values())
    # A plan that fits reserved launches without them.
    assert plan_of("gpt3-175b-1024gpus-t8p8").predicted.reserved_fits
    assert "expandable" not in emitted("gpt3-175b-1024gpus-t8p8", "megatron")["megatron.sh"]
