import pytest

from cost_models.comm import COLLECTIVE_KINDS, collective_time
from planner.cluster import Cluster, LinkSpec

GB = 1e9


@pytest.fixture
def a100() -> Cluster:
    return Cluster.load("dgx-a100-80g").model_copy(update={"num_nodes": 2})


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
