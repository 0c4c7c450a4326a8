"""Cluster description: what the devices can do and how they are wired.

A `Cluster` is loaded from a preset name (``planner/presets/<name>.yaml``) or from a
YAML/JSON file of the same shape. Units follow vendor datasheets: FLOP/s in TFLOP/s,
bandwidths in decimal GB/s (1e9 bytes/s), device memory in GiB.
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_FILE_SUFFIXES = (".yaml", ".yml", ".json")


class _Config(BaseModel):
    # Unknown keys are rejected so a typo in a cluster file fails loudly instead of
    # silently leaving a default in place.
    model_config = ConfigDict(extra="forbid")


class DeviceSpec(_Config):
    """One accelerator (or one CPU process standing in for one)."""

    name: str = Field(description="Device model, e.g. 'A100-SXM4-80GB'.")
    peak_tflops: dict[str, float] = Field(
        description="Dense peak throughput in TFLOP/s per dtype key ('fp32', 'bf16', "
        "'fp16', 'fp8'); must contain 'fp32', the fallback for dtypes not listed."
    )
    memory_gib: float = Field(gt=0, description="Device memory in GiB.")
    memory_bandwidth_gbs: float = Field(
        gt=0, description="Device memory bandwidth in GB/s (1e9 bytes/s)."
    )

    @field_validator("peak_tflops")
    @classmethod
    def _check_peaks(cls, peaks: dict[str, float]) -> dict[str, float]:
        if "fp32" not in peaks:
            raise ValueError("must contain an 'fp32' entry (used for unlisted dtypes)")
        bad = sorted(k for k, v in peaks.items() if v <= 0)
        if bad:
            raise ValueError(f"peaks must be positive; not so for {', '.join(bad)}")
        return peaks


class LinkSpec(_Config):
    """One class of interconnect, as seen by a single device (alpha-beta model)."""

    bandwidth_gbs: float = Field(
        gt=0, description="Bandwidth in GB/s per direction per device."
    )
    latency_us: float = Field(
        ge=0, description="Per-message latency (alpha) in microseconds."
    )


class Cluster(_Config):
    """A homogeneous cluster: `num_nodes` nodes of `devices_per_node` identical devices."""

    name: str = Field(description="Short name of the cluster, e.g. 'dgx-a100-80g'.")
    device: DeviceSpec = Field(description="The accelerator every rank runs on.")
    devices_per_node: int = Field(gt=0, description="Devices in one node (scale-up domain).")
    num_nodes: int = Field(default=1, gt=0, description="Number of nodes.")
    intra_node: LinkSpec = Field(description="Link between devices of one node (e.g. NVLink).")
    inter_node: LinkSpec = Field(
        description="Link between nodes (e.g. InfiniBand), per device."
    )
    description: str = Field(default="", description="Free text: where the numbers come from.")

    @property
    def num_devices(self) -> int:
        """Total number of devices in the cluster."""
        return self.devices_per_node * self.num_nodes

    def link_for_group(self, group_stride: int, group_size: int) -> LinkSpec:
        """The link a collective among `group_size` ranks spaced `group_stride` apart crosses.

        Ranks are numbered node-major, so such a group covers `stride * size` consecutive
        ranks. If that fits in one node the collective stays on the scale-up link;
        otherwise it spans nodes, and since a ring is as slow as its slowest hop the
        whole collective is charged the scale-out link.
        """
        if group_stride < 1 or group_size < 1:
            raise ValueError(
                f"group_stride and group_size must be >= 1, got {group_stride} and {group_size}"
            )
        if group_stride * group_size <= self.devices_per_node:
            return self.intra_node
        return self.inter_node

    @staticmethod
    def presets() -> list[str]:
        """Names of the built-in cluster presets, sorted."""
        return sorted(p.name[: -len(".yaml")] for p in _presets_dir().iterdir()
                      if p.name.endswith(".yaml"))

    @classmethod
    def load(cls, name_or_path: str) -> Cluster:
        """Load a preset by name, or a cluster from a .yaml/.yml/.json file path."""
        path = Path(name_or_path)
        if path.suffix.lower() in _FILE_SUFFIXES or path.is_file():
            return cls._from_file(path)
        known = cls.presets()
        if name_or_path not in known:
            close = _closest(name_or_path, known)
            hint = f"; did you mean {close!r}?" if close else "."
            raise ValueError(
                f"Unknown cluster preset {name_or_path!r} (known presets: "
                f"{', '.join(known)}; or give a .yaml/.json file path){hint}"
            )
        return cls._from_text(
            (_presets_dir() / f"{name_or_path}.yaml").read_text(), f"preset {name_or_path!r}",
            is_json=False,
        )

    @classmethod
    def _from_file(cls, path: Path) -> Cluster:
        if not path.is_file():
            raise ValueError(f"Cluster file {str(path)!r} does not exist.")
        return cls._from_text(
            path.read_text(), f"cluster file {str(path)!r}",
            is_json=path.suffix.lower() == ".json",
        )

    @classmethod
    def _from_text(cls, text: str, source: str, *, is_json: bool) -> Cluster:
        try:
            data: Any = json.loads(text) if is_json else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as err:
            raise ValueError(f"Cannot parse {source}: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(
                f"Invalid {source}: expected a mapping at the top level, "
                f"got {type(data).__name__}."
            )
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ValueError(f"Invalid {source}: {_summarize(err)}.") from None


def _presets_dir() -> Any:
    # importlib.resources works for source checkouts, editable and wheel installs alike.
    return resources.files("planner") / "presets"


def _closest(name: str, known: list[str]) -> str | None:
    """The preset a mistyped name most likely meant, or None if nothing is close."""
    # A truncated name ('dgx-a100') is the common slip; plain difflib would rank
    # 'dgx-h100' above 'dgx-a100-80g' for it, so prefixes win first.
    lowered = name.lower()
    prefixed = [k for k in known if k.startswith(lowered)]
    if prefixed:
        return min(prefixed, key=len)
    close = difflib.get_close_matches(lowered, known, n=1, cutoff=0.4)
    return close[0] if close else None


def _summarize(err: ValidationError) -> str:
    """One line per problem, 'field.path: message', joined with '; '."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)
