"""`plan calibration`: every measured kind of run with its runs and band, any kind's band
on request (borrowed where nothing measured it), and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli
from planner.vocabulary.evidence import shipped_bands


def test_every_measured_kind_is_listed_with_its_runs_and_band(capsys, monkeypatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(cli.console, "_width", 200)
    path = tmp_path / "bands.json"
    assert cli.main(["calibration", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    for band in shipped_bands():
        line = next(text for text in out.splitlines() if text.strip().startswith(band.kind))
        assert f"{band.rows:,}" in line
        assert f"{(band.low - 1) * 100:+.0f}%/{(band.high - 1) * 100:+.0f}%" in line
    written = json.loads(path.read_text())
    assert [b["kind"] for b in written] == [b.kind for b in shipped_bands()]


def test_a_kind_nothing_measured_borrows_a_wider_band(capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 200)
    assert cli.main(["calibration", "--kind", "deepspeed,moe,blackwell"]) == 0
    out = capsys.readouterr().out
    assert "DeepSpeed, MoE on Blackwell: no published run;" in out
    assert "widened 2x" in out
    # A GPU's name is read as its generation: MoE on B300 borrows MoE on Blackwell's.
    assert cli.main(["calibration", "--kind", "megatron,moe,B300"]) == 0
    out = capsys.readouterr().out
    assert "Megatron-LM, MoE on Blackwell Ultra: no published run;" in out
    assert "the band of Megatron-LM, MoE on Blackwell (2 runs) widened 2x" in out


@pytest.mark.parametrize("kind, message", [
    ("megatron,dense", "give ENGINE,FAMILY,GENERATION"),
    ("megatron,sparse,hopper", "the family must be one of dense, moe, mla"),
])
def test_a_malformed_kind_is_one_line_and_exit_2(kind: str, message: str, capsys,
                                                 monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 400)
    assert cli.main(["calibration", "--kind", kind]) == 2
    captured = capsys.readouterr()
    said = (captured.out + captured.err).strip()
    assert said.startswith("error: ") and "\n" not in said
    assert message in said and f"--kind {kind}" in said
