import json
import math

import pytest
import yaml

from planner.vocabulary.efficiency import Efficiency
from planner import cli
from planner.vocabulary.cluster import MAX_DEVICES, Cluster, LinkSpec

PRESETS = (
    "cpu", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-h800", "dgx-b200",
    "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x", "gaudi3", "aws-p3.16xlarge", "rtx-4090",
    "rtx-a6000", "dgx-b300", "mi355x", "tpu-v5p", "tpu-v6e", "tpu-v7", "trn1", "trn2",
)
# Volta predates the sanity checks' assumptions (bf16, >= 40 GiB, > 1 TB/s HBM);
# tests/planner/test_aws_p3_preset.py checks its datasheet numbers instead.
PRE_BF16 = ("cpu", "aws-p3.16xlarge")
# Workstation GPUs have GDDR, not HBM (24 GiB, 768 GB/s) and PCIe past an NVLink bridge,
# if any: tests/planner/vocabulary/test_host_presets.py checks their datasheet numbers.
WORKSTATION = ("rtx-4090", "rtx-a6000")
# TPUs list no fp16 peak, Trainium's TF32 runs at its bf16 rate, and v6e and Trainium 1
# have 32 GiB: tests/planner/vocabulary/test_accelerator_presets.py checks their numbers.
NOT_GPU = ("tpu-v5p", "tpu-v6e", "tpu-v7", "trn1", "trn2")


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


@pytest.mark.parametrize("name", [p for p in PRESETS
                                  if p not in PRE_BF16 + WORKSTATION + NOT_GPU])
def test_preset_numbers_are_sane(name: str) -> None:
    cluster = Cluster.load(name)
    peaks = cluster.device.peak_tflops
    assert peaks["bf16"] > peaks.get("tf32", peaks["fp32"]) >= peaks["fp32"]
    assert peaks["fp16"] == peaks["bf16"]
    assert peaks.get("fp8", peaks["bf16"]) >= peaks["bf16"]
    assert cluster.device.memory_gib >= 40
    assert cluster.device.memory_bandwidth_gbs > 1000
    # The scale-up link is several times the scale-out network per GPU (the H800's, cut
    # for export, the least: 200 GB/s against its 50 GB/s NDR port).
    assert cluster.intra_node.bandwidth_gbs >= 4 * cluster.inter_node.bandwidth_gbs
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
    # A GB200 job holds whole 4-GPU trays, not whole 72-GPU racks.
    assert Cluster.load("gb200-nvl72").with_devices(100).num_devices == 100
    with pytest.raises(ValueError, match="use a multiple of 4"):
        Cluster.load("gb200-nvl72").with_devices(102)


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


# --- Garbage refused (issue 10, family 6): infinite, NaN and absurd numbers, by field. ---


def _write(tmp_path, data: dict, name: str = "bad.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def _preset_with(name: str, path: tuple, value) -> dict:
    """A preset's data with the field at `path` set to `value`."""
    data = Cluster.load(name).model_dump()
    place = data
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("device", "memory_gib"), math.inf, "device.memory_gib: Input should be a finite "
         "number (got inf)"),
        (("device", "memory_bandwidth_gbs"), math.nan, "device.memory_bandwidth_gbs: Input "
         "should be a finite number (got nan)"),
        (("device", "peak_tflops", "bf16"), math.inf, "device.peak_tflops.bf16: Input should "
         "be a finite number (got inf)"),
        (("device", "peak_tflops", "fp32"), 0, "peaks must be positive finite TFLOP/s; not so "
         "for fp32 (0"),
        (("intra_node", "bandwidth_gbs"), math.inf, "intra_node.bandwidth_gbs: Input should be "
         "a finite number (got inf)"),
        (("inter_node", "bandwidth_gbs"), math.nan, "inter_node.bandwidth_gbs"),
        (("inter_node", "latency_us"), math.inf, "inter_node.latency_us: Input should be a "
         "finite number (got inf)"),
        (("intra_node", "latency_us"), -1.0, "intra_node.latency_us: Input should be greater "
         "than or equal to 0 (got -1.0)"),
        (("device", "efficiency", "matmul"), math.nan, "device.efficiency.matmul: Input should "
         "be a finite number (got nan)"),
        (("device", "efficiency", "matmul_half_dim"), math.inf, "device.efficiency."
         "matmul_half_dim: Input should be a finite number (got inf)"),
        (("device", "efficiency", "kernel_overhead_us"), math.inf, "efficiency."
         "kernel_overhead_us: Input should be a finite number"),
        (("devices_per_node",), MAX_DEVICES + 1, f"devices_per_node: Input should be less "
         f"than or equal to {MAX_DEVICES} (got {MAX_DEVICES + 1})"),
        (("num_devices",), 8 << 20, f"cannot hold {8 << 20} devices: that is more than Tessel "
         f"plans for (at most {MAX_DEVICES} devices)"),
    ],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_non_finite_and_absurd_numbers_are_named_by_field(
    tmp_path, path, value, message, suffix
) -> None:
    data = _preset_with("dgx-h100", path, value)
    file = _write(tmp_path, data, "bad" + suffix)  # YAML writes .inf / .nan, JSON Infinity
    with pytest.raises(ValueError) as error:
        Cluster.load(str(file))
    text = str(error.value)
    assert text.startswith(f"Invalid cluster file {str(file)!r}: ")
    assert message in text
    assert "\n" not in text and not text.endswith("..")


def test_an_overflowing_number_is_infinite_and_refused(tmp_path) -> None:
    data = Cluster.load("dgx-h100").model_dump()
    data["device"]["memory_gib"] = 12345.5
    text = json.dumps(data).replace('"memory_gib": 12345.5', '"memory_gib": 1e999')
    assert "1e999" in text
    path = tmp_path / "huge.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"device.memory_gib: Input should be a finite number"):
        Cluster.load(str(path))


# The efficiencies that are fractions of a datasheet peak, and the ones that are not.
FRACTIONS = ("matmul", "fp8_matmul", "attention", "memory", "intra_node_bandwidth",
             "inter_node_bandwidth", "expert_matmul", "alltoall_bandwidth", "sink_attention")
NOT_FRACTIONS = ("matmul_half_dim", "kernel_overhead_us", "dispatch_us",
                 "collective_overhead_us", "moe_sync_us")
SHARES = ("overlap_slowdown",)


def test_every_efficiency_field_is_a_fraction_or_a_cost() -> None:
    assert sorted(FRACTIONS + NOT_FRACTIONS + SHARES) == sorted(Efficiency.model_fields)


@pytest.mark.parametrize("value", [-0.1, 1.01, math.inf, math.nan])
def test_a_share_of_compute_lies_in_0_to_1(value: float) -> None:
    with pytest.raises(ValueError, match="overlap_slowdown"):
        Efficiency(overlap_slowdown=value)
    assert Efficiency(overlap_slowdown=0.0).overlap_slowdown == 0.0


@pytest.mark.parametrize("field", FRACTIONS)
@pytest.mark.parametrize("value", [0.0, -0.5, 1.01, 80.0, math.inf, math.nan])
def test_fractions_of_a_peak_lie_in_0_to_1(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Efficiency(**{field: value})
    assert getattr(Efficiency(**{field: 1.0}), field) == 1.0


@pytest.mark.parametrize("field", NOT_FRACTIONS)
def test_costs_and_dimensions_are_finite_and_not_negative(field: str) -> None:
    for value in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=field):
            Efficiency(**{field: value})
    # Not fractions: above 1 is fine (96 is the default half dimension).
    assert getattr(Efficiency(**{field: 150.0}), field) == 150.0


@pytest.mark.parametrize("name", PRESETS)
def test_presets_pass_the_finite_and_fraction_checks(name: str) -> None:
    cluster = Cluster.load(name)
    efficiency = cluster.device.efficiency
    assert all(0 < getattr(efficiency, f) <= 1 for f in FRACTIONS)
    numbers = [cluster.device.memory_gib, cluster.device.memory_bandwidth_gbs,
               *cluster.device.peak_tflops.values(), cluster.intra_node.bandwidth_gbs,
               cluster.intra_node.latency_us, cluster.inter_node.bandwidth_gbs,
               cluster.inter_node.latency_us, *efficiency.model_dump().values()]
    assert all(math.isfinite(x) for x in numbers)
    # Round trip through the validation a file gets.
    assert Cluster.model_validate(cluster.model_dump()) == cluster


def test_max_devices_bounds_with_devices() -> None:
    assert MAX_DEVICES == 1 << 20
    assert Cluster.load("dgx-h100").with_devices(MAX_DEVICES).num_nodes == MAX_DEVICES // 8
    with pytest.raises(ValueError) as error:
        Cluster.load("dgx-h100").with_devices(10_000_000)
    assert str(error.value) == (
        "Cluster 'dgx-h100' cannot hold 10000000 devices: that is more than Tessel plans for "
        "(at most 1048576 devices); ask for fewer."
    )


def test_num_nodes_past_max_devices_is_refused(tmp_path) -> None:
    data = Cluster.load("dgx-a100-80g").model_dump()
    del data["num_devices"]
    data["num_nodes"] = 10**9
    with pytest.raises(ValueError, match=r"cannot hold 8000000000 devices.*at most 1048576"):
        Cluster.load(str(_write(tmp_path, data)))


def test_a_cluster_file_that_is_not_text_is_refused(tmp_path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ValueError, match=r"'.*binary.yaml' is not text"):
        Cluster.load(str(path))


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        (("device", "memory_gib"), math.inf, "device.memory_gib"),
        (("inter_node", "bandwidth_gbs"), math.inf, "inter_node.bandwidth_gbs"),
        (("device", "efficiency", "memory"), 1.5, "device.efficiency.memory"),
    ],
)
def test_plan_with_a_garbage_cluster_exits_2_in_one_line(
    tmp_path, one_line_error, path, value, fragment
) -> None:
    data = _preset_with("dgx-h100", path, value)
    file = _write(tmp_path, data)
    output = one_line_error(["demo:mlp", "--mesh", "2", "--cluster", str(file)])
    assert fragment in output and str(file) in output


def test_a_cluster_file_with_the_old_band_still_loads(tmp_path) -> None:
    # Files written before the bands came from the evidence held `step_time_ratio` under
    # calibration, and Blackwell's `layer_overhead_us` under efficiency: both are dropped on
    # load (the band is the evidence's; the residual is no longer charged).
    import yaml

    data = Cluster.load("dgx-h100").model_dump(mode="json")
    data["device"]["calibration"]["step_time_ratio"] = [0.95, 1.05]
    data["device"]["efficiency"]["layer_overhead_us"] = 1342.0  # retired in issue 43
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    loaded = Cluster.load(str(path))
    assert loaded.device.calibration is not None
    assert "step_time_ratio" not in loaded.device.calibration.model_dump()
    assert loaded.device.efficiency == Cluster.load("dgx-h100").device.efficiency


@pytest.mark.parametrize("prices", [[-2.0, 3.0], [5.0, 4.0]])
def test_a_price_range_below_zero_or_upside_down_is_refused(tmp_path, prices) -> None:
    # A negative price made "$-2 per GPU-hour" and --objective cost rank plans by it.
    import yaml

    data = Cluster.load("dgx-h100").model_dump(mode="json")
    data["run_costs"]["gpu_hour_usd"] = prices
    path = tmp_path / "priced.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"must be 0 <= low <= high USD per GPU-hour"):
        Cluster.load(str(path))
