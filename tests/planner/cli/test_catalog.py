"""`plan models`: each preset with its parameter count and, for a mixture of experts, the
parameters one token passes through."""

from __future__ import annotations

import json
from pathlib import Path

from planner import cli
from planner.models.presets import PRESETS
from planner.vocabulary.cluster import Cluster


def test_plan_models_lists_total_and_active_parameters(capsys, monkeypatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setattr(cli.console, "_width", 160)
    path = tmp_path / "models.json"
    assert cli.main(["models", "--json", str(path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.strip() and line.split()[0] in PRESETS}
    # DeepSeek-V3's card: 671B total, 37B active (arXiv 2412.19437), MTP not counted.
    assert rows["deepseek-v3"][1:3] == ["671.03", "37.55"]
    assert "MLA" in rows["deepseek-v3"] and rows["deepseek-v3"][-2:] == ["256+sh", "top-8"]
    assert rows["qwen3-235b-a22b"][1:3] == ["235.09", "22.19"]  # "A22B"
    assert rows["qwen3-30b-a3b"][1:3] == ["30.53", "3.35"]  # "A3B"
    assert rows["gpt-oss-120b"][1:3] == ["116.83", "5.71"]  # 117B, 5.1B active + embeddings
    assert rows["mixtral-8x7b"][1:3] == ["46.70", "12.88"]
    assert rows["gpt3-175b"][1:3] == ["174.62", "-"]
    presets = json.loads(path.read_text())
    assert presets["deepseek-v3"]["num_parameters_without_mtp"] == 671_026_404_352
    assert presets["deepseek-v3"]["num_active_parameters"] == 37_552_282_624


def test_plan_clusters_rounds_its_table_and_keeps_the_json_exact(
        capsys, monkeypatch, tmp_path: Path) -> None:
    # V100's 16 GB is 15.78125 GiB and p3's 25 Gbit/s network 3.125 GB/s over 8 GPUs,
    # 0.390625 each: a table shows them for reading, the JSON as they are.
    monkeypatch.setattr(cli.console, "_width", 160)
    path = tmp_path / "clusters.json"
    assert cli.main(["clusters", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines()
               if line.strip().startswith("aws-p3.16xlarge"))
    assert row[2] == "15.8" and row[-1] == "0.39"
    assert "15.78" not in out and "0.3906" not in out
    dgx_h100 = next(line.split() for line in out.splitlines()
                    if line.strip().startswith("dgx-h100"))
    assert dgx_h100[2:5] == ["79.6", "3350", "989.5"]  # one decimal kept, whole numbers whole
    presets = json.loads(path.read_text())
    assert presets["aws-p3.16xlarge"]["device"]["memory_gib"] == 15.78125
    assert presets["aws-p3.16xlarge"]["inter_node"]["bandwidth_gbs"] == 0.390625


def test_plan_clusters_lists_every_preset_with_its_sources(capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 4000)  # each preset's sources on one line
    assert cli.main(["clusters"]) == 0
    out = capsys.readouterr().out
    listed = out.split("sources (")[1].split("calibration (")[0].splitlines()[1:]
    sources = {line.split(":")[0].strip(): line for line in listed if line.strip()}
    assert set(sources) == set(Cluster.presets())
    for name in ("tpu-v5p", "tpu-v6e", "tpu-v7", "trn1", "trn2", "mi355x", "dgx-b300",
                 "dgx-h800", "gb300-nvl72"):
        assert "Sources:" in sources[name] or "Source:" in sources[name], sources[name]
