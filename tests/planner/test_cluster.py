import json

import pytest
import yaml

from planner.cluster import Cluster, LinkSpec


@pytest.mark.parametrize("name", ["cpu", "dgx-a100-80g", "dgx-h100"])
def test_presets_load(name: str) -> None:
    assert name in Cluster.presets()
    cluster = Cluster.load(name)
    assert cluster.name == name
    assert "fp32" in cluster.device.peak_tflops
    assert cluster.num_devices == cluster.devices_per_node * cluster.num_nodes


def test_a100_preset_numbers() -> None:
    c = Cluster.load("dgx-a100-80g")
    assert c.device.peak_tflops["bf16"] == 312
    assert c.devices_per_node == 8
    assert c.intra_node.bandwidth_gbs == 300
    assert c.inter_node.bandwidth_gbs == 25


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_file_round_trip(tmp_path, suffix: str) -> None:
    original = Cluster.load("dgx-h100").model_copy(update={"name": "custom", "num_nodes": 4})
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


def test_link_for_group() -> None:
    c = Cluster.load("dgx-a100-80g").model_copy(update={"num_nodes": 4})
    assert c.link_for_group(group_stride=1, group_size=8) == c.intra_node
    assert c.link_for_group(group_stride=2, group_size=4) == c.intra_node
    # 16 consecutive ranks, or 4 ranks one node apart, span nodes.
    assert c.link_for_group(group_stride=1, group_size=16) == c.inter_node
    assert c.link_for_group(group_stride=8, group_size=4) == c.inter_node
    assert c.link_for_group(group_stride=4, group_size=4) == c.inter_node
    assert isinstance(c.link_for_group(1, 1), LinkSpec)
