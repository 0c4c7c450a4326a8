"""A mixed cluster: pools of different machines joined by one fabric.

Fleets mix generations (H100 beside A100, B200 beside H100). A `PooledCluster` lists
`Pool`s, each a homogeneous `Cluster` (a preset or a cluster file, sized to the pool's
devices), and the link between pools: bandwidth per GPU and latency, as a pipeline's
stage-to-stage transfer crossing from one pool to the next sees it. A plan numbers its
ranks in pipeline order, each pool's together, and names each stage's pool, so a launcher
starts each pool's machines with that pool's devices per host.

A pipeline stage runs inside one pool; the pipeline may cross pools (Metis, ATC'24, plans
stages over device types the same way). Tensor, data and context parallel groups stay in
the stage, hence in one pool: only the pipeline's activations cross `between_pools`.

A file of this shape::

    name: h100-a100
    pools:
      - {name: h100, cluster: dgx-h100, devices: 64}
      - {name: a100, cluster: dgx-a100-80g, devices: 64}
    between_pools: {bandwidth_gbs: 25, latency_us: 10}
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from planner.user_files import parse_nested, read_user_file
from planner.vocabulary.cluster import _FILE_SUFFIXES, Cluster, LinkSpec, _Config, _summarize


class Pool(_Config):
    """One pool: `devices` of one kind of machine."""

    name: str = Field(min_length=1, description="The pool's name, e.g. 'h100'.")
    cluster: Cluster = Field(description="The machines: a preset name, a cluster file's "
                             "path (relative to the pooled file), or a cluster's fields inline.")
    devices: int = Field(ge=1, description="Devices the pool has: whole hosts of its "
                         "cluster (or part of one).")

    @model_validator(mode="after")
    def _sized(self) -> Pool:
        try:
            sized = self.cluster.with_devices(self.devices)
        except ValueError as error:
            raise ValueError(f"pool {self.name!r}: {error}") from None
        self.cluster = sized
        return self


class PooledCluster(_Config):
    """Pools of machines and the fabric between them (the module's docstring)."""

    name: str = Field(description="Short name of the mixed cluster.")
    description: str = Field(default="", description="Free text: what the pools are.")
    pools: list[Pool] = Field(min_length=1, description="The pools (a plan may visit them "
                              "in any order).")
    between_pools: LinkSpec | None = Field(
        default=None, description="The link a transfer from one pool to another crosses, "
        "per GPU (needed with more than one pool).")

    @model_validator(mode="after")
    def _joined(self) -> PooledCluster:
        if len(self.pools) > 1 and self.between_pools is None:
            raise ValueError(
                f"between_pools: {len(self.pools)} pools are joined by no fabric; give "
                "between_pools: {bandwidth_gbs: ..., latency_us: ...}, the link per GPU "
                "from one pool to another")
        names = [pool.name for pool in self.pools]
        if len(set(names)) < len(names):
            raise ValueError(f"pools: names {names} repeat; give each pool its own name")
        return self

    @property
    def num_devices(self) -> int:
        return sum(pool.devices for pool in self.pools)

    def with_memory_headroom(self, gib: float) -> PooledCluster:
        """Every pool keeping `gib` of each device free (`Cluster.with_memory_headroom`)."""
        return self.model_copy(update={"pools": [
            pool.model_copy(update={"cluster": pool.cluster.with_memory_headroom(gib)})
            for pool in self.pools]})

    def pool(self, index: int) -> Cluster:
        """Pool `index`'s machines, sized to its devices."""
        return self.pools[index].cluster

    @cached_property
    def crossing(self) -> Cluster:
        """A cluster whose scale-out link is `between_pools`, on the slower pool's devices
        (its collective overheads and efficiency): what a transfer between pools costs.
        One object per pooled cluster, so its prices are memoised (`cost_models.comm`)."""
        assert self.between_pools is not None  # two pools or more (`_joined`)
        link = self.between_pools
        slowest = min((pool.cluster for pool in self.pools),
                      key=lambda c: c.device.peak_tflops.get(c.device.default_precision,
                                                             c.device.peak_tflops["fp32"]))
        return slowest.model_copy(update={"inter_node": link, "devices_per_node": 1,
                                          "devices_per_host": 1, "num_devices": 2})

    @field_validator("pools", mode="before")
    @classmethod
    def _resolve(cls, pools: Any, info: Any) -> Any:
        """Each pool's `cluster` as a preset name or path becomes the loaded Cluster;
        a path is read relative to the pooled file (`context={'base': dir}`)."""
        if not isinstance(pools, list):
            return pools
        base = (info.context or {}).get("base", Path("."))
        resolved = []
        for index, pool in enumerate(pools):
            if isinstance(pool, dict) and isinstance(pool.get("cluster"), str):
                spec = pool["cluster"]
                path = Path(spec)
                if path.suffix.lower() in _FILE_SUFFIXES and not path.is_absolute():
                    spec = str(base / path)
                try:
                    pool = {**pool, "cluster": Cluster.load(spec)}
                except ValueError as error:
                    raise ValueError(f"pool {index} ({pool.get('name', '?')}): {error}") \
                        from None
            resolved.append(pool)
        return resolved


AnyCluster = Cluster | PooledCluster
"""What `--cluster` names: one kind of machine, or pools of several."""


def on_pool(cluster: AnyCluster, pool: int) -> Cluster:
    """The machines pool `pool` of `cluster` runs on (a plain cluster is its own pool 0)."""
    if isinstance(cluster, PooledCluster):
        return cluster.pool(pool)
    if pool:
        raise ValueError(f"cluster {cluster.name!r} has one pool; pool {pool} is not in it")
    return cluster


def load_any(name_or_path: str) -> AnyCluster:
    """A preset or cluster file (`Cluster.load`), or a pooled cluster file: one whose top
    level has `pools`. ValueError in one line naming the file and the field."""
    path = Path(name_or_path)
    if not (path.suffix.lower() in _FILE_SUFFIXES or path.is_file()):
        return Cluster.load(name_or_path)
    source = f"cluster file {str(path)!r}"
    text = read_user_file(path, source, "a YAML or JSON cluster file")
    try:
        data = parse_nested(json.loads if path.suffix.lower() == ".json" else yaml.safe_load,
                            text, source)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"Cannot parse {source}: {err}") from None
    if not (isinstance(data, dict) and "pools" in data):
        return Cluster.load(name_or_path)
    try:
        return PooledCluster.model_validate(data, context={"base": path.parent})
    except ValidationError as err:
        raise ValueError(f"Invalid {source}: {_summarize(err)}.") from None
