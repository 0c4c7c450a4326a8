"""What a user fixes about memory and layout: with the degrees and micro-batch fixed the
knobs not given are still searched, a refusal for memory names the knob whose release
makes it fit, and --memory-headroom keeps a margin free on every GPU."""

from __future__ import annotations

import json
from pathlib import Path

from planner.cli.main import main

LLAMA_405B = ["llama3-405b", "--cluster", "dgx-h100", "--gpus", "16384", "--seq-length", "8192",
              "--global-batch-size", "2048", "--space", "megatron", "--top", "1"]


def test_knobs_not_given_are_searched_not_megatrons_defaults(tmp_path: Path, capsys) -> None:
    # The Llama 3 paper's degrees: the search turns sequence parallelism and the
    # distributed optimizer on (Megatron-LM's defaults, both off, need 250 GiB).
    out = tmp_path / "plan.json"
    code = main([*LLAMA_405B, "--tensor-model-parallel-size", "8",
                 "--pipeline-model-parallel-size", "16", "--micro-batch-size", "1",
                 "--context-parallel-size", "1", "--json", str(out)])
    capsys.readouterr()
    assert code == 0
    plan = json.loads(out.read_text())
    q = plan["parallel"]
    assert (q["tensor"], q["pipeline"], q["context"], plan["micro_batch_size"]) == (8, 16, 1, 1)
    assert q["sequence_parallel"] and q["zero_stage"] >= 1
    assert plan["predicted"]["fits"]


def test_a_refusal_names_the_fixed_knob_that_would_make_it_fit(capsys) -> None:
    code = main(["llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                 "--global-batch-size", "512", "--tensor-model-parallel-size", "2",
                 "--pipeline-model-parallel-size", "1", "--micro-batch-size", "4",
                 "--zero-stage", "1"])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2 and "Traceback" not in output
    assert output.strip().splitlines()[0].startswith("error: no plan fits")
    text = " ".join(output.split())
    assert "or, on these 64 GPUs, leave --zero-stage 1 to the search" in text


def test_memory_headroom_keeps_every_plan_that_much_below_the_device(
    tmp_path: Path, capsys
) -> None:
    argv = ["llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch-size",
            "512", "--space", "megatron", "--top", "1"]
    peaks = []
    for headroom in ("0", "40"):
        out = tmp_path / f"plan-{headroom}.json"
        assert main([*argv, "--memory-headroom", headroom, "--json", str(out)]) == 0
        peaks.append(json.loads(out.read_text())["predicted"]["memory_gib_per_gpu"])
    capsys.readouterr()
    assert peaks[1] <= 79.6 - 40 < peaks[0]
    assert main([*argv, "--memory-headroom", "90"]) == 2
    captured = capsys.readouterr()
    assert "--memory-headroom 90: 90 GiB is all of a H100-SXM5-80GB's 79.6 GiB" in " ".join(
        (captured.out + captured.err).split())


def test_rows_that_would_read_alike_say_what_differs_and_json_keeps_the_ranking(
        tmp_path: Path, capsys) -> None:
    """DeepSeek-V3 in fp8 on 1,024 H100s: plans of the same degrees that split the 61
    layers differently name their split, and the plan ranked first reserves no more than
    the device holds (it ranked a plan reserving 84 GiB of 79.6 second); --json writes the
    best Plan and the table's plans beside it."""
    out = tmp_path / "plan.json"
    code = main(["deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024",
                 "--global-batch-size", "4096", "--precision", "fp8", "--top", "8",
                 "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    rows: list[str] = []
    for line in text.splitlines():  # a layout may wrap onto a line of its own
        cells = line.split("│")
        if line.startswith("│ ") and cells[1].strip().isdigit():
            rows.append(cells[2].strip())
        elif line.startswith("│ ") and rows and not cells[1].strip():
            rows[-1] += " " + cells[2].strip()
    assert len(rows) == 8 and len(set(rows)) == 8, rows
    assert any(" L" in row for row in rows)  # an uneven split, e.g. L6,8x6,7
    plans = json.loads((tmp_path / "plan.ranked.json").read_text())
    assert len(plans) == 8 and plans[0] == json.loads(out.read_text())
    assert all(plan["predicted"]["reserved_fits"] for plan in plans)


def test_a_faster_plan_past_the_reserve_is_named_below_the_best(capsys) -> None:
    """Meta's 405B degrees without recomputation allocate 79.2 GiB and would reserve 86.5:
    the plan with full recomputation ranks first, and the faster one is named."""
    code = main([*LLAMA_405B[:-1], "5", "--tensor-model-parallel-size", "8",
                 "--pipeline-model-parallel-size", "16", "--micro-batch-size", "1",
                 "--context-parallel-size", "1"])
    flat = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "│ 1 │ t8 p16 d128 mb1 sp zero1 │ full" in flat.replace("L7,8x14,7 ", "")
    assert "faster but ranked below: #4 (8.256 s) allocates 79.2 GiB and would reserve " \
        "86.5 GiB, more than the device holds" in flat
