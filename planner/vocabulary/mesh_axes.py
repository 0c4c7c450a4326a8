"""The names of a plan's device-mesh axes: a training plan's pp x dp x cp x tp (as
DeviceMesh and torchtitan name them), a stage's own mesh, and an operator-level plan's
logical axes."""

from __future__ import annotations

import math

MESH_AXES = ("pp", "dp", "cp", "tp")
"""Named axes of a training plan's device mesh, outermost first (Megatron-LM's rank order:
tensor fastest, then context, data, pipeline). Expert parallelism is carved out of `dp`."""


def logical_axes(ndim: int) -> list[str]:
    """Names of an operator-level mesh's axes: the ILP decides per op what each carries."""
    return [f"axis{i}" for i in range(ndim)]


def stage_mesh(data: int, context: int, tensor: int) -> tuple[list[str], list[int]]:
    """(mesh_axes, mesh_shape) of a training stage: [dp, tp], with cp between when used."""
    if context == 1:
        return ["dp", "tp"], [data, tensor]
    return ["dp", "cp", "tp"], [data, context, tensor]


def training_mesh(
    data: int, context: int, tensor: int, stage_meshes: list[list[int]]
) -> tuple[list[str], list[int]]:
    """(mesh_axes, mesh_shape) of a training plan: pp x dp x cp x tp when every stage has
    the same mesh, else one 'device' axis (each stage carves its own submesh, as in Alpa)."""
    if len({tuple(mesh) for mesh in stage_meshes}) > 1:
        return ["device"], [sum(math.prod(mesh) for mesh in stage_meshes)]
    return list(MESH_AXES), [len(stage_meshes), data, context, tensor]
