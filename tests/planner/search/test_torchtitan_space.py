"""Under the torchtitan engine the search offers only what TorchTitan runs."""

from __future__ import annotations

from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset
from planner.search import search
from planner.torchtitan.rules import zero_stages


def test_the_auto_space_under_torchtitan_keeps_one_mesh_and_its_data_parallelism() -> None:
    model = get_preset("llama3-70b")
    cluster = Cluster.load("dgx-h100").with_devices(256)
    result = search(model, cluster, 512, {"engine": "torchtitan"}, space="auto")
    assert result.ranked
    for candidate, _ in result.ranked[:20]:
        q = candidate.parallel
        assert candidate.stages is None  # every stage on the one mesh
        d = q.dims
        assert q.sharding.zero_stage in zero_stages(d.tensor, d.context, d.pipeline, d.data)
        assert q.execution.engine == "torchtitan"
