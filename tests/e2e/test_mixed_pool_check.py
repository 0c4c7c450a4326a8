"""`plan check` on a mixed cluster: two CPU ranks of the `cpu` preset beside two priced
0.6x as fast. The plan pipelines across both pools with the faster pool's stage holding
more layers (uneven stages), and trains on 4 gloo ranks as one process does, every rank
issuing the collectives and holding the bytes the Plan predicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner import cli

SLOW_CPU = {"name": "slow-cpu", "device": {"name": "slow-cpu", "peak_tflops": {"fp32": 0.06},
                                           "memory_gib": 24, "memory_bandwidth_gbs": 12},
            "devices_per_node": 8, "intra_node": {"bandwidth_gbs": 0.5, "latency_us": 200},
            "inter_node": {"bandwidth_gbs": 1, "latency_us": 100}}


@pytest.mark.timeout(300)
def test_uneven_stages_across_pools_train_as_one_process(tmp_path: Path, capsys) -> None:
    cluster = tmp_path / "fast-slow.yaml"
    cluster.write_text(yaml.safe_dump({
        "name": "fast-slow",
        "pools": [{"name": "fast", "cluster": "cpu", "devices": 2},
                  {"name": "slow", "cluster": SLOW_CPU, "devices": 2}],
        "between_pools": {"bandwidth_gbs": 0.5, "latency_us": 200}}))
    report = tmp_path / "check.json"
    code = cli.main(["check", "llama", "--num-layers", "8", "--hidden-size", "256",
                     "--num-attention-heads", "4", "--vocab-size", "256", "--seq-length", "64",
                     "--cluster", str(cluster), "--gpus", "4", "--global-batch-size", "32",
                     "--steps", "2", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    stages = data["plan"]["stages"]
    assert [stage["pool"] for stage in stages] == ["slow", "fast"]
    assert [stage["layers"] for stage in stages] == [[0, 3], [3, 8]]
    assert [stage["num_devices"] for stage in stages] == [2, 2]
    assert data["passed"] and not data["mismatches"]
    assert "pools slow, fast" in data["plan"]["megatron_incompatibility"]
