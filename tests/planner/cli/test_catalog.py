"""`plan models`: each preset with its parameter count and, for a mixture of experts, the
parameters one token passes through."""

from __future__ import annotations

import json
from pathlib import Path

from planner import cli


def test_plan_models_lists_total_and_active_parameters(capsys, monkeypatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setattr(cli.console, "_width", 160)
    path = tmp_path / "models.json"
    assert cli.main(["models", "--json", str(path)]) == 0
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if "│" in line}
    # DeepSeek-V3's card: 671B total, 37B active (arXiv 2412.19437), MTP not counted.
    assert "671.03 B (37.55 B active)" in rows["deepseek-v3"]
    assert "MLA" in rows["deepseek-v3"] and "256 +shared top-8" in rows["deepseek-v3"]
    assert "235.09 B (22.19 B active)" in rows["qwen3-235b-a22b"]  # "A22B"
    assert "30.53 B (3.35 B active)" in rows["qwen3-30b-a3b"]  # "A3B"
    assert "116.83 B (5.71 B active)" in rows["gpt-oss-120b"]  # 117B, 5.1B active + embeddings
    assert "46.70 B (12.88 B active)" in rows["mixtral-8x7b"]
    assert "174.62 B" in rows["gpt3-175b"] and "active" not in rows["gpt3-175b"]
    presets = json.loads(path.read_text())
    assert presets["deepseek-v3"]["num_parameters_without_mtp"] == 671_026_404_352
    assert presets["deepseek-v3"]["num_active_parameters"] == 37_552_282_624
