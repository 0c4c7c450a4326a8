"""planner.search.graph_space: which submeshes a graph search solves layers on."""

from __future__ import annotations

import itertools

import pytest

from planner.search.graph_space import logical_meshes, usable_submeshes


def _brute_force(sizes: list[int], devices: int, most: int) -> list[int]:
    used = set()
    for k in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(sizes, k):
            if sum(combo) == devices:
                used.update(combo)
    return [n for n in sizes if n in used]


@pytest.mark.parametrize("devices, most", [(64, 1), (64, 2), (64, 3), (64, 16), (8, 3),
                                           (24, 2), (24, 4), (12, 5)])
def test_usable_submeshes_are_those_some_plan_uses(devices: int, most: int) -> None:
    sizes = [1, 2, 4, 8, 16, 24, 32, 64]
    sizes = [n for n in sizes if n <= devices]
    assert usable_submeshes(sizes, devices, most) == _brute_force(sizes, devices, most)


def test_one_micro_batch_solves_layers_on_the_whole_cluster_only() -> None:
    assert usable_submeshes([1, 2, 4, 8, 16, 32, 64], 64, 1) == [64]
    assert logical_meshes(64, 8) == [(64,), (32, 2), (16, 4), (8, 8)]
