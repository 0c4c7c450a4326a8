"""The four MoE rows of `shared/calibration/published_moe_runs.csv`, each as the
Megatron-LM launch line its notes describe, read back by `plan predict`'s reader.

Each line is written from the Megatron-Bridge performance recipe the row names
(NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/<family>/*_workload_base_configs.py
and *_llm_pretrain.py, src/megatron/bridge/recipes/<family>/*.py, at the commit in the
row's `source`), with Megatron-LM's flags for what the recipe sets: the model as the
Hugging Face bridge provides it, the degrees, recomputation, precision
(`utils/precision.py`: FP8-CS is hybrid + tensorwise, MXFP8 e4m3 + mxfp8, both with fp8
parameter gathers), dispatcher and the overlaps the notes name. Flags the recipe also sets
that change no priced quantity (fusions, router dtype, auxiliary losses, YaRN scaling)
are given too, so the test shows they are accepted. Bridge pairs the all-to-all overlap
with --delay-wgrad-compute (`_set_moe_a2a_overlap_overrides`), which Tessel does not price:
the lines leave it out, as the rows' notes do.
"""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

import pytest

from planner.megatron import launch_words, megatron_run, parse_megatron_flags
from planner.models.presets import get_preset

CSV = next((p for p in (Path(__file__).resolve().parents[4] / "shared",
                        Path("/work/shared"))
            if (p / "calibration" / "published_moe_runs.csv").is_file()), None)

_COMMON_MOE = ("--moe-grouped-gemm --moe-permute-fusion --moe-router-fusion "
               "--moe-router-dtype fp32 --moe-router-force-load-balancing "
               "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
               "--hidden-dropout 0 --attention-dropout 0 --normalization RMSNorm "
               "--position-embedding-type rope --untie-embeddings-and-output-weights "
               "--train-iters 50 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer ")

# DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 (@21d102f5e): pp 8 x vp 2 with the layout
# "Et*4|(t*4|)*14tmL", ep 32, etp 1, DeepEP (flex), A2A overlap, TE CUDA graphs of
# attention, router and preprocessing, selective recomputation of mla_up_proj and mlp;
# DeepSeek-V3's recipe: MTP 1, precision-aware optimizer with bf16 grads and moments.
DEEPSEEK_V3 = """torchrun --nnodes 32 --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 \\
  --seq-length 4096 --max-position-embeddings 163840 --vocab-size 129280 \\
  --swiglu --disable-bias-linear --rotary-base 10000 --rotary-scaling-factor 40 \\
  --mscale 1.0 --mscale-all-dim 1.0 \\
  --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 \\
  --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm \\
  --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 \\
  --moe-shared-expert-intermediate-size 2048 --moe-layer-freq "([0]*3+[1]*58)" \\
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias \\
  --moe-router-bias-update-rate 1e-3 --moe-router-topk-scaling-factor 2.5 \\
  --moe-router-num-groups 8 --moe-router-group-topk 4 \\
  --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 \\
  --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 \\
  --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep \\
  --overlap-moe-expert-parallel-comm \\
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 \\
  --pipeline-model-parallel-layout "Et*4|(t*4|)*14tmL" \\
  --expert-model-parallel-size 32 --expert-tensor-parallel-size 1 \\
  --micro-batch-size 1 --global-batch-size 4096 \\
  --recompute-granularity selective --recompute-modules mla_up_proj mlp \\
  --bf16 --fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather \\
  --use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 \\
  --exp-avg-sq-dtype bf16 \\
  --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess \\
  """ + _COMMON_MOE

# QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2 (@21d102f5e): t2 (sequence parallel) x
# pp 8 x vp 4, the embedding and loss counted as layers (94 + 2 = 96 = 32 chunks of 3,
# qwen3_moe.py), ep 32, etp 1, alltoall, A2A overlap, forced balance, no recomputation.
# The Hugging Face vocabulary is not padded (the bridge takes it as it is).
QWEN3_235B = """torchrun --nnodes 32 --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 94 --hidden-size 4096 --ffn-hidden-size 12288 --num-attention-heads 64 \\
  --group-query-attention --num-query-groups 4 --kv-channels 128 --qk-layernorm \\
  --seq-length 4096 --max-position-embeddings 40960 --vocab-size 151936 \\
  --no-pad-vocab-size --swiglu --disable-bias-linear --rotary-base 1000000 \\
  --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 1536 \\
  --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \\
  --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm \\
  --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 8 \\
  --num-virtual-stages-per-pipeline-rank 4 --account-for-embedding-in-pipeline-split \\
  --account-for-loss-in-pipeline-split \\
  --expert-model-parallel-size 32 --expert-tensor-parallel-size 1 \\
  --micro-batch-size 1 --global-batch-size 8192 \\
  --bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather \\
  """ + _COMMON_MOE

# GPT-OSS-120B's shape as Megatron-Bridge's GPT-OSS provider builds it: quick GeGLU (a
# gated MLP, swiglu's three matrices), biases, learnable softmax (sinks), head width 64,
# a 128-token window on every other layer from the first (window_attn_skip_freq 2).
_GPT_OSS = """--num-layers 36 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64 \\
  --group-query-attention --num-query-groups 8 --kv-channels 64 --softmax-type learnable \\
  --window-size 128,0 --window-attn-skip-freq 2 \\
  --seq-length 4096 --max-position-embeddings 131072 --vocab-size 201088 \\
  --quick-geglu --rotary-base 150000 --rotary-scaling-factor 32 \\
  --num-experts 128 --moe-router-topk 4 --moe-ffn-hidden-size 2880 \\
  --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \\
  --tensor-model-parallel-size 1 --expert-tensor-parallel-size 1 \\
  --cp-comm-type a2a --global-batch-size 1280 \\
  """

# GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 (@21d102f5e): pp 4, ep 8, bf16, selective
# recomputation of layernorm and moe_act, alltoall, forced balance.
GPT_OSS_H100 = """torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py \\
  """ + _GPT_OSS + """--moe-token-dispatcher-type alltoall \\
  --pipeline-model-parallel-size 4 --expert-model-parallel-size 8 --micro-batch-size 1 \\
  --recompute-granularity selective --recompute-modules layernorm moe_act --bf16 \\
  """ + _COMMON_MOE

# GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 (@c270efc50): one stage, ep 64, micro
# batch 4, HybridEP (flex), A2A overlap, a full-iteration CUDA graph, MXFP8; the graph
# gives HybridEP a static budget of 1.5 x each rank's even share of routed rows and keeps
# the experts' activations in a paged stash (set_full_iter_cg_configs:
# moe_expert_rank_capacity_factor 1.5, moe_paged_stash; the grouped GEMMs run the rows
# routed, not Megatron-LM's --moe-pad-expert-input-to-capacity).
GPT_OSS_GB200 = """torchrun --nnodes 16 --nproc-per-node 4 pretrain_gpt.py \\
  """ + _GPT_OSS + """--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep \\
  --overlap-moe-expert-parallel-comm --pipeline-model-parallel-size 1 \\
  --expert-model-parallel-size 64 --micro-batch-size 4 --cuda-graph-impl full_iteration \\
  --moe-expert-rank-capacity-factor 1.5 --moe-paged-stash \\
  --bf16 --fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather \\
  """ + _COMMON_MOE

# (row's model, gpu) -> (preset, launch line).
LINES = {
    ("DeepSeek-V3", "B200"): ("deepseek-v3", DEEPSEEK_V3),
    ("Qwen3-235B-A22B", "H100"): ("qwen3-235b-a22b", QWEN3_235B),
    ("GPT-OSS-120B", "H100"): ("gpt-oss-120b", GPT_OSS_H100),
    ("GPT-OSS-120B", "GB200"): ("gpt-oss-120b", GPT_OSS_GB200),
}


def _rows() -> list[dict[str, str]]:
    if CSV is None:
        return []
    with open(CSV / "calibration" / "published_moe_runs.csv") as file:
        return list(csv.DictReader(file))


ROWS = _rows()
needs_rows = pytest.mark.skipif(not ROWS, reason="shared/calibration not found")


def _degree(text: str) -> int:
    return 1 if text in ("-", "") else int(text)


def _read(line: str):
    launch = launch_words(line)
    return launch, parse_megatron_flags(launch.flags)


@needs_rows
@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['model']}-{r['gpu']}")
def test_a_published_runs_launch_line_reads_as_its_row(row: dict[str, str]) -> None:
    """The line's model is the preset's, and its degrees, batches and dispatcher the
    row's."""
    preset, line = LINES[(row["model"], row["gpu"])]
    launch, args = _read(line)
    assert launch.world_size == int(row["num_gpus"])
    run = megatron_run(args, launch.world_size)
    assert run.model == get_preset(preset)
    q, d = run.parallel, run.parallel.dims
    assert (d.tensor, d.pipeline, q.pipelining.virtual_pipeline, d.context, d.expert, d.data) == (
        _degree(row["tp"]), _degree(row["pp"]), _degree(row["vp"]), _degree(row["cp"]),
        _degree(row["ep"]), _degree(row["dp"]))
    assert (q.batch.global_batch_size, q.batch.micro_batch_size, q.dims.expert_tensor_degree) == (
        int(row["global_batch"]), int(row["micro_batch"]), 1)
    assert q.sharding.zero_stage == 1 and q.moe.moe_router_force_load_balancing
    assert q.recomputation.recompute == row["recompute"].split()[0]
    if row["recompute"] != "none":
        assert set(q.recomputation.recompute_modules) == set(row["recompute"].split()[1].split("+"))
    # The notes name the A2A overlap of the first two rows; GB200's recipe sets it too
    # (moe_a2a_overlap=True in GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2).
    assert q.moe.overlap_moe_expert_parallel_comm == (
        "A2A overlap" in row["notes"] or row["gpu"] == "GB200")
    assert q.moe.moe_token_dispatcher == ("flex" if "DeepEP" in row["notes"]
                                      or row["gpu"] == "GB200" else "alltoall")
    assert q.numerics.precision == ("bf16" if row["precision"] == "bf16" else "fp8")
    # Grouped GEMMs are read (priced: one kernel per projection), router fusion ignored.
    assert q.moe.moe_grouped_gemm and "--moe-grouped-gemm" not in run.ignored
    assert "--moe-router-fusion" in run.ignored


def test_deepseek_v3s_line_places_mtp_with_the_loss() -> None:
    launch, args = _read(DEEPSEEK_V3)
    run = megatron_run(args, launch.world_size or 0)
    assert run.chunk_layers == [4] * 15 + [1]
    assert run.model.mtp_num_layers == 1 and run.parallel.pipelining.schedule == "interleaved"


@needs_rows
@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['model']}-{r['gpu']}")
def test_plan_predict_prints_a_prediction_for_each_row(row: dict[str, str], capsys,
                                                      tmp_path: Path) -> None:
    """Each launch line is predicted (no refusal), within 10% of the row's throughput."""
    import json

    from planner import cli

    cluster = {"B200": "dgx-b200", "H100": "dgx-h100", "GB200": "gb200-nvl72"}[row["gpu"]]
    _, line = LINES[(row["model"], row["gpu"])]
    path = tmp_path / "predicted.json"
    code = cli.main(["predict", "--cluster", cluster, "--no-search", "--json", str(path),
                     "--", *shlex.split(line.replace("\\\n", " "))])
    assert code == 0, capsys.readouterr().out
    predicted = json.loads(path.read_text())["launch_line"]["predicted"]
    per_gpu = predicted["tokens_per_s"] / int(row["num_gpus"])
    assert per_gpu == pytest.approx(float(row["value"]), rel=0.10)


@needs_rows
def test_plan_predict_json_of_deepseek_v3_shows_its_moe_in_the_plan(capsys,
                                                                    tmp_path: Path) -> None:
    """The Plan of DeepSeek-V3's launch line carries its multi-latent attention, shared
    and routed experts (dense layers first), MTP layer, dispatcher and schedule."""
    import json

    from planner import cli

    _, line = LINES[("DeepSeek-V3", "B200")]
    path = tmp_path / "predicted.json"
    assert cli.main(["predict", "--cluster", "dgx-b200", "--no-search", "--json", str(path),
                     "--", *shlex.split(line.replace("\\\n", " "))]) == 0
    plan = json.loads(path.read_text())["launch_line"]
    shape = plan["architecture"]
    assert shape["multi_latent_attention"] and shape["kv_lora_rank"] == 512
    assert shape["num_experts"] == 256 and shape["moe_top_k"] == 8
    assert shape["moe_shared_expert_intermediate_size"] == 2048
    assert shape["moe_layer_freq"] == [0] * 3 + [1] * 58 and shape["mtp_num_layers"] == 1
    assert plan["run"]["moe_token_dispatcher"] == "flex"
    assert plan["run"]["overlap_moe_expert_parallel_comm"]
    assert plan["schedule"] == "interleaved" and plan["parallel"]["expert"] == 32
    breakdown = plan["predicted"]["memory_breakdown_gib"]
    assert breakdown["experts' optimizer"] > 0 and breakdown["optimizer"] > 0
