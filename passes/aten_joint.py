"""The joint forward + backward graph of a pipeline stage: a module that is already a
graph of core aten ops, cut from a traced forward (`passes.stage_graph`).

`passes.trace` captures a model whole, through AOTAutograd's joint export and its
functionalization. A stage's ops are already decomposed and functional, so its joint graph
is traced directly: `make_fx` over the forward and `torch.autograd.grad` of its loss, on
fake CPU tensors; the graph search traces hundreds of stages this way.
`trace_decomposed` does the same for a whole model's decomposed forward, where only
collectives are read.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from passes.annotation import annotate, without_objective_prefix
from passes.program import TracedProgram, decomposition_table
from passes.trace import LossFn, export_forward
from passes.sibling_views import merge_sibling_views

_CPU = torch.device("cpu")

Forward = Callable[[dict[str, torch.Tensor], list[Any]], torch.Tensor]
"""(parameters and buffers by FQN, inputs) -> the scalar loss."""


def trace_aten_module(module: fx.GraphModule, example_inputs: tuple[Any, ...]) -> TracedProgram:
    """The training step of `module`, whose forward returns its loss and whose parameters
    and buffers are its attributes. They and the inputs may be meta tensors: nothing is
    allocated."""
    def forward(state: dict[str, torch.Tensor], inputs: list[Any]) -> torch.Tensor:
        return torch.func.functional_call(module, state, tuple(inputs))

    return joint_program(forward, dict(module.named_parameters()), dict(module.named_buffers()),
                         list(example_inputs), module.graph, "make_fx")


def trace_decomposed(model: torch.nn.Module, example_inputs: tuple[Any, ...],
                     loss_fn: LossFn | None = None) -> TracedProgram:
    """The training step of `model` as the joint graph of its decomposed forward
    (`trace.export_forward`): the backward of the decomposed ops, where `trace` keeps a
    fused op's own backward (`silu_backward`), in about half the time. For programs read
    only for the collectives their shardings need (a block's intra-op ILP), which the
    elementwise ops a fused backward decomposes into do not change."""
    exported = export_forward(model, example_inputs, loss_fn)
    signature = exported.graph_signature
    values = {**exported.state_dict, **exported.constants}
    order = [(spec.kind.name, without_objective_prefix(spec.target or ""), spec.target)
             for spec in signature.input_specs]
    parameters = {fqn: values[t] for kind, fqn, t in order if kind == "PARAMETER"}
    # A lifted tensor constant is read like a buffer that is never saved.
    buffers = {fqn: values[t] for kind, fqn, t in order if kind in ("BUFFER", "CONSTANT_TENSOR")}
    loss_index = [spec.kind.name for spec in signature.output_specs].index("USER_OUTPUT")
    graph_module = exported.graph_module

    def forward(state: dict[str, torch.Tensor], inputs: list[Any]) -> torch.Tensor:
        given = iter(inputs)
        args = [next(given) if kind == "USER_INPUT" else state[fqn] for kind, fqn, _ in order]
        return fx.Interpreter(graph_module).run(*args)[loss_index]

    inputs = torch.utils._pytree.tree_leaves(tuple(example_inputs))
    return joint_program(forward, parameters, buffers, inputs, graph_module.graph,
                         "torch.export")


def joint_program(
    forward: Forward, parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
    inputs: list[Any], forward_graph: fx.Graph, method: str,
    keep_attention: bool = True,
) -> TracedProgram:
    """The joint graph of `forward`: placeholders for `parameters`, `buffers` and `inputs`
    in that order, outputs the loss and the gradient of every parameter that requires one
    and that the loss depends on. `forward_graph` (the aten forward, with module paths)
    annotates it as `passes.trace` does."""
    tensors = [*parameters.values(), *buffers.values(), *inputs]
    mode = detect_fake_mode([t for t in tensors if isinstance(t, FakeTensor)]) or FakeTensorMode()

    def fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor):
            return t
        if t.is_meta:
            return mode.fake_tensor_converter.from_meta_and_device(mode, t, _CPU)
        return mode.from_tensor(t)

    names = list(parameters)
    parameter_values = [fake(p.detach()).requires_grad_(p.requires_grad)
                        for p in parameters.values()]
    buffer_values = [fake(b) for b in buffers.values()]
    trainable = [i for i, p in enumerate(parameters.values()) if p.requires_grad]
    with_gradient: list[int] = []  # set while tracing: trainable parameters the loss reads

    def step(params: list, bufs: list, *xs: Any) -> tuple:
        state = {**dict(zip(names, params)), **dict(zip(buffers, bufs))}
        loss = forward(state, list(xs))
        grads = torch.autograd.grad(loss, [params[i] for i in trainable], allow_unused=True)
        with_gradient[:] = [i for i, g in zip(trainable, grads) if g is not None]
        return loss, tuple(g for g in grads if g is not None)

    with mode:
        gm = make_fx(step, decomposition_table=decomposition_table(keep_attention))(
            parameter_values, buffer_values, *[fake(x) for x in inputs])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    count_p, count_b = len(names), len(buffers)
    parameter_nodes = {n.name: f for n, f in zip(placeholders[:count_p], names)}
    buffer_nodes = {n.name: f for n, f in zip(placeholders[count_p:count_p + count_b], buffers)}
    user_inputs = [n.name for n in placeholders[count_p + count_b:]]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    loss, *grads = output.args[0]
    output.args = ((loss, *grads),)
    gradients = {g.name: names[i] for i, g in zip(with_gradient, grads)}
    # Called as the export path's programs are: flat arguments in, a flat tuple out.
    gm.graph._codegen = fx.graph.CodeGen()
    gm.graph.eliminate_dead_code()
    gm.recompile()
    gradient_modules = {name: fqn.rpartition(".")[0] for name, fqn in gradients.items()}
    annotate(gm.graph, forward_graph, parameter_nodes, buffer_nodes, loss.name, gradient_modules)
    merge_sibling_views(gm)
    return TracedProgram(gm, parameter_nodes, buffer_nodes, user_inputs, loss.name, gradients,
                         method=method)
