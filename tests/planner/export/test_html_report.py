"""`plan ... --report report.html`: one self-contained page whose charts (the pipeline
schedule of one step, memory per stage, the step-time breakdown, the top plans and the
whole-run totals) agree with the plan, and render in headless Chromium with every chart
drawn, a screenshot that is not blank and no console message.

Chromium is Debian's `chromium` (the Makefile's `browser` target installs it where apt
can); without it the rendering tests skip, saying so, and the page is still checked here
for every chart and for anything it could fetch."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from headless_chromium import chromium, pixels_of, render

from cost_models.pipeline_timing import dualpipev_bubble, dualpipev_chunk
from cost_models.step_time import StagePhases
from planner.cli.main import main
from planner.export.html_report import CHARTS
from planner.vocabulary.plan import Plan

GPT3_175B = ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024",
             "--global-batch-size", "1536"]
# One plan (--top 1) of fixed degrees with a run length, for the whole-run chart.
LLAMA_RUN = ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "256", "--global-batch-size",
             "512", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4",
             "--micro-batch-size", "1", "--use-distributed-optimizer",
             "--recompute-granularity", "full", "--train-tokens", "1T", "--top", "1"]
# DeepSeek's DualPipeV, as TorchTitan runs it: two chunks per stage in V order.
DUALPIPEV = ["llama3-8b", "--cluster", "dgx-h100", "--gpus", "32", "--global-batch-size", "64",
             "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
             "--micro-batch-size", "1", "--schedule", "dualpipev", "--engine", "torchtitan",
             "--top", "1"]
# The 175B plan with its fabric swept (--bandwidth-sweep), the 70B one with a run length.
CASES = {"gpt3-175b": ([*GPT3_175B, "--bandwidth-sweep"], (*CHARTS[:4], "network")),
         "llama3-70b-1T": (LLAMA_RUN, CHARTS[:5]),
         "llama3-8b-dualpipev": (DUALPIPEV, CHARTS[:4])}
needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="Debian's chromium is not installed (`make browser` installs "
    "it where apt-get can reach Debian's packages); the page is checked without rendering")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, tuple[Path, Plan]]:
    """Each case's report and the best plan `plan` wrote beside it with --json."""
    out = {}
    for name, (argv, _) in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        page, plan = folder / "report.html", folder / "plan.json"
        assert main([*argv, "--report", str(page), "--json", str(plan)]) == 0
        out[name] = (page, Plan.from_json(plan))
    return out


def page_data(page: Path) -> dict:
    """The data the page's charts are drawn from."""
    text = page.read_text()
    block = re.search(r'<script id="report-data" type="application/json">(.*?)</script>',
                      text, re.S)
    assert block is not None
    return json.loads(block.group(1))


@pytest.mark.parametrize("name", list(CASES))
def test_the_page_holds_every_chart_and_fetches_nothing(reports, name: str) -> None:
    page, _ = reports[name]
    text = page.read_text()
    charts = re.findall(r'<figure id="([a-z]+)"', text)
    assert tuple(charts) == CASES[name][1]  # the totals only when a run length was given
    # Nothing to load: no src or href, no CSS url() or @import, no link or img element.
    for pattern in (r"\bsrc\s*=", r"\bhref\s*=", r"url\(", r"@import", r"<link\b", r"<img\b"):
        assert not re.search(pattern, text, re.I), pattern
    # The only address in the page is SVG's namespace, a name that is never fetched.
    assert set(re.findall(r"https?://[^\s\"'`<>)]+", text)) == {"http://www.w3.org/2000/svg"}
    assert "Content-Security-Policy" in text and "default-src 'none'" in text


def test_the_175b_report_agrees_with_its_plan(reports) -> None:
    page, plan = reports["gpt3-175b"]
    data = page_data(page)
    breakdown = plan.predicted.breakdown
    t = data["timeline"]
    assert t["stages"] == len(plan.stages) and t["micro_batches"] == plan.num_micro_batches
    # One step: the pipeline laid out, then data-parallel communication and the optimizer.
    pipeline = breakdown.compute_s + breakdown.tensor_parallel_comm_s + \
        breakdown.pipeline_comm_s + breakdown.bubble_s
    assert t["predicted_pipeline_s"] == pytest.approx(pipeline)
    assert t["pipeline_s"] == pytest.approx(pipeline, rel=1e-2)  # interleaved: approximate
    assert t["step_s"] == pytest.approx(plan.predicted.step_time_s, rel=1e-2)
    kinds = {t["kinds"][bar[3]] for bar in t["bars"]}
    assert {"forward", "backward", "communication", "bubble",
            "data-parallel communication"} <= kinds
    assert {bar[0] for bar in t["bars"]} == set(range(len(plan.stages)))
    memory = data["memory"]
    assert len(memory["stages"]) == len(plan.stages)
    assert memory["capacity_gib"] == 80
    peak = max(sum(parts) for parts in memory["stages"])
    assert peak == pytest.approx(plan.predicted.memory_gib_per_gpu, rel=1e-2)
    assert sum(s for _, s in data["breakdown"]) == pytest.approx(plan.predicted.step_time_s)
    plans = data["plans"]
    assert len(plans) == 5 and plans[0]["step_s"] == plan.predicted.step_time_s
    assert [p["step_s"] for p in plans] == sorted(p["step_s"] for p in plans)
    assert data["totals"] is None
    # The fabric's sweep is the plan's (--bandwidth-sweep), drawn as it was predicted.
    assert data["network"] == [sweep.model_dump() for sweep in plan.network]
    assert [s["name"] for s in data["network"]] == ["scale-up", "scale-out"]
    assert all(s["hides_at_gbs"] > s["cluster_gbs"] for s in data["network"])
    # The band says how sure it is: GPT-3 on A100 is dense Megatron-LM on Ampere, measured.
    assert "How sure: Megatron-LM, dense on Ampere: " in page.read_text()
    assert "step (expect " in page.read_text()  # a predicted band, not a measurement
    assert f"{plan.predicted.band.rows:,} published runs" in page.read_text()


def test_the_whole_run_report_shows_time_cost_and_failures(reports) -> None:
    page, plan = reports["llama3-70b-1T"]
    (row,) = page_data(page)["totals"]
    assert row["expected_days"] == pytest.approx(plan.training.expected_days)
    assert row["expected_cost_usd"] >= row["cost_usd"] > 0
    assert 0 < row["ettr"] < 1


def test_a_dualpipev_report_draws_its_v_and_the_report_s_bubble(reports) -> None:
    page, plan = reports["llama3-8b-dualpipev"]
    assert plan.schedule == "dualpipev" and plan.parallel.virtual_pipeline == 2
    # V order: stage r holds chunks r and 2p - 1 - r of the model's 2p.
    assert [stage.chunks for stage in plan.stages] == [
        [(0, 4), (28, 32)], [(4, 8), (24, 28)], [(8, 12), (20, 24)], [(12, 16), (16, 20)]]
    t = page_data(page)["timeline"]
    assert (t["schedule"], t["virtual"], t["stages"]) == ("dualpipev", 2, 4)
    b = plan.predicted.breakdown
    assert t["predicted_pipeline_s"] == pytest.approx(
        b.compute_s + b.tensor_parallel_comm_s + b.pipeline_comm_s + b.bubble_s)
    # The bubble the plan predicts is DeepSeek-V3's formula over the slowest stage's two
    # chunks (with the second chunk's transfers, as interleaving counts them).
    s = max((StagePhases(**stage.phases_s) for stage in plan.stages), key=lambda s: s.total)
    f, bw, w = dualpipev_chunk(s.forward + s.forward_communication,
                               s.recompute + s.backward + s.backward_communication,
                               s.backward, s.transfer)
    m = plan.num_micro_batches
    assert b.bubble_s == pytest.approx(dualpipev_bubble(4, f, bw, w) + m * s.transfer)
    # Laid out operation by operation the step lasts about that: the closed form is exact
    # where a chunk's I lasts its F and the stages are equal, and these differ a little.
    assert t["pipeline_s"] == pytest.approx(t["predicted_pipeline_s"], rel=5e-2)
    kinds = {t["kinds"][bar[3]] for bar in t["bars"]}
    assert {"forward", "backward", "communication", "bubble"} <= kinds
    assert {bar[5] for bar in t["bars"] if bar[4] >= 0} == {0, 1}  # both chunks drawn
    # The plan's row names its schedule, not "v2" (which reads as interleaving).
    label = page_data(page)["plans"][0]["label"]
    assert label.endswith(" dualpipev") and " v2" not in label


class Marks(HTMLParser):
    """Each figure's data-drawn count and the marks (class "mark") inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.figure: str | None = None
        self.drawn: dict[str, int] = {}
        self.marks: dict[str, int] = {}
        self.charts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body":
            self.charts = (a.get("data-charts") or "").split()
        if tag == "figure":
            self.figure = a["id"]
            self.drawn[self.figure] = int(a.get("data-drawn", 0))
            self.marks[self.figure] = 0
        elif self.figure and "mark" in (a.get("class") or "").split():
            self.marks[self.figure] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.figure = None


@needs_chromium
@pytest.mark.parametrize("name", list(CASES))
def test_the_report_renders_in_headless_chromium_with_every_chart(
        reports, name: str, tmp_path: Path) -> None:
    page, _ = reports[name]
    expected = CASES[name][1]
    image_file = tmp_path / "report.png"
    rendered = render(page, tmp_path / "profile", image_file, 1280, 4000)
    image = rendered.image
    assert rendered.console == []  # no script error, nothing blocked, nothing logged
    marks = Marks()
    marks.feed(rendered.dom)
    assert marks.charts == list(expected)  # the script ran to its end
    for chart in expected:
        assert marks.drawn[chart] > 0, chart
        assert marks.marks[chart] == marks.drawn[chart], chart
    bars = len(page_data(page)["timeline"]["bars"])
    assert marks.marks["timeline"] >= bars  # every bar of the step, and a close-up
    # Not blank: a good share of the page is drawn, in each chart's own colours.
    assert (image.min(axis=2) < 245).mean() > 0.05
    assert pixels_of(image, "#54a24b") > 2000  # timeline: backward passes
    assert pixels_of(image, "#72b7b2") > 500  # memory: gradients
    assert pixels_of(image, "#f58518") > 50  # top plans: the best plan's point
    if "totals" in expected:
        assert pixels_of(image, "#e45756") > 2000  # expected days with failures
    if "network" in expected:  # each tier's points, and the ring where it hides
        sweeps = page_data(page)["network"]
        assert marks.drawn["network"] == sum(len(s["points"]) + 1 for s in sweeps)
