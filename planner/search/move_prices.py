"""What moving a value between placements costs: DTensor's collectives for the move, timed
on the links of a cluster a mesh is laid over (ranks in row-major order), or as a profile
measured them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import DeviceMesh

from cost_models.comm import collective_time
from passes.dtensor_rules import Collective, Placements, is_supported, redistribution, tensor_meta
from planner.vocabulary.cluster import Cluster, LinkSpec

if TYPE_CHECKING:
    from cost_models.profiled_costs import ProfileDatabase


# Cost of a move DTensor cannot make: large enough that no optimum contains one.
IMPOSSIBLE_S = 1e6

SHARED_PRICES_LIMIT = 500_000
"""Most moves and edge matrices one (mesh, cluster) keeps priced for the process."""
_SHARED_PRICES: dict[tuple, dict] = {}


@dataclass
class CommModel:
    """Time of a redistribution on a mesh laid over a cluster (ranks in row-major order)."""

    mesh: DeviceMesh
    cluster: Cluster
    profile: ProfileDatabase | None = None
    """Measured collective times, used where they cover the collective."""
    _cache: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._links: dict[tuple[int, ...], tuple[int, LinkSpec]] = {}
        # Without a profile, a move's price depends only on the mesh, the cluster and the
        # tensor: the layers of a model, and every layer a graph plan solves on this mesh,
        # share one cache for the process.
        if self.profile is None:
            key = (self.mesh.device_type, tuple(self.mesh.shape),
                   self.cluster.model_dump_json())
            if key not in _SHARED_PRICES or len(_SHARED_PRICES[key]) > SHARED_PRICES_LIMIT:
                _SHARED_PRICES[key] = {}
            self._cache = _SHARED_PRICES[key]

    def group(self, dims: tuple[int, ...]) -> tuple[int, int]:
        """(size, stride) of the rank groups a collective over mesh axes `dims` runs in."""
        shape = self.mesh.shape
        return math.prod(shape[d] for d in dims), math.prod(shape[max(dims) + 1 :])

    def link(self, dims: tuple[int, ...]) -> tuple[int, LinkSpec]:
        if dims not in self._links:
            size, stride = self.group(dims)
            self._links[dims] = size, self.cluster.link_for_group(stride, size)
        return self._links[dims]

    def transfer(
        self, value: torch.Tensor, src: Placements, dst: Placements, bucketed: bool = False
    ) -> tuple[float, tuple[Collective, ...]]:
        """Seconds and collectives of one redistribution. `bucketed` all-reduces ride in a
        gradient bucket whose latency is shared, so only their bandwidth term is charged."""
        return self._transfer((tuple(value.shape), value.dtype), value, interned(src), src,
                              interned(dst), dst, bucketed)

    def _transfer(self, tensor_key: tuple, value: torch.Tensor, src_id: int, src: Placements,
                  dst_id: int, dst: Placements,
                  bucketed: bool) -> tuple[float, tuple[Collective, ...]]:
        """`transfer` of a value whose (shape, dtype) is `tensor_key`, of placements
        interned as `src_id` and `dst_id`."""
        key = (tensor_key, src_id, dst_id, bucketed)
        if key not in self._cache:
            if not is_supported(src, dst):
                self._cache[key] = (IMPOSSIBLE_S, ())
                return self._cache[key]
            collectives = tuple(redistribution(self.mesh, tensor_meta(value), src, dst))
            shared = bucketed and all(c.kind == "all_reduce" for c in collectives)
            self._cache[key] = (sum(self.time(c, shared) for c in collectives), collectives)
        return self._cache[key]

    def time(self, collective: Collective, latency_shared: bool = False) -> float:
        measured = self._measured(collective, latency_shared)
        if measured is not None:
            return measured
        size, link = self.link(collective.mesh_dims)
        if latency_shared:
            link = link.model_copy(update={"latency_us": 0.0})
        return collective_time(collective.kind, collective.nbytes, size, link)

    def _measured(self, collective: Collective, latency_shared: bool) -> float | None:
        """The profile's time, None where it has none: no profile, a kind or group size it
        did not measure, or a group spanning nodes (a profile measures one host). With
        `latency_shared`, the time less that of the smallest message (the latency)."""
        if self.profile is None:
            return None
        size, stride = self.group(collective.mesh_dims)
        if self.cluster.spans_domains(stride, size):
            return None
        seconds = self.profile.collective_time(collective.kind, collective.nbytes, size)
        if seconds is None or not latency_shared:
            return seconds
        return max(seconds - self.profile.collective_time(collective.kind, 0, size), 0.0)


_INTERNED: dict[Placements, int] = {}


def interned(placements: Placements) -> int:
    """A number for `placements`, the same for the process: the price cache's keys hold it
    in their place, as hashing a Placement runs Python code and a 2-D edge is priced for
    hundreds of pairs of them."""
    return _INTERNED.setdefault(placements, len(_INTERNED))
