"""The joint forward + backward graph of a training objective (`nn.Module` -> scalar loss),
traced once.

AOTAutograd's joint export (`aot_export_joint_with_descriptors`, the tracer Meta's
AutoParallel plans on) runs the module on fake tensors, differentiates its own ops (a
fused `silu_backward`, not the backward of its decomposition) and decomposes both with
the same table: the ops `torch.export` followed by its joint export give, in one trace
instead of three (export, its forward decomposition for module paths, its joint), a
third to a sixth of the time. Each placeholder and output carries a descriptor naming
what it is (`ParamAOTInput(target=fqn)`, `GradAOTOutput(grad_of=...)`), and module paths
are recorded as the ops are traced: a forward hook on every module opens
`torch.fx.traceback.annotate` for its forward, whose annotation the nodes it makes keep.

The graph takes the loss's gradient (1) as a placeholder; it becomes `full_like(loss, 1)`,
as export's joint seeds it, so the program's inputs are the parameters, buffers and the
user's inputs alone.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch import nn

from passes.annotation import RECORDED_MODULE, annotate_recorded, without_objective_prefix
from passes.program import TracedProgram
from passes.sibling_views import merge_sibling_views

METHOD = "aot_autograd"


def trace_objective(objective: nn.Module, example_inputs: tuple[Any, ...],
                    table: dict) -> TracedProgram:
    """The training step of `objective`, whose forward returns the scalar loss, on
    `example_inputs` (real, fake or fake-CPU tensors), decomposed by `table`."""
    from torch._export.utils import _compiling_state_context
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    # Under export's own flags (`torch.compiler.is_exporting()`), as its non-strict trace
    # runs: libraries that branch on data outside a trace (transformers' packed-sequence
    # check) take their traceable path.
    with warnings.catch_warnings(), contextlib.ExitStack() as stack, \
            _compiling_state_context(), fx_traceback.preserve_node_meta(), \
            _recording_module_paths(objective):
        warnings.simplefilter("ignore")
        joint = aot_export_joint_with_descriptors(
            stack, objective, tuple(example_inputs), decompositions=table)
        graph_module = joint.graph_module
    return _program(graph_module)


@contextlib.contextmanager
def _recording_module_paths(objective: nn.Module) -> Iterator[None]:
    """While tracing, every node records the path of the innermost module running."""
    open_annotations: list[contextlib.AbstractContextManager] = []
    handles = []

    def enter(path: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            annotation = fx_traceback.annotate({RECORDED_MODULE: path})
            annotation.__enter__()
            open_annotations.append(annotation)
        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        open_annotations.pop().__exit__(None, None, None)

    try:
        for path, module in objective.named_modules():
            handles.append(module.register_forward_pre_hook(enter(path)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        while open_annotations:  # a forward that raised leaves its modules open
            open_annotations.pop().__exit__(None, None, None)


def _program(graph_module: fx.GraphModule) -> TracedProgram:
    """The joint graph as Tessel's IR, each placeholder and output named by its
    descriptor."""
    graph = graph_module.graph
    parameters: dict[str, str] = {}
    buffers: dict[str, str] = {}
    user_inputs: list[str] = []
    tangents: list[fx.Node] = []
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        kind = type(node.meta["desc"]).__name__
        if kind == "ParamAOTInput":
            parameters[node.name] = without_objective_prefix(node.meta["desc"].target)
        elif kind == "BufferAOTInput":
            buffers[node.name] = without_objective_prefix(node.meta["desc"].target)
        elif kind == "TangentAOTInput":
            tangents.append(node)
        else:
            user_inputs.append(node.name)
    output = graph.output_node()
    kept, gradients, loss = [], {}, None
    for value, desc in zip(output.args[0], output.meta["desc"]):
        if value is None:  # the gradient of an input: not part of the step
            continue
        kind = type(desc).__name__
        if kind == "GradAOTOutput":
            gradients[value.name] = without_objective_prefix(desc.grad_of.target)
        elif kind == "PlainAOTOutput" and loss is None:
            loss = value
        kept.append(value)
    if loss is None or len(tangents) != 1:
        raise ValueError("the objective's forward must return one scalar loss")
    with graph.inserting_after(loss):
        seed = graph.call_function(torch.ops.aten.full_like.default, (loss, 1),
                                   {"pin_memory": False,
                                    "memory_format": torch.preserve_format})
    seed.meta["val"] = torch.ones_like(loss.meta["val"])
    tangents[0].replace_all_uses_with(seed)
    graph.erase_node(tangents[0])
    output.args = (tuple(kept),)
    # Called as the export path's programs are: flat arguments in, a flat tuple out.
    graph._codegen = fx.graph.CodeGen()
    graph.eliminate_dead_code()
    graph_module.recompile()
    gradient_modules = {name: fqn.rpartition(".")[0] for name, fqn in gradients.items()}
    annotate_recorded(graph, parameters, buffers, loss.name, gradient_modules)
    merge_sibling_views(graph_module)
    return TracedProgram(graph_module, parameters, buffers, user_inputs, loss.name, gradients,
                         method=METHOD)
