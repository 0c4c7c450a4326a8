"""The MoE recipe runs of `../shared/calibration/moe_recipes.csv` as calibration runs.

Each row is a Megatron-Bridge performance recipe resolved to the exact Megatron-LM flag line it
ran, with the throughput published for it. `read_recipe_runs` reads each line as Megatron-LM
reads it (`parse_megatron_flags`, `megatron_run`) into the `MoeRun`s of
`cost_models.moe_calibration`, so the MoE fit and its leave-one-out take them beside the
published table's rows.

The file writes a line as the list of words Megatron-LM's argparse receives, joined by single
spaces -- not as shell text: `--moe-layer-freq ([0]*3+[1]*58)` and
`--pipeline-model-parallel-layout Et|(tt|)*30mL` are one word each, which a shell would read
as a subshell and a pipe. So a line is split on whitespace, and one with shell quoting is
refused rather than guessed at.

What the flags cannot say -- how the recipe's launcher placed the job and what its environment
set -- is added as `RECIPE_ENVIRONMENT` says, each with its source.
"""

from __future__ import annotations

import csv
from pathlib import Path

from cost_models.efficiency_fit import MeasuredStep
from cost_models.moe_calibration import MoeRun, bridge_scale_up_domain
from planner.megatron.arguments import parse_megatron_flags
from planner.megatron.run import megatron_run

RECIPES = "moe_recipes.csv"
SYSTEMS = {"GB200 NVL72": "gb200-nvl72", "H100 SXM 80GB": "dgx-h100"}
"""The file's systems -> Tessel's presets."""
SHELL_QUOTING = ("'", '"', "\\")
"""Characters a line of argparse words never holds but shell text would."""
RECIPE_ENVIRONMENT: dict[tuple[str, str], dict[str, str]] = {
    # The H100 DeepSeek-V3 recipe runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-Bridge
    # @067f987d src/megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py,
    # deepseek_v3_pretrain_1024gpu_h100_fp8cs_config; at the row's commit fa0315ae2,
    # src/megatron/bridge/recipes/run_plugins.py sets it to 1 for tensor parallelism on
    # GPUs before Blackwell); `megatron_run` prices what that does.
    ("DeepSeek-V3", "H100 SXM 80GB"): {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
}
"""The environment each recipe's launcher started Megatron-LM's processes with."""


def recipe_words(line: str) -> list[str]:
    """A file's flag line as the words Megatron-LM's argparse receives; ValueError for a
    line with shell quoting (the file holds words, not shell text)."""
    quoted = [c for c in SHELL_QUOTING if c in line]
    if quoted:
        raise ValueError(f"the flag line holds {quoted[0]!r}: {RECIPES} writes the words "
                         "argparse receives joined by spaces, without shell quoting")
    return line.split()


def read_recipe_runs(path: str | Path) -> list[MoeRun]:
    """Every row of the recipe file as a run on its preset, read as Megatron-LM reads its
    flag line; ValueError naming the line for a system without a preset or a line Tessel
    cannot read (`LaunchLineError`'s message)."""
    runs = []
    with open(path, encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            runs.append(_recipe_run(row, line))
    return runs


def _recipe_run(row: dict[str, str], line: int) -> MoeRun:
    where = f"{RECIPES} line {line}"
    if row["gpu"] not in SYSTEMS:
        raise ValueError(f"{where}: {row['gpu']} has no preset; add it to recipe_runs.SYSTEMS.")
    if row["metric"] != "tok/s/GPU":
        raise ValueError(f"{where}: metric {row['metric']!r} is not tok/s/GPU.")
    gpus, throughput = int(row["num_gpus"]), float(row["value"])
    try:
        run = megatron_run(parse_megatron_flags(recipe_words(row["megatron_flags"])), gpus,
                           RECIPE_ENVIRONMENT.get((row["model"], row["gpu"])))
    except ValueError as error:  # LaunchLineError is one
        raise ValueError(f"{where}: {error}") from None
    parallel = run.parallel
    tokens = parallel.batch.global_batch_size * run.model.seq_length
    step = MeasuredStep(model=run.model, parallel=parallel, num_gpus=gpus,
                        seconds=tokens / (throughput * gpus),
                        label=f"{row['model']} {row['gpu'].split()[0]} recipe", line=line)
    preset = SYSTEMS[row["gpu"]]
    return MoeRun(step=step, preset=preset, tokens_per_gpu_s=throughput,
                  notes=f"recipe flag line; {row['notes']}",
                  layers_per_stage=tuple(run.layers_per_stage) if run.layers_per_stage
                  else None,
                  scale_up_domain=bridge_scale_up_domain(preset, gpus))
