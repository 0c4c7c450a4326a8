"""planner.megatron.run: the run a launch line describes, in Tessel's vocabulary.

Megatron-LM's defaults for absent flags, its `validate_args` rules, flags without time or
memory ignored and those Tessel cannot price refused (`model_shape`, `parallel_config`,
`unpriced`).
"""

from __future__ import annotations

import pytest

from planner.megatron.arguments import megatron_parser, parse_megatron_flags
from planner.megatron.errors import LaunchLineError
from planner.megatron.run import _READ, megatron_run
from planner.megatron.unpriced import UNPRICED

SHAPE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --vocab-size 32768 --micro-batch-size 1")


def run_of(flags: str, world: int = 8):
    return megatron_run(parse_megatron_flags(flags.split()), world)


def error_of(flags: str, world: int = 8) -> str:
    with pytest.raises(LaunchLineError) as caught:
        run_of(flags, world)
    return str(caught.value)


def test_every_flag_tessel_reads_or_refuses_is_one_megatron_lm_has() -> None:
    assert (set(UNPRICED) | _READ) <= set(megatron_parser().defaults_of)


def test_a_bare_launch_line_is_megatron_lms_defaults() -> None:
    run = run_of(SHAPE)
    model, q = run.model, run.parallel
    assert (model.norm, model.activation, model.position_embedding) == (
        "layernorm", "gelu", "learned")
    assert model.tie_embeddings and model.bias and model.ffn_hidden_size == 4 * 1024
    assert model.num_query_groups is None  # multi-head attention
    assert (q.dims.tensor, q.dims.pipeline, q.dims.data, q.dims.context) == (1, 1, 8, 1)
    assert q.batch.global_batch_size == 8  # micro x data
    assert (q.recomputation.recompute, q.sharding.zero_stage, q.pipelining.schedule,
            q.numerics.precision) == (
        "none", 0, "1f1b", "fp32")
    assert any("fp32" in note for note in run.notes)
    assert run.layers_per_stage is None


def test_a_llama_launch_line_maps_to_the_zoos_llama() -> None:
    run = run_of(SHAPE + " --swiglu --normalization RMSNorm --use-rotary-position-embeddings"
                 " --untie-embeddings-and-output-weights --disable-bias-linear --bf16"
                 " --group-query-attention --num-query-groups 4 --rotary-base 500000")
    model = run.model
    assert (model.norm, model.activation, model.position_embedding) == (
        "rmsnorm", "swiglu", "rope")
    assert not model.tie_embeddings and not model.bias
    assert model.num_query_groups == 4 and model.rotary_base == 500000
    # Megatron-LM's swiglu default: 2/3 of 4h, rounded down to a multiple of 64.
    assert model.ffn_hidden_size == int(4 * 1024 * 2 / 3 / 64) * 64 == 2688


def test_query_groups_count_only_with_group_query_attention() -> None:
    assert run_of(SHAPE + " --num-query-groups 4").model.num_query_groups is None


def test_the_vocabulary_is_padded_as_megatron_lm_pads_it() -> None:
    flags = SHAPE.replace("--vocab-size 32768", "--vocab-size 50257")
    assert run_of(flags + " --tensor-model-parallel-size 2").model.vocab_size == 50432
    assert run_of(flags + " --no-pad-vocab-size").model.vocab_size == 50257
    assert run_of(flags + " --padded-vocab-size 50304").model.vocab_size == 50304
    no_vocabulary = SHAPE.replace(" --vocab-size 32768", "")
    assert "--vocab-size N" in error_of(no_vocabulary + " --tokenizer-type HuggingFaceTokenizer")
    # pretrain_gpt.py's default tokenizer is GPT-2's, whose vocabulary is fixed.
    run = run_of(no_vocabulary)
    assert run.model.vocab_size == 50304
    assert any(note.startswith("vocabulary 50,257: pretrain_gpt.py's default tokenizer, "
                               "GPT2BPETokenizer's (GPT-2's byte-pair vocabulary)")
               for note in run.notes)


def test_moe_flags_set_the_experts() -> None:
    run = run_of(SHAPE + " --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 "
                 "--expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall --bf16")
    assert (run.model.num_experts, run.model.moe_top_k, run.model.ffn_hidden_size) == (8, 2, 512)
    assert run.parallel.dims.expert == 4 and run.parallel.moe.moe_token_dispatcher == "alltoall"


def test_parallel_knobs_and_run_settings_map_to_the_configuration() -> None:
    run = run_of(SHAPE + " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                 "--sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
                 "--overlap-param-gather --tp-comm-overlap --global-batch-size 64 "
                 "--num-layers-per-virtual-pipeline-stage 1 --recompute-granularity full "
                 "--recompute-method block --recompute-num-layers 1 --fp8-format hybrid "
                 "--fp8-recipe tensorwise --bf16 --use-flash-attn --cuda-graph-impl local",
                 world=16)
    q = run.parallel
    assert (q.dims.tensor, q.dims.pipeline, q.dims.data) == (2, 4, 2)
    assert q.sharding.sequence_parallel and q.sharding.zero_stage == 1
    assert q.overlap.overlap_param_gather
    assert q.overlap.tp_comm_overlap and q.overlap.overlap_grad_reduce
    assert (q.pipelining.schedule, q.pipelining.virtual_pipeline) == ("interleaved", 2)
    assert (q.recomputation.recompute, q.recomputation.recompute_method,
            q.recomputation.recompute_num_layers) == ("full", "block", 1)
    assert (q.numerics.precision, q.numerics.fp8_recipe) == ("fp8", "tensorwise")
    assert q.execution.attention_backend == "flash" and q.execution.cuda_graphs
    selective = run_of(SHAPE + " --recompute-activations").parallel
    assert selective.recomputation.recompute == "selective"
    assert run_of(SHAPE + " --enable-cuda-graph").parallel.execution.cuda_graphs


def test_uneven_stages_pass_on_their_layers() -> None:
    flags = SHAPE.replace("--num-layers 8", "--num-layers 10")
    run = run_of(flags + " --pipeline-model-parallel-size 4 "
                 "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3")
    assert run.layers_per_stage == [1, 3, 3, 3]
    assert "divisible by --pipeline-model-parallel-size 4" in error_of(
        flags + " --pipeline-model-parallel-size 4")


def test_flags_without_time_or_memory_are_ignored_and_listed() -> None:
    run = run_of(SHAPE + " --lr 3e-4 --data-path 0.5 /a 0.5 /b --save /ckpt --seed 7 "
                 "--log-interval 10 --tokenizer-type GPT2BPETokenizer")
    assert run.ignored == ["--lr", "--data-path", "--save", "--seed", "--log-interval",
                           "--tokenizer-type"]


@pytest.mark.parametrize("extra, fragments", [
    ("--fine-grained-activation-offloading", ["--fine-grained-activation-offloading "
                                              "changes time or memory", "drop it"]),
    ("--num-distributed-optimizer-instances 2", ["--num-distributed-optimizer-instances"]),
    ("--num-experts 8 --moe-latent-size 128", ["--moe-latent-size"]),
    ("--position-embedding-type none", ["--position-embedding-type"]),
    ("--hybrid-layer-pattern M*8", ["--hybrid-layer-pattern", "Mamba"]),
])
def test_a_flag_tessel_cannot_price_is_refused_by_name(extra: str, fragments: list[str]) -> None:
    message = error_of(f"{SHAPE} {extra}")
    for fragment in fragments:
        assert fragment in message


def test_a_flag_without_its_value_is_refused_where_tessel_reads_it() -> None:
    assert error_of(f"{SHAPE} --save --micro-batch-size") == (
        "--micro-batch-size is given no value (the word after it is another flag, or none: a "
        "variable of the script left empty?); give its value, e.g. with --env NAME=VALUE")
    assert "--save given no value" in run_of(f"{SHAPE} --save --seed 7").notes[0]


def test_delayed_weight_gradients_need_the_expert_all_to_all_overlap() -> None:
    # Priced with the overlap (cost_models/moe_dispatch.py); alone, Megatron-Core refuses it.
    assert error_of(f"{SHAPE} --delay-wgrad-compute") == (
        "--delay-wgrad-compute delays weight gradients under the expert all-to-all overlap, "
        "which Megatron-Core requires with it; add --overlap-moe-expert-parallel-comm or "
        "drop it")


def test_unpriced_flags_at_their_neutral_values_are_accepted() -> None:
    run_of(SHAPE + " --num-distributed-optimizer-instances 1 --mtp-num-layers 0 "
           "--cp-comm-type p2p --no-fp8-wgrad --moe-layer-freq 2")  # no fp8, no experts


@pytest.mark.parametrize("flags, world, fragments", [
    (SHAPE.replace("--num-layers 8 ", ""), 8,
     ["the launch line has no --num-layers", "Megatron-LM requires"]),
    (SHAPE.replace(" --micro-batch-size 1", "").replace(" --seq-length 2048", ""), 8,
     ["no --seq-length, --micro-batch-size"]),
    (SHAPE + " --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4", 8,
     ["the 8 GPUs are not divisible by --tensor-model-parallel-size 4 x "
      "--pipeline-model-parallel-size 4"]),
    (SHAPE + " --global-batch-size 12", 8, ["--global-batch-size 12 must be divisible by"]),
    (SHAPE + " --recompute-method uniform", 8,
     ["--recompute-method applies only with --recompute-granularity full"]),
    (SHAPE + " --recompute-granularity full", 8, ["needs --recompute-method"]),
    (SHAPE + " --overlap-param-gather", 8, ["needs --use-distributed-optimizer"]),
    (SHAPE + " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
     8, ["--num-layers-per-virtual-pipeline-stage 3 must divide the 4 layers"]),
    (SHAPE + " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2", 8,
     ["micro-batches per step", "multiple of --pipeline-model-parallel-size 2"]),
    (SHAPE + " --bf16 --fp16", 8, ["--bf16 and --fp16"]),
    (SHAPE + " --fp8-format hybrid", 8, ["--fp8-format hybrid without --bf16"]),
    (SHAPE + " --num-attention-heads 7", 8,
     ["--hidden-size (1024) must be divisible by --num-attention-heads (7)"]),
    (SHAPE + " --expert-model-parallel-size 2", 8, ["--expert-model-parallel-size 2 needs"]),
    (SHAPE + " --batch-size 4", 8, ["--batch-size is retired", "--micro-batch-size"]),
    (SHAPE + " --tensor-model-parallel-size 0", 8, ["--tensor-model-parallel-size 0 must be"]),
])
def test_megatron_lms_rules_are_errors_naming_the_flags(
    flags: str, world: int, fragments: list[str]
) -> None:
    message = error_of(flags, world)
    for fragment in fragments:
        assert fragment in message


def test_the_embedding_and_loss_counted_as_layers_shorten_the_end_chunks() -> None:
    # NeMo's Llama 3 405B layout: 126 layers + 2 slots over 8 stages x 8 virtual chunks.
    flags = SHAPE.replace("--num-layers 8", "--num-layers 126")
    run = run_of(flags + " --pipeline-model-parallel-size 8 "
                 "--num-virtual-stages-per-pipeline-rank 8 --global-batch-size 64 "
                 "--account-for-embedding-in-pipeline-split "
                 "--account-for-loss-in-pipeline-split", world=8)
    assert run.chunk_layers == [1] + [2] * 62 + [1]
    assert run.layers_per_stage == [15, 16, 16, 16, 16, 16, 16, 15]
    assert run.parallel.pipelining.virtual_pipeline == 8
    assert "split evenly over --pipeline-model-parallel-size 8" in error_of(
        flags.replace("126", "125") + " --pipeline-model-parallel-size 8 "
        "--account-for-loss-in-pipeline-split")
    assert "size the end stages twice" in error_of(
        flags + " --pipeline-model-parallel-size 8 --account-for-loss-in-pipeline-split "
        "--decoder-first-pipeline-num-layers 15")


def test_optimizer_state_flags_set_the_dtypes_they_name() -> None:
    run = run_of(SHAPE + " --bf16 --use-distributed-optimizer --use-precision-aware-optimizer "
                 "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --grad-reduce-in-bf16 "
                 "--recompute-granularity selective --recompute-modules core_attn mlp")
    q = run.parallel
    assert (q.numerics.main_grads_dtype, q.numerics.exp_avg_dtype,
            q.recomputation.recompute_modules) == (
        "bf16", "bf16", ("core_attn", "mlp"))
    assert "--use-precision-aware-optimizer" in error_of(SHAPE + " --exp-avg-dtype bf16")
    assert "--recompute-modules" in error_of(
        SHAPE + " --recompute-granularity selective --recompute-modules mamba")


def test_a_pipeline_layout_string_places_the_layers_of_each_chunk() -> None:
    flags = SHAPE.replace("--num-layers 8", "--num-layers 10")
    # Megatron-Core's form: the embedding alone on the first stage, the loss on the last.
    run = run_of(flags + " --pipeline-model-parallel-size 4 "
                 "--pipeline-model-parallel-layout E|t*5|t*5|L")
    assert run.layers_per_stage == [0, 5, 5, 0] and run.chunk_layers == [0, 5, 5, 0]
    # Two chunks per rank, run-length form with cosmetic commas: interleaved.
    run = run_of(flags + " --pipeline-model-parallel-size 4 --global-batch-size 8 "
                 "--pipeline-model-parallel-layout Et,|(t|)*6,t*3L")
    assert run.chunk_layers == [1, 1, 1, 1, 1, 1, 1, 3]
    pipelining = run.parallel.pipelining
    assert pipelining.virtual_pipeline == 2 and pipelining.schedule == "interleaved"
    assert run.layers_per_stage == [2, 2, 2, 4]


@pytest.mark.parametrize("layout, fragment", [
    ("E|t*5|t*4|L", "places 9 transformer layers, not --num-layers 10"),
    ("E|t*10|L", "has 3 stages, not a multiple of --pipeline-model-parallel-size 4"),
    ("t*5|t*5|E|L", "must begin with the embedding E"),
    ("E|t*5|tx*5|L", "'x'"),
    ("E|t*5|t*4m|L", "multi-token-prediction"),
])
def test_a_bad_pipeline_layout_is_one_line(layout: str, fragment: str) -> None:
    flags = SHAPE.replace("--num-layers 8", "--num-layers 10")
    message = error_of(flags + f" --pipeline-model-parallel-size 4 "
                       f"--pipeline-model-parallel-layout {layout}")
    assert fragment in message and "--pipeline-model-parallel-layout" in message
    assert "places every layer" in error_of(
        flags + " --pipeline-model-parallel-size 4 --pipeline-model-parallel-layout E|t*5|t*5|L"
        " --decoder-first-pipeline-num-layers 2")


def test_cuda_graph_modules_is_read_as_the_deprecated_scope_is() -> None:
    # --cuda-graph-modules is the current spelling; validate_args copies the deprecated
    # --cuda-graph-scope into it (megatron/training/arguments.py).
    graphs = " --bf16 --cuda-graph-impl transformer_engine"
    for flag in ("--cuda-graph-modules", "--cuda-graph-scope"):
        run = run_of(f"{SHAPE}{graphs} {flag} attn mlp")
        assert run.parallel.execution.cuda_graph_scope == ("attn", "mlp") and not run.ignored


def test_offload_flags_are_read_as_megatron_lm_runs_them() -> None:
    """--optimizer-cpu-offload (with the precision-aware optimizer Megatron-LM requires),
    --optimizer-offload-fraction and --cpu-offloading-num-layers are priced, not refused;
    the offload without the precision-aware optimizer, or offloading every layer, is
    refused as Megatron-LM refuses it."""
    run = run_of(SHAPE + " --bf16 --use-distributed-optimizer --optimizer-cpu-offload "
                 "--use-precision-aware-optimizer --overlap-cpu-optimizer-d2h-h2d "
                 "--optimizer-offload-fraction 0.5")
    offload = run.parallel.offload
    assert (offload.offload_optimizer, offload.optimizer_offload_fraction) == ("cpu", 0.5)
    layers = run_of(SHAPE + " --bf16 --cpu-offloading-num-layers 3")
    assert layers.parallel.offload.offload_activation_layers == 3
    assert "--use-precision-aware-optimizer" in error_of(
        SHAPE + " --bf16 --optimizer-cpu-offload")
    assert "must be from 0 to 7" in error_of(SHAPE + " --bf16 --cpu-offloading-num-layers 8")
    assert "offload_activation_layers needs one pipeline stage and no recomputation" in \
        error_of(SHAPE + " --bf16 --cpu-offloading-num-layers 2 --recompute-granularity full "
                 "--recompute-method uniform --recompute-num-layers 1")
