"""Cutting a forward into layers and stages (`passes.stage_graph`): where cuts may go, what a
stage program holds, and how whole tensors are routed between stages of any size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from passes.stage_graph import (
    backward_nodes,
    boundary_parameters,
    forward_at_batch,
    forward_graph,
    gradient_inputs,
    layer_cuts,
    micro_batch_inputs,
    piece_numel,
    routes,
    stage_graph,
    stage_outputs,
    stage_program,
)


class Chain(nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 8)
        self.tied = tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b(torch.relu(self.a(x))))
        if self.tied:  # the first layer's weight read again at the end, as a tied head is
            return torch.nn.functional.linear(x, self.a.weight.t())
        return self.c(x)


def _forward(model: nn.Module):
    with torch.device("meta"):
        model = model.to("meta")
    return forward_graph(model, micro_batch_inputs((torch.randn(4, 8),), 4))


def test_layers_balance_flops_and_may_split_a_tied_weight() -> None:
    forward = _forward(Chain())
    cuts = layer_cuts(forward, 3)
    assert cuts[0] == 0 and cuts[-1] == len(forward.ops) and len(cuts) == 4
    tied = _forward(Chain(tied=True))
    weight = next(n for n in tied.graph.nodes if tied.parameters.get(n.name) == "a.weight")
    uses = [tied.ops.index(u) for u in weight.users]
    assert max(uses) - min(uses) > 1  # read by the first layer and the last
    cuts = layer_cuts(tied, 3)
    assert len(cuts) == 4
    assert any(min(uses) < cut <= max(uses) for cut in cuts[1:-1])
    # Each stage holding a read of the weight holds the weight.
    values = dict(Chain(tied=True).to("meta").named_parameters())
    first = stage_graph(tied, cuts, 0, 1, values)
    last = stage_graph(tied, cuts, 2, 3, values)
    for stage in (first, last):
        assert "a.weight" in dict(stage.module.named_parameters())


def test_a_stage_program_receives_tensors_as_parameters_and_ends_in_their_gradients() -> None:
    model = Chain().to("meta")
    forward = _forward(model)
    cuts = layer_cuts(forward, 3)
    values = dict(model.named_parameters())
    inputs = micro_batch_inputs((torch.randn(4, 8),), 4)
    first = stage_graph(forward, cuts, 0, 1, values)
    last = stage_graph(forward, cuts, 1, len(cuts) - 1, values)
    assert not first.inputs and first.outputs and not first.is_last
    assert last.inputs and last.is_last
    program = stage_program(first, inputs)
    assert boundary_parameters(program) == []
    gradients = gradient_inputs(program, len(first.user_inputs))
    assert len(gradients) == len(first.outputs)
    later = backward_nodes(program, gradients)
    assert set(program.gradients) <= later  # every weight gradient waits for grad_K
    (sent,) = stage_outputs(program, gradients)
    assert sent not in later  # what is sent is computed before the gradient arrives
    program = stage_program(last, inputs)
    assert boundary_parameters(program) == ["tessel_boundary.0"]
    assert "tessel_boundary.0" in program.gradients.values()


@pytest.mark.parametrize("senders,receivers", [(1, 4), (2, 4), (4, 4), (4, 2), (8, 2), (3, 2)])
def test_every_receiver_gets_the_whole_tensor_once(senders: int, receivers: int) -> None:
    numel = 1000
    plan = routes(senders, receivers)
    assert len(plan) == receivers
    for route in plan:
        assert sum(piece_numel(numel, piece, pieces) for _, piece, pieces in route) == numel
        assert sorted(piece for _, piece, _ in route) == list(range(route[0][2]))
    sent = [sender for route in plan for sender, _, _ in route]
    if senders > receivers and senders % receivers == 0:
        assert sorted(sent) == list(range(senders))  # each sender sends one piece


class Flattening(nn.Module):
    """A view that folds the batch into another dim, as attention's reshapes do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x.reshape(-1, 8)).reshape(x.shape[0], 2, 8)


def _shapes(forward) -> list:
    return [tuple(n.meta["val"].shape) if isinstance(n.meta.get("val"), torch.Tensor)
            else None for n in forward.ops]


def test_another_batch_re_propagates_the_shapes_an_export_would_give() -> None:
    # The search's second micro-batch size: the first trace's graph with its shapes
    # propagated again, op for op and shape for shape what exporting again gives.
    model = Chain().to("meta")
    again = forward_at_batch(forward_graph(model, micro_batch_inputs((torch.randn(4, 8),), 4)),
                             4, 12)
    exported = forward_graph(model, micro_batch_inputs((torch.randn(4, 8),), 12))
    assert again is not None
    assert [n.target for n in again.ops] == [n.target for n in exported.ops]
    assert _shapes(again) == _shapes(exported)
    assert again.loss.meta["val"].shape == exported.loss.meta["val"].shape
    assert layer_cuts(again, 3) == layer_cuts(exported, 3)


def test_a_batch_folded_into_another_dim_is_exported_again() -> None:
    # Export writes the folded size ([4 * 2, 8]) into the graph: re-propagating it for a
    # batch of 12 fails, so the caller exports again.
    model = Flattening().to("meta")
    forward = forward_graph(model, micro_batch_inputs((torch.randn(4, 2, 8),), 4))
    assert forward_at_batch(forward, 4, 12) is None


def test_a_weight_as_wide_as_the_batch_is_exported_again() -> None:
    # A dim equal to the old batch that stays (a weight of width 4) could be a size the
    # graph wrote down: the shapes are not trusted.
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 8)).to("meta")
    forward = forward_graph(model, micro_batch_inputs((torch.randn(4, 8),), 4))
    assert forward_at_batch(forward, 4, 12) is None


class MaskedBlocks(nn.Module):
    """Blocks that each read a causal mask the model makes once, as a Hugging Face
    transformer passes its mask to every decoder layer; `transposed`: each block hands the
    next its output transposed, a view of another layout."""

    def __init__(self, transposed: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.transposed = transposed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        positions = torch.arange(s, device=x.device)
        mask = positions[:, None] >= positions[None, :]  # bool: no gradient to send back
        for k, layer in enumerate(self.layers):
            if self.transposed and k:
                x = x.transpose(1, 2)
            scores = (layer(x) @ x.transpose(1, 2)).masked_fill(~mask, 0.0)
            x = scores @ x
            if self.transposed:
                x = x.transpose(1, 2)
        return x


def _masked_forward(model: nn.Module):
    return forward_graph(model.to("meta"), micro_batch_inputs((torch.randn(2, 4, 8),), 2))


def test_a_mask_made_from_the_inputs_is_made_again_by_each_stage_not_sent() -> None:
    model = MaskedBlocks()
    forward = _masked_forward(model)
    cuts = layer_cuts(forward, 3)
    assert len(cuts) == 4  # one layer per block: the mask does not stop the cuts
    for cut in cuts[1:-1]:
        assert [n.meta["val"].dtype for n in forward.recomputed(cut)] == [torch.bool]
        assert all(n.meta["val"].is_floating_point() for n in forward.crossing(cut))
    values = dict(model.named_parameters())
    second = stage_graph(forward, cuts, 1, 2, values)
    # It receives the hidden state only, and computes the mask from the positions again.
    assert [tuple(v.shape) for v in second.inputs] == [(2, 4, 8)]
    ops = {getattr(n.target, "_overloadpacket", None) for n in second.module.graph.nodes}
    assert torch.ops.aten.ge in ops and torch.ops.aten.arange in ops
    inputs = micro_batch_inputs((torch.randn(2, 4, 8),), 2)
    program = stage_program(second, inputs)
    assert boundary_parameters(program) == ["tessel_boundary.0"]


def test_no_cut_where_a_view_of_another_layout_crosses() -> None:
    forward = _masked_forward(MaskedBlocks(transposed=True))
    for cut in range(1, len(forward.ops)):
        crossing = [n.meta["val"] for n in forward.crossing(cut)]
        if not all(v.is_contiguous() for v in crossing):
            assert not forward.can_cut(cut)
    assert layer_cuts(forward, 3) != layer_cuts(_masked_forward(MaskedBlocks()), 3)
