"""passes.trace: one joint forward + backward aten graph per model, with the model's own
parameter names, shapes on every node, module paths and phases, and a usable error when a
model cannot be traced."""

from __future__ import annotations

import inspect
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from passes.program import TracedProgram
from passes.trace import TraceError, trace
from planner.models import demo

aten = torch.ops.aten
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default
SDPA_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.fixture(scope="module")
def mlp_traced() -> tuple[nn.Module, tuple[torch.Tensor, ...], TracedProgram]:
    torch.manual_seed(0)
    model, inputs = demo.mlp(batch=8, in_features=32, hidden=64, out_features=16)
    return model, inputs, trace(model, inputs)


@pytest.fixture(scope="module")
def gpt_traced() -> tuple[nn.Module, tuple[torch.Tensor, ...], TracedProgram]:
    torch.manual_seed(0)
    model, inputs = demo.gpt()
    return model, inputs, trace(model, inputs)


@pytest.fixture(params=["mlp", "gpt"])
def traced(request, mlp_traced, gpt_traced):
    return {"mlp": mlp_traced, "gpt": gpt_traced}[request.param]


def _placeholders(program: TracedProgram) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.op == "placeholder"]


def _outputs(program: TracedProgram) -> list[str]:
    (output,) = [n for n in program.graph.nodes if n.op == "output"]
    return [a.name for a in output.args[0]]


def _run(program: TracedProgram, model: nn.Module, inputs) -> dict[str, torch.Tensor]:
    """Execute the traced training step on the model's real weights: output name -> value."""
    params = dict(model.named_parameters())
    user = dict(zip(program.user_inputs, inputs))
    args = [
        params[program.parameters[n.name]].detach()
        if n.name in program.parameters
        else user[n.name]
        for n in _placeholders(program)
    ]
    return dict(zip(_outputs(program), program.graph_module(*args)))


# -- names -----------------------------------------------------------------------------------


def test_parameter_names_are_the_models_own(traced) -> None:
    model, _, program = traced
    assert sorted(program.parameters.values()) == sorted(n for n, _ in model.named_parameters())
    assert program.buffers == {}
    assert program.method == "aot_autograd"


def test_every_parameter_has_exactly_one_gradient_output(traced) -> None:
    model, _, program = traced
    names = {n for n, _ in model.named_parameters()}
    assert set(program.gradients.values()) == names
    assert len(program.gradients) == len(names)
    outputs = _outputs(program)
    assert outputs[0] == program.loss
    assert set(outputs[1:]) == set(program.gradients)


# -- shapes ----------------------------------------------------------------------------------


def test_placeholders_carry_the_shapes_of_parameters_and_inputs(traced) -> None:
    model, inputs, program = traced
    params = dict(model.named_parameters())
    placeholders = _placeholders(program)
    assert [n.name for n in placeholders[-len(inputs):]] == program.user_inputs
    for node in placeholders:
        value = node.meta["val"]
        assert isinstance(value, torch.Tensor), node.name
        if node.name in program.parameters:
            param = params[program.parameters[node.name]]
            assert (tuple(value.shape), value.dtype) == (tuple(param.shape), param.dtype)
    for name, example in zip(program.user_inputs, inputs):
        value = program.nodes[name].meta["val"]
        assert (tuple(value.shape), value.dtype) == (tuple(example.shape), example.dtype)


def test_every_op_that_feeds_another_has_a_traced_value(traced) -> None:
    _, _, program = traced
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if not node.users:  # shape assertions export leaves behind return nothing
            continue
        value = node.meta.get("val")
        leaves = value if isinstance(value, (tuple, list)) else [value]
        assert any(isinstance(v, torch.Tensor) for v in leaves), (node.name, node.target)


def test_gradients_have_the_shape_of_their_parameter(traced) -> None:
    model, _, program = traced
    params = dict(model.named_parameters())
    for output, fqn in program.gradients.items():
        assert program.nodes[output].meta["val"].shape == params[fqn].shape, fqn


def test_loss_is_a_floating_point_scalar(traced) -> None:
    _, _, program = traced
    value = program.nodes[program.loss].meta["val"]
    assert value.shape == () and value.dtype.is_floating_point


# -- the graph is the training step -------------------------------------------------------------


def assert_runs_like_autograd(program: TracedProgram, model: nn.Module, inputs) -> None:
    """The graph's loss is the default loss of `model` and its gradients are autograd's."""
    values = _run(program, model, inputs)
    model.zero_grad()
    expected = (model(*inputs) ** 2).mean()
    expected.backward()
    torch.testing.assert_close(values[program.loss], expected.detach())
    params = dict(model.named_parameters())
    for output, fqn in program.gradients.items():
        torch.testing.assert_close(values[output], params[fqn].grad, msg=fqn)
    model.zero_grad()


def test_running_the_graph_gives_the_default_loss_and_autograd_gradients(mlp_traced) -> None:
    model, inputs, program = mlp_traced
    assert_runs_like_autograd(program, model, inputs)


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_custom_loss_fn_receives_the_inputs_and_becomes_the_loss() -> None:
    torch.manual_seed(0)
    model = _Classifier()
    inputs = (torch.randn(4, 8), torch.randint(0, 5, (4,)))
    program = trace(model, inputs, loss_fn=lambda out, x, target: F.cross_entropy(out, target))

    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert aten._log_softmax.default in targets
    assert len(program.user_inputs) == 2
    loss = _run(program, model, inputs)[program.loss]
    torch.testing.assert_close(loss, F.cross_entropy(model(*inputs), inputs[1]).detach())
    assert not torch.allclose(loss, (model(*inputs) ** 2).mean())


# -- module paths and phases ------------------------------------------------------------------


def test_forward_linear_ops_carry_their_module_path(mlp_traced) -> None:
    _, _, program = mlp_traced
    (x,) = program.user_inputs
    addmms = [n for n in program.graph.nodes if n.target == aten.addmm.default]
    assert len(addmms) == 2
    fc1 = next(n for n in addmms if program.nodes[x] in n.all_input_nodes)
    fc2 = next(n for n in addmms if n is not fc1)
    assert (fc1.meta["tessel_module"], fc1.meta["tessel_phase"]) == ("fc1", "forward")
    assert (fc2.meta["tessel_module"], fc2.meta["tessel_phase"]) == ("fc2", "forward")
    weight = next(n for n, fqn in program.parameters.items() if fqn == "fc1.weight")
    assert program.nodes[weight].meta["tessel_module"] == "fc1"


def test_nodes_after_the_loss_are_backward(traced) -> None:
    _, _, program = traced
    phases = []
    seen_loss = False
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        phases.append(node.meta["tessel_phase"])
        assert node.meta["tessel_phase"] == ("backward" if seen_loss else "forward"), node.name
        seen_loss = seen_loss or node.name == program.loss
    assert seen_loss and "backward" in phases
    for output in program.gradients:
        assert program.nodes[output].meta["tessel_phase"] == "backward"


# -- attention ----------------------------------------------------------------------------------


def test_attention_stays_one_fused_op_per_block(gpt_traced) -> None:
    _, _, program = gpt_traced
    forward = [n for n in program.graph.nodes if n.target == SDPA]
    backward = [n for n in program.graph.nodes if n.target == SDPA_BACKWARD]
    assert len(forward) == 2 and len(backward) == 2
    assert [n.meta["tessel_phase"] for n in forward] == ["forward", "forward"]
    assert [n.meta["tessel_phase"] for n in backward] == ["backward", "backward"]
    assert [n.meta["tessel_module"] for n in forward] == ["blocks.0.attn", "blocks.1.attn"]
    # [batch, heads, seq, head_dim] for demo.gpt(): batch 2, 4 heads, seq 16, hidden 64.
    assert all(n.meta["val"][0].shape == (2, 4, 16, 16) for n in forward)
    assert not any("_math" in str(n.target) for n in program.graph.nodes)


def test_attention_backward_carries_the_path_of_its_own_block(gpt_traced) -> None:
    _, _, program = gpt_traced
    for node in program.graph.nodes:
        if node.target != SDPA_BACKWARD:
            continue
        producers = {
            a.args[0] if a.target is operator.getitem else a for a in node.all_input_nodes
        }
        (forward,) = [p for p in producers if p.target == SDPA]
        block = forward.meta["tessel_module"]  # "blocks.0.attn" / "blocks.1.attn"
        assert node.meta["tessel_module"].startswith(block.rpartition(".")[0] + "."), (
            node.name, node.meta["tessel_module"], block,
        )


# -- failures ------------------------------------------------------------------------------------


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


def test_data_dependent_control_flow_raises_a_trace_error_naming_the_line() -> None:
    lines, start = inspect.getsourcelines(_DataDependent.forward)
    line = start + next(i for i, text in enumerate(lines) if "if x.sum()" in text)

    with pytest.raises(TraceError) as info:
        trace(_DataDependent(), (torch.randn(2, 4),))

    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert message.startswith("could not trace the model in _DataDependent (the model) at ")
    assert f"{__file__}:{line} (if x.sum() > 0:)" in message
    assert "control flow or a shape depends on tensor values" in message
    assert "torch.where" in message
    assert "\n" not in message  # one line, not export's whole graph dump
