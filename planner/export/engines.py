"""The engines `plan --emit` writes launch files for, and what each writes for a Plan.

Each exporter module reads only the Plan (and the model's shape, which a Plan names but
does not hold); this registry is the one place that knows them all. Slurm and Ray Train
are launchers: they start what torchrun would, Megatron-LM's `pretrain_gpt.py` with the
plan's flags where Megatron-LM can run the plan, else the PyTorch export's script; for a
graph plan (a model of one's own), the PyTorch export is `train_graph.py` on Tessel's
runtime (`planner.export.graph_script`). MaxText (TPUs, and GPUs) and NeuronX Distributed
Training (Trainium) get the plan's degrees in their own config keys
(`planner.export.maxtext`, `planner.export.neuronx`).

`engine_files(name, plan, model)` returns {file name: text}, or raises `Refusal` with the
one line saying why that engine cannot run the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # the exporters are imported when used: `plan` starts without them
    from planner.export.torchrun import Elastic
    from planner.models.config import TransformerConfig
    from planner.vocabulary.plan import Plan

ENGINES = ("megatron", "torchtitan", "deepspeed", "pytorch", "slurm", "ray", "maxtext",
           "neuronx")


class Refusal(ValueError):
    """An engine cannot run a plan; the message is the one line that says why."""


def workload(plan: Plan, model: TransformerConfig | None) -> tuple[list[str], dict[str, str]]:
    """What a launcher starts on every rank (script and arguments) and the environment it
    needs: Megatron-LM's pretrain_gpt.py with the plan's flags, else the PyTorch script."""
    from planner.export import graph_script, megatron_launch, pytorch_script
    from planner.export.torchrun import allocator_environment

    environment = allocator_environment(plan)
    if graph_script.is_graph_plan(plan):
        return [graph_script.FILE], environment
    if megatron_launch.megatron_incompatibility(plan) is None:
        assert plan.megatron_flags is not None
        flags = [word for flag in plan.megatron_flags for word in flag.split()]
        return (["pretrain_gpt.py", *flags, *megatron_launch.launch_words(plan)],
                {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} | environment)
    why = pytorch_script.pytorch_incompatibility(plan, model)
    if why is None:
        return [pytorch_script.FILE], environment
    raise Refusal(f"neither Megatron-LM ({megatron_launch.megatron_incompatibility(plan)}) "
                  f"nor the PyTorch script ({why}) runs this plan")


def _exporters() -> dict[str, Callable[[Plan, TransformerConfig | None], dict[str, str]]]:
    from planner.export import deepspeed, megatron_launch, pytorch_script, ray_train, slurm
    from planner.export import maxtext, neuronx, torchtitan

    return {
        "megatron": lambda plan, model: megatron_launch.megatron_script(plan),
        "torchtitan": torchtitan.torchtitan_files,
        "deepspeed": lambda plan, model: deepspeed.deepspeed_files(plan),
        "pytorch": pytorch_script.pytorch_files,
        "slurm": lambda plan, model: slurm.slurm_files(plan, *workload(plan, model)),
        "ray": lambda plan, model: ray_train.ray_files(plan, *workload(plan, model)),
        "maxtext": maxtext.maxtext_files,
        "neuronx": neuronx.neuronx_files,
    }


def engine_files(name: str, plan: Plan, model: TransformerConfig | None,
                 elastic: Elastic | None = None) -> dict[str, str]:
    """{file name: text} of engine `name` for `plan`; Refusal (one line) when it cannot
    run the plan; KeyError for an engine not in ENGINES. A graph plan runs on Tessel's
    staged runtime: `pytorch` writes its script, Slurm and Ray start that. Only a graph
    plan's PyTorch job runs `elastic`, re-planning for the ranks it restarts with; the
    other engines keep the degrees they are given."""
    from planner.export import graph_script

    if name not in ENGINES:
        raise KeyError(name)
    graph = graph_script.is_graph_plan(plan)
    if elastic is not None and not (graph and name == "pytorch"):
        raise Refusal("--elastic: only a graph plan's PyTorch job (Tessel's runtime) "
                      "re-plans for the ranks it restarts with; "
                      f"{name} keeps the plan's degrees")
    try:
        if graph and name not in ("slurm", "ray"):
            if name != "pytorch":
                raise Refusal(f"{name} runs stages of one layout; this graph plan's stages "
                              "have meshes and operator shardings of their own, which "
                              "Tessel's runtime runs: emit pytorch (or slurm, ray)")
            return graph_script.graph_files(plan, elastic)
        return _exporters()[name](plan, model)
    except Refusal:
        raise
    except ValueError as error:  # each exporter's own one-line refusal
        raise Refusal(str(error)) from None
