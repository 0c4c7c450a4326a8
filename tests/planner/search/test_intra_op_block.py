"""The intra-op ILP, run on traced transformer blocks, finds Megatron-LM's tensor +
sequence parallel layout: per block, two all-gathers and two reduce-scatters of the hidden
state in the forward pass and their mirror in the backward. These are the collectives
`cost_models/step_time.py` charges a stage per layer, so the training-plan search prices
stages with the sharding the ILP would choose for them."""

from __future__ import annotations

from collections import Counter

import pytest

from passes.dtensor_rules import fake_mesh
from passes.model_graph import trace_model
from passes.strategies import enumerate_strategies
from planner.vocabulary.cluster import Cluster
from planner.search.intra_op import plan_intra_op
from planner.models.sources import load_model
from planner.search import search
from planner.search.stage_ilp import layer_collectives

# GPT-3 2.7B's block shape (h 2560, 32 heads, s 2048), on the meta device.
SHAPE = dict(hidden_size=2560, num_attention_heads=32, seq_length=2048, vocab_size=51200)
FP32 = 4
HIDDEN = SHAPE["seq_length"] * SHAPE["hidden_size"] * FP32  # micro-batch 1, fp32 trace


def hidden_collectives(num_layers: int, tensor: int) -> Counter:
    """(phase, kind) -> count of the hidden-state-sized collectives the ILP plans for the
    whole training step of a `num_layers`-block GPT on a 1-D mesh of `tensor` GPUs."""
    loaded = load_model("gpt", {**SHAPE, "num_layers": num_layers})
    program = trace_model(loaded.build, None).program
    mesh = fake_mesh((tensor,))
    cluster = Cluster.load("dgx-a100-80g")
    table = enumerate_strategies(program, mesh, cluster.device)
    # Untied: on 2 tensor-parallel GPUs the best plan does not lay out every block alike
    # (it is 0.01% cheaper than the best that does); the tied plan, which `plan` makes,
    # adds two more backward all-gathers per block instead of Megatron's pattern.
    solution = plan_intra_op(program, table, mesh, cluster, time_limit_s=60, tie_blocks=False)
    return Counter(
        (transfer.phase, collective.kind)
        for transfer in solution.transfers
        for collective in transfer.collectives
        if collective.nbytes == HIDDEN
    )


@pytest.mark.parametrize("tensor, backward_gathers", [(2, 4), (8, 2)])
def test_each_block_adds_megatron_sequence_parallel_collectives(
        tensor: int, backward_gathers: int) -> None:
    """One more block adds exactly two all-gathers and two reduce-scatters of the hidden
    state in the forward: Megatron-LM's sequence-parallel layout (column-parallel q/k/v
    and fc1 after one all-gather each, row-parallel o_proj and fc2 before a
    reduce-scatter), and their mirror in the backward. On 2 GPUs the backward gathers
    each column-parallel input again for its weight gradient, as Megatron-LM does (4
    all-gathers); on 8 it computes the weight gradients without gathering the input
    again (2)."""
    two, three = hidden_collectives(2, tensor), hidden_collectives(3, tensor)
    added = {key: three[key] - two[key] for key in set(two) | set(three)}
    expected = {(phase, kind): 2 for phase in ("forward", "backward")
                for kind in ("all_gather", "reduce_scatter")}
    expected["backward", "all_gather"] = backward_gathers
    assert {k: v for k, v in added.items() if v} == expected


@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama3-8b"])
def test_stage_collectives_from_the_ilp_are_megatrons(name: str) -> None:
    """`plan --intra-op ilp` charges each layer what the ILP chose on the traced block:
    for GPT and Llama blocks, 2 all-gathers + 2 reduce-scatters of the hidden state (2h
    bf16 bytes per token) on every tensor-parallel degree, so the best plan and its step
    time equal the analytic model's."""
    loaded = load_model(name)
    graph = trace_model(loaded.build, loaded.num_layers, decomposed_backward=True)
    cluster = Cluster.load("dgx-a100-80g")
    collectives, _ = layer_collectives(graph, cluster, [2, 8])
    # One forked process per degree solves the same ILPs, and the block's own backward
    # ops (a fused silu_backward) need the collectives the decomposed one does.
    assert layer_collectives(graph, cluster, [2, 8], processes=2)[0] == collectives
    exact = trace_model(loaded.build, loaded.num_layers)
    assert layer_collectives(exact, cluster, [2, 8], processes=2)[0] == collectives
    hidden = 2 * loaded.config.hidden_size
    for degree in (2, 8):
        kinds = Counter((c.kind, c.bytes_per_token) for c in collectives[degree])
        assert kinds == {("all_gather", hidden): 2, ("reduce_scatter", hidden): 2}
    sized = cluster.with_devices(64)
    fixed = {"tensor": 2, "sequence_parallel": True}
    analytic = search(loaded.config, sized, 512, fixed, "megatron").ranked[0]
    from_ilp = search(loaded.config, sized, 512, fixed, "megatron",
                      collectives=collectives).ranked[0]
    assert from_ilp[0] == analytic[0]
    assert from_ilp[1].step_time_s == pytest.approx(analytic[1].step_time_s, rel=1e-12)
