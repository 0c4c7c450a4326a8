"""`plan MODEL --gpus N` when no plan fits: one line naming what the model needs, for every
schedule and every engine on the mixture-of-experts presets, and the fixed knob (the
schedule among them) whose release makes it fit on the GPUs asked for; and the DualPipeV
plan of DeepSeek-V3 under TorchTitan that once crashed that path."""

from __future__ import annotations

import json
import re

import pytest

from planner.cli.main import main
from planner.vocabulary.parallel import ENGINES
from planner.vocabulary.schedules import SCHEDULES

H100 = "H100-SXM5-80GB (79.6 GiB)"


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The command's output as one line of words, after checking it fails as a user
    mistake (exit 2) with one error and no traceback."""
    code = main([*argv, "--cluster", "dgx-h100"])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2 and "Traceback" not in output and output.count("error:") == 1
    assert output.lstrip().startswith("error: ")
    return " ".join(output.split())


# (schedule, engine) -> an MoE preset and a GPU count too small for it; every preset once
# or more, the schedule cases that no GPU count runs (61 and 94 layers split into virtual
# stages) among them.
CASES = {
    ("gpipe", "megatron"): ("mixtral-8x7b", 8),
    ("gpipe", "torchtitan"): ("gpt-oss-120b", 8),
    ("gpipe", "tessel"): ("qwen3-235b-a22b", 8),
    ("1f1b", "megatron"): ("deepseek-v3", 8),
    ("1f1b", "torchtitan"): ("mixtral-8x22b", 8),
    ("1f1b", "tessel"): ("gpt-oss-20b", 1),
    ("interleaved", "megatron"): ("qwen3-235b-a22b", 8),
    ("interleaved", "torchtitan"): ("deepseek-v3", 8),
    ("interleaved", "tessel"): ("qwen3-30b-a3b", 2),
    ("dualpipev", "megatron"): ("mixtral-8x22b", 8),
    ("dualpipev", "torchtitan"): ("deepseek-v3", 8),
    ("dualpipev", "tessel"): ("gpt-oss-120b", 8),
}
# Whatever the memory: the schedule cannot split these layers for any pipeline (Megatron-LM's
# chunks must divide a stage's layers; TorchTitan splits any depth its own way).
NO_SIZE_RUNS = {("interleaved", "megatron")}


def test_the_cases_cover_every_schedule_and_engine() -> None:
    assert set(CASES) == {(s, e) for s in SCHEDULES for e in ENGINES}


@pytest.mark.parametrize("schedule, engine", sorted(CASES))
def test_no_plan_fits_is_one_line_naming_what_the_model_needs(
    schedule: str, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model, gpus = CASES[schedule, engine]
    # Offload fixed off: the search would otherwise keep state on the host (see
    # tests/cost_models/test_offload.py).
    text = refusal([model, "--gpus", str(gpus), "--global-batch-size", "64",
                    "--engine", engine, "--schedule", schedule, "--offload-optimizer",
                    "none"], capsys)
    if (schedule, engine) == ("dualpipev", "megatron"):
        assert text == ("error: --schedule dualpipev is TorchTitan's and Tessel's runtime's, "
                        "not Megatron-LM's (it has no DualPipe schedule); add --engine "
                        "torchtitan or --engine tessel.")
        return
    head = (f"error: no plan fits: {model} does not fit on {gpus} x {H100} with global "
            f"batch 64; ")
    assert text.startswith(head)
    needs = (rf"with --schedule {schedule} no cluster of this kind up to 1048576 GPUs fits "
             rf"it, without it at least \d+ GPUs do"
             if (schedule, engine) in NO_SIZE_RUNS else r"it needs at least \d+ GPUs of this kind")
    assert re.fullmatch(needs, text.removeprefix(head)), text


def test_the_reported_dualpipev_command_plans_deepseek_v3_split_as_torchtitan_splits_it(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 42: this ended "AttributeError: 'FixedKnobs' object has no attribute 'pop'" in
    # the no-fit path; DeepSeek-V3's 61 layers over 2 x 2 model parts are TorchTitan's split
    # (the embedding and output weighing a layer each: 15, 16, 16, 14), in V order. (The
    # pipeline is fixed at 2: which degree is fastest is the cost model's, not this test's.)
    path = tmp_path / "plan.json"
    assert main(["deepseek-v3", "--gpus", "2048", "--global-batch-size", "4096", "--engine",
                 "torchtitan", "--schedule", "dualpipev", "--cluster", "dgx-h100", "--top", "1",
                 "--pipeline-model-parallel-size", "2", "--json", str(path)]) == 0
    capsys.readouterr()
    plan = json.loads(path.read_text())
    assert plan["schedule"] == "dualpipev" and plan["parallel"]["pipeline"] == 2
    assert [stage["chunks"] for stage in plan["stages"]] == [[[0, 15], [47, 61]],
                                                             [[15, 31], [31, 47]]]
    assert plan["predicted"]["fits"]


def test_virtual_stages_are_released_as_the_flag_that_set_them(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # Named by layers per chunk as typed (1), not by the 24 virtual stages it makes.
    text = refusal(["qwen3-30b-a3b", "--gpus", "16", "--global-batch-size", "128",
                    "--pipeline-model-parallel-size", "2",
                    "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "2",
                    "--recompute-granularity", "selective", "--zero-stage", "1",
                    "--tensor-model-parallel-size", "1", "--offload-optimizer", "none"],
                   capsys)
    assert re.search(
        r"; or, on these 16 GPUs, leave --num-layers-per-virtual-pipeline-stage 1 to the "
        r"search: the fastest plan then takes the 1f1b schedule \(\d+\.\d{3} s a step\)$",
        text), text


def test_a_model_that_fits_even_offloaded_nowhere_says_so(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # One GB200 tray: 960 GiB of host memory and no NVMe figures, against DeepSeek-V3's
    # 671B parameters' 18 bytes each of weights, gradients and optimizer state.
    code = main(["deepseek-v3", "--gpus", "4", "--global-batch-size", "64", "--cluster",
                 "gb200-nvl72"])
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    assert code == 2
    assert re.search(r"no plan fits: deepseek-v3 does not fit on 4 x \S+ \(\S+ GiB\) with "
                     r"global batch 64; even with its state offloaded to the host and NVMe; "
                     r"without offload needs at least \d+ GPUs of this kind", text), text
