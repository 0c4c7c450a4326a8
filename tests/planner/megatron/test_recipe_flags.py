"""The flag lines of the 2026 MoE recipes (tests/planner/megatron/recipes/*.txt): each read
by `plan predict`'s reader with no flag refused as unpriced, and predicted on its GPUs.

Each file holds one recipe's Megatron-LM flags as its source sets them (Megatron-Bridge's
performance recipes, Megatron-MoE-ModelZoo's best-practice scripts; `# source:` names the
repository, commit and files), its GPU count (`# gpus:`), the cluster preset or GPU it
ran on (`# cluster:`), and, where Megatron-LM itself refuses the line, why
(`# refused:`, with the flag the refusal names).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from cost_models.step_time import predict_step
from planner.megatron import megatron_run, parse_megatron_flags
from planner.megatron.errors import LaunchLineError
from planner.vocabulary.cluster import Cluster

RECIPES = Path(__file__).parent / "recipes"


@dataclass(frozen=True)
class Recipe:
    name: str
    flags: list[str]
    gpus: int
    cluster: str
    refused: str | None
    """The flag Megatron-LM refuses in this line, where it does."""


def read_recipe(path: Path) -> Recipe:
    header = {}
    lines = path.read_text().splitlines()
    for line in lines:
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            header.setdefault(key, value.strip())
    flags = shlex.split(next(line for line in lines if not line.startswith("#")))
    refused = header.get("refused")
    return Recipe(path.stem, flags, int(header["gpus"]), header["cluster"],
                  refused.split()[0] if refused else None)


ALL = [read_recipe(path) for path in sorted(RECIPES.glob("*.txt"))]


def test_the_corpus_holds_the_2026_moe_recipes() -> None:
    assert len(ALL) >= 12
    assert all(r.flags and not r.flags[0].endswith(".py") for r in ALL)  # flags only
    given = {flag for r in ALL for flag in r.flags}
    assert {"--delay-wgrad-compute", "--moe-paged-stash", "--fp8-output-proj",
            "--optimizer-cpu-offload"} <= given


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: r.name)
def test_no_recipe_flag_is_refused_as_unpriced(recipe: Recipe) -> None:
    args = parse_megatron_flags(recipe.flags)
    if recipe.refused is not None:
        with pytest.raises(LaunchLineError, match=recipe.refused) as refused:
            megatron_run(args, recipe.gpus)
        assert "does not price" not in str(refused.value)
        return
    run = megatron_run(args, recipe.gpus)
    given = set(recipe.flags)
    moe = run.parallel.moe
    assert moe.delay_wgrad_compute == ("--delay-wgrad-compute" in given)
    assert moe.moe_paged_stash == ("--moe-paged-stash" in given)
    assert run.parallel.numerics.fp8_output_proj == ("--fp8-output-proj" in given)
    # The ModelZoo's long-context DeepSeek-V3 keeps its optimizer on the CPU.
    assert (run.parallel.offload.offload_optimizer == "cpu") == \
        ("--optimizer-cpu-offload" in given)


@pytest.mark.parametrize("recipe", [r for r in ALL if r.refused is None
                                    and r.cluster in Cluster.presets()], ids=lambda r: r.name)
def test_each_recipe_is_predicted_on_its_cluster(recipe: Recipe) -> None:
    run = megatron_run(parse_megatron_flags(recipe.flags), recipe.gpus)
    cluster = Cluster.load(recipe.cluster).with_devices(recipe.gpus)
    prediction = predict_step(run.model, cluster, run.parallel)
    assert prediction.step_time_s > 0 and prediction.memory_gib_per_gpu > 0
