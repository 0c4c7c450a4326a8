"""A fabric as tiers (`Cluster.tiers`: leaf, spine, WAN, with oversubscription) and a
scale-up torus (`Cluster.torus`): the link each group crosses, what a collective costs on
it, the search keeping activation-heavy groups inside a data centre, the bandwidth sweep
by tier, and a bad fabric refused in one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cost_models.bandwidth_sweep import tier_keys, tier_name
from cost_models.comm import group_collective_time
from planner import cli
from planner.vocabulary.cluster import Cluster

H100 = {"name": "H100-SXM5-80GB", "peak_tflops": {"fp32": 66.9, "bf16": 989.5},
        "memory_gib": 79.6, "memory_bandwidth_gbs": 3350}
TWO_DATA_CENTRES = {
    "name": "two-dcs", "device": H100, "devices_per_node": 8, "num_devices": 128,
    "intra_node": {"bandwidth_gbs": 450, "latency_us": 3},
    "inter_node": {"bandwidth_gbs": 50, "latency_us": 10},
    "tiers": [{"name": "leaf", "devices": 32, "bandwidth_gbs": 50, "latency_us": 10},
              {"name": "spine", "devices": 64, "bandwidth_gbs": 50, "latency_us": 12,
               "oversubscription": 2},
              {"name": "wan", "devices": 128, "bandwidth_gbs": 2.5, "latency_us": 30000,
               "wan": True}]}


def _cluster(**change) -> Cluster:
    return Cluster.model_validate({**TWO_DATA_CENTRES, **change})


def test_a_group_crosses_the_narrowest_tier_up_to_the_one_that_holds_it() -> None:
    c = _cluster()
    # One GPU per node of 4 nodes: a block of 32 ranks, one leaf, at the NICs' 50 GB/s.
    assert c.scale_out_link(8, 4).bandwidth_gbs == 50
    # 64 ranks: across leaves, through the 2:1 spine at 25 GB/s, its 12 us.
    link = c.scale_out_link(8, 8)
    assert (link.bandwidth_gbs, link.latency_us) == (25, 12)
    # 128 ranks: across the data centres at 2.5 GB/s; of the ring's 15 steps one crosses
    # (2 data centres), so 12 us + (30,000 - 12) / 15 us a step; a pipeline's message across
    # them waits the whole 30 ms.
    link = c.scale_out_link(8, 16)
    assert link.bandwidth_gbs == 2.5
    assert link.latency_us == pytest.approx(12 + (30000 - 12) / 15)
    assert c.scale_out_link(64, 2, point_to_point=True).latency_us == 30000
    assert c.crosses_wan(8, 16) == "wan" and c.crosses_wan(8, 8) is None
    # A cluster with no tiers: one flat network, as before.
    flat = _cluster(tiers=[])
    assert flat.scale_out_link(8, 16) == flat.inter_node


def test_an_all_reduce_through_an_oversubscribed_spine_takes_twice_as_long() -> None:
    c = _cluster()
    size = 1e9
    in_leaf = group_collective_time("all_reduce", size, 4, 8, c)
    via_spine = group_collective_time("all_reduce", size, 8, 8, c)
    eff = c.device.efficiency.inter_node_bandwidth
    ring = 2 * 7 / 8 * size / (25e9 * eff)
    # The ring's 2 (n - 1) steps at the spine's latency, and the launch of a group of 8.
    assert via_spine == pytest.approx(
        ring + 14 * 12e-6 + 3 * c.device.efficiency.collective_overhead_us * 1e-6, rel=1e-6)
    assert via_spine > 1.9 * in_leaf


def test_a_torus_gives_a_group_the_share_of_the_dimensions_it_spans() -> None:
    tpu = Cluster.model_validate({
        "name": "v5p-128", "device": {**H100, "name": "TPU-v5p"}, "devices_per_node": 64,
        "devices_per_host": 4, "num_devices": 64, "torus": [4, 4, 4],
        "intra_node": {"bandwidth_gbs": 600, "latency_us": 2},
        "inter_node": {"bandwidth_gbs": 6.25, "latency_us": 20}})
    assert tpu.torus_share(1, 4) == tpu.torus_share(4, 4) == tpu.torus_share(16, 4) == 1 / 3
    assert tpu.torus_share(1, 16) == 2 / 3 and tpu.torus_share(1, 64) == 1
    one_axis = group_collective_time("all_gather", 1e12, 4, 1, tpu)
    whole = group_collective_time("all_gather", 1e12, 64, 1, tpu)
    # 4 ranks on one axis: 3/4 of the bytes at a third of the links; 64 on all: 63/64.
    assert one_axis / whole == pytest.approx((3 / 4 * 3) / (63 / 64), rel=1e-3)


def test_the_search_keeps_context_rings_inside_a_data_centre_and_sweeps_each_tier() -> None:
    from planner.models.presets import zoo_config
    from planner.search import search
    from planner.vocabulary.parallel import FixedKnobs

    c = _cluster()
    result = search(zoo_config("llama3-8b", {}), c, 512, FixedKnobs())
    for candidate, _ in result.ranked:
        dims = candidate.parallel.dims
        assert c.crosses_wan(dims.tensor, dims.context) is None
    assert tier_keys(c) == ("intra_node", "inter_node", "tiers.0", "tiers.1", "tiers.2")
    assert [tier_name(c, key) for key in tier_keys(c)] == [
        "scale-up", "scale-out", "leaf", "spine", "wan"]


def _write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("change, words", [
    ({"tiers": [{"name": "leaf", "devices": 32, "bandwidth_gbs": 0, "latency_us": 5}]},
     "tiers.0.bandwidth_gbs: Input should be greater than 0"),
    ({"tiers": [{"name": "leaf", "devices": 32, "bandwidth_gbs": -50, "latency_us": 5}]},
     "tiers.0.bandwidth_gbs: Input should be greater than 0"),
    ({"tiers": [{"name": "spine", "devices": 32, "bandwidth_gbs": 50, "latency_us": 5,
                 "oversubscription": 0.5}]},
     "tiers.0.oversubscription: Input should be greater than or equal to 1"),
    ({"tiers": [{"name": "leaf", "devices": 36, "bandwidth_gbs": 50, "latency_us": 5}]},
     "tiers.0.devices: leaf joins 36 devices, which is not a multiple above 8"),
    ({"torus": [4, 4, 4]}, "torus [4, 4, 4] holds 64 chips, but a scale-up domain has "
                           "devices_per_node 8"),
])
def test_a_bad_fabric_gets_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, words: str) -> None:
    path = _write(tmp_path, {**TWO_DATA_CENTRES, **change})
    code = cli.main(["llama3-8b", "--cluster", path, "--gpus", "128",
                     "--global-batch-size", "128"])
    said = capsys.readouterr()
    said = said.out + said.err
    assert code == 2 and words in said and len(said.strip().splitlines()) == 1, said


def test_a_context_group_fixed_across_the_wan_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tensor groups never leave a scale-up domain (refused by that rule); a context ring
    of tensor 8 x context 16 = 128 ranks would run every layer across the data centres."""
    path = _write(tmp_path, TWO_DATA_CENTRES)
    code = cli.main(["llama3-8b", "--cluster", path, "--gpus", "128", "--global-batch-size",
                     "128", "--tensor-model-parallel-size", "8",
                     "--context-parallel-size", "16"])
    said = capsys.readouterr()
    said = said.out + said.err
    assert code == 2 and len(said.strip().splitlines()) == 1, said
    assert ("--context-parallel-size 16: its groups of 128 ranks would cross the WAN tier "
            "'wan' between data centres") in said
