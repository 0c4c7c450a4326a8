"""A pipeline whose end stages hold one layer fewer (Megatron-LM's split with the embedding
and the loss counted as layers) trains as planned on real gloo ranks."""

from __future__ import annotations

import json

import pytest

from planner import cli


@pytest.mark.timeout(300)
def test_end_stages_one_layer_short_run_as_predicted(tmp_path, capsys) -> None:
    # 6 layers + the embedding + the loss = 8 slots over 4 stages: 1, 2, 2, 1 layers.
    report = tmp_path / "check.json"
    code = cli.main(["check", "llama", "--num-layers", "6", "--hidden-size", "64",
                     "--num-attention-heads", "4", "--vocab-size", "256", "--seq-length", "16",
                     "--gpus", "4", "--global-batch-size", "8",
                     "--pipeline-model-parallel-size", "4", "--steps", "2",
                     "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    stages = [stage["layers"] for stage in data["plan"]["stages"]]
    assert stages == [[0, 1], [1, 3], [3, 5], [5, 6]]
    assert data["passed"] and not data["mismatches"]
    assert "--decoder-first-pipeline-num-layers 1" in " ".join(data["plan"]["megatron_flags"])
    # Each rank's sends and receives are its stage's, as predicted: the end stages talk to
    # one neighbour, the middle ones to two.
    sends = [rank["send"]["count"] for rank in data["details"]["comparison"]["measured"]]
    assert sends[0] == sends[3] and sends[1] == sends[2] == 2 * sends[0]
