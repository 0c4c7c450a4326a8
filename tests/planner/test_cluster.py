import json

import pytest
import yaml

from cost_models.efficiency import Efficiency
from planner import cli
from planner.cluster import Cluster, LinkSpec

PRESETS = (
    "cpu", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200",
    "gb200-nvl72", "mi300x", "mi325x", "gaudi3",
)


def test_every_preset_is_listed() -> None:
    assert sorted(PRESETS) == Cluster.presets()


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load(name: str) -> None:
    cluster = Cluster.load(name)
    assert cluster.name == name
    assert "fp32" in cluster.device.peak_tflops
    assert cluster.description
    # A preset is one scale-up domain until sized with with_devices.
    assert cluster.num_devices == cluster.devices_per_node
    assert cluster.num_nodes == 1
    assert isinstance(cluster.device.efficiency, Efficiency)


@pytest.mark.parametrize("name", [p for p in PRESETS if p != "cpu"])
def test_preset_numbers_are_sane(name: str) -> None:
    cluster = Cluster.load(name)
    peaks = cluster.device.peak_tflops
    assert peaks["bf16"] > peaks.get("tf32", peaks["fp32"]) >= peaks["fp32"]
    assert peaks["fp16"] == peaks["bf16"]
    assert peaks.get("fp8", peaks["bf16"]) >= peaks["bf16"]
    assert cluster.device.memory_gib >= 40
    assert cluster.device.memory_bandwidth_gbs > 1000
    # The scale-up link is several times the scale-out network per GPU.
    assert cluster.intra_node.bandwidth_gbs >= 5 * cluster.inter_node.bandwidth_gbs
    assert cluster.intra_node.latency_us <= cluster.inter_node.latency_us


def test_datasheet_numbers() -> None:
    h100, b200 = Cluster.load("dgx-h100"), Cluster.load("dgx-b200")
    # Dense = half the datasheets' "with sparsity" figures.
    assert h100.device.peak_tflops["bf16"] == 1979 / 2
    assert h100.device.peak_tflops["fp8"] == 3958 / 2
    # DGX B200: 72 PF FP8 with sparsity over 8 GPUs; 1.8 TB/s NVLink 5 both ways.
    assert b200.device.peak_tflops["fp8"] == 72_000 / 8 / 2
    assert b200.intra_node.bandwidth_gbs == 1800 / 2
    assert Cluster.load("gb200-nvl72").devices_per_node == 72
    assert Cluster.load("gaudi3").inter_node.bandwidth_gbs == 3 * 200 / 8


def test_cpu_links_are_measured_so_reached_in_full() -> None:
    efficiency = Cluster.load("cpu").device.efficiency
    assert efficiency.intra_node_bandwidth == efficiency.inter_node_bandwidth == 1.0


def test_a100_preset_numbers() -> None:
    c = Cluster.load("dgx-a100-80g")
    assert c.device.peak_tflops["bf16"] == 312
    assert c.devices_per_node == 8
    assert c.intra_node.bandwidth_gbs == 300
    assert c.inter_node.bandwidth_gbs == 25


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_file_round_trip(tmp_path, suffix: str) -> None:
    original = Cluster.load("dgx-h100").with_devices(32).model_copy(update={"name": "custom"})
    path = tmp_path / f"cluster{suffix}"
    data = original.model_dump()
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
    assert Cluster.load(str(path)) == original


def test_unknown_preset_suggests_closest() -> None:
    with pytest.raises(ValueError) as err:
        Cluster.load("dgx-a100")
    message = str(err.value)
    assert "'dgx-a100'" in message
    assert "did you mean 'dgx-a100-80g'" in message
    for name in Cluster.presets():
        assert name in message


def test_malformed_file_names_file_and_field(tmp_path) -> None:
    path = tmp_path / "broken.yaml"
    data = Cluster.load("cpu").model_dump()
    del data["devices_per_node"]
    data["intra_node"]["bandwidth_gbs"] = -1
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError) as err:
        Cluster.load(str(path))
    message = str(err.value)
    assert str(path) in message
    assert "devices_per_node" in message
    assert "intra_node.bandwidth_gbs" in message


def test_unparsable_file_names_file(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        Cluster.load(str(path))


def test_unknown_key_rejected(tmp_path) -> None:
    path = tmp_path / "typo.yaml"
    data = Cluster.load("cpu").model_dump()
    data["devices_per_nod"] = 4
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="devices_per_nod"):
        Cluster.load(str(path))


def test_with_devices_whole_nodes() -> None:
    c = Cluster.load("dgx-a100-80g").with_devices(32)
    assert (c.num_devices, c.num_nodes, c.devices_per_node) == (32, 4, 8)
    assert Cluster.load("gb200-nvl72").with_devices(144).num_nodes == 2


def test_with_devices_part_of_one_node() -> None:
    # --gpus 4 on a DGX: 4 GPUs of one node, still joined by NVLink.
    c = Cluster.load("dgx-h100").with_devices(4)
    assert (c.num_devices, c.num_nodes, c.devices_per_node) == (4, 1, 8)
    assert c.link_for_group(group_stride=1, group_size=4) == c.intra_node
    # Any group of a part-filled single node stays in it, even of 3 or 6 ranks.
    assert c.with_devices(6).link_for_group(group_stride=1, group_size=6) == c.intra_node


@pytest.mark.parametrize("bad", [0, -8])
def test_with_devices_needs_one_device(bad: int) -> None:
    with pytest.raises(ValueError, match=f"cannot hold {bad} devices; ask for at least 1"):
        Cluster.load("dgx-h100").with_devices(bad)


def test_with_devices_whole_nodes_past_one() -> None:
    with pytest.raises(ValueError) as err:
        Cluster.load("dgx-h100").with_devices(12)
    message = str(err.value)
    assert "'dgx-h100' has 8 devices per node" in message
    assert "use a multiple of 8" in message
    with pytest.raises(ValueError, match="72 devices per node"):
        Cluster.load("gb200-nvl72").with_devices(100)


def test_num_nodes_in_a_file(tmp_path) -> None:
    data = Cluster.load("dgx-a100-80g").model_dump()
    del data["num_devices"]
    data["num_nodes"] = 4
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(data))
    assert Cluster.load(str(path)).num_devices == 32
    data["num_devices"] = 16
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="num_nodes 4 and num_devices 16 disagree"):
        Cluster.load(str(path))


def test_part_filled_node_in_a_file(tmp_path) -> None:
    data = Cluster.load("dgx-a100-80g").model_dump() | {"num_devices": 12}
    path = tmp_path / "twelve.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="twelve.yaml.*use a multiple of 8"):
        Cluster.load(str(path))


def test_plan_clusters_lists_every_preset(capsys) -> None:
    assert cli.main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert "TFLOP/s" in out and "989.5" in out


def test_link_for_group() -> None:
    c = Cluster.load("dgx-a100-80g").with_devices(32)
    assert c.link_for_group(group_stride=1, group_size=8) == c.intra_node
    assert c.link_for_group(group_stride=2, group_size=4) == c.intra_node
    # 16 consecutive ranks, or 4 ranks one node apart, span nodes.
    assert c.link_for_group(group_stride=1, group_size=16) == c.inter_node
    assert c.link_for_group(group_stride=8, group_size=4) == c.inter_node
    assert c.link_for_group(group_stride=4, group_size=4) == c.inter_node
    assert isinstance(c.link_for_group(1, 1), LinkSpec)


def test_groups_not_tiling_a_node_span_nodes() -> None:
    # 6 consecutive ranks on 24 GPUs: the block [6, 12) straddles nodes 0 and 1.
    c = Cluster.load("dgx-a100-80g").with_devices(24)
    assert c.spans_domains(group_stride=1, group_size=6)
    assert not c.spans_domains(group_stride=1, group_size=4)


def test_ranks_per_domain() -> None:
    c = Cluster.load("dgx-a100-80g").with_devices(32)
    assert c.ranks_per_domain(group_stride=1, group_size=4) == 4    # one node
    assert c.ranks_per_domain(group_stride=1, group_size=16) == 8   # 2 nodes x 8
    assert c.ranks_per_domain(group_stride=4, group_size=4) == 2    # 2 nodes x 2
    assert c.ranks_per_domain(group_stride=8, group_size=4) == 1    # 4 nodes x 1
