"""Published 405B layouts that ran are predicted to fit, with their own flags."""

from __future__ import annotations

import shlex

import pytest

from cost_models.pipeline_memory import StageLayout
from cost_models.step_time import predict_stages
from planner.vocabulary.cluster import Cluster
from planner.export.megatron import megatron_flags
from planner.megatron.arguments import parse_megatron_flags
from planner.megatron.run import megatron_run

LLAMA3_405B = (
    "--num-layers 126 --hidden-size 16384 --num-attention-heads 128 --num-query-groups 8 "
    "--group-query-attention --ffn-hidden-size 53248 --seq-length 8192 "
    "--max-position-embeddings 8192 --vocab-size 128256 --swiglu --normalization RMSNorm "
    "--position-embedding-type rope --untie-embeddings-and-output-weights "
    "--disable-bias-linear --hidden-dropout 0 --attention-dropout 0 --bf16 "
    "--sequence-parallel --use-distributed-optimizer --micro-batch-size 1")
# The Llama 3 paper (Dubey et al. 2024, Sec. 3.3.2 and Table 4): t8 p16, global batch 2048
# at 8,192 tokens, one layer fewer on the first and last stage; NeMo's 405B recipes count
# the embedding and loss as pipeline layers.
LAYOUTS = {
    "llama3-paper-8192": (8192, "dgx-h100", "--tensor-model-parallel-size 8 "
                          "--pipeline-model-parallel-size 16 --global-batch-size 2048 "
                          "--decoder-first-pipeline-num-layers 7 "
                          "--decoder-last-pipeline-num-layers 7"),
    "llama3-paper-16384": (16384, "dgx-h100", "--tensor-model-parallel-size 8 "
                           "--pipeline-model-parallel-size 16 --global-batch-size 2048 "
                           "--decoder-first-pipeline-num-layers 7 "
                           "--decoder-last-pipeline-num-layers 7"),
    "nemo-h100-1024": (1024, "dgx-h100", "--tensor-model-parallel-size 8 "
                       "--pipeline-model-parallel-size 8 --context-parallel-size 2 "
                       "--num-virtual-stages-per-pipeline-rank 8 --global-batch-size 512 "
                       "--account-for-embedding-in-pipeline-split "
                       "--account-for-loss-in-pipeline-split"),
    # The Llama 3 paper's split said as a layout string.
    "llama3-paper-layout": (16384, "dgx-h100", "--tensor-model-parallel-size 8 "
                            "--pipeline-model-parallel-size 16 --global-batch-size 2048 "
                            "--pipeline-model-parallel-layout Et*7|(t*8|)*14t*7L"),
    "nemo-gb200-256": (256, "gb200-nvl72", "--tensor-model-parallel-size 4 "
                       "--pipeline-model-parallel-size 16 "
                       "--num-virtual-stages-per-pipeline-rank 4 --global-batch-size 64 "
                       "--account-for-embedding-in-pipeline-split "
                       "--account-for-loss-in-pipeline-split"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_published_405b_layouts_fit(name: str) -> None:
    gpus, preset, flags = LAYOUTS[name]
    run = megatron_run(parse_megatron_flags(f"{LLAMA3_405B} {flags}".split()), gpus)
    cluster = Cluster.load(preset).with_devices(gpus)
    q = run.parallel
    stages = [StageLayout(layers, q.dims.tensor, q.dims.data) for layers in run.layers_per_stage]
    predicted = predict_stages(run.model, cluster, q, stages)
    assert predicted.fits, (name, predicted.memory_gib_per_gpu)
    # The flags the plan exports say the same layout again.
    flags = megatron_flags(run.model, q, run.layers_per_stage, run.chunk_layers)
    again = megatron_run(parse_megatron_flags(shlex.split(" ".join(flags))), gpus)
    assert (again.layers_per_stage, again.chunk_layers) == (run.layers_per_stage,
                                                           run.chunk_layers)
