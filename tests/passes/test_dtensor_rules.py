"""passes.dtensor_rules: placement strings, fake meshes, redistribution collectives and the
op strategies DTensor registers; a shard moved between dims on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from passes.dtensor_rules import (
    Collective,
    UnsupportedRedistribution,
    fake_mesh,
    has_rule,
    is_supported,
    op_choices,
    parse_placements,
    placement_str,
    redistribute,
    redistribution,
    tensor_meta,
)
from runtime.comm_counter import CommCounter
from runtime.local_ranks import run_on_ranks

P = parse_placements


@pytest.fixture(autouse=True)
def _fresh_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def mesh4():
    return fake_mesh((4,))


# -- placement strings -----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["S(0)", "R", "P", "S(1)R", "RS(0)", "P(avg)", "PS(2)"])
def test_placement_string_round_trip(text: str) -> None:
    assert placement_str(parse_placements(text)) == text


@pytest.mark.parametrize(
    ("text", "placements"),
    [
        ("S(1)R", (Shard(1), Replicate())),
        ("RS(0)", (Replicate(), Shard(0))),
        ("P(avg)", (Partial("avg"),)),
        ("PS(2)", (Partial(), Shard(2))),
        ("", ()),
    ],
)
def test_parse_placements_builds_dtensor_placements(text: str, placements: tuple) -> None:
    assert parse_placements(text) == placements


def test_placement_str_of_no_placement() -> None:
    assert placement_str(None) == "-"


@pytest.mark.parametrize("text", ["Q", "RQ", "S0"])
def test_unparsable_placement_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse placement"):
        parse_placements(text)


# -- fake meshes -----------------------------------------------------------------------------


def test_fake_mesh_has_the_requested_shape() -> None:
    mesh = fake_mesh((2, 2))
    assert tuple(mesh.shape) == (2, 2)
    assert mesh.ndim == 2
    assert dist.get_world_size() == 4
    assert dist.get_backend() == "fake"


def test_fake_mesh_replaces_an_earlier_fake_group_of_another_size() -> None:
    assert tuple(fake_mesh((4,)).shape) == (4,)
    mesh = fake_mesh((2, 3))
    assert tuple(mesh.shape) == (2, 3)
    assert dist.get_world_size() == 6


# -- redistribution --------------------------------------------------------------------------


META = tensor_meta(torch.empty(8, 16))  # 512 bytes of float32


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        ("P", "R", [Collective("all_reduce", (0,), 512)]),
        ("S(0)", "R", [Collective("all_gather", (0,), 512)]),
        ("P", "S(0)", [Collective("reduce_scatter", (0,), 512)]),
        ("R", "S(0)", []),
        ("S(0)", "S(0)", []),
    ],
)
def test_redistribution_on_a_1d_mesh(mesh4, src: str, dst: str, expected: list) -> None:
    assert redistribution(mesh4, META, P(src), P(dst)) == expected


def test_shard_to_shard_on_a_cpu_mesh_is_one_all_to_all(mesh4) -> None:
    # gloo runs all_to_all_single, so `redistribute` moves a shard with one (DTensor itself
    # would all-gather on CPU): each rank sends and receives its local 128 bytes.
    assert mesh4.device_type == "cpu"
    assert redistribution(mesh4, META, P("S(0)"), P("S(1)")) == [
        Collective("all_to_all", (0,), 128)
    ]


def _move_shard(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16).requires_grad_()
    x = distribute_tensor(full.detach(), mesh, [Shard(0)]).requires_grad_()
    with CommCounter() as counter:
        y = redistribute(x, (Shard(1),))
        (y.to_local() * (rank + 1)).sum().backward()
    return {"local": y.to_local(), "grad": x.grad.to_local(), "counts": counter.by_kind(),
            "placements": placement_str(y.placements)}


def test_a_shard_moves_between_dims_by_all_to_all_on_gloo_with_its_gradient() -> None:
    results = run_on_ranks(_move_shard, 2)
    full = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16)
    for rank, result in enumerate(results):
        assert result["placements"] == "S(1)"
        assert torch.equal(result["local"], full.chunk(2, dim=1)[rank])
        # Forward and backward: one all-to-all each, 256 bytes (a rank's [4, 16] shard).
        assert result["counts"] == {"all_to_all": {"count": 2, "bytes": 512}}
        # d(sum over ranks of (rank + 1) * y_rank) / dx: column half c weighs c + 1.
        want = torch.cat([torch.ones(8, 8), 2 * torch.ones(8, 8)], dim=1).chunk(2, dim=0)[rank]
        assert torch.equal(result["grad"], want)


def test_redistribution_bytes_follow_the_dtype(mesh4) -> None:
    half = tensor_meta(torch.empty(8, 16, dtype=torch.bfloat16))
    assert redistribution(mesh4, half, P("P"), P("R")) == [Collective("all_reduce", (0,), 256)]


def test_an_even_plan_is_shared_by_every_mesh_of_as_many_axes() -> None:
    # Where the whole mesh divides every dim either end shards, DTensor's plan differs
    # between 2-D meshes only in the bytes each collective moves: every move of a
    # [16, 8, 1] tensor on 4x2, planned from the 2x2 and 2x4 plans, equals DTensor's own
    # plan on 4x2, bytes too (its batch dim of 1, never evenly split, is no obstacle).
    import itertools

    from passes import dtensor_rules

    meta = tensor_meta(torch.empty(16, 8, 1))
    ones = ["R", "P", "S(0)", "S(1)"]
    pairs = [(P(a + b), P(c + d)) for a, b, c, d in itertools.product(ones, repeat=4)
             if is_supported(P(a + b), P(c + d))]
    dtensor_rules._EVEN_PLANS.clear()
    for shape in ((2, 2), (2, 4)):
        mesh = fake_mesh(shape)
        for src, dst in pairs:
            redistribution(mesh, meta, src, dst)
    planned = len(dtensor_rules._EVEN_PLANS)
    mesh = fake_mesh((4, 2))
    warm = [redistribution(mesh, meta, src, dst) for src, dst in pairs]
    assert len(dtensor_rules._EVEN_PLANS) == planned
    cold = [dtensor_rules._sized(dtensor_rules._plan(mesh, meta, src, dst), meta, mesh)
            for src, dst in pairs]
    assert warm == cold
    # A gather over both axes of the 4x2 mesh holds all 512 bytes; its plan came from 2x2.
    assert redistribution(mesh, meta, P("S(0)S(1)"), P("RR"))[-1].nbytes == 512


def test_shard_to_partial_is_unsupported(mesh4) -> None:
    assert not is_supported(P("S(0)"), P("P"))
    assert is_supported(P("R"), P("P"))
    assert is_supported(P("P"), P("P"))
    assert is_supported(P("P"), P("R"))
    with pytest.raises(UnsupportedRedistribution, match="S\\(0\\) to P"):
        redistribution(mesh4, META, P("S(0)"), P("P"))


def test_two_axis_gather_collects_both_axes() -> None:
    mesh = fake_mesh((2, 2))
    collectives = redistribution(mesh, META, P("S(0)S(1)"), P("RR"))
    assert [c.kind for c in collectives] == ["all_gather", "all_gather"]
    assert sorted(d for c in collectives for d in c.mesh_dims) == [0, 1]
    # The last gather produces the whole 512-byte tensor.
    assert max(c.nbytes for c in collectives) == 512


# -- op strategies ---------------------------------------------------------------------------


def test_mm_offers_column_and_row_parallel_choices(mesh4) -> None:
    a, b = tensor_meta(torch.empty(8, 16)), tensor_meta(torch.empty(16, 32))
    out = tensor_meta(torch.empty(8, 32))
    candidates = [[P("R"), P("S(0)"), P("S(1)")]] * 2
    choices = op_choices(torch.ops.aten.mm.default, (a, b), {}, mesh4, candidates, out)
    assert choices is not None
    table = {(c.inputs, c.outputs) for c in choices}
    # Column parallel: replicated activations, weight split by columns -> output columns.
    assert ((P("R"), P("S(1)")), (P("S(1)"),)) in table
    # Row parallel: contraction dim split on both sides -> a partial sum.
    assert ((P("S(1)"), P("S(0)")), (P("P"),)) in table
    # Data parallel: rows of the activations.
    assert ((P("S(0)"), P("R")), (P("S(0)"),)) in table
    for choice in choices:
        assert len(choice.inputs) == 2 and len(choice.outputs) == 1


def test_op_without_a_rule_has_no_choices(mesh4) -> None:
    op = torch.ops.aten.nonzero.default  # data-dependent output shape: DTensor has no rule
    assert not has_rule(op)
    assert has_rule(torch.ops.aten.mm.default)
    x = tensor_meta(torch.empty(8, 16))
    assert op_choices(op, (x,), {}, mesh4, [[P("R")]], None) is None


@pytest.mark.parametrize("batch", [1, 4])
def test_cpu_attention_splits_batch_only_where_there_is_more_than_one(mesh4, batch) -> None:
    """A batch of one has nothing to split: no strategy labels it S(0) (DTensor's dispatch
    would otherwise pick such a strategy, of equal cost, from replicated inputs where the
    plan runs the attention replicated)."""
    q = tensor_meta(torch.empty(batch, 4, 8, 16))
    outputs = [tensor_meta(torch.empty(batch, 4, 8, 16)), tensor_meta(torch.empty(batch, 4, 8))]
    candidates = [[P("R"), P("S(0)"), P("S(1)")]] * 3
    choices = op_choices(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                         (q, q, q, 0.0, True), {}, mesh4, candidates, outputs)
    assert choices is not None
    produced = {c.outputs[0] for c in choices}
    assert (P("S(0)") in produced) == (batch > 1)
    assert {P("R"), P("S(1)")} <= produced  # heads split either way
