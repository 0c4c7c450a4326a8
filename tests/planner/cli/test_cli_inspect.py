"""`plan inspect`: a full-size preset and a custom shape, traced on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

from planner import cli
from planner.models.config import TransformerConfig
from planner.models.presets import get_preset


def inspect(tmp_path: Path, capsys, *argv: str) -> tuple[dict, str]:
    report_path = tmp_path / "report.json"
    assert cli.main(["inspect", *argv, "--json", str(report_path)]) == 0
    return json.loads(report_path.read_text()), capsys.readouterr().out


def test_gpt3_175b_is_embedding_96_blocks_of_one_template_and_head(tmp_path, capsys) -> None:
    report, out = inspect(tmp_path, capsys, "gpt3-175b")
    assert [(r["first"], r["last"], r["count"]) for r in report["rows"]] == [
        ("embedding", "embedding", 1), ("layers.0", "layers.95", 96), ("head", "head", 1)
    ]
    assert report["num_layers"] == 98 and report["num_templates"] == 3
    assert report["num_parameters"] == get_preset("gpt3-175b").num_parameters()
    assert report["traced_blocks"] == 2
    assert report["ops_without_rule"] == []
    block = report["rows"][1]
    h, s = 12288, 2048
    assert abs(block["flops_per_token"] / (24 * h * h + 4 * s * h) - 1) < 0.01
    assert "layers.0-95" in out and "every op has a sharding rule" in out


def test_megatron_shape_flags_build_that_shape(tmp_path, capsys) -> None:
    flags = dict(num_layers=3, hidden_size=256, num_attention_heads=8, seq_length=64,
                 vocab_size=1000, ffn_hidden_size=512, num_query_groups=2)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    report, _ = inspect(tmp_path, capsys, "gpt", *argv, "--swiglu", "--normalization", "RMSNorm")
    config = TransformerConfig(
        **flags, activation="swiglu", norm="rmsnorm", tie_embeddings=True
    )
    assert report["num_parameters"] == config.num_parameters()
    assert [r["count"] for r in report["rows"]] == [1, 3, 1]
