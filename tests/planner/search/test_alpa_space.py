"""planner.search.alpa_space: the submeshes the stage DP places stages on, and the bound that
keeps its tables small on a million GPUs."""

from __future__ import annotations

import math

import pytest

from planner.search.alpa_space import MAX_DEVICE_STATES, submeshes
from planner.vocabulary.cluster import Cluster


def sizes_on(gpus: int) -> list[int]:
    return submeshes(Cluster.load("dgx-h100").with_devices(gpus))


def states(gpus: int) -> int:
    """The device counts the stage DP indexes: the cluster in units of the sizes' gcd."""
    return gpus // math.gcd(*sizes_on(gpus))


def test_alpas_submeshes_up_to_the_bound() -> None:
    # Powers of two within a node, then powers of two of nodes, and all nodes.
    assert sizes_on(8) == [1, 2, 4, 8]
    assert sizes_on(24) == [1, 2, 4, 8, 16, 24]
    assert sizes_on(MAX_DEVICE_STATES) == [2**i for i in range(15)]


@pytest.mark.parametrize(("gpus", "smallest"), [
    (1 << 15, 2), (1 << 17, 8), (1 << 20, 64),
    (1_000_000, 64),  # 125,000 nodes: every size a multiple of 64, 15,625 states
])
def test_a_larger_cluster_drops_the_smallest_submeshes_to_the_bound(
        gpus: int, smallest: int) -> None:
    sizes = sizes_on(gpus)
    assert sizes[0] == smallest and sizes[-1] == gpus
    assert states(gpus) <= MAX_DEVICE_STATES
    assert sizes == [s for s in sizes_on_unbounded(gpus) if s >= smallest]


def test_a_node_count_with_few_factors_of_two_keeps_every_submesh() -> None:
    # 131,071 nodes (a prime): only the whole cluster would fit the bound, so nothing is
    # dropped and the DP indexes every device count, as before the bound.
    gpus = 8 * 131_071
    assert sizes_on(gpus) == sizes_on_unbounded(gpus)


def sizes_on_unbounded(gpus: int) -> list[int]:
    """Alpa's list without the bound, written out."""
    nodes = gpus // 8
    return sorted({1, 2, 4, 8} | {8 * k for k in range(2, nodes + 1)
                                  if k & (k - 1) == 0 or k == nodes})
