"""Version-1 plans (operator-level `Plan`s and `TrainingPlan`s) read as version 2."""

from __future__ import annotations

import math
from typing import Any

from planner.vocabulary.mesh_axes import logical_axes, stage_mesh, training_mesh


def migrate_v1(data: dict[str, Any], version: int = 2) -> dict[str, Any]:
    """A version-1 plan (an operator-level `Plan` or a `TrainingPlan`) in the fields of
    `version` 2 (`planner.vocabulary.plan.SCHEMA_VERSION`, which imports this module)."""
    data = dict(data)
    data.pop("version", None)
    if "mesh_shape" in data and "nodes" in data:  # operator-level
        mesh = list(data.pop("mesh_shape"))
        predicted = dict(data.pop("predicted"))
        memory = predicted.pop("memory_bytes_per_device", 0.0)
        operators = {key: data.pop(key) for key in (
            "graph_fingerprint", "inputs", "nodes", "gradient_buckets",
            "communication_by_phase", "fallback_ops", "solver") if key in data}
        stage = {"layers": (0, 1), "num_devices": math.prod(mesh),
                 "mesh_axes": logical_axes(len(mesh)), "mesh_shape": mesh,
                 "parameters": data.pop("parameters"), "operators": operators}
        return {
            **data, "version": version, "num_gpus": math.prod(mesh),
            "mesh_axes": logical_axes(len(mesh)), "mesh_shape": mesh, "stages": [stage],
            "predicted": {**predicted, "memory_gib_per_gpu": memory / 2**30},
            "provenance": {"model_spec": data["model"], "cluster": data["cluster"],
                           "cost_source": data.pop("cost_source", "analytical"),
                           "tessel_version": "0.1.0"},
        }
    # A v1 training plan: every stage on a [data, tensor] mesh, context ranks aside.
    parallel = data["parallel"]
    stages, first = [], 0
    for stage in data.pop("stages"):
        axes, shape = stage_mesh(stage["mesh_shape"][0], parallel["context"],
                                 stage["mesh_shape"][1])
        stages.append({**stage, "first_device": first, "mesh_axes": axes, "mesh_shape": shape,
                       "virtual_chunks": parallel["virtual_pipeline"]})
        first += stage["num_devices"]
    predicted = dict(data.pop("predicted"))
    breakdown = predicted.get("breakdown") or {}
    axes, shape = training_mesh(parallel["data"], parallel["context"], parallel["tensor"],
                                [s["mesh_shape"] for s in stages])
    per_node = _preset_devices_per_node(data["cluster"])
    return {
        **data, "version": version, "stages": stages, "mesh_axes": axes,
        "mesh_shape": shape, "devices_per_node": min(per_node or 1, data["num_gpus"]),
        "predicted": {**predicted, "compute_s": breakdown.get("compute_s", 0.0),
                      "communication_s": sum(v for k, v in breakdown.items()
                                             if k.endswith("comm_s"))},
        "provenance": {"model_spec": data["model"], "cluster": data["cluster"],
                       "tessel_version": "0.1.0"},
    }


def _preset_devices_per_node(cluster: str) -> int | None:
    """Devices per node of a cluster preset (a version-1 plan did not record them)."""
    from planner.vocabulary.cluster import Cluster

    return Cluster.load(cluster).devices_per_node if cluster in Cluster.presets() else None
