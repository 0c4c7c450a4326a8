"""The TPU, Trainium, AMD, Gaudi and B300 presets' numbers, each against the figure its
preset cites (written here beside the citation), and each preset loading by name."""

from __future__ import annotations

import pytest

from planner.vocabulary.cluster import Cluster
from planner.vocabulary.evidence import generation_of

GIB = 2**30
NEW = ("tpu-v5p", "tpu-v6e", "tpu-v7", "trn1", "trn2", "mi355x", "dgx-b300")
REVIEWED = ("mi300x", "mi325x", "gaudi3")
TPU_MATMUL = 0.735
"""The TPU presets' shared matmul efficiency, fitted to the TPU rows of
published_accelerators.csv (tests/cost_models/test_published_accelerators.py holds the
fit to the rows)."""


@pytest.mark.parametrize("name", NEW + REVIEWED)
def test_each_preset_loads_by_name_as_one_domain(name: str) -> None:
    cluster = Cluster.load(name)
    assert cluster.name == name
    assert cluster.num_devices == cluster.devices_per_node and cluster.num_nodes == 1
    assert "fp32" in cluster.device.peak_tflops and cluster.description
    assert cluster.intra_node.bandwidth_gbs > cluster.inter_node.bandwidth_gbs
    assert cluster.intra_node.latency_us <= cluster.inter_node.latency_us


def test_tpu_v5p_is_google_clouds_table() -> None:
    # Google Cloud "TPU v5p" / TPU7x comparison table: 459 TFLOPS BF16 and FP8 per chip;
    # 95 GiB HBM2e at 2,765 GB/s; ICI 1,200 GB/s per chip both ways ("4,800 Gbps" one way);
    # DCN 50 Gb/s per chip; 4 chips per VM; largest slice 16x16x24 = 6,144 chips.
    c = Cluster.load("tpu-v5p")
    peaks = c.device.peak_tflops
    assert (peaks["bf16"], peaks["fp8"]) == (459, 459)
    assert peaks["fp32"] == pytest.approx(459 / 6, abs=0.05)  # 6 bf16 passes (approximate)
    assert "fp16" not in peaks and "tf32" not in peaks
    assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (95, 2765)
    assert c.intra_node.bandwidth_gbs == 1200 / 2 == 4800 / 8  # 6 links x 100 GB/s one way
    assert c.inter_node.bandwidth_gbs == 50 / 8
    assert (c.devices_per_node, c.devices_per_host) == (16 * 16 * 24, 4)
    assert c.host is None and c.run_costs is None  # Google publishes no host bandwidth, power


def test_tpu_v6e_is_google_clouds_table() -> None:
    # Google Cloud "TPU v6e": 918 TFLOPS BF16 (FP8 the same, TPU7x table), 32 GiB at 1,638
    # GBps, bidirectional ICI 800 GBps per chip over 4 ports, 2-D torus, 256 chips per pod;
    # DCN 100 Gb/s per chip.
    c = Cluster.load("tpu-v6e")
    peaks = c.device.peak_tflops
    assert (peaks["bf16"], peaks["fp8"], peaks["fp32"]) == (918, 918, 918 / 6)
    assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (32, 1638)
    assert c.intra_node.bandwidth_gbs == 800 / 2  # 4 links x 100 GB/s one way
    assert c.inter_node.bandwidth_gbs == 100 / 8
    assert (c.devices_per_node, c.devices_per_host) == (16 * 16, 4)


def test_tpu_v7_ironwood_is_google_clouds_table() -> None:
    # Google Cloud "TPU7x (Ironwood)": 2,307 TFLOPS BF16 and 4,614 FP8 per chip, 192 GiB at
    # 7,380 GB/s, ICI 1,200 GB/s per chip both ways, DCN 100 Gb/s per chip, 9,216 chips per
    # pod; a chip is two JAX devices (96 GiB and 1,153.5 bf16 TFLOP/s each).
    c = Cluster.load("tpu-v7")
    peaks = c.device.peak_tflops
    assert (peaks["bf16"], peaks["fp8"]) == (2307, 4614)
    assert peaks["fp32"] == pytest.approx(2307 / 6, abs=0.05)
    assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (192, 7380)
    assert c.intra_node.bandwidth_gbs == 1200 / 2
    assert c.inter_node.bandwidth_gbs == 100 / 8
    assert (c.devices_per_node, c.devices_per_host) == (9216, 4)


@pytest.mark.parametrize("name", ("tpu-v5p", "tpu-v6e", "tpu-v7"))
def test_tpu_presets_share_the_fitted_matmul_efficiency(name: str) -> None:
    device = Cluster.load(name).device
    assert device.efficiency.matmul == TPU_MATMUL
    assert device.calibration is not None
    assert "published_accelerators.csv" in device.calibration.data
    assert device.flash_attention and not device.tp_comm_overlap


def test_trn1_is_the_neuron_docs() -> None:
    # AWS Neuron "Trainium Architecture": 190 FP16/BF16/cFP8/TF32 TFLOPS, 47.5 FP32 per
    # chip; 32 GiB at 820 GiB/s. "Trn1/Trn1n Architecture": 16 chips per trn1.32xlarge,
    # NeuronLink-v2 384 GiB/s per chip (taken as both directions, approximate), EFA 800 Gb/s.
    c = Cluster.load("trn1")
    assert c.device.peak_tflops == {"fp32": 47.5, "tf32": 190, "bf16": 190, "fp16": 190,
                                    "fp8": 190}
    assert c.device.memory_gib == 32
    assert c.device.memory_bandwidth_gbs == pytest.approx(820 * GIB / 1e9, abs=0.05)
    assert c.devices_per_node == 16
    assert c.intra_node.bandwidth_gbs == pytest.approx(384 / 2 * GIB / 1e9, abs=0.05)
    assert c.inter_node.bandwidth_gbs == 800 / 8 / 16
    assert c.device.calibration is not None  # its one published row's fit
    # 16 chips: the instance's 3,040 BF16 TFLOPS and 13,120 GiB/s.
    assert 16 * c.device.peak_tflops["bf16"] == 3040
    assert 16 * c.device.memory_bandwidth_gbs == pytest.approx(13120 * GIB / 1e9, rel=1e-4)


def test_trn2_is_the_neuron_docs() -> None:
    # AWS Neuron "Trainium2 Architecture": 1,299 FP8, 667 BF16/FP16/TF32, 181 FP32 TFLOPS
    # per chip; 96 GiB at 2.9 TB/s. "Trn2 Architecture": 16 chips per trn2.48xlarge (4x4
    # torus), NeuronLink-v3 1,024 GB/s per chip within the instance, EFAv3 3,200 Gb/s.
    # published_network.csv's Trn2 row: 1.28 TB/s per device = 1,024 + 256 (UltraServer).
    c = Cluster.load("trn2")
    assert c.device.peak_tflops == {"fp32": 181, "tf32": 667, "bf16": 667, "fp16": 667,
                                    "fp8": 1299}
    assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (96, 2900)
    assert c.devices_per_node == 16
    assert c.intra_node.bandwidth_gbs == 1024 / 2
    assert 1024 + 256 == 1280  # the network row's 1.28 TB/s, less the UltraServer tier
    assert c.inter_node.bandwidth_gbs == 3200 / 8 / 16
    # 16 chips: the instance's 10.7 BF16 and 20.8 FP8 PFLOPS, 46.4 TB/s.
    assert 16 * c.device.peak_tflops["bf16"] == pytest.approx(10_700, rel=0.01)
    assert 16 * c.device.peak_tflops["fp8"] == pytest.approx(20_800, rel=0.01)
    assert 16 * c.device.memory_bandwidth_gbs == 46_400


def test_mi355x_is_amds_figures() -> None:
    # AMD MI355X: 288 GB HBM3E (ROCm: 288 GiB) at 8 TB/s, 1,400 W; dense peaks from 256 CUs
    # at 2.4 GHz: BF16 4,096, FP8 8,192, FP32 256 FLOP per CU per clock ("2.5 PF", "5 PF").
    c = Cluster.load("mi355x")
    peaks = c.device.peak_tflops
    per_clock = 256 * 2.4e9 / 1e12
    assert peaks["bf16"] == peaks["fp16"] == pytest.approx(4096 * per_clock, abs=0.05)
    assert peaks["fp8"] == peaks["mxfp8"] == pytest.approx(8192 * per_clock, abs=0.05)
    assert peaks["fp32"] == pytest.approx(256 * per_clock, abs=0.05)
    assert "tf32" not in peaks
    assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (288, 8000)
    assert c.device.rated_power_w == 1400
    assert c.intra_node.bandwidth_gbs == pytest.approx(7 * 153.6 / 2)  # 7 links (approximate)
    assert c.inter_node.bandwidth_gbs == 400 / 8
    assert c.devices_per_node == 8 and c.run_costs is None


def test_dgx_b300_is_nvidias_figures() -> None:
    # HGX B300 per GPU (8 GPUs, with sparsity: BF16 36 PF, FP8 72 PF, TF32 18 PF; FP32 600
    # TF): dense halves over 8; 288 GB HBM3e at 8 TB/s; NVLink 5 1.8 TB/s; ConnectX-8 800 Gb/s.
    c = Cluster.load("dgx-b300")
    peaks = c.device.peak_tflops
    assert peaks == {"fp32": 600 / 8, "tf32": 18_000 / 8 / 2, "bf16": 36_000 / 8 / 2,
                     "fp16": 36_000 / 8 / 2, "fp8": 72_000 / 8 / 2, "mxfp8": 72_000 / 8 / 2}
    assert c.device.memory_gib == pytest.approx(288e9 / GIB, abs=0.05)
    assert c.device.memory_bandwidth_gbs == 8000
    assert c.intra_node.bandwidth_gbs == 1800 / 2 and c.inter_node.bandwidth_gbs == 800 / 8
    # The B200's peaks, so dgx-b200's efficiency (borrowed from the GB200 fit) applies as is.
    b200 = Cluster.load("dgx-b200").device
    assert {k: peaks[k] for k in ("bf16", "fp8")} == {k: b200.peak_tflops[k]
                                                      for k in ("bf16", "fp8")}
    assert c.device.efficiency == b200.efficiency
    assert c.host is not None and c.host.cpu_cores == 2 * 64 and c.host.memory_gib == 2048


def test_reviewed_amd_and_gaudi_presets_are_their_data_sheets() -> None:
    # AMD MI300X / MI325X data sheets: dense BF16 1,307.4, FP8 2,614.9, TF32 653.7, FP32
    # 163.4 TFLOPS = 304 CUs x 2.1 GHz x 2,048 / 4,096 / 1,024 / 256 FLOP per CU per clock;
    # 192 GB at 5.3 TB/s (750 W) and 256 GB at 6 TB/s (1,000 W); ROCm: 192 and 256 GiB;
    # 7 Infinity Fabric links of 128 GB/s both ways.
    per_clock = 304 * 2.1e9 / 1e12
    for name, gib, bandwidth, watts in (("mi300x", 192, 5300, 750),
                                        ("mi325x", 256, 6000, 1000)):
        c = Cluster.load(name)
        peaks = c.device.peak_tflops
        assert peaks["bf16"] == peaks["fp16"] == pytest.approx(2048 * per_clock, abs=0.05)
        assert peaks["fp8"] == pytest.approx(4096 * per_clock, abs=0.05)
        assert peaks["tf32"] == pytest.approx(1024 * per_clock, abs=0.05)
        assert peaks["fp32"] == pytest.approx(256 * per_clock, abs=0.05)
        assert (c.device.memory_gib, c.device.memory_bandwidth_gbs) == (gib, bandwidth)
        assert c.device.rated_power_w == watts and c.run_costs is not None
        assert c.run_costs.gpu_power_w == watts
        assert c.intra_node.bandwidth_gbs == 7 * 128 / 2
    # Intel Gaudi 3 (Hot Chips 2024): BF16 and FP8 matrix 1,835 TFLOPS, 128 GB HBM2e at 3.67
    # TB/s, 24x 200 GbE (21 to the 7 peers, 3 out), TDP 900 W.
    g = Cluster.load("gaudi3")
    assert (g.device.peak_tflops["bf16"], g.device.peak_tflops["fp8"]) == (1835, 1835)
    assert (g.device.memory_gib, g.device.memory_bandwidth_gbs) == (128, 3670)
    assert g.intra_node.bandwidth_gbs == 21 * 200 / 8 and g.inter_node.bandwidth_gbs == 3 * 200 / 8
    assert g.device.rated_power_w == 900


def test_new_devices_have_their_generations() -> None:
    generations = {name: generation_of(Cluster.load(name).device.name) for name in NEW}
    assert generations == {"tpu-v5p": "tpu-v5p", "tpu-v6e": "tpu-v6e", "tpu-v7": "tpu-v7",
                           "trn1": "trainium1", "trn2": "trainium2",
                           "mi355x": "mi355x-288gb", "dgx-b300": "blackwell-ultra"}
