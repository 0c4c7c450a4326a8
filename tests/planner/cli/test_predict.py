"""`plan predict`: a Megatron-LM launch line in, the prediction of exactly that run out.

Each launch line must predict the same numbers (and the same plan) as `plan` given the
same model and knobs under its own flags; the search's best plan comes with its speed-up
and the flags that change; a bad launch line is one line and exit 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner import cli

CLUSTER = ["--cluster", "dgx-h100"]

GPT = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
       "--max-position-embeddings 2048 --vocab-size 51200")
LLAMA = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 "
         "--ffn-hidden-size 14336 --seq-length 8192 --max-position-embeddings 8192 "
         "--vocab-size 128000 --rotary-base 500000")
# What Megatron-LM needs to be told to build the zoo's llama (its defaults are GPT's).
LLAMA_FORM = ("--group-query-attention --swiglu --normalization RMSNorm "
              "--position-embedding-type rope --untie-embeddings-and-output-weights "
              "--disable-bias-linear --hidden-dropout 0 --attention-dropout 0")
MIXTRAL = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 "
           "--seq-length 4096 --max-position-embeddings 32768 --vocab-size 32768 "
           "--rotary-base 1000000 --num-experts 8 --moe-router-topk 2")

# name -> (GPUs, the launch line's flags, `plan`'s model and flags for the same run)
CASES = {
    "gpt": (16, f"{GPT} --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                "--micro-batch-size 4 --global-batch-size 256",
            f"gpt {GPT} --precision bf16 --tensor-model-parallel-size 2 "
            "--pipeline-model-parallel-size 2 --micro-batch-size 4 --global-batch-size 256"),
    # Without --bf16 or --fp16, Megatron-LM trains in fp32.
    "gpt-fp32-by-default": (
        8, f"{GPT} --micro-batch-size 2 --global-batch-size 64",
        f"gpt {GPT} --precision fp32 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 1 --micro-batch-size 2 --global-batch-size 64"),
    "gpt-full-recompute-uniform": (
        16, f"{GPT} --bf16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
            "--micro-batch-size 8 --global-batch-size 512 --recompute-granularity full "
            "--recompute-method uniform --recompute-num-layers 1",
        f"gpt {GPT} --precision bf16 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --micro-batch-size 8 --global-batch-size 512 "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
    "gpt-full-recompute-block": (
        16, f"{GPT} --bf16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
            "--micro-batch-size 8 --global-batch-size 512 --recompute-granularity full "
            "--recompute-method block --recompute-num-layers 4",
        f"gpt {GPT} --precision bf16 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --micro-batch-size 8 --global-batch-size 512 "
        "--recompute-granularity full --recompute-method block --recompute-num-layers 4"),
    # --recompute-activations is Megatron-LM's spelling of selective recomputation.
    "gpt-selective-recompute": (
        16, f"{GPT} --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
            "--micro-batch-size 16 --global-batch-size 256 --recompute-activations",
        f"gpt {GPT} --precision bf16 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 1 --micro-batch-size 16 --global-batch-size 256 "
        "--recompute-granularity selective"),
    "gpt-sequence-parallel-tp-overlap": (
        16, f"{GPT} --bf16 --tensor-model-parallel-size 8 --sequence-parallel "
            "--tp-comm-overlap --micro-batch-size 2 --global-batch-size 128",
        f"gpt {GPT} --precision bf16 --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 1 --sequence-parallel --tp-comm-overlap "
        "--micro-batch-size 2 --global-batch-size 128"),
    # Megatron-LM pads the tokenizer's 50257 to a multiple of 128 x tensor 2 = 50432.
    "gpt-padded-vocabulary": (
        8, f"{GPT.replace('51200', '50257')} --bf16 --tensor-model-parallel-size 2 "
           "--micro-batch-size 4 --global-batch-size 64",
        f"gpt {GPT.replace('51200', '50432')} --precision bf16 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 1 --micro-batch-size 4 --global-batch-size 64"),
    "llama-gqa-distributed-optimizer": (
        32, f"{LLAMA} {LLAMA_FORM} --bf16 --tensor-model-parallel-size 8 "
            "--pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
            "--overlap-grad-reduce --overlap-param-gather --micro-batch-size 1 "
            "--global-batch-size 128",
        f"llama {LLAMA} --precision bf16 --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather --micro-batch-size 1 "
        "--global-batch-size 128"),
    "llama-virtual-pipeline": (
        32, f"{LLAMA} {LLAMA_FORM} --bf16 --tensor-model-parallel-size 8 "
            "--pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 "
            "--global-batch-size 128 --num-layers-per-virtual-pipeline-stage 2",
        f"llama {LLAMA} --precision bf16 --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 "
        "--global-batch-size 128 --num-layers-per-virtual-pipeline-stage 2"),
    # Two chunks per rank of the 8 layers of each stage: 4 layers per virtual stage.
    "llama-virtual-stages-per-rank": (
        32, f"{LLAMA} {LLAMA_FORM} --bf16 --tensor-model-parallel-size 4 "
            "--pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 "
            "--global-batch-size 128 --num-virtual-stages-per-pipeline-rank 2",
        f"llama {LLAMA} --precision bf16 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 "
        "--global-batch-size 128 --num-layers-per-virtual-pipeline-stage 4"),
    "llama-context-parallel": (
        32, f"{LLAMA} {LLAMA_FORM} --bf16 --tensor-model-parallel-size 4 "
            "--context-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
            "--micro-batch-size 1 --global-batch-size 64",
        f"llama {LLAMA} --precision bf16 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 1 --context-parallel-size 2 --sequence-parallel "
        "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64"),
    "llama-fp8": (
        16, f"{LLAMA} {LLAMA_FORM} --bf16 --fp8-format hybrid --fp8-recipe tensorwise "
            "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
            "--sequence-parallel --micro-batch-size 1 --global-batch-size 64",
        f"llama {LLAMA} --precision fp8 --fp8-recipe tensorwise --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 "
        "--global-batch-size 64"),
    "llama-flash-attention-cuda-graphs": (
        16, f"{LLAMA} {LLAMA_FORM} --bf16 --use-flash-attn --cuda-graph-impl local "
            "--tensor-model-parallel-size 8 --sequence-parallel --micro-batch-size 1 "
            "--global-batch-size 32",
        f"llama {LLAMA} --precision bf16 --attention-backend flash --cuda-graph-impl local "
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel "
        "--micro-batch-size 1 --global-batch-size 32"),
    "mixtral-moe": (
        64, f"{MIXTRAL} {LLAMA_FORM} --moe-ffn-hidden-size 14336 --bf16 "
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
            "--expert-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer "
            "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --micro-batch-size 1 "
            "--global-batch-size 256",
        f"mixtral {MIXTRAL} --ffn-hidden-size 14336 --precision bf16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        # Megatron-LM's experts split over the tensor ranks unless told otherwise.
        "--expert-model-parallel-size 4 --expert-tensor-parallel-size 2 "
        "--sequence-parallel --use-distributed-optimizer "
        "--moe-token-dispatcher-type alltoall --micro-batch-size 1 --global-batch-size 256"),
}


def predict(argv: list[str], tmp_path: Path, capsys) -> tuple[dict, str]:
    path = tmp_path / "predict.json"
    assert cli.main(["predict", *CLUSTER, "--json", str(path), *argv]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def plan_json(argv: list[str], tmp_path: Path, capsys) -> dict:
    path = tmp_path / "plan.json"
    assert cli.main([*argv, *CLUSTER, "--json", str(path)]) == 0
    capsys.readouterr()
    return json.loads(path.read_text())


# What a launch line leaves at Megatron-LM's defaults, which `plan` would search: said
# explicitly on the `plan` side, knob by knob, where the case does not give it.
_LITERAL_DEFAULTS = (
    (("--sequence-parallel",), "--no-sequence-parallel"),
    (("--use-distributed-optimizer", "--zero-stage"), "--zero-stage 0"),
    (("--recompute-granularity",), "--recompute-granularity none"),
    (("--overlap-grad-reduce",), "--no-overlap-grad-reduce"),
    (("--overlap-param-gather",), "--no-overlap-param-gather"),
    (("--tp-comm-overlap",), "--no-tp-comm-overlap"),
    (("--num-layers-per-virtual-pipeline-stage", "--schedule"), "--schedule 1f1b"),
    (("--cuda-graph-impl",), "--cuda-graph-impl none"),
    (("--space",), "--space megatron"),  # Megatron-LM's even split, no stages of their own
)


def _with_literal_defaults(plan_argv: str) -> list[str]:
    argv = plan_argv.split()
    for given, default in _LITERAL_DEFAULTS:
        if not any(flag in argv for flag in given):
            argv += default.split()
    return argv


def _same_run(plan: dict) -> dict:
    """A plan without the name it was given (`pretrain_gpt` vs the zoo family)."""
    return {k: v for k, v in plan.items() if k not in ("model", "provenance")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_launch_line_predicts_what_plan_predicts_with_the_same_knobs(
    case: str, tmp_path: Path, capsys
) -> None:
    gpus, launch, plan_argv = CASES[case]
    predicted, output = predict(["--gpus", str(gpus), "--no-search", "--", *launch.split()],
                                tmp_path, capsys)
    planned = plan_json([*_with_literal_defaults(plan_argv), "--gpus", str(gpus)], tmp_path,
                        capsys)
    launched = predicted["launch_line"]
    assert launched["predicted"] == planned["predicted"]
    assert _same_run(launched) == _same_run(planned)
    assert f"{launched['predicted']['step_time_s']:.3f}" in output
    assert predicted["best"] == [] and predicted["speed_up"] is None


def test_the_best_plan_comes_with_its_speed_up_and_the_flags_that_change(
    tmp_path: Path, capsys
) -> None:
    launch = (f"{GPT} --bf16 --tensor-model-parallel-size 8 --micro-batch-size 1 "
              "--global-batch-size 64 --recompute-granularity full --recompute-method uniform "
              "--recompute-num-layers 1")
    report, output = predict(["--gpus", "8", "--top", "2", "--", *launch.split()],
                             tmp_path, capsys)
    launched, best = report["launch_line"], report["best"][0]
    assert len(report["best"]) == 2
    assert best["predicted"]["step_time_s"] < launched["predicted"]["step_time_s"]
    assert report["speed_up"] == pytest.approx(
        launched["predicted"]["step_time_s"] / best["predicted"]["step_time_s"])
    assert best["precision"] == "bf16"  # the launch line's numerics are kept
    changed = {c["flag"]: (c["launch_line"], c["best"]) for c in report["flags_changed"]}
    assert changed["--recompute-granularity"] == ("full", None)
    best_flags = {f.partition(" ")[0]: f.partition(" ")[2] for f in best["megatron_flags"]}
    for flag, (_, value) in changed.items():
        assert best_flags.get(flag) == value
    assert f"{report['speed_up']:.2f}x" in output
    assert "- --recompute-granularity full" in " ".join(output.split())


def test_a_run_that_does_not_fit_is_predicted_and_called_out(tmp_path: Path, capsys) -> None:
    launch = f"{LLAMA} {LLAMA_FORM} --bf16 --micro-batch-size 4 --global-batch-size 32"
    report, output = predict(["--gpus", "8", "--no-search", "--", *launch.split()],
                             tmp_path, capsys)
    assert not report["launch_line"]["predicted"]["fits"]
    assert "out of memory" in output


def test_an_args_file_with_a_torchrun_prefix_gives_the_world_size(
    tmp_path: Path, capsys
) -> None:
    gpus, launch, plan_argv = CASES["llama-virtual-pipeline"]
    script = tmp_path / "launch.sh"
    one_flag_a_line = " \\\n    ".join(re.split(r" (?=--)", launch))
    script.write_text(
        "#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\nDATA=/data/corpus\n"
        "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py \\\n"
        f"    {one_flag_a_line} \\\n"
        "    --data-path $DATA --lr 3e-4  # the rest is ignored\n"
    )
    report, output = predict(["--args-file", str(script), "--no-search"], tmp_path, capsys)
    planned = plan_json([*_with_literal_defaults(plan_argv), "--gpus", str(gpus)], tmp_path,
                        capsys)
    assert report["launch_line"]["num_gpus"] == gpus == 32
    assert report["launch_line"]["predicted"] == planned["predicted"]
    assert report["ignored_flags"] == ["--data-path", "--lr"]
    assert "ignored 2 flags" in output


def test_flags_after_the_args_file_are_added_to_its_flags(tmp_path: Path, capsys) -> None:
    script = tmp_path / "flags.txt"
    script.write_text(f"{GPT} --bf16 --micro-batch-size 4 --global-batch-size 64\n")
    report, _ = predict(["--gpus", "8", "--args-file", str(script), "--no-search", "--",
                         "--micro-batch-size", "8"], tmp_path, capsys)
    assert report["launch_line"]["micro_batch_size"] == 8


def test_uneven_pipeline_stages_are_predicted_as_given(tmp_path: Path, capsys) -> None:
    launch = (f"{GPT} --bf16 --pipeline-model-parallel-size 4 --micro-batch-size 1 "
              "--global-batch-size 64 --decoder-first-pipeline-num-layers 3 "
              "--decoder-last-pipeline-num-layers 5")
    report, _ = predict(["--gpus", "8", "--no-search", "--", *launch.split()], tmp_path,
                        capsys)
    stages = report["launch_line"]["stages"]
    assert [s["layers"][1] - s["layers"][0] for s in stages] == [3, 8, 8, 5]


BAD = {
    "unknown-flag": (["--gpus", "8", "--", *GPT.split(), "--micro-batch-size", "1",
                      "--tensor-parallel-size", "2"],
                     ["unknown Megatron-LM option --tensor-parallel-size",
                      "did you mean --tensor-model-parallel-size?"]),
    "malformed-int": (["--gpus", "8", "--", *GPT.replace("24", "2x4").split(),
                       "--micro-batch-size", "1"],
                      ["--num-layers '2x4' is not a whole number"]),
    "missing-num-layers": (["--gpus", "8", "--", *GPT.split()[2:], "--micro-batch-size", "1"],
                           ["no --num-layers", "Megatron-LM requires"]),
    "degrees-not-dividing": (["--gpus", "8", "--", *GPT.split(), "--micro-batch-size", "1",
                              "--tensor-model-parallel-size", "4",
                              "--pipeline-model-parallel-size", "4"],
                             ["the 8 GPUs are not divisible by --tensor-model-parallel-size 4 "
                              "x --pipeline-model-parallel-size 4"]),
    "tensor-beyond-a-node": (["--gpus", "32", "--", *GPT.split(), "--micro-batch-size", "1",
                              "--tensor-model-parallel-size", "16"],
                             ["--tensor-model-parallel-size 16 must divide"]),
    "unpriced-flag": (["--gpus", "8", "--", *GPT.split(), "--micro-batch-size", "1",
                       "--fine-grained-activation-offloading"],
                      ["--fine-grained-activation-offloading changes time or memory"]),
    "no-world-size": (["--", *GPT.split(), "--micro-batch-size", "1"], ["add --gpus N"]),
    "world-sizes-disagree": (["--gpus", "16", "--", "torchrun", "--nproc-per-node", "8",
                              "pretrain_gpt.py", *GPT.split(), "--micro-batch-size", "1"],
                             ["--gpus 16 but the launch line's torchrun starts 8"]),
    "megatron-flags-before-the-separator": (["--gpus", "8", "--num-layers", "4"],
                                            ["put Megatron-LM's flags after --"]),
    "no-launch-line": (["--gpus", "8"], ["needs a launch line"]),
    "missing-args-file": (["--gpus", "8", "--args-file", "nowhere.sh"],
                          ["--args-file 'nowhere.sh' cannot be read"]),
    "fp8-on-a100": (["--cluster", "dgx-a100-80g", "--gpus", "8", "--", *GPT.split(),
                     "--micro-batch-size", "1", "--bf16", "--fp8-format", "hybrid"],
                    ["--fp8-format hybrid needs fp8 tensor cores"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_launch_line_is_one_line_and_exit_2(case: str, one_line_error, monkeypatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    argv, fragments = BAD[case]
    output = one_line_error(["predict", *CLUSTER, *argv])
    assert output.startswith("error: ")
    for fragment in fragments:
        assert fragment in output


# Mixtures of experts (issue 30): a bad MoE launch line is one line naming the flag.
MOE = ("--num-layers 4 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 "
       "--max-position-embeddings 4096 --vocab-size 129280 --micro-batch-size 1 --bf16 "
       "--swiglu --normalization RMSNorm --position-embedding-type rope "
       "--num-experts 64 --moe-router-topk 8 --moe-ffn-hidden-size 2048")
BAD_MOE = {
    "mla-rank-above-the-hidden-size": (
        f"{MOE} --multi-latent-attention --kv-lora-rank 8192",
        ["--kv-lora-rank (8192) must be smaller than --hidden-size (7168)"]),
    "top-k-above-the-experts": (MOE.replace("--moe-router-topk 8", "--moe-router-topk 65"),
                                ["--moe-router-topk (65) cannot exceed --num-experts (64)"]),
    "layer-pattern-of-another-length": (f"{MOE} --moe-layer-freq ([0]*1+[1]*5)",
                                        ["--moe-layer-freq as a list needs one 0 or 1 per "
                                         "layer, 4 in all; it has 6"]),
    "layer-pattern-as-code": (f"{MOE} --moe-layer-freq [__import__('os')]",
                              ["--moe-layer-freq", "nor a list pattern"]),
    "unknown-dispatcher": (f"{MOE} --moe-token-dispatcher-type foo",
                           ["--moe-token-dispatcher-type 'foo' is not one of allgather, "
                            "alltoall, flex"]),
    "expert-tensor-on-a-dense-model": (
        GPT + " --micro-batch-size 1 --expert-tensor-parallel-size 2",
        ["--expert-tensor-parallel-size 2 splits experts, and the model has none"]),
    "expert-degree-dividing-the-experts-not": (f"{MOE} --expert-model-parallel-size 3",
                                               ["--expert-model-parallel-size 3 must divide "
                                                "--num-experts 64"]),
    "expert-degree-dividing-the-gpus-not": (
        f"{MOE} --expert-model-parallel-size 16",
        ["expert (16) x expert_tensor (1) must divide the 8 ranks"]),
    "a2a-overlap-without-expert-parallelism": (
        f"{MOE} --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm",
        ["--overlap-moe-expert-parallel-comm needs expert parallelism"]),
    "window-looking-ahead": (f"{MOE} --window-size 128,64", ["--window-size 128,64",
                                                             "right size 0"]),
    "mtp-outside-the-last-stage": (
        f"{MOE} --mtp-num-layers 1 --pipeline-model-parallel-size 2 "
        "--pipeline-model-parallel-layout Et*2m|t*2L",
        ["--pipeline-model-parallel-layout", "outside the last stage"]),
}


@pytest.mark.parametrize("case", list(BAD_MOE))
def test_a_bad_moe_launch_line_is_one_line_and_exit_2(case: str, one_line_error, monkeypatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    line, fragments = BAD_MOE[case]
    output = one_line_error(["predict", *CLUSTER, "--gpus", "8", "--", *line.split()])
    assert output.startswith("error: ")
    text = " ".join(output.split())
    for fragment in fragments:
        assert fragment in text, text


def test_a_moe_launch_line_reads_every_moe_flag(tmp_path: Path, capsys) -> None:
    """MLA, shared experts, the dense/MoE pattern, group-limited routing, MTP and the MoE
    run flags reach the plan; flags that change nothing priced are listed as ignored."""
    from planner.megatron import megatron_run, parse_megatron_flags

    line = (f"{MOE} --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 "
            "--qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 "
            "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq ([0]*1+[1]*3) "
            "--moe-router-score-function sigmoid --moe-router-num-groups 8 "
            "--moe-router-group-topk 4 --mtp-num-layers 1 --expert-model-parallel-size 8 "
            "--expert-tensor-parallel-size 1 --moe-router-force-load-balancing "
            "--moe-expert-capacity-factor 1.25 --moe-token-dispatcher-type flex "
            "--moe-enable-deepep --moe-grouped-gemm --moe-permute-fusion "
            "--moe-router-dtype fp32 --moe-aux-loss-coeff 1e-4 --mscale 1.0")
    run = megatron_run(parse_megatron_flags(line.split()), 8)
    m, q = run.model, run.parallel
    assert (m.multi_latent_attention, m.q_lora_rank, m.kv_lora_rank, m.v_head_dim) == (
        True, 1536, 512, 128)
    assert (m.moe_layer_freq, m.moe_shared_expert_intermediate_size, m.ffn_hidden_size,
            m.moe_ffn_hidden_size) == ([0, 1, 1, 1], 2048, 4 * 7168 * 2 // 3 // 64 * 64, 2048)
    assert (m.moe_router_score_function, m.moe_router_num_groups, m.moe_router_group_topk,
            m.mtp_num_layers) == ("sigmoid", 8, 4, 1)
    assert (q.dims.expert, q.dims.expert_tensor_degree, q.moe.moe_router_force_load_balancing,
            q.moe.moe_expert_capacity_factor, q.moe.moe_token_dispatcher) == (8, 1, True, 1.25,
                                                                              "flex")
    assert {"--moe-permute-fusion", "--moe-router-dtype", "--moe-aux-loss-coeff",
            "--mscale"} <= set(run.ignored)
    assert q.moe.moe_grouped_gemm and "--moe-grouped-gemm" not in run.ignored
