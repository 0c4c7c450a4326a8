"""Ray Train: `ray_train.py`, a `TorchTrainer` that runs a Plan's training script on
`ScalingConfig(num_workers=GPUS, use_gpu=True)`.

Ray Train starts one worker per GPU, packs them onto hosts (`placement_strategy="PACK"`:
consecutive ranks share a host, as the plan's mesh assumes), initializes torch's process
group (NCCL) and sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE, the variables a
torchrun script reads. Each worker then runs the script torchrun would run, with its
arguments: what runs is given by the caller (`planner.export.engines`: Megatron-LM's
`pretrain_gpt.py` with the plan's flags, or the PyTorch export's script). The tests build
the trainer with Ray's own classes when Ray Train is installed.
"""

from __future__ import annotations

import re

from planner.vocabulary.plan import Plan

FILE = "ray_train.py"


def ray_script(plan: Plan, command: list[str], env: dict[str, str] | None = None) -> str:
    """The Ray Train script running `command` (script and arguments) on every worker."""
    name = "tessel-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", plan.model).strip("-") or "plan")
    script, args = command[0], command[1:]
    # The model and cluster as names safe inside the docstring.
    what = re.sub(r"[^A-Za-z0-9_.:/() -]+", "-", f"{plan.model} on {plan.num_gpus} GPUs "
                  f"({plan.cluster})")
    return f'''"""Ray Train: {what}, as Tessel planned it.

One Ray worker per GPU runs {script} as torchrun would (Ray Train sets up the process
group and RANK, LOCAL_RANK, WORLD_SIZE). Run from the folder that holds {script},
on a Ray cluster with {plan.num_gpus} GPUs: python ray_train.py
"""

import os
import runpy
import sys

from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

SCRIPT = {script!r}
ARGS = {_flag_lines(args)}
ENV = {dict(env or {})!r}


def train_loop_per_worker(config: dict) -> None:
    """Run the training script in this worker, as its own __main__, with its folder on
    the import path as `python SCRIPT` would have it."""
    os.environ.update(ENV)
    script = config["script"]
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script, *ARGS]
    runpy.run_path(script, run_name="__main__")


def trainer() -> TorchTrainer:
    # The path as this driver sees it; workers on other hosts need it at the same place
    # (a shared file system), as torchrun does.
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={{"script": os.path.abspath(SCRIPT)}},
        scaling_config=ScalingConfig(
            num_workers={plan.num_gpus}, use_gpu=True, resources_per_worker={{"GPU": 1}},
            placement_strategy="PACK",
        ),
        torch_config=TorchConfig(backend="nccl"),
        run_config=RunConfig(name={name!r}),
    )


if __name__ == "__main__":
    trainer().fit()
'''


def _flag_lines(words: list[str]) -> str:
    """A list literal of command-line words, one flag and its values a line."""
    if not words:
        return "[]"
    lines: list[list[str]] = []
    for word in words:
        if word.startswith("-") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return "[\n" + "".join("    " + " ".join(f"{w!r}," for w in line) + "\n"
                           for line in lines) + "]"


def ray_files(plan: Plan, command: list[str], env: dict[str, str] | None = None
              ) -> dict[str, str]:
    """{'ray_train.py': ...}: see `ray_script`."""
    return {FILE: ray_script(plan, command, env)}
