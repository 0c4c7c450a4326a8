"""The evidence behind the bands against the predictions Tessel ships: every published run
of ../shared/calibration/ is in planner/presets/evidence.json with the error the shipped
presets give it today, and 80% or more of them land inside their own kind's band."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from planner.calibration.evidence_rows import CALIBRATION, EvidenceRow, every_row
from planner.vocabulary.evidence import EVIDENCE_FILE, band_for

pytestmark = pytest.mark.skipif(not CALIBRATION.is_dir(),
                                reason="../shared/calibration/ is not beside the repository")
STALE = "planner/presets/evidence.json is stale: run `plan calibration --refresh`"


@pytest.fixture(scope="module")
def rows() -> list[EvidenceRow]:
    """Every run's measured over predicted step time, as the presets ship (seconds)."""
    return every_row(hold_out=False)


def test_the_evidence_file_holds_every_run_as_predicted_today(rows) -> None:
    document = json.loads(EVIDENCE_FILE.read_text(encoding="utf-8"))
    written = {(row[3], row[4]): dict(zip(document["row_columns"], row))
               for row in document["rows"]}
    assert len(written) == len(rows) == len(document["rows"]), STALE
    for row in rows:
        stored = written.get((row.source, row.label))
        assert stored is not None, f"{row.source} is not in it: {STALE}"
        assert [stored["engine"], stored["family"], stored["generation"]] == \
            [row.engine, row.family, row.generation], STALE
        assert stored["shipped"] == pytest.approx(row.shipped, abs=2e-4), \
            f"{row.source} ({row.label}): {STALE}"


def test_eight_runs_in_ten_fall_inside_their_kinds_band(rows) -> None:
    inside = Counter()
    for row in rows:
        band = band_for(row.engine, row.family, row.generation)
        assert band.rows > 0, f"{row.source}'s kind has no band of its own"
        inside[band.low <= row.shipped <= band.high] += 1
    assert inside[True] / len(rows) >= 0.8, inside


def test_every_file_and_kind_is_there(rows) -> None:
    files = {row.source.split(" line ")[0] for row in rows}
    assert files == {"vtrain_a100_single_node.csv", "vtrain_a100_multi_node.csv",
                     "megatron_core_h100_weak_scaling.csv", "nemo_llama3_pretrain.csv",
                     "published_moe_runs.csv", "moe_recipes.csv",
                     "published_torchtitan_runs.csv", "published_accelerators.csv"}
    kinds = {(row.engine, row.family, row.generation) for row in rows}
    assert {("megatron", "moe", "blackwell"), ("megatron", "mla", "hopper"),
            ("torchtitan", "dense", "hopper"), ("megatron", "dense", "tpu-v5p"),
            ("megatron", "dense", "blackwell-ultra"), ("megatron", "dense", "trainium1")
            } <= kinds
