"""Offload: model state and activations kept in host memory or on NVMe, priced by mechanism.

What moves, per GPU and step, and what it waits for:

- Optimizer offload (ZeRO-Offload, Ren et al., USENIX ATC 2021, Sec. 4; Megatron-Core's
  HybridDeviceOptimizer, --optimizer-cpu-offload): the GPU sends its gradient shard to the
  host (bucket by bucket as the backward reduces it: hidden behind the last micro-batch's
  backward), the CPU runs Adam over the fp32 master weights and moments, and the updated
  16-bit weights come back before the next forward (exposed). Under ZeRO 2-3 the fp32
  gradients live on the host too (DeepSpeed's offload_optimizer); Megatron-LM keeps its
  main-gradient buffer on the GPU. `optimizer_offload_fraction` of the state and step move;
  the rest stays on the GPU.
- The CPU's Adam step is bound by the host's memory bandwidth: a vectorised CPU Adam
  (DeepSpeed's CPU-Adam, torch's fused AdamW on the CPU) reads the fp32 weight, gradient and
  two moments and writes the weight, the moments and the 16-bit copy, `CPU_ADAM_BYTES` a
  parameter; the GPUs of a host share its bandwidth, at `HOST_MEMORY_EFFICIENCY` of the
  peak.
- NVMe (ZeRO-Infinity, Rajbhandari et al., SC 2021, Sec. 5-6): optimizer state on NVMe is
  read before and written after each CPU step (the moments and master weights, 12 bytes a
  parameter each way); parameters on NVMe are read for every forward and backward pass
  (ZeRO-3 fetches each layer's shard before it runs) and written once after the step. The
  GPUs of a host share its drives.
- Parameter offload (ZeRO-3 offload_param): every pass of every micro-batch fetches the
  GPU's 16-bit shard over PCIe (and the recomputed forward again), prefetched behind the
  compute of the layers before it: exposed only where the pass's transfer outlasts its
  compute.
- Activation offload (Megatron-LM's --cpu-offloading-num-layers, Transformer Engine's
  CPU offload context): those layers' saved activations go to the host in forward and come
  back in backward, each behind the next layer's compute.
- Checkpoint offload (DeepSpeed's activation_checkpointing.cpu_checkpointing): under full
  recomputation each layer's checkpointed input goes to the host in forward and comes back
  before the layer is recomputed. With async copies (DeepSpeed's offload engine of 2026,
  PR #8282) each runs beside the next layer's compute, as activation offload does. With
  blocking copies (`offload_copies`: checkpointing.py's `.cpu()` and `.to(device)` on the
  compute stream, before that; v0.6.2's transport stream is created and never used) each
  holds the stream, and `.cpu()` lands in pageable memory, which the CUDA driver stages
  through a pinned buffer of its own: the bytes cross the host link into it, then the CPU
  copies them on (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++", 2012):
  `pageable_bytes_per_s`.
- Paged optimizer state (bitsandbytes' PagedAdamW8bit, `cost_models.eight_bit_adam`): the
  state in CUDA unified memory stays on the GPU while it fits beside torch's reserved
  pool; what does not is paged out to the host and back for every step, in line with the
  compute (each paged step synchronizes): exposed.
- PCIe: each GPU's host link at `PCIE_EFFICIENCY` of its rate, and no more than its share
  of the host's memory bandwidth (every GPU of a host copies at once).

`PCIE_EFFICIENCY` and `HOST_MEMORY_EFFICIENCY` are estimates, not fits: nothing in the
calibration set measures a transfer alone; the fine-tuning rows with offload
(`published_finetune_offload.csv`) judge them (benchmarks/finetune_accuracy.py), and a plan
that offloads carries the band those rows leave (`evidence.FINETUNE_OFFLOAD`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.eight_bit_adam import paged
from planner.vocabulary.cluster import Cluster, HostSpec
from planner.vocabulary.parallel import ParallelConfig

PCIE_EFFICIENCY = 0.8
"""Pinned host<->device copies over PCIe reach about 80% of the link's rate (128b/130b
encoding and TLP headers on Gen3+): an estimate."""
HOST_MEMORY_EFFICIENCY = 0.5
"""The share of the host's peak memory bandwidth a streaming CPU kernel sustains across
both sockets (STREAM-like triad, NUMA placement not tuned): an estimate, not a fit. One
published run checks it: torchtune's Llama 3.1 70B full fine-tune with FSDP's CPU offload on
8 A100 (published_finetune_offload.csv), whose predicted step is half the CPU's Adam step on
the DGX A100 host's 409.6 GB/s, and whose throughput is predicted within 3%
(benchmarks/finetune_accuracy.py)."""
CPU_ADAM_BYTES = 4 + 4 + 8 + 4 + 8 + 2
"""Host bytes of one parameter's Adam step: fp32 weight, gradient and two moments read,
the weight and moments written, the 16-bit copy written."""
COPY_BYTES = 2
"""Bytes of a gradient copied out, and of a weight copied back, per offloaded parameter:
16 bits each."""
NVME_STATE_BYTES = 12
"""Bytes of one parameter's optimizer state on NVMe: fp32 master weight and two moments."""
HOST_USABLE = 0.9
"""The share of a host's memory offloaded state may take; the rest is the OS's, the data
loader's and the pinned staging buffers' (an estimate)."""
NVME_MIN_READ_GBS = 7.0
"""NVMe read bandwidth per host below which NVMe offload is a cliff (a single Gen4 drive's
rate; Gen5 drives read 12-14 GB/s): a plan on such a host is warned about, not refused."""


@dataclass(frozen=True)
class OffloadBytes:
    """What one GPU keeps off the device, and what it moves per step, by mechanism."""

    host_bytes: float = 0.0
    """Host memory the GPU's offloaded state and activations take (its share of a host)."""
    nvme_bytes: float = 0.0
    """NVMe capacity its offloaded state takes."""
    cpu_parameters: float = 0.0
    """Parameters whose Adam step the CPU runs for it: their 16-bit gradients copied to the
    host after the last micro-batch's backward, their updated 16-bit weights back after
    the step (`COPY_BYTES` each way)."""
    fetch_per_pass: float = 0.0
    """Parameter bytes fetched for each forward and backward pass of a micro-batch."""
    fetches: int = 0
    """Passes that fetch them per micro-batch (forward, backward, a recomputed forward)."""
    activations_per_layer: float = 0.0
    """Bytes one offloaded layer's activations copy out in forward (and back in backward)
    per micro-batch."""
    activation_layers: int = 0
    """Layers whose activations are offloaded."""
    nvme_read: float = 0.0
    """Optimizer-state bytes read from NVMe per step (parameters on NVMe are read as they
    are fetched: `nvme_bytes_read`)."""
    nvme_write: float = 0.0
    """Bytes written to NVMe per step (optimizer state, updated weights)."""
    params_on_nvme: bool = False
    """Whether the fetched parameters come from NVMe."""
    paged_state: float = 0.0
    """Optimizer state in CUDA unified memory (bitsandbytes' paged optimizers), outside
    torch's allocator."""
    paged_moved: float = 0.0
    """Of it, what does not fit on the GPU beside torch's reserved pool: paged out to the
    host and back each step (`eight_bit_adam.paged_bytes`, set once the peak is known)."""

    def nvme_bytes_read(self, micro_batches: int) -> float:
        """Bytes read from NVMe per step, parameter fetches included."""
        fetched = micro_batches * self.fetches * self.fetch_per_pass if self.params_on_nvme \
            else 0.0
        return self.nvme_read + fetched

    def pcie_bytes(self, micro_batches: int) -> float:
        """Bytes over the GPU's host link per step, both directions."""
        return (2 * COPY_BYTES * self.cpu_parameters + 2 * self.paged_moved
                + micro_batches * (self.fetches * self.fetch_per_pass
                                   + 2 * self.activation_layers * self.activations_per_layer))


@dataclass(frozen=True)
class OffloadTime:
    """Seconds per step the offload adds, by mechanism (on the slowest stage's GPU)."""

    optimizer_s: float = 0.0
    """The CPU's Adam step, its NVMe swap and the updated weights' copy back, and paged
    optimizer state out and back: exposed."""
    transfers_s: float = 0.0
    """Parameter fetches, activation copies and the gradients' copy out left exposed."""

    @property
    def total(self) -> float:
        return self.optimizer_s + self.transfers_s


def offloads(parallel: ParallelConfig) -> bool:
    """Whether `parallel` keeps anything off the GPU."""
    offload = parallel.offload
    return (offload.offload_optimizer != "none" or offload.offload_params != "none"
            or offload.offload_activation_layers > 0 or offload.offload_checkpoints
            or paged(parallel))


def offloaded_layers(parallel: ParallelConfig, layers: int) -> int:
    """Layers of a stage of `layers` whose saved activations (or, under checkpoint
    offload, checkpointed inputs) go to the host."""
    offload = parallel.offload
    return layers if offload.offload_checkpoints \
        else min(offload.offload_activation_layers, layers)


def optimizer_off_gpu(parallel: ParallelConfig) -> float:
    """The share of the optimizer's state and step kept off the GPU: the offload fraction,
    or 0 without optimizer offload."""
    offload = parallel.offload
    return offload.optimizer_offload_fraction if offload.offload_optimizer != "none" else 0.0


def gpus_per_host(cluster: Cluster) -> int:
    """The job's GPUs on one host, which share its memory, bandwidth and drives: a whole
    host's, or the few of a job smaller than one."""
    return min(cluster.devices_per_host, cluster.num_devices)


def pcie_bytes_per_s(cluster: Cluster) -> float:
    """One GPU's host link while every GPU of the job on its host copies: the link's rate
    at `PCIE_EFFICIENCY`, at most its share of the host's memory bandwidth."""
    host = _host(cluster)
    share = host.memory_bandwidth_gbs / gpus_per_host(cluster)
    return min(host.pcie_gbs * PCIE_EFFICIENCY, share) * 1e9


def pageable_bytes_per_s(cluster: Cluster) -> float:
    """One GPU's blocking copy to or from pageable host memory: the host link into the
    driver's pinned staging buffer (`pcie_bytes_per_s`), then the CPU's copy between it and
    the pageable pages, which reads and writes each byte in the GPU's share of the host's
    streaming bandwidth; the two in turn."""
    host = _host(cluster)
    copy = host.memory_bandwidth_gbs * 1e9 * HOST_MEMORY_EFFICIENCY / gpus_per_host(cluster) / 2
    return 1 / (1 / pcie_bytes_per_s(cluster) + 1 / copy)


def nvme_bytes_per_s(cluster: Cluster) -> tuple[float, float]:
    """(read, write) NVMe bandwidth of one GPU's share of its host's drives."""
    host = _host(cluster)
    if host.nvme_read_gbs is None or host.nvme_write_gbs is None:
        raise ValueError(f"cluster {cluster.name!r} has no NVMe figures (host.nvme_read_gbs, "
                         "host.nvme_write_gbs); offload to cpu, or add them")
    per_host = gpus_per_host(cluster)
    return host.nvme_read_gbs * 1e9 / per_host, host.nvme_write_gbs * 1e9 / per_host


def cpu_adam_seconds(parameters: float, cluster: Cluster) -> float:
    """The CPU's Adam step over `parameters` of one GPU, while every GPU of the host steps
    its own share (`CPU_ADAM_BYTES` each over its share of the host's bandwidth)."""
    host = _host(cluster)
    share = host.memory_bandwidth_gbs * 1e9 * HOST_MEMORY_EFFICIENCY / gpus_per_host(cluster)
    return parameters * CPU_ADAM_BYTES / share


def _host(cluster: Cluster) -> HostSpec:
    if cluster.host is None:
        raise ValueError(f"cluster {cluster.name!r} has no host figures (host memory, PCIe, "
                         "NVMe), so offload cannot be priced; add a host: section to it")
    return cluster.host


@dataclass(frozen=True)
class StageState:
    """What one GPU of a stage holds before offload, as the offload rules read it."""

    optimizer_parameters: float
    """Parameters whose optimizer state and step this GPU owns (its ZeRO shard)."""
    optimizer_bytes: float
    """Their optimizer state."""
    gradient_bytes: float
    """Its gradients."""
    weight_shard_bytes: float
    """Its weights (a ZeRO-3 shard): what parameter offload fetches each pass."""
    activation_bytes_per_layer: float
    """Activations one layer keeps per micro-batch."""
    layers: int
    """Layers of the stage."""


def offload_bytes(state: StageState, parallel: ParallelConfig, in_flight: int) -> OffloadBytes:
    """What one GPU's offload keeps on the host and NVMe and moves per step, under the
    rules of this module's docstring; `in_flight`: micro-batches whose activations the
    stage keeps at once."""
    offload = parallel.offload
    f = optimizer_off_gpu(parallel)
    shard = state.optimizer_parameters * f
    host = nvme = read = write = 0.0
    if f:
        # Under ZeRO 2-3 the fp32 gradient shard lives on the host (DeepSpeed).
        moved_grads = state.gradient_bytes * f if parallel.sharding.zero_stage >= 2 else 0.0
        host += moved_grads
        if offload.offload_optimizer == "nvme":
            nvme += state.optimizer_bytes * f
            read += shard * NVME_STATE_BYTES
            write += shard * NVME_STATE_BYTES
        else:
            host += state.optimizer_bytes * f
    fetch, fetches = 0.0, 0
    if offload.offload_params != "none":
        fetch, fetches = state.weight_shard_bytes, (
            3 if parallel.recomputation.recompute == "full" else 2)
        if offload.offload_params == "nvme":
            nvme += fetch
            write += fetch  # the updated weights, once a step
        else:
            host += fetch
    layers = offloaded_layers(parallel, state.layers)
    host += layers * state.activation_bytes_per_layer * in_flight
    in_unified = state.optimizer_bytes if paged(parallel) else 0.0
    host += in_unified  # what backs it when it is paged out
    return OffloadBytes(
        paged_state=in_unified,
        host_bytes=host, nvme_bytes=nvme, cpu_parameters=shard, fetch_per_pass=fetch,
        fetches=fetches,
        activations_per_layer=state.activation_bytes_per_layer, activation_layers=layers,
        nvme_read=read, nvme_write=write, params_on_nvme=offload.offload_params == "nvme")


def offload_time(moved: OffloadBytes, parallel: ParallelConfig, cluster: Cluster,
                 micro_batches: int, forward_s: float, backward_s: float,
                 layers: int) -> OffloadTime:
    """Seconds one GPU's offload (`moved`) adds to a step: `forward_s` and `backward_s`
    are its stage's compute per micro-batch over its `layers` layers, what prefetches and
    copies hide behind."""
    pcie = pcie_bytes_per_s(cluster)
    blocking = parallel.offload.offload_copies == "blocking"
    optimizer = transfers = 0.0
    if moved.cpu_parameters:
        # Gradients out during the last micro-batch's backward: what outlasts it waits (all
        # of it where each copy blocks); then the CPU's step and the weights' copy back.
        copy = COPY_BYTES * moved.cpu_parameters / pcie
        transfers += copy if blocking else max(0.0, copy - backward_s)
        optimizer += cpu_adam_seconds(moved.cpu_parameters, cluster) + copy
    if moved.paged_moved:
        optimizer += 2 * moved.paged_moved / pcie
    if moved.nvme_read or moved.nvme_write:
        read, write = nvme_bytes_per_s(cluster)
        optimizer += moved.nvme_read / read + moved.nvme_write / write
    if moved.fetches:
        fetch = moved.fetch_per_pass / pcie
        if moved.params_on_nvme:
            read, _ = nvme_bytes_per_s(cluster)
            fetch = max(fetch, moved.fetch_per_pass / read)  # NVMe -> host -> GPU, pipelined
        # Each pass's fetch is prefetched behind that pass's compute.
        forwards = moved.fetches - 1
        transfers += micro_batches * (forwards * max(0.0, fetch - forward_s)
                                      + max(0.0, fetch - backward_s))
    if moved.activation_layers and blocking:
        # Each checkpoint out in forward and back before its recomputation, nothing beside.
        transfers += micro_batches * moved.activation_layers * 2 \
            * moved.activations_per_layer / pageable_bytes_per_s(cluster)
    elif moved.activation_layers and layers:
        # Each offloaded layer's copy runs beside the next layer's compute.
        copy = moved.activations_per_layer / pcie
        transfers += micro_batches * moved.activation_layers * (
            max(0.0, copy - forward_s / layers) + max(0.0, copy - backward_s / layers))
    return OffloadTime(optimizer, transfers)


def host_fits(host_bytes: float, nvme_bytes: float, cluster: Cluster) -> bool:
    """Whether every GPU of a host keeping `host_bytes` in its memory and `nvme_bytes` on
    its drives fits in the host's usable memory and drives; True where nothing is."""
    if not host_bytes and not nvme_bytes:
        return True
    host = _host(cluster)
    per_host = gpus_per_host(cluster)
    if host_bytes * per_host > host.memory_gib * 2**30 * HOST_USABLE:
        return False
    return not nvme_bytes or (host.nvme_tb is not None
                              and nvme_bytes * per_host <= host.nvme_tb * 1e12)
