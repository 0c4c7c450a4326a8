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

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

AXES = ("pp", "dp", "cp", "tp")
"""Mesh axes, slowest first: pipeline, data, context, tensor."""


@dataclass(frozen=True)
class Degrees:
    """Degree of each mesh axis."""

    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, axis) for axis in AXES)

    @property
    def world_size(self) -> int:
        size = 1
        for degree in self.shape:
            size *= degree
        return size

    def coordinates(self, rank: int) -> dict[str, int]:
        """The rank's index on each axis (tensor fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        coords = {}
        for axis in reversed(AXES):
            degree = getattr(self, axis)
            coords[axis] = rank % degree
            rank //= degree
        return {axis: coords[axis] for axis in AXES}

    def group(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of `rank` but `axis`, in axis order."""
        coords = self.coordinates(rank)
        ranks = []
        for index in range(getattr(self, axis)):
            moved = dict(coords, **{axis: index})
            flat = 0
            for name in AXES:
                flat = flat * getattr(self, name) + moved[name]
            ranks.append(flat)
        return ranks


def build_mesh(degrees: Degrees, device_type: str = "cpu") -> DeviceMesh:
    """The world's DeviceMesh with axes `AXES` (needs an initialized process group of
    `degrees.world_size` ranks); take submeshes by name: ``mesh["tp"]``, ``mesh["dp"]``."""
    return init_device_mesh(device_type, degrees.shape, mesh_dim_names=AXES)
