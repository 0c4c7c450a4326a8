"""Every bad input gets one clear line: exit status 2 (130 for an interrupt), exactly one
line of output at a piped terminal's 80 columns, no traceback, and the flag named as
typed. Each case has a timeout, so an input that hangs fails here instead of blocking CI.

The families are those a new user hit: knob values no plan can honour, failures that
escaped as tracebacks, output paths that fail only after the work, inputs that hang or
ask for unbounded work, garbage data files accepted, and misspelt flags.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner import cli

FIXTURES = Path(__file__).parents[2] / "fixtures"
RAISING = FIXTURES / "raising_factory.py"
H100 = ["--cluster", "dgx-h100"]
GPT3 = ["gpt3-175b", *H100, "--gpus", "512", "--global-batch-size", "1536"]
SMALL = ["gpt3-125m", *H100, "--gpus", "8", "--global-batch-size", "64"]
MIXTRAL = ["mixtral-8x7b", *H100, "--gpus", "64", "--global-batch-size", "256"]

# (argv, fragments the one line must contain)
KNOB_VALUES = {
    "expert-tensor-divides-nothing": (["qwen3-30b-a3b", *H100, "--gpus", "16",
                                       "--global-batch-size", "64",
                                       "--expert-tensor-parallel-size", "3"],
                                      ["--expert-tensor-parallel-size 3 must divide the 16 "
                                       "GPUs and the experts' 768-wide MLP"]),
    # Part of a node that fits nothing: the least size named, not "14 devices would leave a
    # node part-filled" (the search doubled 7 to a size no DGX has).
    "part-of-a-node-fits-nothing": (["deepseek-v3", *H100, "--gpus", "7",
                                     "--global-batch-size", "64", "--offload-optimizer",
                                     "none"],
                                    ["deepseek-v3 does not fit on 7 x H100-SXM5-80GB",
                                     "it needs at least 256 GPUs of this kind"]),
    "lora-rank-zero": ([*SMALL, "--finetune", "lora", "--lora-rank", "0"],
                       ["--lora-rank 0 must be from 1"]),
    "lora-rank-above-the-hidden-size": ([*SMALL, "--finetune", "lora", "--lora-rank", "1024"],
                                        ["--lora-rank 1024 must be from 1 to the hidden size "
                                         "(768)"]),
    "lora-targets-naming-no-linear": ([*SMALL, "--finetune", "lora", "--lora-targets",
                                       "linear_foo"], ["--lora-targets", "linear_foo"]),
    "lora-rank-without-adapters": ([*SMALL, "--lora-rank", "8"],
                                   ["--lora-rank set the adapters of --finetune lora"]),
    "qlora-without-a-4-bit-path": ([*SMALL, "--finetune", "qlora", "--precision", "fp8"],
                                   ["--finetune qlora", "--precision fp8 has no 4-bit path"]),
    "nvme-offload-without-nvme-figures": (
        ["gpt3-125m", "--cluster", str(FIXTURES / "host_without_nvme.yaml"), "--gpus", "8",
         "--global-batch-size", "64", "--offload-optimizer", "nvme"],
        ["offload to nvme needs the cluster's NVMe figures"]),
    "offload-fraction-above-one": ([*SMALL, "--offload-optimizer", "cpu",
                                    "--optimizer-offload-fraction", "1.5"],
                                   ["--optimizer-offload-fraction", "1.5 is not between 0 "
                                    "and 1"]),
    "offload-fraction-below-zero": ([*SMALL, "--offload-optimizer", "cpu",
                                     "--optimizer-offload-fraction", "-0.5"],
                                    ["--optimizer-offload-fraction", "-0.5 is not between 0 "
                                     "and 1"]),
    "tensor-divides-nothing": ([*GPT3, "--tensor-model-parallel-size", "5"],
                               ["--tensor-model-parallel-size 5 must divide the 96 attention "
                                "heads and the 8 GPUs of a node"]),
    "tensor-beyond-a-node": (["gpt3-175b", *H100, "--gpus", "16", "--global-batch-size", "64",
                              "--tensor-model-parallel-size", "16"], ["the 8 GPUs of a node"]),
    "tensor-beyond-the-heads": ([*SMALL, "--tensor-model-parallel-size", "8"],
                                ["--tensor-model-parallel-size 8", "12 attention heads"]),
    "tensor-zero": ([*SMALL, "--tensor-model-parallel-size", "0"],
                    ["--tensor-model-parallel-size 0 must be from 1"]),
    "pipeline-beyond-the-layers": ([*SMALL, "--pipeline-model-parallel-size", "32"],
                                   ["--pipeline-model-parallel-size 32 is more than the "
                                    "model's 12 layers"]),
    "pipeline-negative": ([*SMALL, "--pipeline-model-parallel-size", "-2"],
                          ["--pipeline-model-parallel-size -2 must be from 1"]),
    "degrees-not-dividing-the-gpus": ([*SMALL, "--pipeline-model-parallel-size", "3"],
                                      ["pipeline (3) must divide the 8 GPUs"]),
    "context-zero": ([*SMALL, "--context-parallel-size", "0"],
                     ["--context-parallel-size 0 must be from 1"]),
    "context-not-splitting-the-sequence": ([*SMALL, "--context-parallel-size", "3"],
                                           ["--context-parallel-size 3 must divide the 8 GPUs"]),
    "expert-on-a-dense-model": ([*GPT3, "--expert-model-parallel-size", "4"],
                                ["--expert-model-parallel-size 4 needs a mixture-of-experts",
                                 "dense"]),
    "expert-not-dividing-the-experts": ([*MIXTRAL, "--expert-model-parallel-size", "3"],
                                        ["must divide the model's 8 experts"]),
    "micro-batch-zero": ([*SMALL, "--micro-batch-size", "0"],
                         ["--micro-batch-size 0 must be from 1"]),
    "micro-batch-not-dividing-the-batch": ([*SMALL, "--micro-batch-size", "3"],
                                           ["--micro-batch-size 3 must divide "
                                            "--global-batch-size 64"]),
    "virtual-zero": ([*SMALL, "--pipeline-model-parallel-size", "2",
                      "--num-layers-per-virtual-pipeline-stage", "0"],
                     ["--num-layers-per-virtual-pipeline-stage 0 must be from 1"]),
    "virtual-without-pipeline": ([*SMALL, "--num-layers-per-virtual-pipeline-stage", "2"],
                                 ["needs --pipeline-model-parallel-size"]),
    "virtual-not-dividing-a-stage": ([*SMALL, "--pipeline-model-parallel-size", "2",
                                      "--num-layers-per-virtual-pipeline-stage", "4"],
                                     ["must divide the 12 / 2 layers of each stage"]),
    "virtual-with-another-schedule": ([*SMALL, "--pipeline-model-parallel-size", "2",
                                       "--num-layers-per-virtual-pipeline-stage", "2",
                                       "--schedule", "gpipe"], ["not --schedule gpipe"]),
    "interleaving-one-stage": ([*SMALL, "--pipeline-model-parallel-size", "1", "--schedule",
                                "interleaved"], ["--schedule interleaved needs pipeline"]),
    "dualpipev-one-stage": ([*SMALL, "--pipeline-model-parallel-size", "1", "--schedule",
                             "dualpipev", "--engine", "torchtitan"],
                            ["--schedule dualpipev needs pipeline stages"]),
    "dualpipev-under-megatron": ([*SMALL, "--pipeline-model-parallel-size", "2", "--schedule",
                                  "dualpipev"], ["--schedule dualpipev is TorchTitan's",
                                                 "--engine torchtitan"]),
    "gpipe-in-the-megatron-space": ([*SMALL, "--schedule", "gpipe", "--space", "megatron"],
                                    ["--schedule gpipe is not in --space megatron"]),
    "zero-3-in-the-megatron-space": ([*SMALL, "--zero-stage", "3", "--space", "megatron"],
                                     ["--zero-stage 3 is not in --space megatron"]),
    "zero-stage-5": ([*SMALL, "--zero-stage", "5"], ["--zero-stage 5 is not one of 0, 1, 2, 3"]),
    "distributed-optimizer-and-zero-3": ([*SMALL, "--use-distributed-optimizer",
                                          "--zero-stage", "3"],
                                         ["--use-distributed-optimizer is ZeRO stage 1"]),
    "sequence-parallel-on-one-tensor-rank": ([*SMALL, "--sequence-parallel",
                                              "--tensor-model-parallel-size", "1"],
                                             ["--sequence-parallel shards over the "
                                              "tensor-parallel group"]),
    "batch-smaller-than-the-data-parallel-degree": (
        ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024", "--global-batch-size", "1"],
        ["--global-batch-size 1 cannot be split over the data-parallel replicas"]),
    "batch-zero": ([*H100, "gpt3-125m", "--gpus", "8", "--global-batch-size", "0"],
                   ["--global-batch-size 0 must be from 1"]),
    "gpus-without-batch": (["gpt3-125m", *H100, "--gpus", "8"], ["--global-batch-size"]),
    "gpus-leaving-a-node-part-filled": (["gpt3-125m", *H100, "--gpus", "12",
                                         "--global-batch-size", "64"],
                                        ["--gpus 12", "use a multiple of 8"]),
    "fp8-without-fp8-tensor-cores": (["gpt3-125m", "--cluster", "dgx-a100-80g", "--gpus", "8",
                                      "--global-batch-size", "64", "--precision", "fp8"],
                                     ["--precision fp8 needs fp8 tensor cores"]),
    "bf16-on-a-v100": (["gpt3-350m", "--cluster", "aws-p3.16xlarge", "--gpus", "8",
                        "--global-batch-size", "64", "--precision", "bf16"],
                       ["--precision bf16 needs bf16 tensor cores", "V100-SXM2-16GB",
                        "fp16, fp32"]),
    "mxfp8-before-blackwell": ([*SMALL, "--precision", "fp8", "--fp8-recipe", "mxfp8"],
                               ["--fp8-recipe mxfp8 needs Blackwell", "H100"]),
    "fp8-recipe-without-fp8": ([*SMALL, "--fp8-recipe", "tensorwise"],
                               ["--fp8-recipe tensorwise applies to fp8 matmuls"]),
    "flash-on-a-v100": (["gpt3-350m", "--cluster", "aws-p3.16xlarge", "--gpus", "8",
                         "--global-batch-size", "64", "--attention-backend", "flash"],
                        ["--attention-backend flash needs fused attention", "local"]),
    "tp-overlap-without-sequence-parallel": (
        [*SMALL, "--tp-comm-overlap", "--no-sequence-parallel"],
        ["--tp-comm-overlap", "needs --sequence-parallel"]),
    "param-gather-without-distributed-optimizer": (
        [*SMALL, "--overlap-param-gather", "--zero-stage", "0"],
        ["--overlap-param-gather", "--use-distributed-optimizer"]),
    "recompute-method-without-full": ([*SMALL, "--recompute-method", "block"],
                                      ["--recompute-method", "--recompute-granularity full"]),
    "dispatcher-on-a-dense-model": ([*SMALL, "--moe-token-dispatcher-type", "alltoall"],
                                    ["--moe-token-dispatcher-type", "dense"]),
    "what-if-that-does-not-fit": (
        ["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--global-batch-size", "8",
         "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1",
         "--micro-batch-size", "1", "--offload-optimizer", "none"], None),
    "nothing-fits": (["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "8",
                      "--global-batch-size", "64", "--offload-optimizer", "none"],
                     ["no plan fits", "at least 64 GPUs"]),
}

ESCAPED_TRACEBACKS = {
    "json-is-a-directory": (["demo:mlp", "--mesh", "2", "--json", "."], ["--json '.' is a "
                                                                         "directory"]),
    "json-in-a-missing-folder": (["demo:mlp", "--json", "no/such/dir/plan.json"],
                                 ["--json 'no/such/dir/plan.json'", "does not exist"]),
    "json-unwritable": (["demo:mlp", "--json", "/proc/self/plan.json"],
                        ["--json '/proc/self/plan.json' cannot be written"]),
    "emit-code-onto-a-file": (["demo:mlp", "--emit-code", "plain-file"],
                              ["--emit-code 'plain-file' is a file"]),
    "emit-code-unwritable": (["demo:mlp", "--emit-code", "/proc/self/ranks"],
                             ["--emit-code '/proc/self/ranks' cannot be written"]),
    "check-json-unwritable": (["check", "demo:mlp", "--mesh", "2", "--json", "/proc/self/c.json"],
                              ["--json '/proc/self/c.json' cannot be written"]),
    "inspect-json-is-a-directory": (["inspect", "gpt3-125m", "--json", "."], ["--json '.'"]),
    "profile-output-is-a-directory": (["profile", "--output", "."], ["--output '.' is a "
                                                                     "directory"]),
    "factory-raises": ([f"{RAISING}:build", "--mesh", "2"],
                       ["raised ZeroDivisionError at raising_factory.py:9",
                        "fix the factory"]),
    "hf-config-field-transformers-rejects": (["inspect", "hf:badfield"], ["badfield"]),
    "gpus-huge": (["gpt3-175b", *H100, "--gpus", "1000000000", "--global-batch-size", "8"],
                  ["--gpus 1000000000 must be from 1 to 1,048,576"]),
    "gpus-not-a-number": ([*SMALL[:-4], "--gpus", "eight"], ["--gpus 'eight' is not a whole"]),
}

HANGS_AND_UNBOUNDED_WORK = {
    # A FIFO blocked the read forever; /dev/zero ran it out of memory.
    "args-file-a-fifo": (["predict", *H100, "--gpus", "8", "--args-file", "launch.fifo"],
                         ["--args-file 'launch.fifo' is not a regular file (a pipe, a device "
                          "or a folder); give the launch script"]),
    "torchtitan-dev-zero": (["predict", *H100, "--gpus", "8", "--torchtitan", "/dev/zero"],
                            ["--torchtitan '/dev/zero' is not a config Tessel knows"]),
    "torchtitan-a-fifo": (["predict", *H100, "--gpus", "8", "--torchtitan", "job.toml"],
                          ["--torchtitan 'job.toml' is not a regular file"]),
    "four-mesh-axes": (["demo:mlp", "--mesh", "2x2x2x2", "--time-limit", "5"],
                       ["--mesh 2x2x2x2 has 4 axes", "at most 3"]),
    "mesh-beyond-the-cluster": (["demo:mlp", "--mesh", "1000000"],
                                ["--mesh 1000000 needs 1,000,000 devices", "--cluster cpu has 8"]),
    "check-mesh-beyond-the-cluster": (["check", "demo:mlp", "--mesh", "16"],
                                      ["--mesh 16 needs 16 devices"]),
    "check-more-ranks-than-a-machine-runs": (["check", "demo:mlp", "--mesh", "32", "--cluster",
                                              "big.yaml"],
                                             ["--mesh 32 needs 32 ranks", "at most 16"]),
    "check-a-training-plan-beyond-a-machine": (["check", *SMALL[:-4], "--gpus", "32",
                                                "--global-batch-size", "64"],
                                               ["--gpus 32: plan check runs each rank", "16"]),
    "check-a-bf16-training-plan": (["check", *SMALL[:-4], "--gpus", "4",
                                    "--global-batch-size", "8", "--precision", "bf16"],
                                   ["--precision bf16: plan check trains in fp32"]),
    "check-kill-without-its-step": (["check", *SMALL[:-4], "--gpus", "2",
                                     "--global-batch-size", "8", "--kill-rank", "1"],
                                    ["--kill-rank and --kill-at-step go together"]),
    "check-kill-a-rank-the-plan-lacks": (["check", *SMALL[:-4], "--gpus", "2",
                                          "--global-batch-size", "8", "--kill-rank", "2",
                                          "--kill-at-step", "1"],
                                         ["--kill-rank 2: the plan runs ranks 0-1"]),
    "check-kill-after-the-last-step": (["check", *SMALL[:-4], "--gpus", "2",
                                        "--global-batch-size", "8", "--steps", "3",
                                        "--kill-rank", "0", "--kill-at-step", "3"],
                                       ["--kill-at-step 3: the check trains steps 0-2"]),
    "check-faults-on-a-mesh-check": (["check", "demo:mlp", "--mesh", "2",
                                      "--checkpoint-every", "1"],
                                     ["exercise the training-plan runtime: give --gpus"]),
    "check-mesh-and-gpus": (["check", "demo:mlp", "--mesh", "2", "--gpus", "2",
                             "--global-batch-size", "8"], ["give one of the two"]),
    "check-training-knobs-on-a-mesh-check": (["check", "demo:mlp", "--zero-stage", "1"],
                                             ["--zero-stage applies only to training plans"]),
    "steps-unbounded": (["check", "demo:mlp", "--mesh", "2", "--steps", "1000000"],
                        ["--steps 1000000 must be from 1 to 1,000"]),
    "steps-zero": (["check", "demo:mlp", "--steps", "0"], ["--steps 0 must be from 1"]),
    "time-limit-honoured": (["demo:gpt", "--mesh", "2x2x2", "--time-limit", "1"],
                            ["--time-limit 1:", "did not finish within the 1 s time limit"]),
    "time-limit-zero": (["demo:mlp", "--time-limit", "0"], ["--time-limit 0 must be more than 0"]),
    "time-limit-nan": (["demo:mlp", "--time-limit", "nan"], ["--time-limit nan"]),
    "time-limit-infinite": (["demo:mlp", "--time-limit", "inf"], ["--time-limit inf"]),
    "layers-unbounded": (["inspect", "gpt", "--num-layers", "1000000007", "--hidden-size", "64",
                          "--num-attention-heads", "4", "--vocab-size", "64", "--seq-length",
                          "16"], ["--num-layers 1000000007 must be from 1 to 16,384"]),
}

GARBAGE = {
    "calibrate-empty-csv": (["calibrate", "empty.csv"], ["empty.csv"]),
    "calibrate-nan-time": (["calibrate", "nan.csv"], ["nan.csv", "line 2"]),
    "cluster-with-infinite-memory": (["demo:mlp", "--cluster", "infinite.yaml"],
                                     ["infinite.yaml", "memory_gib"]),
    # Infinite times inside a real database: tests/cost_models/test_profiled_costs.py.
    "profile-not-a-database": (["demo:mlp", "--mesh", "2", "--profile", "inf-profile.json"],
                               ["inf-profile.json"]),
    "top-negative": ([*SMALL, "--top", "-3"], ["--top -3 must be from 1 to 100"]),
    "top-zero": ([*SMALL, "--top", "0"], ["--top 0 must be from 1"]),
    "models-bogus-flag": (["models", "--bogus-flag"], ["unknown option --bogus-flag"]),
    "clusters-bogus-flag": (["clusters", "--gpus", "8"], ["unknown option --gpus"]),
    "clusters-json-in-a-missing-folder": (["clusters", "--json", "nope/x.json"], ["--json"]),
    "training-knobs-on-a-mesh-plan": (["demo:mlp", "--mesh", "2", "--tensor-model-parallel-size",
                                       "2", "--top", "3"],
                                      ["--tensor-model-parallel-size, --top apply only to "
                                       "training plans"]),
    "mesh-on-a-training-plan": ([*SMALL, "--mesh", "2x2"], ["--mesh is for an operator-level "
                                                            "plan"]),
    "extra-positional": (["demo:mlp", "extra"], ["unexpected argument 'extra'"]),
    # Issue 31's catalogue: an empty mesh is not the default one; a PUE below 1 is not a
    # data centre's; an empty engine name between commas is a typo, not nothing.
    "mesh-empty": (["demo:mlp", "--mesh", ""], ["--mesh '' is not a mesh shape"]),
    "pue-below-one": ([*SMALL, "--train-tokens", "1B", "--pue", "0.5"],
                      ["--pue '0.5' is below 1"]),
    "emit-empty-engine": ([*SMALL, "--emit", "megatron,,deepspeed", "emitted"],
                          ["empty engine name"]),
}

MISSPELT = {
    "tensor-parallel-size": ([*GPT3, "--tensor-parallel-size", "8"],
                             ["unknown option --tensor-parallel-size; did you mean "
                              "--tensor-model-parallel-size?"]),
    "gpu": (["gpt3-125m", "--gpu", "8"], ["unknown option --gpu; did you mean --gpus?"]),
    "check-step": (["check", "demo:mlp", "--step", "2"], ["did you mean --steps?"]),
    "abbreviation": (["demo:mlp", "--mes", "2"], ["unknown option --mes; did you mean --mesh?"]),
    "flag-with-equals": (["demo:mlp", "--meshes=2"], ["unknown option --meshes"]),
    "no-model": ([], ["the following arguments are required: model"]),
    "bad-choice": ([*SMALL, "--recompute-granularity", "all"],
                   ["--recompute-granularity all is not one of none, selective, full"]),
    "flag-without-value": ([*SMALL, "--micro-batch-size"], ["--micro-batch-size expected one"]),
}

# A model of one's own on a cluster: the graph plan reads only the batch flags.
GRAPH = [f"{Path(__file__).parents[2] / 'e2e' / 'graph_models.py'}:wide_mlp", "--cluster",
         str(FIXTURES / "small_memory.yaml"), "--gpus", "8", "--global-batch-size", "32"]
GRAPH_PLANS = {
    "graph-transformer-knob": ([*GRAPH, "--tensor-model-parallel-size", "2"],
                               ["--tensor-model-parallel-size: wide_mlp is planned from its "
                                "traced graph"]),
    "graph-micro-batch": ([*GRAPH, "--micro-batch-size", "5"],
                          ["--micro-batch-size 5 must divide --global-batch-size 32"]),
    "graph-no-batch": (GRAPH[:-2], ["--gpus needs --global-batch-size"]),
    "graph-selective-recompute": ([*GRAPH, "--recompute-granularity", "selective"],
                                  ["--recompute-granularity selective: a graph plan "
                                   "recomputes whole stages"]),
    "graph-interleaved": ([*GRAPH, "--schedule", "interleaved"],
                          ["--schedule interleaved: graph plans run 1f1b or gpipe"]),
    "graph-train-tokens": ([*GRAPH, "--train-tokens", "1e9"],
                           ["--train-tokens: a graph plan counts its run in steps"]),
    "graph-run-without-run-costs": ([*GRAPH, "--train-iters", "100"],
                                    ["--cluster small-memory has no run_costs"]),
    "graph-bf16-on-v100": ([GRAPH[0], "--cluster", "aws-p3.16xlarge", "--gpus", "8",
                            "--global-batch-size", "32", "--precision", "bf16"],
                           ["--precision bf16 needs bf16 tensor cores, which V100-SXM2-16GB "
                            "lacks"]),
    "graph-fp16-without-fp16": ([*GRAPH, "--precision", "fp16"],
                                ["--precision fp16 needs fp16 tensor cores, which small-device "
                                 "lacks"]),
    "graph-fp8": ([*GRAPH, "--precision", "fp8"],
                  ["--precision fp8: graph plans train in fp32, bf16, fp16"]),
    "graph-zero-1": ([*GRAPH, "--zero-stage", "1"],
                     ["--zero-stage 1: a graph plan shards a parameter, its gradient"]),
}
TINY = ["check", "gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads",
        "4", "--vocab-size", "64", "--seq-length", "8", "--gpus", "2", "--global-batch-size",
        "4"]
# Caught before any work (no rank starts).
FACTORIES_AND_CHECK_FLAGS = {
    "factory-exits-0": ([f"{RAISING}:exits_cleanly", "--mesh", "2"],
                        ["called sys.exit(0) instead of returning (model, example_inputs)"]),
    "factory-exits-3": ([f"{RAISING}:exits_with_3", "--mesh", "2"],
                        ["called sys.exit(3)"]),
    "inputs-of-the-wrong-shape": ([f"{RAISING}:wrong_shape", "--mesh", "2"],
                                  ["[4, 5] X [8, 8]", "The example inputs do not fit the "
                                   "model"]),
    "checkpoint-dir-unwritable": ([*TINY, "--checkpoint-every", "1", "--checkpoint-dir",
                                   "plain-file/checkpoints"],
                                  ["--checkpoint-dir 'plain-file/checkpoints' cannot be "
                                   "written"]),
    "stall-rank-beyond-the-ranks": ([*TINY, "--stall-rank", "5", "--stall-at-step", "0"],
                                    ["--stall-rank 5: the plan runs ranks 0-1"]),
    "slow-rank-without-a-factor": ([*TINY, "--slow-rank", "1"],
                                   ["--slow-rank and --slow-factor go together"]),
    "nan-beyond-the-steps": ([*TINY, "--nan-at-step", "3"],
                             ["--nan-at-step 3: the check trains steps 0-2"]),
    "rollback-without-checkpoints": ([*TINY, "--on-divergence", "rollback"],
                                     ["--on-divergence rollback goes back to the last "
                                      "checkpoint: give --checkpoint-every"]),
    "elastic-without-the-ranks": ([*TINY, "--checkpoint-every", "1", "--elastic", "3:4"],
                                  ["--elastic 3:4: --gpus 2 is not within it"]),
    "elastic-not-a-range": ([*TINY, "--elastic", "4"], ["'4' is not MIN:MAX"]),
}
FAMILIES = {**KNOB_VALUES, **ESCAPED_TRACEBACKS, **HANGS_AND_UNBOUNDED_WORK, **GARBAGE,
            **MISSPELT, **GRAPH_PLANS, **FACTORIES_AND_CHECK_FLAGS}

# Issue 44's inputs that hung or answered wrong, a case of each kind: argv -> the exact line.
PREDICT = ["predict", *H100, "--gpus", "8"]
LAUNCH = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers {layers} --hidden-size 256 "
          "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
          "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000\n")
HUNG_OR_ANSWERED_WRONG = {
    # FIFOs blocked the read forever.
    "cluster-a-fifo": ([*SMALL[:3], "--cluster", "cluster.fifo.yaml", *SMALL[5:]],
                       "cluster file 'cluster.fifo.yaml' is not a regular file (a pipe, a "
                       "device or a folder); give a YAML or JSON cluster file"),
    # /dev/zero, by name or through a link, read until memory ran out; a file of 2 GiB is
    # refused after reading 1 MiB of it.
    "args-file-dev-zero": ([*PREDICT, "--args-file", "/dev/zero"],
                           "--args-file '/dev/zero' is not a regular file (a pipe, a device "
                           "or a folder); give the launch script"),
    "torchtitan-a-link-to-dev-zero": ([*PREDICT, "--torchtitan", "zero.toml"],
                                      "--torchtitan 'zero.toml' is not a regular file (a "
                                      "pipe, a device or a folder); give the job config "
                                      "TorchTitan reads (--job.config_file)"),
    "args-file-of-2-gib": ([*PREDICT, "--args-file", "huge.sh"],
                           "--args-file 'huge.sh' is over 1 MiB, the most Tessel reads of one "
                           "file; give the launch script"),
    # Expansion bombs: a value doubled 40 times (MemoryError), functions calling functions
    # ten times over, seven deep (ten million commands).
    "args-file-doubling-40-times": (
        [*PREDICT, "--args-file", "doubling.sh"],
        "doubling.sh: line 19: a value of 262,144 characters, longer than the 131,072 (128 "
        "KiB) Linux passes as one word to a command (MAX_ARG_STRLEN); Tessel stops there; "
        "Tessel reads the script as bash would, without running it"),
    "args-file-calls-fanning-out": (
        [*PREDICT, "--args-file", "fanning.sh"],
        "fanning.sh: line 1: reading the script takes more than 500,000 steps (commands, "
        "values copied at each `if` Tessel cannot decide, characters matched against a "
        "pattern; a launch script takes a few hundred); Tessel stops there; Tessel reads the "
        "script as bash would, without running it"),
    # Unbounded counts: 2 ** 2 ** 40 is 0 in bash's 64 bits (it was a 2^40-bit number).
    "args-file-power-tower": ([*PREDICT, "--args-file", "tower.sh"],
                              "--num-layers 0 must be from 1 to 16,384; give a count in range"),
    "args-file-31-digit-layers": ([*PREDICT, "--args-file", "digits.sh"],
                                  "--num-layers 1000000000000000000000000000000 must be from 1 "
                                  "to 16,384; give a count in range"),
    "predict-mtp-depth": ([*PREDICT, "--", *LAUNCH.format(layers=4).split()[3:],
                           "--mtp-num-layers", "100000000"],
                          "--mtp-num-layers 100000000 must be from 1 to 1,024; give a count "
                          "in range"),
    "torchtitan-a-name-squared-40-times": ([*PREDICT, "--torchtitan", "squared.py:job"],
                                           "squared.py:3: binop `a * a` comes to a number "
                                           "beyond 64 bits; no TorchTitan setting is that "
                                           "large"),
    # Zero experts: a dense plan with exit 0.
    "hf-zero-experts-per-token": (["hf:experts0.json", *SMALL[1:]],
                                  "experts0.json: field 'num_experts_per_tok' is 0; it must "
                                  "be a whole number from 1 to 1,024 (the most "
                                  "--moe-router-topk takes)."),
    # A size field beyond any plan: 10**30 layers hung (a list of them was built); no
    # heads divided by zero.
    "hf-unbounded-layers": (["hf:layers-1e30.json", *SMALL[1:]],
                            "layers-1e30.json: field 'num_hidden_layers' is "
                            "1000000000000000000000000000000; it must be a whole number from 1 "
                            "to 16,384 (the most --num-layers takes)."),
    # A token count past any run: 1e999 raised OverflowError; 1e30 was counted.
    "train-tokens-1e999": ([*SMALL, "--train-tokens", "1e999"],
                           "--train-tokens '1e999' is more than 10,000T tokens, the most a "
                           "run's totals are counted for; give fewer"),
    "hf-zero-heads": (["hf:heads0.json", *SMALL[1:]],
                      "heads0.json: field 'num_attention_heads' is 0; it must be a whole "
                      "number from 1 to 16,384 (the most --num-attention-heads takes)."),
    # Negative prices: "$-2 per GPU-hour", and --objective cost ranked by them.
    "cluster-negative-price": ([*SMALL[:1], "--cluster", "priced.yaml", *SMALL[3:]],
                               "Invalid cluster file 'priced.yaml': run_costs.gpu_hour_usd: "
                               "must be 0 <= low <= high USD per GPU-hour, got [-2.0, 3.0]."),
    # Late flag checks: the whole search ran, then the flag was refused.
    "elastic-without-emit": ([*SMALL, "--elastic", "1:8"],
                             "--elastic says how an emitted job restarts: give --emit pytorch "
                             "DIR as well"),
    # Unclear exception names: RecursionError, ZeroDivisionError, int()'s digit limit.
    "cluster-nested-200000-deep": ([*SMALL[:1], "--cluster", "nested.json", *SMALL[3:]],
                                   "cluster file 'nested.json' nests arrays or tables deeper "
                                   "than 100 levels (a config nests a few); fix the file"),
    "cluster-yaml-nested": ([*SMALL[:1], "--cluster", "nested.yaml", *SMALL[3:]],
                            "cluster file 'nested.yaml' nests arrays or tables deeper than 100 "
                            "levels (a config nests a few); fix the file"),
    # Counts past any job: 10**23 steps and 10**21 sequences a batch were predicted.
    "torchtitan-steps-1e23": ([*PREDICT, "--torchtitan", "steps.toml"],
                              "steps.toml: training.steps = 100000000000000000000000 must be a "
                              "whole number from 1 to 2,147,483,647"),
    "torchtitan-batch-1e21": ([*PREDICT, "--torchtitan", "batch.toml"],
                              "batch.toml: training.local_batch_size = 1000000000000000000000 "
                              "must be a whole number from 1 to 2,147,483,647"),
    # A profile database that is a device: it was read as missing.
    "profile-a-link-to-dev-zero": (["demo:mlp", "--mesh", "2", "--profile", "zero.toml"],
                                   "Profile database 'zero.toml' is not a regular file (a "
                                   "pipe, a device or a folder); give one `plan profile` "
                                   "wrote."),
    "torchtitan-nested": ([*PREDICT, "--torchtitan", "nested.toml"],
                          "--torchtitan 'nested.toml' nests arrays or tables deeper than 100 "
                          "levels (a config nests a few); fix the file"),
    "torchtitan-module-nested": ([*PREDICT, "--torchtitan", "nested.py:job"],
                                 "nested.py nests expressions deeper than Python parses; give "
                                 "a TorchTitan config module"),
    "cluster-5000-digits": ([*SMALL[:1], "--cluster", "digits.json", *SMALL[3:]],
                            "cluster file 'digits.json' holds a number of more than 4,300 "
                            "digits; fix the file"),
    "hf-nested-200000-deep": (["hf:nested.json", *SMALL[1:]],
                              "nested.json nests arrays or tables deeper than 100 levels (a "
                              "config nests a few); fix the file"),
    "hf-a-link-to-dev-zero": (["hf:zero/config.json", *SMALL[1:]],
                              "zero/config.json is not a regular file (a pipe, a device or a "
                              "folder); give a config.json"),
    "hf-decoder-sparse-step-0": (["hf:sparse-step0.json", *SMALL[1:]],
                                 "qwen3_moe config: field 'decoder_sparse_step' is 0; it must "
                                 "be a whole number from 1."),
}


@pytest.fixture(autouse=True)
def _workdir(tmp_path, monkeypatch):
    """Run each case in a folder holding the bad files the cases name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain-file").write_text("not a folder\n")
    os.mkfifo(tmp_path / "launch.fifo")  # nothing ever writes them: a read would block
    os.mkfifo(tmp_path / "job.toml")
    _hung_or_answered_wrong(tmp_path)
    (tmp_path / "badfield").mkdir()
    (tmp_path / "badfield" / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": "wide", "num_hidden_layers": [2]})
    )
    (tmp_path / "empty.csv").write_text("")
    header = ("Parameters (billion),# GPUs,global batch,micro batch,hidden size,attention heads,"
              "# layers,sequence length,tensor parallelism,data parallelism,pipeline "
              "parallelism,iteration time (ms)\n")  # vTrain's columns
    (tmp_path / "nan.csv").write_text(header + "3.6,8,64,1,3072,32,30,2048,8,1,1,nan\n")
    preset = (Path(cli.__file__).parents[1] / "presets" / "cpu.yaml").read_text()
    (tmp_path / "infinite.yaml").write_text(preset.replace("memory_gib: 24", "memory_gib: .inf"))
    (tmp_path / "big.yaml").write_text(preset.replace("num_devices: 8", "num_devices: 64"))
    (tmp_path / "inf-profile.json").write_text(json.dumps({"memory": [[64, float("inf")]]}))
    monkeypatch.setattr(cli.console, "_width", 80)  # a pipe's width, however run


def _hung_or_answered_wrong(folder: Path) -> None:
    """The files of HUNG_OR_ANSWERED_WRONG."""
    os.mkfifo(folder / "cluster.fifo.yaml")
    os.symlink("/dev/zero", folder / "zero.toml")
    (folder / "zero").mkdir()
    os.symlink("/dev/zero", folder / "zero" / "config.json")
    with open(folder / "huge.sh", "wb") as sparse:
        sparse.truncate(2 << 30)  # 2 GiB that take no disk and no time
    (folder / "doubling.sh").write_text('A=x\n' + 'A="$A$A"\n' * 40 + LAUNCH.format(layers="$A"))
    (folder / "fanning.sh").write_text("".join(
        f"{name}() {{ {' '.join([callee + ';'] * 10)} }}\n"
        for name, callee in zip("bcdefgh", "abcdefg")).replace("b() {", "a() { :; }\nb() {")
        + "h\n" + LAUNCH.format(layers=4))
    (folder / "tower.sh").write_text("L=$(( 2 ** 2 ** 40 ))\n" + LAUNCH.format(layers="$L"))
    (folder / "digits.sh").write_text(LAUNCH.format(layers=10 ** 30))
    (folder / "squared.py").write_text("def job():\n    a = 99999999999\n"
                                       + "    a = a * a\n" * 40 + "    return a\n")
    (folder / "nested.py").write_text("def job():\n    return " + "1+" * 100_000 + "1\n")
    (folder / "nested.json").write_text("[" * 200_000 + "]" * 200_000)
    (folder / "nested.yaml").write_text("- " * 5_000 + "x\n")
    (folder / "nested.toml").write_text("a = " + "[" * 5_000 + "]" * 5_000 + "\n")
    llama8 = '[model]\nname = "llama3"\nflavor = "8B"\n'
    (folder / "steps.toml").write_text(llama8 + f"[training]\nsteps = {10**23}\n")
    (folder / "batch.toml").write_text(llama8 + f"[training]\nlocal_batch_size = {10**21}\n")
    (folder / "digits.json").write_text('{"num_devices": ' + "9" * 5_000 + "}")
    qwen3 = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
             "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 64}
    (folder / "experts0.json").write_text(json.dumps({**qwen3, "num_experts_per_tok": 0}))
    (folder / "sparse-step0.json").write_text(json.dumps({**qwen3, "decoder_sparse_step": 0}))
    (folder / "layers-1e30.json").write_text(json.dumps({**qwen3, "num_hidden_layers": 10**30}))
    (folder / "heads0.json").write_text(json.dumps({**qwen3, "num_attention_heads": 0}))
    preset = (Path(cli.__file__).parents[1] / "presets" / "dgx-h100.yaml").read_text()
    (folder / "priced.yaml").write_text(preset.replace("gpu_hour_usd: [2.99, 6.88]",
                                                       "gpu_hour_usd: [-2, 3]"))


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(FAMILIES))
def test_a_bad_input_gets_one_line_and_exit_2(case: str, capsys) -> None:
    argv, fragments = FAMILIES[case]
    code, output = run(argv, capsys)
    assert code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert fragments is None or len(lines) == 1, output
    assert lines[-1].startswith("error: ")
    text = " ".join(output.split())
    for fragment in fragments or []:
        assert fragment in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(HUNG_OR_ANSWERED_WRONG))
def test_an_input_that_hung_or_answered_wrong_gets_its_one_line(case: str, capsys) -> None:
    argv, line = HUNG_OR_ANSWERED_WRONG[case]
    code, output = run(argv, capsys)
    assert code == 2
    assert output.strip() == f"error: {line}"


@pytest.mark.timeout(60)
def test_an_interrupt_exits_130_in_one_line(capsys) -> None:
    code, output = run([f"{RAISING}:interrupted", "--mesh", "2"], capsys)
    assert code == 130
    assert output.strip() == "interrupted"


@pytest.mark.timeout(60)
def test_an_unexpected_failure_is_named_in_one_line(capsys, monkeypatch) -> None:
    import planner.cli.catalog as catalog

    def broken(args):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(catalog, "run_models", broken)
    code, output = run(["models"], capsys)
    assert code == 2
    assert output.strip().splitlines() == [
        "error: TypeError: unsupported operand (rerun with --debug for the traceback)"
    ]


def test_a_failure_that_says_nothing_is_named_once(capsys, monkeypatch) -> None:
    # Issue 44 saw "error: MemoryError: MemoryError".
    import planner.cli.catalog as catalog

    def exhausted(args):
        raise MemoryError

    monkeypatch.setattr(catalog, "run_models", exhausted)
    code, output = run(["models"], capsys)
    assert code == 2
    assert output.strip() == "error: MemoryError (rerun with --debug for the traceback)"


@pytest.mark.timeout(60)
def test_debug_keeps_the_exit_code_and_adds_the_traceback(capsys) -> None:
    code = cli.main(["gpt3-125m", *H100, "--gpus", "8", "--global-batch-size", "64",
                     "--tensor-model-parallel-size", "5", "--debug"])
    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" in captured.err
    assert captured.out.strip().startswith("error: --tensor-model-parallel-size 5")


@pytest.mark.timeout(60)
def test_no_work_is_done_before_an_output_path_is_refused(capsys, monkeypatch) -> None:
    """`plan profile --output` and `plan check --json` used to measure or train first."""
    import runtime.measure
    import planner.checks.operator

    monkeypatch.setattr(runtime.measure, "measure_profile",
                        lambda *a: pytest.fail("measured before checking --output"))
    monkeypatch.setattr(planner.checks.operator, "check_plan",
                        lambda *a, **k: pytest.fail("trained before checking --json"))
    assert run(["profile", "--output", "/proc/self/p.json"], capsys)[0] == 2
    assert run(["check", "demo:mlp", "--mesh", "2", "--json", "/proc/self/c.json"], capsys)[0] == 2


def test_elastic_without_emit_is_refused_before_the_search(capsys, monkeypatch) -> None:
    """It ran the whole search, printed the plan, then failed (issue 44)."""
    import planner.cli.train

    monkeypatch.setattr(planner.cli.train, "plan_from_flags",
                        lambda *a, **k: pytest.fail("searched before checking --elastic"))
    assert run([*SMALL, "--elastic", "1:8"], capsys)[0] == 2


def test_a_refused_output_path_leaves_no_file(capsys, tmp_path) -> None:
    code, _ = run(["demo:mlp", "--mesh", "2x2x2x2", "--json", "plan.json"], capsys)
    assert code == 2
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("command", ["models", "clusters"])
def test_models_and_clusters_write_json(command: str, capsys, tmp_path) -> None:
    code, _ = run([command, "--json", "out.json"], capsys)
    assert code == 0
    presets = json.loads((tmp_path / "out.json").read_text())
    assert ("gpt3-175b" if command == "models" else "dgx-h100") in presets


# Mixtures of experts as trained in 2026 (issue 30): each bad shape or degree in one line.
DEEPSEEK = ["deepseek-v3", *H100, "--gpus", "1024", "--global-batch-size", "8192"]
QWEN3 = ["qwen3-30b-a3b", *H100, "--gpus", "64", "--global-batch-size", "256"]
MOE_INPUTS = {
    "mla-rank-above-the-hidden-size": ([*DEEPSEEK, "--kv-lora-rank", "8192"],
                                       ["--kv-lora-rank (8192) must be smaller than",
                                        "(7168)"]),
    "q-rank-above-the-hidden-size": ([*DEEPSEEK, "--q-lora-rank", "7168"],
                                     ["--q-lora-rank (7168) must be smaller"]),
    "top-k-above-the-experts": ([*QWEN3, "--moe-router-topk", "200"],
                                ["--moe-router-topk (200) cannot exceed", "(128)"]),
    "layer-pattern-of-another-length": ([*DEEPSEEK, "--moe-layer-freq", "([0]*3+[1]*50)"],
                                        ["--moe-layer-freq as a list needs one 0 or 1 per "
                                         "layer, 61 in all; it has 53"]),
    "layer-pattern-as-code": ([*DEEPSEEK, "--moe-layer-freq", "__import__('os')"],
                              ["--moe-layer-freq", "neither a whole number nor a list"]),
    "unknown-dispatcher": ([*QWEN3, "--moe-token-dispatcher-type", "foo"],
                           ["--moe-token-dispatcher-type foo is not one of allgather, "
                            "alltoall, flex"]),
    "expert-degree-dividing-neither": ([*QWEN3, "--expert-model-parallel-size", "3"],
                                       ["--expert-model-parallel-size 3 must divide the "
                                        "model's 128 experts"]),
    "expert-shape-on-a-dense-model": ([*SMALL, "--moe-ffn-hidden-size", "64"],
                                      ["--moe-ffn-hidden-size", "num_experts is not set"]),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(MOE_INPUTS))
def test_a_bad_moe_input_gets_one_line_and_exit_2(case: str, one_line_error) -> None:
    argv, fragments = MOE_INPUTS[case]
    output = one_line_error(argv)
    assert output.startswith("error: ")
    text = " ".join(output.split())
    for fragment in fragments:
        assert fragment in text


def test_an_expert_tensor_degree_on_a_dense_model_gets_one_line(capsys) -> None:
    code, output = run([*SMALL, "--expert-tensor-parallel-size", "2"], capsys)
    assert code == 2 and "--expert-tensor-parallel-size 2" in output and "dense" in output
    assert len(output.strip().splitlines()) == 1


@pytest.mark.parametrize("extra", [
    ["--expert-model-parallel-size", "1"], ["--moe-token-dispatcher-type", "allgather"],
    ["--recompute-granularity", "full"]])
def test_the_all_to_all_overlap_where_megatron_refuses_it_gets_one_line(
        capsys, extra: list[str]) -> None:
    code, output = run(["mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100",
                        "--global-batch-size", "256", "--overlap-moe-expert-parallel-comm",
                        *extra], capsys)
    assert code == 2 and "--overlap-moe-expert-parallel-comm" in output
    assert len(output.strip().splitlines()) == 1, output
