"""Megatron-LM's tolerance, as Megatron-LM has it: where its `validate_args` (megatron/
training/arguments.py) or Megatron-Core's `TransformerConfig.__post_init__` adjust a
setting with a warning instead of refusing it, the launch line is read with the same
adjustment and one note says so; what they refuse stays refused, by name."""

from __future__ import annotations

import pytest

from tests.planner.megatron.test_run import error_of, run_of

SHAPE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --vocab-size 32768 --micro-batch-size 1 --bf16 "
         "--global-batch-size 8")

# NVIDIA's examples/llama/train_llama3_8b_h100_fp8.sh (Megatron-LM d98e8a64): its model,
# precision, parallel and DDP flags as the script's arrays hold them, TP_SIZE=1 with
# "--sequence-parallel  # Always enable sequence parallelism with TP_SIZE=2".
LLAMA3_8B_FP8 = """
--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
--seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
--rotary-base 1000000 --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0
--swiglu --normalization RMSNorm --init-method-std 0.0134 --attention-backend fused
--apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
--micro-batch-size 1 --global-batch-size 128 --bf16 --grad-reduce-in-bf16
--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
--fp8-param-gather
--tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel
--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
--vocab-size 128256
"""


def test_nvidias_llama3_8b_fp8_example_runs_without_sequence_parallelism() -> None:
    run = run_of(LLAMA3_8B_FP8)
    q = run.parallel
    assert (q.dims.tensor, q.dims.data, q.sharding.sequence_parallel) == (1, 8, False)
    assert (q.numerics.precision, q.sharding.zero_stage, q.overlap.overlap_param_gather) == (
        "fp8", 1, True)
    assert run.notes == ["--sequence-parallel is off: Megatron-LM turns it off at "
                         "--tensor-model-parallel-size 1 (it shards over the tensor-parallel "
                         "group)"]


def test_sequence_parallelism_stays_on_with_a_tensor_group() -> None:
    run = run_of(SHAPE + " --tensor-model-parallel-size 2 --sequence-parallel")
    assert run.parallel.sharding.sequence_parallel and run.notes == []


def test_the_tp_overlap_still_needs_the_sequence_parallelism_tensor_size_1_turns_off() -> None:
    # validate_args turns --sequence-parallel off, then asserts --tp-comm-overlap has it.
    assert error_of(SHAPE + " --sequence-parallel --tp-comm-overlap") == (
        "--tp-comm-overlap needs sequence parallelism, which Megatron-LM turns off at "
        "--tensor-model-parallel-size 1; drop the overlap or raise the tensor size")


def test_recompute_activations_makes_full_recomputation_selective() -> None:
    run = run_of(SHAPE + " --recompute-activations --recompute-granularity full")
    assert run.parallel.recomputation.recompute == "selective"
    assert run.notes == ["--recompute-activations makes the recomputation selective, over "
                         "--recompute-granularity full, as Megatron-LM does"]
    # Selective, Megatron-LM then asserts there is no --recompute-method.
    assert error_of(SHAPE + " --recompute-activations --recompute-granularity full "
                    "--recompute-method uniform --recompute-num-layers 1") == (
        "--recompute-method applies only with --recompute-granularity full, which "
        "--recompute-activations turns selective, as Megatron-LM does; drop one of them")


def test_an_absent_global_batch_is_micro_batch_times_data_parallel_said_in_a_note() -> None:
    run = run_of(SHAPE.replace(" --global-batch-size 8", "") + " --micro-batch-size 2",
                 world=16)
    assert run.parallel.batch.global_batch_size == 32
    assert run.notes == ["no --global-batch-size: Megatron-LM takes micro batch 2 x "
                         "data-parallel size 16 = 32"]


# (flags, notes, whole layers graphed, their graphed parts, token dispatcher)
@pytest.mark.parametrize("extra, notes, graphs, scope, dispatcher", [
    ("--enable-cuda-graph",
     ["--enable-cuda-graph is deprecated: Megatron-LM reads it as --cuda-graph-impl local"],
     True, (), "allgather"),
    ("--external-cuda-graph",
     ["--external-cuda-graph is deprecated: Megatron-LM reads it as --cuda-graph-impl "
      "transformer_engine"], True, (), "allgather"),
    ("--cuda-graph-impl transformer_engine --cuda-graph-scope attn",
     ["--cuda-graph-scope is deprecated: Megatron-LM reads it as --cuda-graph-modules"],
     False, ("attn",), "allgather"),
    ("--cuda-graph-impl transformer_engine --cuda-graph-scope full",
     ["--cuda-graph-scope is deprecated: Megatron-LM reads it as --cuda-graph-modules",
      "--cuda-graph-scope full is deprecated: Megatron-LM graphs whole layers, as with no "
      "scope"], True, (), "allgather"),
    ("--num-experts 8 --moe-ffn-hidden-size 512 --moe-token-dispatcher-type flex "
     "--moe-enable-deepep",
     ["--moe-enable-deepep is deprecated: Megatron-LM reads it as "
      "--moe-flex-dispatcher-backend deepep"], False, (), "flex"),
])
def test_a_deprecated_flag_is_read_as_its_successor_with_a_note(
    extra: str, notes: list[str], graphs: bool, scope: tuple[str, ...], dispatcher: str
) -> None:
    run = run_of(f"{SHAPE} {extra}")
    q = run.parallel
    assert run.notes == notes
    assert (q.execution.cuda_graphs, q.execution.cuda_graph_scope,
            q.moe.moe_token_dispatcher) == (graphs, scope, dispatcher)


def test_experts_without_a_width_are_as_wide_as_the_dense_mlp() -> None:
    run = run_of(SHAPE + " --num-experts 8")
    assert (run.model.num_experts, run.model.ffn_hidden_size) == (8, 4096)
    assert run.model.moe_ffn_hidden_size is None  # the zoo's "as wide as the dense MLP"
    assert run.notes == ["no --moe-ffn-hidden-size: Megatron-LM makes each expert "
                         "--ffn-hidden-size 4,096 wide"]


def test_an_expert_width_without_experts_is_ignored_only_beside_dense_layers() -> None:
    # TransformerConfig.__post_init__: ignored (a warning) when --moe-layer-freq leaves
    # dense layers, a ValueError when every layer would be MoE.
    run = run_of(SHAPE + " --moe-ffn-hidden-size 512 --moe-layer-freq 2")
    assert (run.model.num_experts, run.model.ffn_hidden_size) == (None, 4096)
    assert run.notes == ["--moe-ffn-hidden-size is ignored: the line has no --num-experts, "
                         "so every layer is dense, as Megatron-Core reads it"]
    assert error_of(SHAPE + " --moe-ffn-hidden-size 512") == (
        "--moe-ffn-hidden-size sizes experts, and the line has no --num-experts, which "
        "Megatron-Core refuses; add --num-experts or drop it")


def test_zero_experts_are_none_as_megatron_reads_them_said_in_a_note() -> None:
    # validate_args: "if args.num_experts == 0: args.num_experts = None".
    run = run_of(SHAPE + " --num-experts 0")
    assert run.model.num_experts is None
    assert "--num-experts 0: Megatron-LM builds no experts (it reads 0 as none), a dense " \
        "model" in run.notes


def test_an_unbounded_mtp_depth_is_refused_as_plan_refuses_it() -> None:
    assert error_of(SHAPE + " --mtp-num-layers 100000000") == (
        "--mtp-num-layers 100000000 must be from 1 to 1,024; give a count in range")
