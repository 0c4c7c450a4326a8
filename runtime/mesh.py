"""The device mesh of a training plan, with named axes in torchtitan's vocabulary.

Ranks are laid out as Megatron-LM lays them out: tensor parallelism fastest (neighbouring
ranks share a tensor group, the group with the most traffic), then context, then data,
pipeline slowest. A 2x2x2 pp.dp.tp plan puts ranks {0, 1} in one tensor group, {0, 2} in
one data group and {0, 4} in one pipeline.

Expert parallelism is not an axis of this mesh: Megatron carves the expert group out of
the data-parallel ranks, and `runtime.experts.expert_mesh` splits ``dp`` into ``edp`` x
``ep`` for it. An axis of degree 1 is kept so that every rank can ask for any axis by
name.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.vocabulary.mesh_axes import MESH_AXES
from planner.vocabulary.parallel_dims import ParallelDims

AXES = MESH_AXES
"""Mesh axes, slowest first: pipeline, data, context, tensor (`planner.vocabulary.mesh_axes`)."""


def build_mesh(dims: ParallelDims, device_type: str = "cpu") -> DeviceMesh:
    """The world's DeviceMesh with axes `AXES`, laid out from the plan's degrees (needs an
    initialized process group of `dims.world_size` ranks); take submeshes by name:
    ``mesh["tp"]``, ``mesh["dp"]``."""
    return init_device_mesh(device_type, dims.shape, mesh_dim_names=AXES)
