"""Cluster description: what the devices can do and how they are wired.

A `Cluster` is loaded from a preset name (``planner/presets/<name>.yaml``) or from a
YAML/JSON file of the same shape. Units follow vendor datasheets: FLOP/s in TFLOP/s,
bandwidths in decimal GB/s (1e9 bytes/s), device memory in GiB.

A cluster is a number of devices grouped into scale-up domains of `devices_per_node`: the
devices one fast link joins (NVLink and NVSwitch in a DGX node, Infinity Fabric on an AMD
OAM board, or a whole 72-GPU rack in GB200 NVL72). Past a domain, traffic leaves through
the scale-out network (InfiniBand or Ethernet). A domain is made of hosts of
`devices_per_host` (one OS instance each, what torchrun's --nproc-per-node starts): a
DGX node is one 8-GPU host, a GB200 NVL72 rack 18 hosts of 4 GPUs. A job takes whole
hosts, so its last domain may be part-filled (256 GB200s: 3 racks and 40 GPUs of a
fourth). Each preset describes one domain, and `Cluster.with_devices` sizes it: 4 GPUs of
a DGX node, or 64 DGX nodes. How close real kernels and collectives come to these
datasheet peaks is the device's `Efficiency`.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.user_files import parse_nested, read_user_file
from planner.vocabulary.efficiency import Efficiency, without_retired
from planner.vocabulary.fabric import crossed_link, crossed_wan, fabric_problem, torus_share

_FILE_SUFFIXES = (".yaml", ".yml", ".json")

MAX_DEVICES = 1 << 20
"""The most devices Tessel plans for: 1048576, far past the largest training clusters
(~10^5 GPUs). A cluster, a scale-up domain or `with_devices` asking for more is refused;
the CLI checks `--gpus` against this too."""


class _Config(BaseModel):
    # Unknown keys are rejected so a typo in a cluster file fails loudly instead of
    # silently leaving a default in place; infinite and NaN numbers (YAML's .inf and .nan,
    # JSON's Infinity and NaN, or 1e999) are rejected too: no device or link has them.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Calibration(_Config):
    """Where a device's efficiency comes from. How well predictions on it hold is the
    evidence's (`planner.vocabulary.evidence`; `plan calibration`), per kind of run."""

    data: str = Field(description="The measurements the efficiency was fitted to (and which "
                      "rows only checked it), in words.")

    @model_validator(mode="before")
    @classmethod
    def _drop_the_old_band(cls, values: Any) -> Any:
        # Cluster files written before the evidence carried `step_time_ratio`, the band of
        # the fitted rows; the band is the evidence's now, so an old file loads without it.
        return without_retired(values, "step_time_ratio")


def calibration_of(device: DeviceSpec) -> str:
    """What `device`'s efficiency was fitted to, in words, for a plan's provenance."""
    if device.calibration is None:
        return "uncalibrated (typical efficiencies)"
    return " ".join(device.calibration.data.split())


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
    efficiency: Efficiency = Field(
        default_factory=Efficiency,
        description="Achieved fractions of the peaks above and of the links' bandwidths "
        "(fitted by calibration; typical values when not given).",
    )
    flash_attention: bool = Field(
        default=True, description="Whether fused (FlashAttention-style) attention kernels "
        "run on it, so attention keeps no score matrix (FlashAttention 2 needs an A100 or "
        "newer; a V100 has none).",
    )

    calibration: Calibration | None = Field(
        default=None, description="What `efficiency` was fitted to and how far measured step "
        "times fell from the fit's predictions; None: typical values, not fitted.",
    )
    tp_comm_overlap: bool = Field(
        default=False, description="Whether Transformer Engine's userbuffers overlap "
        "tensor-parallel communication with matmuls on it (--tp-comm-overlap: Hopper and "
        "newer NVIDIA GPUs); the search turns it on where it runs.",
    )
    rated_power_w: float | None = Field(
        default=None, gt=0, description="Board power (TDP) at which the peaks above are "
        "quoted, W (700 for an H100 SXM5); needed with power_limit_w.",
    )
    power_limit_w: float | None = Field(
        default=None, gt=0, description="Board power limit the GPUs ran at when set below "
        "rated_power_w (nvidia-smi --power-limit), W: clocks fall to hold it, and with them "
        "the compute-bound kernels' speed (cost_models/power.py); None: the rated power.",
    )

    @model_validator(mode="after")
    def _check_power(self) -> DeviceSpec:
        if self.power_limit_w is None:
            return self
        if self.rated_power_w is None:
            raise ValueError("power_limit_w needs rated_power_w, the power the peaks are "
                             "quoted at")
        if self.power_limit_w > self.rated_power_w:
            raise ValueError(f"power_limit_w ({self.power_limit_w} W) must not exceed "
                             f"rated_power_w ({self.rated_power_w} W)")
        return self

    @field_validator("peak_tflops")
    @classmethod
    def _check_peaks(cls, peaks: dict[str, float]) -> dict[str, float]:
        if "fp32" not in peaks:
            raise ValueError("must contain an 'fp32' entry (used for unlisted dtypes)")
        bad = sorted(k for k, v in peaks.items() if not (math.isfinite(v) and v > 0))
        if bad:
            raise ValueError(
                "peaks must be positive finite TFLOP/s; not so for "
                + ", ".join(f"{k} ({peaks[k]})" for k in bad)
            )
        return peaks

    @property
    def default_precision(self) -> str:
        """The matmul precision a plan uses unless told: bf16 where the device has it
        (mixed precision, as Megatron-LM trains), else fp16 where it has that (a V100:
        mixed precision with loss scaling, Megatron-LM's --fp16), else fp32 (a CPU)."""
        peaks = self.peak_tflops
        return "bf16" if "bf16" in peaks else "fp16" if "fp16" in peaks else "fp32"


class LinkSpec(_Config):
    """One class of interconnect, as seen by a single device (alpha-beta model)."""

    bandwidth_gbs: float = Field(
        gt=0, description="Bandwidth in GB/s per direction per device."
    )
    latency_us: float = Field(
        ge=0, description="Per-message latency (alpha) in microseconds."
    )


class Tier(_Config):
    """A level of the scale-out fabric above the scale-up domains: leaves (or rail
    groups), spines, the link between data centres. A collective whose group spans
    domains crosses every tier up to the lowest whose one unit holds it: the narrowest of
    those (and of the NICs, `inter_node`) sets its bandwidth, the highest its latency."""

    name: str = Field(min_length=1, description="The tier's name: leaf, rail, spine, wan.")
    devices: int = Field(
        ge=1, le=MAX_DEVICES, description="Devices one unit of the tier joins: a leaf's (or a "
        "rail-optimized group's: NCCL keeps a collective's traffic on its rail), a spine "
        "pod's, a data centre's for the tier above it; a multiple of devices_per_node and "
        "of the tier below's.")
    bandwidth_gbs: float = Field(
        gt=0, description="Bandwidth per device for traffic between the units below this "
        "tier, GB/s per direction, before oversubscription.")
    latency_us: float = Field(ge=0, description="Per-message latency across the tier, us.")
    oversubscription: float = Field(
        default=1.0, ge=1, description="Downlink over uplink bandwidth of the tier's "
        "switches (2 for 2:1): traffic through it gets bandwidth_gbs / oversubscription.")
    wan: bool = Field(
        default=False, description="The tier joins data centres (tens of ms apart): only "
        "pipeline and data-parallel traffic may cross it, never a tensor, context or "
        "expert group.")


class HostSpec(_Config):
    """One host's memory, PCIe and NVMe: where offloaded state lives and how fast it moves
    (`cost_models.offload`)."""

    memory_gib: float = Field(gt=0, description="Host (CPU) memory of one host, GiB.")
    memory_bandwidth_gbs: float = Field(
        gt=0, description="Host memory bandwidth of all its sockets, GB/s (channels x "
        "transfer rate x 8 bytes): what the CPU's Adam step and the GPUs' copies share.")
    cpu_cores: int = Field(gt=0, description="CPU cores of one host, all sockets.")
    pcie_gbs: float = Field(
        gt=0, description="Host-to-GPU link of one GPU, GB/s per direction (PCIe x16 at its "
        "generation's rate, or NVLink-C2C's share on a Grace host).")
    nvme_read_gbs: float | None = Field(
        default=None, gt=0, description="Sequential read bandwidth of the host's NVMe "
        "drives together (RAID-0 over them), GB/s; None: no NVMe figures (NVMe offload is "
        "refused).")
    nvme_write_gbs: float | None = Field(
        default=None, gt=0, description="Sequential write bandwidth of those drives, GB/s.")
    nvme_tb: float | None = Field(
        default=None, gt=0, description="Capacity of those drives, TB.")
    source: str = Field(description="Where the host figures come from.")


class RunCosts(_Config):
    """What a cluster's GPU-hour costs, how often its GPUs fail and what they draw."""

    gpu_hour_usd: tuple[float, float] = Field(
        description="Range of on-demand list prices per GPU-hour, low to high, USD.")
    price_source: str = Field(description="Where the price range comes from, and when.")
    failure_rate_per_gpu_hour: float = Field(
        gt=0, description="Job-interrupting failures per GPU-hour (the job's rate is this "
        "times its GPUs).")
    failure_source: str = Field(description="Where the failure rate comes from.")
    gpu_power_w: float = Field(gt=0, description="Board power of one GPU (its TDP), W.")
    system_power_w: float = Field(
        gt=0, description="Rated power of one host with its GPUs (a DGX node, a GB200 "
        "NVL72 rack's share per host), W: what is not the GPUs' is shared overhead.")
    devices_per_system: int = Field(gt=0, description="GPUs that system_power_w feeds.")
    power_source: str = Field(description="Where the power figures come from.")

    @field_validator("gpu_hour_usd")
    @classmethod
    def _check_prices(cls, prices: tuple[float, float]) -> tuple[float, float]:
        low, high = prices
        if not 0 <= low <= high:
            raise ValueError(f"must be 0 <= low <= high USD per GPU-hour, got {list(prices)}")
        return prices

    @property
    def default_price(self) -> float:
        """The middle of the price range."""
        return sum(self.gpu_hour_usd) / 2


class Cluster(_Config):
    """A homogeneous cluster: `num_devices` identical devices in scale-up domains of
    `devices_per_node`, numbered domain-major (ranks 0..7 share the first DGX node), each
    domain made of hosts of `devices_per_host`; the last domain may be part-filled."""

    name: str = Field(description="Short name of the cluster, e.g. 'dgx-a100-80g'.")
    device: DeviceSpec = Field(description="The accelerator every rank runs on.")
    devices_per_node: int = Field(
        gt=0, le=MAX_DEVICES,
        description="Devices in one scale-up domain, the devices the intra-node link joins: "
        "a node (8 GPUs over NVLink and NVSwitch), or a 72-GPU rack for GB200 NVL72.",
    )
    devices_per_host: int = Field(
        gt=0, le=MAX_DEVICES,
        description="Devices of one host (one OS instance; torchrun's --nproc-per-node), "
        "the unit a job is given: 8 for a DGX node, 4 for a GB200 compute tray. Must divide "
        "devices_per_node; defaults to it (the domain is one host).",
    )
    num_devices: int = Field(
        gt=0,
        description="Devices in the cluster: whole hosts (a multiple of devices_per_host; "
        "the last domain may be part-filled), or part of one host. Files may give num_nodes "
        "(whole domains) instead; one domain if neither.",
    )
    intra_node: LinkSpec = Field(
        description="Link between devices of one scale-up domain (e.g. NVLink), per device."
    )
    inter_node: LinkSpec = Field(
        description="Scale-out link between domains (e.g. InfiniBand), per device."
    )
    description: str = Field(default="", description="Free text: where the numbers come from.")
    run_costs: RunCosts | None = Field(
        default=None, description="Price per GPU-hour, failure rate and power, with their "
        "sources: what a whole run's totals need (--train-tokens).",
    )
    host: HostSpec | None = Field(
        default=None, description="Each host's memory, PCIe and NVMe, with their sources: "
        "what offloading to the CPU or NVMe needs (None: offload cannot be priced).",
    )
    memory_headroom_gib: float = Field(
        default=0.0, ge=0, description="GiB of each device a plan must leave free: a plan "
        "fits only in the device's memory less this margin (--memory-headroom).",
    )
    tiers: list[Tier] = Field(
        default_factory=list, description="The scale-out fabric's levels above the domains, "
        "lowest first (leaf or rail, spine, WAN); empty: one flat network at inter_node.")
    torus: list[int] | None = Field(
        default=None, description="The scale-up domain's torus dimensions, fastest first "
        "(a TPU slice's ICI: [4, 4, 4]); their product is devices_per_node. A group "
        "inside a domain gets intra_node's bandwidth in the share of the torus's "
        "dimensions it spans (one ring per dimension).")

    @model_validator(mode="before")
    @classmethod
    def _nodes_to_devices(cls, data: Any) -> Any:
        """Accept `num_nodes` (whole domains) as another way to give `num_devices`, and
        default `devices_per_host` to the domain (every cluster file written before hosts
        were told apart from domains describes one-host domains)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        nodes = data.pop("num_nodes", None)
        per_node = data.get("devices_per_node")
        if not isinstance(per_node, int) or not 1 <= per_node <= MAX_DEVICES:
            # devices_per_node's own error is the one to report; these placeholders are unused.
            data.setdefault("num_devices", 1)
            data.setdefault("devices_per_host", 1)
            return data
        data.setdefault("devices_per_host", per_node)
        if nodes is None:
            data.setdefault("num_devices", per_node)
            return data
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"num_nodes must be a whole number >= 1, got {nodes!r}")
        if data.setdefault("num_devices", nodes * per_node) != nodes * per_node:
            raise ValueError(
                f"num_nodes {nodes} and num_devices {data['num_devices']} disagree for "
                f"{per_node}-device nodes; give only one of them"
            )
        return data

    @model_validator(mode="after")
    def _whole_hosts(self) -> Cluster:
        if self.devices_per_node % self.devices_per_host:
            raise ValueError(
                f"devices_per_host {self.devices_per_host} must divide devices_per_node "
                f"{self.devices_per_node} (a host never straddles scale-up domains); give a "
                "divisor, or leave devices_per_host out when a domain is one host"
            )
        _check_size(self.num_devices, self.devices_per_host, self.devices_per_node, self.name)
        problem = fabric_problem(self.devices_per_node, self.tiers, self.torus)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def num_nodes(self) -> int:
        """Scale-up domains the devices occupy (a part-filled one counts as one)."""
        return math.ceil(self.num_devices / self.devices_per_node)

    @property
    def num_hosts(self) -> int:
        """Hosts the devices occupy (torchrun's --nnodes; a part-filled one counts as one)."""
        return math.ceil(self.num_devices / self.devices_per_host)

    def with_devices(self, num_devices: int) -> Cluster:
        """A copy of this cluster sized to `num_devices` devices.

        Up to `devices_per_host` devices are that many devices of one host (`--gpus 4` on
        a DGX preset: 4 GPUs of one node, still joined by NVLink); more must fill whole
        hosts, and the last scale-up domain may be part-filled (`--gpus 256` on GB200
        NVL72: 3 racks and 10 trays of a fourth). Raises ValueError otherwise, naming the
        host size.
        """
        _check_size(num_devices, self.devices_per_host, self.devices_per_node, self.name)
        return self.model_copy(update={"num_devices": num_devices})

    def with_segments(self, hosts: int) -> Cluster:
        """A copy whose jobs are placed in segments of `hosts` hosts, each inside one
        scale-up domain, so that each segment is the domain a job's ranks see. Slurm's
        `--segment` asks for this on block topologies (slurm.conf topology/block;
        Megatron-Bridge's launcher sets it on GB200 NVL72: segments of up to 18 trays,
        scripts/performance/utils/executors.py @067f987d): 256 GB200s as four racks of 64
        instead of three racks and 40 GPUs of a fourth. ValueError when a segment does not
        fit in a domain."""
        devices = hosts * self.devices_per_host
        if hosts < 1 or devices > self.devices_per_node:
            raise ValueError(
                f"a segment of {hosts} hosts is {devices} devices, more than the "
                f"{self.devices_per_node} of one {self.name} scale-up domain; use at most "
                f"{self.devices_per_node // self.devices_per_host} hosts")
        return self.model_copy(update={"devices_per_node": devices, "torus": None})

    @property
    def usable_memory_bytes(self) -> float:
        """Bytes of one device a plan may use: its memory less the headroom kept free."""
        return (self.device.memory_gib - self.memory_headroom_gib) * 2**30

    def with_memory_headroom(self, gib: float) -> Cluster:
        """A copy whose plans must leave `gib` GiB of each device free; ValueError when
        that leaves nothing."""
        if gib >= self.device.memory_gib:
            raise ValueError(f"{gib:g} GiB is all of a {self.device.name}'s "
                             f"{self.device.memory_gib:g} GiB; keep less free")
        return self.model_copy(update={"memory_headroom_gib": gib})

    def with_unbounded_memory(self) -> Cluster:
        """A copy whose devices never run out of memory: for an ILP whose caller checks
        memory itself (with what the ILP does not see, e.g. micro-batches in flight)."""
        device = self.device.model_copy(update={"memory_gib": 2.0**40})
        return self.model_copy(update={"device": device})

    def with_efficiency(self, efficiency: Efficiency) -> Cluster:
        """A copy of this cluster whose devices reach `efficiency` (a fit, a what-if)."""
        device = self.device.model_copy(update={"efficiency": efficiency})
        return self.model_copy(update={"device": device})

    def spans_domains(self, group_stride: int, group_size: int) -> bool:
        """Whether a group of `group_size` ranks spaced `group_stride` apart crosses domains.

        Mesh groups are aligned blocks of `stride * size` consecutive ranks. Every such
        block fits in one domain when it is no larger than a domain and a domain holds a
        whole number of blocks, or when the whole cluster is one (part-filled) domain;
        otherwise some block, and so the slowest group, crosses the scale-out network.
        """
        if group_stride < 1 or group_size < 1:
            raise ValueError(
                f"group_stride and group_size must be >= 1, got {group_stride} and {group_size}"
            )
        span = group_stride * group_size
        per_node = self.devices_per_node
        fits = span <= per_node and (per_node % span == 0 or self.num_devices <= per_node)
        return not fits

    def ranks_per_domain(self, group_stride: int, group_size: int) -> int:
        """Members of such a group that share one domain, where fewest do: all of them
        when no group spans domains, else the fewest that any group has in any domain it
        touches (the domain whose few network links carry the group's cross-domain
        traffic, and so the slowest group's). A block that straddles a domain boundary
        off-centre (64 ranks from 192 on GB200 NVL72: 24 in the third rack, 40 in the
        fourth) leaves few members on one side; so can the part-filled last domain."""
        if not self.spans_domains(group_stride, group_size):
            return group_size
        return _fewest_members_per_domain(
            self.num_devices, self.devices_per_node, group_stride, group_size
        )

    def scale_out_link(self, group_stride: int, group_size: int,
                       point_to_point: bool = False) -> LinkSpec:
        """The link a group spanning domains crosses: `inter_node` on a flat network, the
        narrowest tier it crosses on a fabric of `tiers` (`fabric.crossed_link`)."""
        if not self.tiers:
            return self.inter_node
        bandwidth, latency = crossed_link(
            self.inter_node.bandwidth_gbs, self.inter_node.latency_us, self.devices_per_node,
            self.tiers, group_stride, group_size, point_to_point)
        return LinkSpec(bandwidth_gbs=bandwidth, latency_us=latency)

    def torus_share(self, group_stride: int, group_size: int) -> float:
        """The share of the domain's torus a group inside it spans (`fabric.torus_share`)."""
        return torus_share(self.torus, group_stride, group_size)

    def crosses_wan(self, group_stride: int, group_size: int) -> str | None:
        """The WAN tier a group crosses, or None (`fabric.crossed_wan`)."""
        return crossed_wan(self.devices_per_node, self.tiers, group_stride, group_size)

    def link_for_group(self, group_stride: int, group_size: int) -> LinkSpec:
        """The link a collective among `group_size` ranks spaced `group_stride` apart crosses.

        The scale-up link if the group stays in one domain (`spans_domains`); otherwise
        the scale-out link for the whole collective, since a ring is as slow as its
        slowest hop.
        """
        if self.spans_domains(group_stride, group_size):
            return self.scale_out_link(group_stride, group_size)
        return self.intra_node

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
        source = f"cluster file {str(path)!r}"
        text = read_user_file(path, source, "a YAML or JSON cluster file")
        return cls._from_text(text, source, is_json=path.suffix.lower() == ".json")

    @classmethod
    def _from_text(cls, text: str, source: str, *, is_json: bool) -> Cluster:
        try:
            data: Any = parse_nested(json.loads if is_json else yaml.safe_load, text, source)
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


@functools.lru_cache(maxsize=4096)
def _fewest_members_per_domain(devices: int, per_domain: int, stride: int, size: int) -> int:
    """The fewest members that a group of `size` ranks `stride` apart (in aligned blocks of
    stride x size ranks) has in one domain of `per_domain` devices that it touches.

    A group starting at rank a has its members at a + j * stride. Every domain it covers
    whole (one between its first and its last) holds per_domain // stride of them or one
    more; the first and last domains it touches hold what the start and the end leave, and
    those depend only on a mod per_domain. So the answer is a minimum over the residues
    mod per_domain at which some group starts: O(per_domain), cached per shape. The
    part-filled last domain needs no case of its own: the cluster ends at a block's end,
    so a group can only end in it, and a group's last domain holds the members from the
    domain's start to the group's end, whether or not the domain is full.
    """
    if stride >= per_domain:
        return 1  # consecutive members lie a domain or more apart
    span = stride * size
    blocks = max(1, -(-devices // span))
    # Block b starts at b * span; mod per_domain those starts repeat with this period.
    period = per_domain // math.gcd(span, per_domain)
    starts = bytearray(per_domain)
    for block in range(min(blocks, period)):
        first = block * span % per_domain
        # The stride groups of a block start at its first `stride` ranks.
        end = first + stride
        starts[first:min(end, per_domain)] = b"\x01" * (min(end, per_domain) - first)
        if end > per_domain:
            starts[: end - per_domain] = b"\x01" * (end - per_domain)
    fewest = size
    for residue in (r for r in range(per_domain) if starts[r]):
        in_first = -(-(per_domain - residue) // stride)  # members before the next boundary
        if in_first >= size:
            continue  # this group stays inside one domain
        last = residue + (size - 1) * stride  # the last member, from the first's domain
        in_last = last % per_domain // stride + 1
        fewest = min(fewest, in_first, in_last)
        if last // per_domain >= 2:  # a domain covered whole lies between
            fewest = min(fewest, per_domain // stride)
    return max(1, fewest)


def _check_size(num_devices: int, per_host: int, per_node: int, name: str) -> None:
    """Raise unless `num_devices` is part of one host or a whole number of hosts, and at
    most MAX_DEVICES."""
    if num_devices < 1:
        raise ValueError(
            f"Cluster {name!r} cannot hold {num_devices} devices; ask for at least 1."
        )
    if num_devices > MAX_DEVICES:
        raise ValueError(
            f"Cluster {name!r} cannot hold {num_devices} devices: that is more than Tessel "
            f"plans for (at most {MAX_DEVICES} devices); ask for fewer."
        )
    if num_devices <= per_host or num_devices % per_host == 0:
        return
    if per_host == per_node:
        raise ValueError(
            f"Cluster {name!r} has {per_node} devices per node, so {num_devices} devices "
            f"would leave a node part-filled; use a multiple of {per_node} (or at most "
            f"{per_node}, part of one node)."
        )
    raise ValueError(
        f"Cluster {name!r} has {per_host} devices per host ({per_node} per scale-up "
        f"domain), so {num_devices} devices would leave a host part-filled; use a multiple "
        f"of {per_host} (or at most {per_host}, part of one host)."
    )


def _presets_dir() -> Any:
    # importlib.resources works for source checkouts, editable and wheel installs alike.
    return resources.files("planner") / "presets"


def _closest(name: str, known: list[str]) -> str | None:
    """The preset a mistyped name most likely meant, or None if nothing is close."""
    # A truncated name ('dgx-a100') is the common slip; plain difflib would rank
    # 'dgx-h100' above 'dgx-a100-80g' for it, so prefixes win first: the shortest, and
    # of equally short ones the last in order (the larger variant: 'dgx-a100-80g').
    lowered = name.lower()
    prefixed = [k for k in known if k.startswith(lowered)]
    if prefixed:
        return max(prefixed, key=lambda k: (-len(k), k))
    close = difflib.get_close_matches(lowered, known, n=1, cutoff=0.4)
    return close[0] if close else None


def _summarize(err: ValidationError) -> str:
    """One part per problem, 'field.path: message (got value)', joined with '; '."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        message = str(e["msg"]).removeprefix("Value error, ").rstrip(".")
        value = e.get("input")
        shown = f" (got {value!r})" if isinstance(value, (int, float, str)) and not (
            e["type"] == "value_error" or e["type"] == "missing"
        ) else ""
        parts.append(f"{loc}: {message}{shown}" if loc else f"{message}{shown}")
    return "; ".join(parts)
