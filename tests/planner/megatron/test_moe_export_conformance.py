"""The exporter's MoE flags, read back by Megatron-LM and by `plan predict`'s reader.

Each published MoE run's configuration (`test_published_moe_runs.LINES`) goes through
`megatron_flags`; the line must pass the shared option list and `validate_args` rules
(`tests/planner/export/test_megatron.check_launch_line`), Megatron-LM's own `parse_args` +
`validate_args` where megatron-core is installed (`megatron_validate.py`, as
`make conformance` installs it), and read back as the same model and configuration.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from planner.export.megatron import megatron_flags, megatron_incompatibility
from planner.megatron import launch_words, megatron_run, parse_megatron_flags

HERE = Path(__file__).resolve().parent
EXPORT_TESTS = HERE.parent / "export"
sys.path.insert(0, str(HERE))
from test_published_moe_runs import LINES  # noqa: E402

_EXTRA = ["--train-iters", "10", "--lr", "1e-4", "--mock-data", "--tokenizer-type",
          "NullTokenizer"]


def _exported(key: tuple[str, str]):
    _, line = LINES[key]
    launch = launch_words(line)
    run = megatron_run(parse_megatron_flags(launch.flags), launch.world_size or 0)
    p = run.parallel.dims.pipeline
    layers = run.layers_per_stage or [run.model.num_layers // p] * p
    assert megatron_incompatibility(run.parallel, layers, run.chunk_layers) is None
    flags = shlex.split(" ".join(megatron_flags(run.model, run.parallel, layers,
                                                run.chunk_layers)))
    return run, launch.world_size, flags


@pytest.mark.parametrize("key", list(LINES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_exported_moe_flags_read_back_as_the_same_run(key: tuple[str, str]) -> None:
    run, world, flags = _exported(key)
    again = megatron_run(parse_megatron_flags(flags), world)
    assert again.model == run.model
    assert again.parallel == run.parallel
    assert again.chunk_layers == run.chunk_layers


@pytest.mark.parametrize("key", list(LINES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_exported_moe_flags_pass_the_shared_option_list(key: tuple[str, str]) -> None:
    spec = importlib.util.spec_from_file_location("export_test_megatron",
                                                  EXPORT_TESTS / "test_megatron.py")
    assert spec is not None and spec.loader is not None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except pytest.skip.Exception as skipped:  # no shared reference
        pytest.skip(str(skipped))
    _, world, flags = _exported(key)
    items = [" ".join(shlex.quote(w) for w in group) for group in _groups(flags)]
    problems = module.check_launch_line(items, world)
    # The shared checker's layer rule predates --pipeline-model-parallel-layout and the
    # account-for flags, with which Megatron-LM splits layers unevenly (Megatron's own
    # parser below takes them).
    placed = any(flag in flags for flag in ("--pipeline-model-parallel-layout",
                                            "--account-for-embedding-in-pipeline-split"))
    assert [p for p in problems if not (placed and p.startswith("num layers"))] == []


def _groups(words: list[str]) -> list[list[str]]:
    """Flags with their values: ['--a', '1', '--b'] -> [['--a', '1'], ['--b']]."""
    groups: list[list[str]] = []
    for word in words:
        if word.startswith("--"):
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def test_exported_moe_flags_pass_megatron_lms_own_parser() -> None:
    if importlib.util.find_spec("megatron") is None or \
            importlib.util.find_spec("megatron.training") is None:
        pytest.skip("megatron-core's training package is not installed: make conformance")
    requests, worlds = [], []
    for key in LINES:
        _, world, flags = _exported(key)
        worlds.append(world)
        requests.append({"argv": ["pretrain_gpt.py", *flags, *_EXTRA],
                         "env": {"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"}})
    done = subprocess.run([sys.executable, str(EXPORT_TESTS / "megatron_validate.py")],
                          input=json.dumps(requests), capture_output=True, text=True,
                          cwd=str(EXPORT_TESTS), timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    for key, world, result in zip(LINES, worlds, json.loads(done.stdout)):
        assert result["ok"], (key, result["error"])
        assert result["world_size"] == world


DEEPSEEK_PLANS = {"dgx-h100": 1024, "gb200-nvl72": 256}


@pytest.fixture(scope="module")
def deepseek_plans(tmp_path_factory) -> dict[str, dict]:
    """`plan deepseek-v3` at 8192 x 4096 tokens on 1024 H100s and 256 GB200s."""
    from planner import cli

    plans = {}
    for cluster, gpus in DEEPSEEK_PLANS.items():
        path = tmp_path_factory.mktemp("plans") / f"{cluster}.json"
        assert cli.main(["deepseek-v3", "--cluster", cluster, "--gpus", str(gpus),
                         "--global-batch-size", "8192", "--seq-length", "4096",
                         "--json", str(path)]) == 0
        plans[cluster] = json.loads(path.read_text())
    return plans


@pytest.mark.parametrize("cluster", list(DEEPSEEK_PLANS))
def test_deepseek_v3_is_planned_with_experts_across_nodes(deepseek_plans, cluster: str
                                                          ) -> None:
    """The best plan spreads experts over more GPUs than a host holds (a DGX node, a
    4-GPU GB200 tray), sends tokens with an all-to-all dispatcher, and Megatron-LM can
    run it."""
    from planner.vocabulary.cluster import Cluster

    plan = deepseek_plans[cluster]
    per_host = Cluster.load(cluster).devices_per_host
    expert_ranks = plan["parallel"]["expert"] * plan["parallel"]["expert_tensor"]
    assert expert_ranks > per_host
    assert plan["run"]["moe_token_dispatcher"] in ("alltoall", "flex")
    assert plan["megatron_incompatibility"] is None and plan["megatron_flags"]
    flags = shlex.split(" ".join(plan["megatron_flags"]))
    assert "--multi-latent-attention" in flags and "--mtp-num-layers" in flags


def test_deepseek_v3_plans_pass_megatron_lms_own_parser(deepseek_plans) -> None:
    if importlib.util.find_spec("megatron") is None or \
            importlib.util.find_spec("megatron.training") is None:
        pytest.skip("megatron-core's training package is not installed: make conformance")
    requests = [{"argv": ["pretrain_gpt.py", *shlex.split(" ".join(plan["megatron_flags"])),
                          *_EXTRA],
                 "env": {"WORLD_SIZE": str(plan["num_gpus"]), "RANK": "0", "LOCAL_RANK": "0"}}
                for plan in deepseek_plans.values()]
    done = subprocess.run([sys.executable, str(EXPORT_TESTS / "megatron_validate.py")],
                          input=json.dumps(requests), capture_output=True, text=True,
                          cwd=str(EXPORT_TESTS), timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    for cluster, result in zip(deepseek_plans, json.loads(done.stdout)):
        assert result["ok"], (cluster, result["error"])
