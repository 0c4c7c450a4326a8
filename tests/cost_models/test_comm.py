import pytest

from cost_models.comm import (
    COLLECTIVE_KINDS,
    collective_time,
    effective_link,
    group_collective_time,
    tree_all_reduce_time,
)
from planner.vocabulary.efficiency import Efficiency
from planner.vocabulary.cluster import Cluster, LinkSpec

GB = 1e9
GIB = 2**30


@pytest.fixture
def a100() -> Cluster:
    return a100_at(16)


def a100_at(num_devices: int) -> Cluster:
    """DGX A100 nodes at fixed link efficiencies (80%), whatever the preset's calibration
    says, so the hand-computed values below stay valid."""
    cluster = Cluster.load("dgx-a100-80g").with_devices(num_devices)
    efficiency = Efficiency(intra_node_bandwidth=0.8, inter_node_bandwidth=0.8)
    return cluster.with_efficiency(efficiency)


def test_ring_all_reduce_within_node(a100: Cluster) -> None:
    link = a100.link_for_group(group_stride=1, group_size=8)
    # NVLink 300 GB/s, 3 us: 2*7/8 * 1 GB / 300 GB/s + 2*7 * 3 us
    #   = 5.8333 ms + 0.042 ms = 5.87533 ms
    t = collective_time("all_reduce", 1 * GB, 8, link)
    assert t == pytest.approx(1.75 / 300 + 42e-6)
    assert t == pytest.approx(5.875333e-3, rel=1e-6)


def test_ring_all_reduce_across_nodes(a100: Cluster) -> None:
    link = a100.link_for_group(group_stride=1, group_size=16)
    # HDR IB 25 GB/s per GPU, 10 us: 2*15/16 * 1 GB / 25 GB/s + 2*15 * 10 us
    #   = 75 ms + 0.3 ms = 75.3 ms
    t = collective_time("all_reduce", 1 * GB, 16, link)
    assert t == pytest.approx(1.875 / 25 + 300e-6)
    assert t == pytest.approx(75.3e-3)


def test_gather_scatter_alltoall_half_of_all_reduce_bandwidth() -> None:
    link = LinkSpec(bandwidth_gbs=100, latency_us=0)
    full = collective_time("all_reduce", 4 * GB, 4, link)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert collective_time(kind, 4 * GB, 4, link) == pytest.approx(full / 2)
        assert collective_time(kind, 4 * GB, 4, link) == pytest.approx(3 / 4 * 4 / 100)


def test_send_recv() -> None:
    link = LinkSpec(bandwidth_gbs=50, latency_us=10)
    assert collective_time("send_recv", 1 * GB, 2, link) == pytest.approx(1 / 50 + 10e-6)


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_group_of_one_is_free(kind: str) -> None:
    link = LinkSpec(bandwidth_gbs=1, latency_us=100)
    assert collective_time(kind, 1 * GB, 1, link) == 0.0


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="broadcast"):
        collective_time("broadcast", 1.0, 2, LinkSpec(bandwidth_gbs=1, latency_us=1))


# group_collective_time on a DGX A100 preset: NVLink 300 GB/s at 3 us, HDR 25 GB/s per GPU
# at 10 us, both reached at the default efficiency of 0.8: 240 GB/s and 20 GB/s.


def test_efficiency_scales_link_bandwidth(a100: Cluster) -> None:
    assert effective_link(a100, 1, 8) == LinkSpec(bandwidth_gbs=240, latency_us=3)
    assert effective_link(a100, 1, 16) == LinkSpec(bandwidth_gbs=20, latency_us=10)


def test_group_all_reduce_within_node(a100: Cluster) -> None:
    # ring: 2*7/8 * 2^30 B / 240e9 B/s + 2*7 * 3 us
    #     = 1879048192 / 240e9 + 42e-6 = 7.829367 ms + 0.042 ms = 7.871367 ms
    # tree: 2 * 2^30 / 240e9 + 2*3 * 3 us = 8.947849 ms + 0.018 ms, slower: ring wins.
    t = group_collective_time("all_reduce", GIB, 8, 1, a100)
    assert t == pytest.approx(1.75 * GIB / 240e9 + 42e-6)
    assert t == pytest.approx(7.871367e-3, rel=1e-6)


def test_group_all_reduce_across_two_nodes(a100: Cluster) -> None:
    # 16 ranks span 2 nodes: every step at the scale-out latency, a ring's slowest hop.
    # The 8 ranks of each node drive the node's 8 NICs (one ring channel each), so the
    # ring runs at 8 x 20 GB/s = 160 GB/s (below NVLink's 240 GB/s that feeds them):
    # ring: 2*15/16 * 2^30 / 160e9 + 2*15 * 10 us = 12.582912 ms + 0.3 ms = 12.882912 ms
    # tree: 2 * 2^30 / 160e9 + 2*4 * 10 us = 13.421773 ms + 0.08 ms, slower.
    t = group_collective_time("all_reduce", GIB, 16, 1, a100)
    assert t == pytest.approx(1.875 * GIB / 160e9 + 300e-6)
    assert t == pytest.approx(12.882912e-3, rel=1e-6)


def test_one_rank_per_node_gets_one_nic(a100: Cluster) -> None:
    # 2 ranks 8 apart: one GPU in each node, one NIC's 20 GB/s.
    # ring: 2*1/2 * 2^30 / 20e9 + 2 * 10 us = 53.687091 ms + 0.02 ms
    t = group_collective_time("all_reduce", GIB, 2, 8, a100)
    assert t == pytest.approx(GIB / 20e9 + 20e-6)


def test_stride_of_a_node_spans_nodes() -> None:
    # 4 ranks 8 apart on 32 GPUs: one GPU in each of 4 nodes.
    c = a100_at(32)
    assert c.spans_domains(group_stride=8, group_size=4)
    # all-gather: 3/4 * 2^30 / 20e9 + 3 * 10 us = 40.265318 ms + 0.03 ms
    t = group_collective_time("all_gather", GIB, 4, 8, c)
    assert t == pytest.approx(0.75 * GIB / 20e9 + 30e-6)
    # The same 4 ranks 2 apart sit in one node: 3/4 * 2^30 / 240e9 + 3 * 3 us.
    inside = group_collective_time("all_gather", GIB, 4, 2, c)
    assert inside == pytest.approx(0.75 * GIB / 240e9 + 9e-6)


def test_tree_wins_for_small_all_reduce(a100: Cluster) -> None:
    # 1 KB among 8 in a node: the bandwidth terms are ~8 ns; latency decides.
    # ring: 2*7 steps * 3 us = 42 us; tree: 2*log2(8) steps * 3 us = 18 us.
    link = effective_link(a100, 1, 8)
    ring = collective_time("all_reduce", 1e3, 8, link)
    tree = tree_all_reduce_time(1e3, 8, link)
    assert tree == pytest.approx(2e3 / 240e9 + 18e-6)
    assert ring == pytest.approx(1.75e3 / 240e9 + 42e-6)
    assert group_collective_time("all_reduce", 1e3, 8, 1, a100) == pytest.approx(tree)


def test_tree_depth_rounds_up() -> None:
    link = LinkSpec(bandwidth_gbs=1, latency_us=1)
    # 5 ranks: depth ceil(log2 5) = 3, so 6 steps.
    assert tree_all_reduce_time(0, 5, link) == pytest.approx(6e-6)
    assert tree_all_reduce_time(1 * GB, 1, link) == 0.0


def test_send_recv_intra_and_inter(a100: Cluster) -> None:
    # Pipeline stages 4 ranks apart, 2 stages: both in node 0, over NVLink.
    # 1 GB / 240 GB/s + 3 us
    inside = group_collective_time("send_recv", 1 * GB, 2, 4, a100)
    assert inside == pytest.approx(1 / 240 + 3e-6)
    # Stages a node apart: 1 GB / 20 GB/s + 10 us.
    across = group_collective_time("send_recv", 1 * GB, 2, 8, a100)
    assert across == pytest.approx(1 / 20 + 10e-6)
    # 4 stages of 4 ranks: the boundary between stages 1 and 2 crosses nodes.
    assert group_collective_time("send_recv", 1 * GB, 4, 4, a100) == pytest.approx(across)


def test_all_to_all_across_nodes_sends_only_remote_share(a100: Cluster) -> None:
    # 16 ranks, 8 per node: 8 of a rank's 15 peers are remote, so 8/16 of the buffer
    # crosses the scale-out link: 0.5 * 1 GB / 20 GB/s + 15 * 10 us = 25 ms + 0.15 ms.
    t = group_collective_time("all_to_all", 1 * GB, 16, 1, a100)
    assert t == pytest.approx(0.5 / 20 + 150e-6)
    # One rank per node: all (n-1)/n is remote, as in the ring formula.
    c = a100_at(32)
    one_per_node = group_collective_time("all_to_all", 1 * GB, 4, 8, c)
    assert one_per_node == pytest.approx(0.75 / 20 + 30e-6)


def test_group_all_reduce_uses_preset_efficiency() -> None:
    # The cpu preset's links are measured, so they are charged in full: 0.5 GB/s, 200 us.
    cpu = Cluster.load("cpu")
    t = group_collective_time("all_reduce", 4e6, 4, 1, cpu)
    ring = 2 * 3 / 4 * 4e6 / 0.5e9 + 2 * 3 * 200e-6
    tree = 2 * 4e6 / 0.5e9 + 2 * 2 * 200e-6
    assert t == pytest.approx(min(ring, tree))


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_group_of_one_is_free_on_a_cluster(kind: str, a100: Cluster) -> None:
    assert group_collective_time(kind, 1 * GB, 1, 8, a100) == 0.0


def test_group_collective_rejects_bad_input(a100: Cluster) -> None:
    with pytest.raises(ValueError, match="broadcast"):
        group_collective_time("broadcast", 1.0, 2, 1, a100)
    with pytest.raises(ValueError, match="group_stride"):
        group_collective_time("all_reduce", 1.0, 2, 0, a100)
