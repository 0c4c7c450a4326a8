"""The evidence behind every prediction's band: each published run Tessel predicts, held
out of the fit that predicts it (`evidence_rows`), grouped by kind of run, and each kind's
band drawn from its held-out errors (`bands`). `write_evidence` refreshes
`planner/presets/evidence.json`, which plans read (`planner.vocabulary.evidence`);
`plan calibration` prints it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from planner.calibration.bands import draw_band, pooled_spread
from planner.calibration.evidence_rows import ONE_ROW_FIT, EvidenceRow, every_row
from planner.vocabulary.evidence import EVIDENCE_FILE, Band


def kinds(rows: list[EvidenceRow]) -> dict[tuple[str, str, str], list[EvidenceRow]]:
    """The rows of each kind (engine, family, generation), in the order first seen."""
    grouped: dict[tuple[str, str, str], list[EvidenceRow]] = {}
    for row in rows:
        grouped.setdefault((row.engine, row.family, row.generation), []).append(row)
    return grouped


def bands_of(rows: list[EvidenceRow]) -> list[Band]:
    """Each kind's band from its rows' held-out errors (`bands.draw_band`)."""
    grouped = kinds(rows)
    spread = pooled_spread([np.log([r.held_out for r in group]) for group in grouped.values()])
    bands = []
    for (engine, family, generation), group in grouped.items():
        low, high, method = draw_band(np.array([r.held_out for r in group]), spread,
                                      either_side=all(r.how == ONE_ROW_FIT for r in group))
        bands.append(Band(engine=engine, family=family, generation=generation,
                          low=round(low, 4), high=round(high, 4), rows=len(group),
                          method=method, held_out="; ".join(dict.fromkeys(r.how for r in group))))
    return bands


ROW_COLUMNS = ("engine", "family", "generation", "source", "label", "shipped", "held_out")
"""The columns of each row in the evidence file (one row a line)."""


def write_evidence(path: Path = EVIDENCE_FILE, rows: list[EvidenceRow] | None = None) -> None:
    """Collect every row (minutes), draw the bands and write them, with the rows (one a
    line), to `path`."""
    rows = every_row() if rows is None else rows
    head = {
        "about": "Bands of measured over predicted step time per kind of run, from the "
                 "held-out errors of ../shared/calibration/'s runs. Written by "
                 "`plan calibration --refresh`; read by planner.vocabulary.evidence.",
        "bands": [band.model_dump(exclude_none=True) for band in bands_of(rows)],
        "row_columns": list(ROW_COLUMNS),
    }
    lines = [json.dumps([r.engine, r.family, r.generation, r.source, r.label,
                         round(r.shipped, 4), round(r.held_out, 4)]) for r in rows]
    text = json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n  ' + ",\n  ".join(lines) \
        + "\n ]\n}\n"
    path.write_text(text, encoding="utf-8")
