"""`plan calibration`: how sure Tessel's predictions are, kind of run by kind of run.

Lists every kind (engine x model family x GPU generation) with published runs: how many,
how each was held out of the fit that predicted it, and the band of measured over
predicted step time a prediction of that kind carries. `--kind ENGINE,FAMILY,GENERATION`
shows any kind's band, borrowed from the nearest measured kind where it has no runs;
`--rows` lists the runs; `--refresh` recomputes everything from `../shared/calibration/`
(minutes: every held-out fit runs) and rewrites `planner/presets/evidence.json`.
"""

from __future__ import annotations

import argparse
import json

from rich import box
from rich.table import Table

from planner.cli.console import console
from planner.cli.errors import UsageError
from planner.cli.output import write_json
from planner.vocabulary.evidence import (
    EVIDENCE_FILE,
    FAMILIES,
    GENERATIONS,
    Band,
    band_for,
    generation_of,
    shipped_bands,
)


def add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", metavar="ENGINE,FAMILY,GENERATION",
                        help="the band of one kind of run, e.g. torchtitan,moe,blackwell "
                        "(engines: megatron, torchtitan, deepspeed, tessel; families: "
                        f"{', '.join(FAMILIES)}; generations: {', '.join(GENERATIONS)}, "
                        "or a GPU's name)")
    parser.add_argument("--rows", action="store_true",
                        help="also list every published run with its held-out error")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute every held-out prediction from ../shared/calibration/ "
                        "and rewrite planner/presets/evidence.json (minutes)")
    parser.add_argument("--json", metavar="PATH", help="also write the bands as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _kind(text: str) -> tuple[str, str, str]:
    parts = [p.strip().lower() for p in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"--kind {text}: give ENGINE,FAMILY,GENERATION, e.g. "
                         "--kind torchtitan,dense,hopper")
    if parts[1] not in FAMILIES:
        raise UsageError(f"--kind {text}: the family must be one of {', '.join(FAMILIES)}")
    generation = parts[2] if parts[2] in GENERATIONS else generation_of(parts[2])
    return parts[0], parts[1], generation


def _span(band: Band) -> str:
    return f"{(band.low - 1) * 100:+.0f}%/{(band.high - 1) * 100:+.0f}%"


def run_calibration(args: argparse.Namespace) -> int:
    """`plan calibration`."""
    kind = _kind(args.kind) if args.kind else None
    if args.refresh:
        from planner.calibration import write_evidence

        with console.status("holding out every published run of ../shared/calibration/ ..."):
            write_evidence()
        shipped_bands.cache_clear()
        console.print(f"wrote {EVIDENCE_FILE}")
    bands = shipped_bands()
    if kind is not None:
        band = band_for(*kind)
        console.print(f"expect measured / predicted step time of {band.low:.3f}-"
                      f"{band.high:.3f}: {band.words()}", highlight=False)
        _write(args.json, [band])
        return 0
    table = Table(title="calibration evidence: measured over predicted step time",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption="held out: each run predicted by a fit that did not see it "
                  "(`plan calibration --rows`); a kind not listed borrows the nearest "
                  "kind's band, widened (`--kind`)")
    for column in ("kind", "runs", "band", "held out", "band drawn as"):
        table.add_column(column, justify="right" if column in ("runs", "band") else "left",
                         no_wrap=column == "band")
    for band in bands:
        table.add_row(band.kind, f"{band.rows:,}", _span(band), band.held_out, band.method)
    console.print(table)
    if args.rows:
        _print_rows()
    _write(args.json, list(bands))
    return 0


def _print_rows() -> None:
    document = json.loads(EVIDENCE_FILE.read_text(encoding="utf-8"))
    rows = [dict(zip(document["row_columns"], row)) for row in document["rows"]]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  title="published runs: measured over predicted step time")
    for column in ("kind", "run", "source", "shipped", "held out"):
        table.add_column(column, justify="right" if column in ("shipped", "held out")
                         else "left")
    for row in rows:
        table.add_row(f"{row['engine']} {row['family']} {row['generation']}", row["label"],
                      row["source"],
                      f"{row['shipped']:.3f}", f"{row['held_out']:.3f}")
    console.print(table)


def _write(path: str | None, bands: list[Band]) -> None:
    if path:
        write_json(path, json.dumps([b.model_dump() | {"kind": b.kind} for b in bands],
                                    indent=2), "bands")

