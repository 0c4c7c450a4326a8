"""A graph plan's launch files (`plan MODEL --gpus N --emit pytorch DIR` for a model of
one's own, or a zoo or hf: model under `--intra-op ilp`): the plan itself and
`train_graph.py`, which every rank runs under torchrun (`planner.jobs.graph_job`: Tessel's
staged runtime, the only engine that runs a plan whose stages have meshes of their own and
per-operator shardings). Slurm and Ray start the same script (`planner.export.engines`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from planner.export.torchrun import Elastic, torchrun_args
from planner.vocabulary.plan import Plan

FILE = "train_graph.py"
PLAN_FILE = "plan.json"

SCRIPT = '''"""Train {what} with its graph plan ({plan_file}, beside this file),
one process per rank:

    {torchrun}

Emitted by `plan`; `python {file} --help` lists the options (--steps, --checkpoint-dir).
"""

import sys
from pathlib import Path

from planner.jobs.graph_job import main

if __name__ == "__main__":
    plan = Path(__file__).with_name({plan_file!r})
    sys.exit(main(["--plan", str(plan), "--model", {model!r}, {shape}*sys.argv[1:]]))
'''


def is_graph_plan(plan: Plan) -> bool:
    return plan.layer_cuts is not None


def graph_files(plan: Plan, elastic: Elastic | None = None) -> dict[str, str]:
    """{'train_graph.py': ..., 'plan.json': ...}: the script builds the model the plan names
    (a factory, or a zoo or hf: model at the plan's shape; with real weights, each module's
    own initialisation); ValueError (one line) for a plan whose model cannot be built
    again (`planner.parallelize` names a model by its class). With `elastic` (MIN:MAX
    ranks, on a cluster), torchrun restarts the job with the nodes present and the job
    re-plans for the ranks it finds (`planner.jobs.graph_job`'s --elastic)."""
    from planner.models.presets import FAMILIES, PRESETS

    spec = plan.provenance.model_spec
    if ":" not in spec and spec not in PRESETS and spec not in FAMILIES:
        raise ValueError(f"the plan names its model {spec!r}, not how to build it "
                         "(file.py:function, package.module:function, a zoo or hf: model)")
    # The job may start elsewhere: a factory's file and an hf: config by their full paths.
    if spec.startswith("hf:"):
        spec = f"hf:{Path(spec.removeprefix('hf:')).resolve()}"
    elif ":" in spec:
        target, function = spec.rsplit(":", 1)
        if target.endswith(".py"):
            spec = f"{Path(target).resolve()}:{function}"
    shape = plan.provenance.model_shape
    shape_args = f'"--shape", {json.dumps(shape, sort_keys=True)!r}, ' if shape else ""
    if elastic is not None:
        shape_args += (f'"--elastic", "{elastic.min_ranks}:{elastic.max_ranks}", '
                       f'"--cluster", {elastic.cluster!r}, ')
    torchrun = " ".join(w if w.startswith("$MASTER_ADDR:") else shlex.quote(w)
                        for w in ["torchrun", *torchrun_args(plan, elastic), FILE])
    what = f"{plan.model} on {plan.num_gpus} x {plan.cluster}"
    return {FILE: SCRIPT.format(what=what, plan_file=PLAN_FILE, torchrun=torchrun,
                                file=FILE, model=spec, shape=shape_args),
            PLAN_FILE: plan.to_json()}
