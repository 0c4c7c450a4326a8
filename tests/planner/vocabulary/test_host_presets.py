"""The presets' host figures (CPU memory, PCIe, NVMe) and the two workstation GPUs' device
numbers, each against the figure its preset cites (NVIDIA and AWS datasheets and user
guides; the whitepapers' dense FP32-accumulate tensor peaks)."""

from __future__ import annotations

import pytest

from planner.vocabulary.cluster import Cluster

TB_OF_DRAM_GIB = 1024  # DIMMs are binary-sized: "2 TB" of them is 2048 GiB

# Preset -> (host GiB, memory GB/s, cores, host link GB/s per direction,
#            NVMe read GB/s, NVMe write GB/s, NVMe TB); None: not published, not priced.
HOSTS = {
    # DGX H100/H200 user guide: 2x Xeon 8480C (112 cores), 2 TB in 32 DIMMs (16 channels x 2
    # DIMMs: DDR5-4400), 8x 3.84 TB U.2 (~6.9 / ~4 GB/s each, estimated); PCIe Gen5 x16.
    "dgx-h100": (2 * TB_OF_DRAM_GIB, 2 * 8 * 4400 * 8 / 1000, 112, 128 / 2,
                 8 * 6.9, 8 * 4.0, 8 * 3.84),
    "dgx-h200": (2 * TB_OF_DRAM_GIB, 2 * 8 * 4400 * 8 / 1000, 112, 128 / 2,
                 8 * 6.9, 8 * 4.0, 8 * 3.84),
    # The DGX H800: the DGX H100 chassis with H800 GPUs (assumed: no English guide).
    "dgx-h800": (2 * TB_OF_DRAM_GIB, 2 * 8 * 4400 * 8 / 1000, 112, 128 / 2,
                 8 * 6.9, 8 * 4.0, 8 * 3.84),
    # DGX B200 user guide: 2x Xeon 8570 (56 cores each), 2 TB in 32 DIMMs, 8x 3.84 TB U.2.
    "dgx-b200": (2 * TB_OF_DRAM_GIB, 2 * 8 * 4400 * 8 / 1000, 2 * 56, 64,
                 8 * 6.9, 8 * 4.0, 8 * 3.84),
    # DGX B300 (summaries of NVIDIA's figures): 2x Xeon 6776P (64 cores each), 2 TB, 8x 3.84
    # TB E1.S; memory speed and drive speeds estimated as dgx-b200.yaml's (the preset says).
    "dgx-b300": (2 * TB_OF_DRAM_GIB, 2 * 8 * 5200 * 8 / 1000, 2 * 64, 64,
                 8 * 6.9, 8 * 4.0, 8 * 3.84),
    # DGX A100: 2x EPYC 7742 (128 cores, 8 channels of DDR4-3200 each); A100 "PCIe Gen4:
    # 64GB/s"; 640GB model 2 TB and 8x 3.84 TB, 320GB model 1 TB and 4x 3.84 TB.
    "dgx-a100-80g": (2 * TB_OF_DRAM_GIB, 2 * 8 * 3200 * 8 / 1000, 128, 64 / 2,
                     8 * 6.9, 8 * 4.0, 8 * 3.84),
    "dgx-a100-40g": (1 * TB_OF_DRAM_GIB, 2 * 8 * 3200 * 8 / 1000, 128, 64 / 2,
                     4 * 6.9, 4 * 4.0, 4 * 3.84),
    # GB200 NVL72 compute tray: 2 Grace (72 cores, 480 GB LPDDR5X at 512 GB/s each);
    # NVLink-C2C 900 GB/s both ways per Grace, shared by its 2 GPUs; drives unpublished.
    "gb200-nvl72": (2 * 480, 2 * 512, 2 * 72, 900 / 2 / 2, None, None, None),
    # GB300 NVL72: the rack's 17 TB of LPDDR5X at 14 TB/s over 36 Graces, 2 per tray
    # (decimal bytes); NVLink-C2C as GB200's; drives unpublished.
    "gb300-nvl72": (2 * 17e12 / 36 / 2**30, 2 * 14_000 / 36, 2 * 72, 900 / 2 / 2,
                    None, None, None),
    # p3.16xlarge: 488 GiB, 64 vCPUs = 32 cores, 2x 4 channels of DDR4-2400, PCIe Gen3 x16,
    # EBS only.
    "aws-p3.16xlarge": (488, 2 * 4 * 2400 * 8 / 1000, 32, 16, None, None, None),
    # Workstations: assumptions (2-channel DDR5-5600; 8-channel DDR4-3200; one Gen4 drive),
    # and the cards' own PCIe 4.0 x16.
    "rtx-4090": (128, 2 * 5600 * 8 / 1000, 16, 32, 7, 5, 2),
    "rtx-a6000": (256, 8 * 3200 * 8 / 1000, 32, 32, 7, 5, 2),
}
# Host chosen by the server vendor, or (TPU, Trainium) not published per chip.
NO_HOST = ("cpu", "mi300x", "mi325x", "gaudi3", "mi355x", "tpu-v5p", "tpu-v6e", "tpu-v7",
           "trn1", "trn2")


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_host_figures_are_the_cited_ones(name: str) -> None:
    host = Cluster.load(name).host
    assert host is not None
    memory, bandwidth, cores, link, read, write, capacity = HOSTS[name]
    assert host.memory_gib == pytest.approx(memory)
    assert host.memory_bandwidth_gbs == pytest.approx(bandwidth)
    assert host.cpu_cores == cores
    assert host.pcie_gbs == pytest.approx(link)
    assert host.nvme_read_gbs == (None if read is None else pytest.approx(read))
    assert host.nvme_write_gbs == (None if write is None else pytest.approx(write))
    assert host.nvme_tb == (None if capacity is None else pytest.approx(capacity))
    assert host.source.strip()


def test_dgx_h100_host_in_datasheet_terms() -> None:
    host = Cluster.load("dgx-h100").host
    assert host is not None
    # 2 TB of DDR5 is 32 x 64 GiB DIMMs, not 2e12 bytes (1862.6 GiB).
    assert host.memory_gib == 2048 and host.memory_gib != pytest.approx(2e12 / 2**30)
    assert host.cpu_cores == 112 and host.pcie_gbs == 64
    # Two DIMMs a channel: DDR5-4400, below the 614.4 GB/s of DDR5-4800 at one a channel.
    assert host.memory_bandwidth_gbs == pytest.approx(2 * 8 * 4400 * 8 / 1000)  # 563.2
    assert host.memory_bandwidth_gbs < 2 * 8 * 4800 * 8 / 1000  # 614.4


@pytest.mark.parametrize("name", NO_HOST)
def test_presets_without_published_host_figures_leave_them_out(name: str) -> None:
    assert Cluster.load(name).host is None


def test_every_preset_is_accounted_for() -> None:
    # A new preset states its host figures here, or why it has none.
    assert not set(HOSTS) & set(NO_HOST)
    assert set(HOSTS) | set(NO_HOST) == set(Cluster.presets())


def test_rtx_4090_device_is_the_whitepapers() -> None:
    cluster = Cluster.load("rtx-4090")
    device = cluster.device
    # Ada whitepaper v2.02 Appendix A, dense halves of the dense/sparse pairs, FP32
    # accumulate: BF16/FP16 165.2/330.4, FP8 330.3/660.6, TF32 82.6/165.2; FP32 82.6.
    assert device.peak_tflops == {"fp32": 82.6, "tf32": 82.6, "bf16": 330.4 / 2,
                                  "fp16": 330.4 / 2, "fp8": 660.6 / 2}
    assert device.default_precision == "bf16"
    assert device.memory_gib == pytest.approx(24564 / 1024, abs=0.005)  # 24 GB GDDR6X
    assert device.memory_bandwidth_gbs == 1008
    assert device.flash_attention and not device.tp_comm_overlap
    assert device.calibration is None and device.rated_power_w == 450
    assert (cluster.devices_per_node, cluster.devices_per_host, cluster.num_devices) == (1, 1, 1)
    # No NVLink: both links are PCIe 4.0 x16, 32 GB/s per direction.
    assert cluster.intra_node.bandwidth_gbs == cluster.inter_node.bandwidth_gbs == 32
    assert cluster.run_costs is None


def test_rtx_a6000_device_is_the_whitepapers() -> None:
    cluster = Cluster.load("rtx-a6000")
    device = cluster.device
    # GA102 whitepaper Table 3: BF16/FP16 with FP32 accumulate 154.8/309.6 (dense first);
    # datasheet FP32 38.7 TFLOPS, 48 GB GDDR6 at 768 GB/s; no fp8 on Ampere.
    assert device.peak_tflops["bf16"] == device.peak_tflops["fp16"] == 309.6 / 2
    assert device.peak_tflops["fp32"] == 38.7 and device.peak_tflops["tf32"] == 154.8 / 2
    assert "fp8" not in device.peak_tflops
    assert device.memory_gib == pytest.approx(49140 / 1024, abs=0.005)
    assert device.memory_bandwidth_gbs == 768
    assert device.flash_attention and not device.tp_comm_overlap
    assert device.calibration is None and device.rated_power_w == 300
    # The NVLink bridge joins a pair: 112.5 GB/s both ways; PCIe 4.0 x16 past it.
    assert (cluster.devices_per_node, cluster.num_devices) == (2, 2)
    assert cluster.intra_node.bandwidth_gbs == 112.5 / 2
    assert cluster.inter_node.bandwidth_gbs == 32
    assert cluster.run_costs is None


@pytest.mark.parametrize("name", ["rtx-4090", "rtx-a6000"])
def test_workstation_presets_resize_and_say_their_host_is_assumed(name: str) -> None:
    cluster = Cluster.load(name)
    assert cluster.with_devices(1).num_devices == 1
    assert cluster.with_devices(4).num_hosts == 4 // cluster.devices_per_host
    assert cluster.host is not None and "assumption" in cluster.host.source.lower()


def test_dgx_h800_is_the_h100_with_deepseeks_nvlink() -> None:
    """DeepSeek-V3's cluster: the H100's compute and HBM3 (the same GH100 die), NVLink cut to
    400 GB/s per GPU, and DeepSeek-V3's report's achieved 160 GB/s NVLink and 50 GB/s IB."""
    h800, h100 = Cluster.load("dgx-h800"), Cluster.load("dgx-h100")
    assert h800.device.peak_tflops == h100.device.peak_tflops
    assert h800.device.peak_tflops["bf16"] == 1979 / 2 and h800.device.peak_tflops["fp8"] == 1979
    assert h800.device.memory_gib == h100.device.memory_gib == 79.6
    assert h800.device.memory_bandwidth_gbs == 3350
    assert h800.intra_node.bandwidth_gbs == 400 / 2  # per direction
    achieved = h800.intra_node.bandwidth_gbs * h800.device.efficiency.intra_node_bandwidth
    assert achieved == pytest.approx(160)  # "NVLink offers a bandwidth of 160 GB/s"
    assert h800.inter_node.bandwidth_gbs == 50  # "IB (50 GB/s)", 400 Gb/s NDR per GPU
    # The H100's fitted kernels, which the H800 shares; no H800 run fitted anything.
    assert h800.device.efficiency.model_copy(update={"intra_node_bandwidth": 0.0}) \
        == h100.device.efficiency.model_copy(update={"intra_node_bandwidth": 0.0})
    assert h800.device.calibration is not None
    assert "No H800 run was fitted" in h800.device.calibration.data
    assert h800.run_costs is None


def test_gb300_nvl72_is_the_specifications_per_gpu() -> None:
    """NVIDIA's GB300 NVL72 rack figures per GPU: the GB200's bf16 and fp8 tensor rates (360
    and 720 PF with sparsity per rack), 288 GB of HBM3e at 576 TB/s / 72, NVLink 1.8 TB/s,
    one 800 Gb/s ConnectX-8 per GPU; kernels: the GB200 fit, fp8 matmuls and attention
    scaled to its one published row (tests/cost_models/test_published_accelerators.py)."""
    gb300, gb200 = Cluster.load("gb300-nvl72"), Cluster.load("gb200-nvl72")
    peaks = gb300.device.peak_tflops
    assert peaks["bf16"] == 360_000 / 72 / 2 and peaks["fp8"] == 720_000 / 72 / 2
    assert peaks == gb200.device.peak_tflops
    assert gb300.device.memory_gib == pytest.approx(288e9 / 2**30, abs=0.05)
    assert gb300.device.memory_bandwidth_gbs == 576_000 / 72
    assert gb300.intra_node.bandwidth_gbs == 1800 / 2
    assert gb300.inter_node.bandwidth_gbs == 800 / 8
    assert (gb300.devices_per_node, gb300.devices_per_host) == (72, 4)
    mine, theirs = gb300.device.efficiency, gb200.device.efficiency
    assert mine.model_copy(update={"fp8_matmul": theirs.fp8_matmul,
                                   "attention": theirs.attention}) == theirs
    assert mine.fp8_matmul > theirs.fp8_matmul and mine.attention > theirs.attention
    assert gb300.device.calibration is not None
    assert "GB300 row" in gb300.device.calibration.data
