"""`plan ... --report report.html`: one self-contained HTML page about a training plan.

The page shows the best plan's pipeline schedule of one step (stages x time: forward,
backward, recomputation, bubbles, exposed communication), its memory per stage against
the device's capacity, its step-time breakdown, the top plans' step time against memory,
and, when a run length was given, their whole-run time, cost and failure totals.

Text and tables are written here; the charts are inline SVG that the page's own script
(`report_charts.js`, inlined) draws from the data inlined beside it (`report_data.py`).
Nothing is fetched when the page is opened: no CDN, font or image, and a Content Security
Policy that forbids any load, so a page that tried would show it in the console.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from planner.vocabulary.cluster import Cluster
from planner.export.report_data import Label, report_data
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan

CHARTS = ("timeline", "memory", "breakdown", "plans", "totals", "network")
"""Each chart's figure id, in page order ("totals" only with whole-run totals, "network"
only with --bandwidth-sweep)."""
SCRIPT = Path(__file__).with_name("report_charts.js")
# Inline script and style only; nothing from anywhere, not even this page's folder.
POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       margin: 0 auto; padding: 24px 32px 48px; max-width: 1160px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 2px; }
h2 { font-size: 17px; margin: 32px 0 4px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub, figcaption, .note { color: #666; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 16px 0 4px; }
.card { border: 1px solid #e2e2e8; border-radius: 6px; padding: 8px 12px; min-width: 120px; }
.card b { display: block; font-size: 18px; }
.card span { color: #666; font-size: 12px; }
figure { margin: 8px 0 0; }
svg { width: 100%; height: auto; display: block; }
svg text { font: 12px system-ui, sans-serif; fill: #444; }
svg .unit { fill: #777; font-size: 11px; }
svg .axis { stroke: #999; }
svg .grid { stroke: #eee; }
svg .limit { stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .limit-label { fill: #d62728; }
svg .peak { stroke: #555; stroke-dasharray: 2 3; }
svg .peak-label, svg .point-label { fill: #333; }
svg .bar-label { fill: #fff; font-size: 10px; pointer-events: none; }
svg .bar-label.dark { fill: #333; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0 0 88px; font-size: 12px; }
.legend i { display: inline-block; width: 11px; height: 11px; margin-right: 5px;
            vertical-align: -1px; border-radius: 2px; }
table { border-collapse: collapse; margin-top: 10px; font-size: 13px; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child, .text { text-align: left; }
td.text { white-space: nowrap; }
th { font-weight: 600; color: #555; }
code { font-size: 12px; word-break: break-all; }
.tip { position: absolute; display: none; background: #222; color: #fff; padding: 4px 8px;
       border-radius: 4px; font-size: 12px; pointer-events: none; max-width: 420px; }
.failed { color: #b00; font-weight: 600; }
"""


def write_report(path: str | Path, plans: list[Plan], model: TransformerConfig,
                 cluster: Cluster, label: Label) -> None:
    """Write the report of `plans` (best first) of `model` on `cluster` to `path`;
    `label` names a plan's layout as `plan` prints it."""
    Path(path).write_text(render_report(plans, model, cluster, label), encoding="utf-8")


def render_report(plans: list[Plan], model: TransformerConfig, cluster: Cluster,
                  label: Label) -> str:
    """The report page of `plans` (best first), as one HTML string."""
    data = report_data(plans, model, cluster, label)
    best = plans[0]
    # "<" as an escape keeps "</script>" in a name from ending the data block.
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    script = SCRIPT.read_text(encoding="utf-8")
    title = f"{best.model} on {best.num_gpus} x {best.cluster}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Tessel plan: {_e(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<div class="sub">{_e(_subtitle(best, len(plans)))}</div>',
        _cards(best, cluster),
        _band_note(best),
        _timeline_section(data["timeline"]),
        _memory_section(data["memory"]),
        _breakdown_section(data["breakdown"], best),
        _plans_section(data["plans"]),
        _totals_section(data["totals"]) if data["totals"] else "",
        _network_section(data["network"]) if data["network"] else "",
        _flags_section(best),
        '<script id="report-data" type="application/json">' + payload + "</script>",
        "<script>",
        # A chart that fails says so on the page, not only in the console.
        "window.addEventListener('error', function (e) { var p = document.createElement('p');"
        " p.className = 'failed'; p.textContent = 'A chart could not be drawn: ' + e.message;"
        " document.body.insertBefore(p, document.body.firstChild); });",
        script,
        "</script>",
        "</body></html>",
    ])


def _e(value: Any) -> str:
    return html.escape(str(value))


def _subtitle(plan: Plan, count: int) -> str:
    return (f"global batch {plan.global_batch_size} sequences; the best of {count} "
            f"plan{'s' if count > 1 else ''} Tessel {plan.provenance.tessel_version} found; "
            f"costs {plan.provenance.cost_source}")


def _cards(plan: Plan, cluster: Cluster) -> str:
    p = plan.predicted
    # The band is what a run may measure, predicted: not a measurement.
    band = (f"expect {p.step_time_band_s[0]:.2f}-{p.step_time_band_s[1]:.2f} s"
            if p.step_time_band_s else "step time")
    cards = [
        (f"{p.step_time_s:.3f} s", f"step ({band})"),
        (f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-", "tokens / s"),
        (f"{p.mfu:.1%}" if p.mfu is not None else "-", "MFU"),
        (f"{p.model_tflops_per_gpu:.0f}" if p.model_tflops_per_gpu else "-",
         "model TFLOP/s per GPU"),
        (f"{p.memory_gib_per_gpu:.1f} GiB", f"peak per GPU of {cluster.device.memory_gib:g}"),
        (f"{len(plan.stages)} x {plan.num_micro_batches}",
         f"stages x micro-batches of {plan.micro_batch_size}, {plan.schedule or '-'}"),
    ]
    if plan.training is not None:
        cards.append((f"{plan.training.expected_days:.1f} days",
                      f"${plan.training.expected_cost_usd:,.0f} expected with failures"))
    return '<div class="cards">' + "".join(
        f"<div class=card><b>{_e(value)}</b><span>{_e(words)}</span></div>"
        for value, words in cards) + "</div>"


def _band_note(plan: Plan) -> str:
    """Where the step-time band comes from: its kind of run's evidence, in one line."""
    band = plan.predicted.band
    if band is None:
        return ""
    return (f'<p class="note">How sure: {_e(band.words())} (measured over predicted step '
            "time; <code>plan calibration</code> lists every kind).</p>")


def _figure(chart: str, caption: str) -> str:
    return (f'<figure id="{chart}"><div class="plot"></div><div class="legend"></div>'
            f"<figcaption>{caption}</figcaption></figure>")


def _timeline_section(t: dict[str, Any]) -> str:
    schedule = t["schedule"] + (f" with {t['virtual']} chunks per stage" if t["virtual"] > 1
                                else "")
    note = ""
    if abs(t["pipeline_s"] - t["predicted_pipeline_s"]) > 1e-3 * t["predicted_pipeline_s"]:
        note = (f" Laid out operation by operation the pipeline takes {t['pipeline_s']:.3f} s; "
                f"the step-time model's formula gives {t['predicted_pipeline_s']:.3f} s.")
    caption = _e(
        f"{t['micro_batches']} micro-batches through {t['stages']} stages ({schedule}), each "
        "stage starting an operation as soon as it is free and its input has arrived; "
        "then the exposed data-parallel communication and the optimizer step." + note)
    return "<h2>Pipeline schedule of one step</h2>" + _figure("timeline", caption)


def _memory_section(m: dict[str, Any]) -> str:
    caption = _e(
        "One GPU of each stage at its peak: its weights, gradients and optimizer state as "
        "the plan holds them, the activations its schedule keeps in flight, the working "
        "buffers of backward and the memory outside the allocator; a tick marks what the "
        f"allocator reserves. Against the {m['capacity_gib']:g} GiB of a {m['device']}.")
    return "<h2>Memory per stage</h2>" + _figure("memory", caption)


def _table(head: list[str], rows: list[list[str]], text_columns: tuple[int, ...] = (),
           foot: list[str] | None = None) -> str:
    """An HTML table: the header row `head`, a row of data cells (formatted and escaped
    already) per item of `rows`, then a footer row `foot` of header cells; the cells of
    `text_columns` are text (class=text), the others numbers."""

    def row(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(
            f"<{tag}{' class=text' if i in text_columns else ''}>{cell}</{tag}>"
            for i, cell in enumerate(cells)) + "</tr>"

    body = "".join(row(cells, "td") for cells in rows)
    return f"<table>{row(head, 'th')}{body}{row(foot, 'th') if foot else ''}</table>"


def _breakdown_section(parts: list[list[Any]], plan: Plan) -> str:
    step = plan.predicted.step_time_s
    table = _table(["part of the step", "seconds", "share"],
                   [[_e(name), f"{seconds:.3f}", f"{seconds / step:.1%}"]
                    for name, seconds in parts],
                   foot=["step", f"{step:.3f}", "100%"])
    caption = _e("Where the step's time goes: the slowest stage's kernels and exposed "
                 "communication over all its micro-batches, its wait while the pipeline "
                 "fills and drains, then data-parallel communication and the optimizer.")
    return "<h2>Step-time breakdown</h2>" + _figure("breakdown", caption) + table


def _plans_section(plans: list[dict[str, Any]]) -> str:
    table = _table(
        ["#", "layout", "recompute", "GPUs", "step s", "MFU", "GiB/GPU"],
        [[f"{p['rank']}", _e(p["label"]), _e(p["recompute"]), f"{p['gpus']}",
          f"{p['step_s']:.3f}", f"{p['mfu']:.1%}",
          f"{p['memory_gib']:.1f}{'' if p['fits'] else ' (does not fit)'}"] for p in plans],
        text_columns=(1, 2))
    caption = _e("Each plan's predicted step time against the peak memory of its fullest "
                 "GPU; the best is the largest point.")
    return ("<h2>Top plans: step time against memory</h2>" + _figure("plans", caption)
            + table)


def _network_section(sweeps: list[dict[str, Any]]) -> str:
    table = _table(
        ["tier", "GB/s per GPU", "step s", "exposed", "hides at GB/s per GPU"],
        [[_e(s["name"]), f"{s['cluster_gbs']:,.4g}",
          f"{s['points'][len(s['points']) // 2]['step_s']:.3f}",
          f"{s['points'][len(s['points']) // 2]['exposed_s']:.3f} s",
          "-" if s["hides_at_gbs"] is None else f"{s['hides_at_gbs']:,.1f} "
          f"({s['hides_at_gbs'] / s['cluster_gbs']:.2g}x)"] for s in sweeps],
        text_columns=(0,))
    caption = _e("The best plan's step as each tier's bandwidth goes from 1/8x to 8x the "
                 "cluster's, the other tiers as they are (--bandwidth-sweep); the ring marks "
                 "where its communication hides (the step within 1% of an unbounded link's).")
    return ("<h2>Step time by the fabric's bandwidth</h2>" + _figure("network", caption)
            + table)


def _totals_section(rows: list[dict[str, Any]]) -> str:
    table = _table(
        ["#", "layout", "GPUs", "steps", "days", "GPU-hours", "cost", "MWh", "MTTF h",
         "checkpoint every min", "ETTR", "expected days", "expected cost"],
        [[f"{r['rank']}", _e(r["label"]), f"{r['gpus']}", f"{r['steps']:,}",
          f"{r['days']:.1f}", f"{r['gpu_hours']:,.0f}", f"${r['cost_usd']:,.0f}",
          f"{r['energy_kwh'] / 1000:,.0f}", f"{r['mttf_hours']:.1f}",
          f"{r['checkpoint_interval_s'] / 60:.0f}", f"{r['ettr']:.1%}",
          f"{r['expected_days']:.1f}", f"${r['expected_cost_usd']:,.0f}"] for r in rows],
        text_columns=(1,))
    caption = _e("The whole run without failures, and as expected with job-stopping "
                 "failures, Young/Daly checkpoints and restarts (ETTR: useful over expected "
                 "time).")
    return "<h2>Whole run: time, cost and failures</h2>" + _figure("totals", caption) + table


def _flags_section(plan: Plan) -> str:
    if plan.megatron_flags:
        return ("<h2>Megatron-LM flags of the best plan</h2><p><code>"
                + _e(" ".join(plan.megatron_flags)) + "</code></p>")
    return (f'<p class="note">Megatron-LM cannot run the best plan: '
            f"{_e(plan.megatron_incompatibility)}</p>")
