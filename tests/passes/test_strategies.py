"""passes.strategies: the candidate shardings of every node of a traced training step on a
fake logical mesh, with their compute and memory costs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard

from passes.dtensor_rules import fake_mesh, parse_placements, placement_str
from passes.strategies import (
    TRAINING_STATE_COPIES,
    training_state_bytes,
    NodeStrategies,
    Strategy,
    enumerate_strategies,
    fallback_nodes,
    is_even,
    shard_factor,
)
from passes.program import TracedProgram
from passes.trace import trace
from planner.vocabulary.cluster import Cluster
from planner.models import demo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from models_without_rules import nearest_centers  # noqa: E402

P = parse_placements
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def device():
    return Cluster.load("cpu").device


@pytest.fixture(scope="module")
def mlp() -> TracedProgram:
    torch.manual_seed(0)
    model, inputs = demo.mlp(batch=8, in_features=32, hidden=64, out_features=16)
    return trace(model, inputs)


@pytest.fixture(scope="module")
def gpt() -> TracedProgram:
    torch.manual_seed(0)
    model, inputs = demo.gpt()
    return trace(model, inputs)


def _node_of(program: TracedProgram, fqn: str) -> str:
    return next(name for name, f in program.parameters.items() if f == fqn)


def _addmm(program: TracedProgram, weight_fqn: str) -> str:
    """The forward addmm whose mat2 is the transpose of `weight_fqn`."""
    weight = program.nodes[_node_of(program, weight_fqn)]
    for node in program.graph.nodes:
        if node.target == aten.addmm.default and node.args[2].args[0] is weight:
            return node.name
    raise AssertionError(f"no addmm reads {weight_fqn}")


def _text(strategy: Strategy) -> tuple:
    return (
        tuple(placement_str(p) for p in strategy.inputs),
        tuple(placement_str(p) if p is not None else None for p in strategy.outputs),
        placement_str(strategy.produced) if strategy.produced is not None else None,
    )


def _outputs(node: NodeStrategies) -> set[str]:
    return {placement_str(s.outputs[0]) for s in node.strategies}


# -- placeholders --------------------------------------------------------------------------------


def test_parameters_get_every_even_placement_on_a_1d_mesh(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((4,)), device)
    weight = table[_node_of(mlp, "fc1.weight")]  # [64, 32]
    bias = table[_node_of(mlp, "fc1.bias")]  # [64]
    assert weight.kind == bias.kind == "parameter"
    assert _outputs(weight) == {"R", "S(0)", "S(1)"}
    assert _outputs(bias) == {"R", "S(0)"}
    # Training state (weight, gradient, two Adam moments) divided by the shards.
    full = 64 * 32 * 4 * TRAINING_STATE_COPIES
    memory = {placement_str(s.outputs[0]): s.memory_bytes for s in weight.strategies}
    assert memory == {"R": full, "S(0)": full / 4, "S(1)": full / 4}
    assert table[mlp.user_inputs[0]].kind == "input"


def test_a_half_precision_parameter_holds_megatrons_18_bytes_per_element() -> None:
    # bf16 weight, fp32 gradient accumulator, fp32 master weight and two moments.
    weight = torch.empty(64, 32, dtype=torch.bfloat16, device="meta")
    assert training_state_bytes(weight) == 64 * 32 * 18
    assert training_state_bytes(weight.float()) == 64 * 32 * 4 * TRAINING_STATE_COPIES


def test_parameters_get_every_even_placement_on_a_2d_mesh(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((2, 2)), device)
    weight = table[_node_of(mlp, "fc1.weight")]  # [64, 32]
    bias = table[_node_of(mlp, "fc1.bias")]  # [64]
    assert _outputs(weight) == {
        a + b for a in ("R", "S(0)", "S(1)") for b in ("R", "S(0)", "S(1)")
    }
    assert _outputs(bias) == {"RR", "RS(0)", "S(0)R", "S(0)S(0)"}


def test_uneven_shards_are_not_offered(gpt, device) -> None:
    # Token ids are [2, 16]: the batch of 2 cannot be split 4 ways.
    table = enumerate_strategies(gpt, fake_mesh((4,)), device)
    assert _outputs(table[gpt.user_inputs[0]]) == {"R", "S(1)"}


@pytest.mark.parametrize(
    ("placements", "shape", "mesh_shape", "even"),
    [
        ("S(0)", (6, 4), (4,), False),
        ("S(1)", (6, 4), (4,), True),
        ("R", (6, 4), (4,), True),
        ("S(0)R", (6, 4), (2, 2), True),
        ("S(0)S(0)", (6, 4), (2, 2), False),
        ("S(2)", (6, 4), (4,), False),
        ("P", (6, 4), (4,), True),
    ],
)
def test_is_even(placements, shape, mesh_shape, even) -> None:
    assert is_even(P(placements), shape, fake_mesh(mesh_shape)) is even


def test_shard_factor_counts_split_and_partial_axes() -> None:
    mesh = fake_mesh((2, 2))
    assert shard_factor(P("RR"), mesh) == 1
    assert shard_factor(P("S(0)R"), mesh) == 2
    assert shard_factor(P("S(0)P"), mesh) == 4
    assert shard_factor(None, mesh) == 1


# -- linear layers ---------------------------------------------------------------------------


def test_fc1_offers_column_parallel(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((4,)), device)
    node = table[_addmm(mlp, "fc1.weight")]
    assert node.kind == "op"
    # Sources are (bias, input, weight^T), in aten.addmm's argument order.
    kinds = [mlp.nodes[s].op for s, _ in node.sources]
    assert kinds == ["placeholder", "placeholder", "call_function"]
    strategies = {_text(s) for s in node.strategies}
    assert (("S(0)", "R", "S(1)"), ("S(1)",), None) in strategies
    assert (("R", "R", "R"), ("R",), None) in strategies


def test_fc2_offers_row_parallel_with_and_without_the_all_reduce(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((4,)), device)
    strategies = {_text(s) for s in table[_addmm(mlp, "fc2.weight")].strategies}
    # Partial sums leave the node as they are...
    assert (("P", "S(1)", "S(0)"), ("P",), None) in strategies
    # ...or are all-reduced inside the node, so every consumer reads a replicated value.
    assert (("P", "S(1)", "S(0)"), ("R",), "P") in strategies


def test_sharding_an_op_4_ways_divides_its_compute_time_by_4(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((4,)), device)
    node = table[_addmm(mlp, "fc1.weight")]
    by_output = {}
    for s in node.strategies:
        if s.produced is None:
            by_output.setdefault(placement_str(s.outputs[0]), s.compute_s)
    replicated = by_output["R"]
    assert replicated > 0
    for placement in ("S(0)", "S(1)", "P"):
        assert by_output[placement] == pytest.approx(replicated / 4, rel=1e-6)


def test_saved_activations_cost_memory_and_sharding_divides_it(mlp, device) -> None:
    table = enumerate_strategies(mlp, fake_mesh((4,)), device)
    relu = next(n.name for n in mlp.graph.nodes if n.target == aten.relu.default)
    memory = {placement_str(s.outputs[0]): s.memory_bytes for s in table[relu].strategies}
    # relu([8, 64]) fp32 is read by the backward pass.
    assert memory == {"R": 8 * 64 * 4, "S(0)": 8 * 64, "S(1)": 8 * 64}


# -- whole programs ----------------------------------------------------------------------------


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)])
def test_every_strategy_is_even_and_every_op_node_can_replicate(mlp, device, mesh_shape) -> None:
    mesh = fake_mesh(mesh_shape)
    table = enumerate_strategies(mlp, mesh, device)
    replicated = tuple(Replicate() for _ in mesh_shape)
    assert fallback_nodes(table) == []
    for name, node in table.items():
        assert node.strategies, name
        for s in node.strategies:
            assert len(s.inputs) == len(node.sources), name
            for placements, (source, index) in zip(s.inputs, node.sources):
                value = mlp.nodes[source].meta["val"]
                value = value[index] if isinstance(value, (tuple, list)) else value
                assert is_even(placements, value.shape, mesh), (name, placements)
        if node.kind in ("op", "factory"):
            assert any(all(p == replicated for p in s.outputs) for s in node.strategies), name


def test_no_partial_placement_on_integer_tensors(gpt, device) -> None:
    table = enumerate_strategies(gpt, fake_mesh((4,)), device)
    checked = 0
    for name, node in table.items():
        value = gpt.nodes[name].meta["val"]
        outputs = value if isinstance(value, (tuple, list)) else (value,)
        inputs = []
        for source, index in node.sources:
            v = gpt.nodes[source].meta["val"]
            inputs.append(v[index] if isinstance(v, (tuple, list)) else v)
        for s in node.strategies:
            pairs = list(zip(s.inputs, inputs)) + list(zip(s.outputs, outputs))
            if s.produced is not None:
                pairs.append((s.produced, outputs[0]))
            for placements, tensor in pairs:
                if placements is None or not isinstance(tensor, torch.Tensor):
                    continue
                if not tensor.dtype.is_floating_point:
                    checked += 1
                    assert not any(p.is_partial() for p in placements), (name, s)
    assert checked > 0  # the token ids and the masks built from them were seen


def test_token_ids_may_be_sharded_along_the_sequence(gpt, device) -> None:
    table = enumerate_strategies(gpt, fake_mesh((4,)), device)
    embedding = next(n for n in gpt.graph.nodes if n.target == aten.embedding.default)
    assert any(
        s.outputs[0] == (Shard(1),) for s in table[embedding.name].strategies
    ), "the embedding of sequence-sharded ids should stay sequence-sharded"


def test_an_op_without_a_rule_falls_back_to_replication(device) -> None:
    model, inputs = nearest_centers()
    program = trace(model, inputs)
    table = enumerate_strategies(program, fake_mesh((4,)), device)
    fallbacks = fallback_nodes(table)
    targets = {program.nodes[n].target for n in fallbacks}
    assert targets == {aten._cdist_forward.default, aten._cdist_backward.default}
    replicated = (Replicate(),)
    for name in fallbacks:
        (only,) = table[name].strategies
        assert all(p == replicated for p in only.inputs)
        assert all(p == replicated for p in only.outputs)
        assert only.compute_s > 0
    # The rest of the model is still planned with real choices.
    linear = next(n for n in program.graph.nodes if n.target == aten.addmm.default)
    assert table[linear.name].kind == "op" and len(table[linear.name].strategies) > 1


def _as_text(table: dict[str, NodeStrategies]) -> dict[str, list[tuple]]:
    return {name: [(tuple(map(placement_str, s.inputs)),
                    tuple(placement_str(p) if p is not None else None for p in s.outputs),
                    placement_str(s.produced) if s.produced is not None else None,
                    s.compute_s, s.memory_bytes) for s in node.strategies]
            for name, node in table.items()}


def test_a_layer_of_other_widths_reuses_the_cached_ways_exactly(device) -> None:
    # Two MLPs that differ only in widths (every width split by the 2x2 mesh) ask DTensor
    # mostly the same questions: the second, built mostly from the first's cached ways,
    # must equal its own enumeration from empty caches, placements and costs alike.
    from passes.strategies import _RuleCache

    def program(hidden: int) -> TracedProgram:
        torch.manual_seed(0)
        model, inputs = demo.mlp(batch=8, in_features=32, hidden=hidden, out_features=16)
        return trace(model, inputs)

    narrow, wide = program(64), program(96)
    mesh = fake_mesh((2, 2))
    _RuleCache._answers.clear()
    enumerate_strategies(narrow, mesh, device)
    asked = len(_RuleCache._answers)
    warm = enumerate_strategies(wide, mesh, device)
    new = len(_RuleCache._answers) - asked
    _RuleCache._answers.clear()
    cold = enumerate_strategies(wide, mesh, device)
    assert new < len(_RuleCache._answers) / 4  # views of sizes are asked again, the rest not
    assert _as_text(warm) == _as_text(cold)
    assert any(len(node.strategies) > 10 for node in cold.values())


def test_a_table_on_another_2d_mesh_reuses_dtensors_answers_exactly(device, monkeypatch) -> None:
    # Where every dim splits over the whole mesh (or is 1), a rule reads the axes' sizes
    # only to ask that, so it answers alike on every 2-D mesh: a transformer's 4x2 table
    # (views, attention, layer norms, embedding and loss), built wholly from the 2x2 and
    # 2x4 tables' answers, equals the one built asking DTensor each time, costs too.
    from passes.strategies import _RuleCache

    torch.manual_seed(0)
    model, inputs = demo.gpt(batch=8, seq_len=16, vocab=64, hidden=64, heads=8, layers=1)
    program = trace(model, inputs)
    _RuleCache._answers.clear()
    enumerate_strategies(program, fake_mesh((2, 2)), device)
    enumerate_strategies(program, fake_mesh((2, 4)), device)
    asked = len(_RuleCache._answers)
    warm = enumerate_strategies(program, fake_mesh((4, 2)), device)
    assert len(_RuleCache._answers) == asked  # nothing asked again
    monkeypatch.setattr(_RuleCache, "_key", lambda self, *args: None)
    cold = enumerate_strategies(program, fake_mesh((4, 2)), device)
    _RuleCache._answers.clear()
    assert _as_text(warm) == _as_text(cold)
    assert any(len(node.strategies) > 10 for node in cold.values())
