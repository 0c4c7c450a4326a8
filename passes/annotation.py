"""Module paths and phases on a joint graph's nodes.

A joint graph loses the forward's `nn_module_stack`; every node gains two annotations
from the forward it was traced from:

- `meta["tessel_module"]`: the module path the node came from ("blocks.0.attn"); backward
  nodes take the path of the forward op autograd made them for where the trace recorded
  it, else of the forward values they consume.
- `meta["tessel_phase"]`: "forward" or "backward".
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx


def without_objective_prefix(fqn: str) -> str:
    return fqn.removeprefix("model.")


def _module_of(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    return _within_model(list(stack.values())[-1][0])


def _within_model(path: str) -> str:
    """A module path in the objective as a path in the model ("" for the model itself)."""
    return without_objective_prefix(path).removeprefix("model")


# How far ahead the forward-op walk looks for the op the joint graph has next.
_RESYNC_WINDOW = 8


def annotate(
    joint: fx.Graph,
    forward: fx.Graph,
    parameters: dict[str, str],
    buffers: dict[str, str],
    loss: str,
    gradient_modules: dict[str, str],
) -> None:
    """Tag each joint node with its phase and module path.

    The joint graph loses `nn_module_stack`, but its forward part is the decomposed forward
    op for op, so module paths are carried over by walking both in order.
    """
    forward_ops = [n for n in forward.nodes if n.op == "call_function"]
    cursor = 0

    def matched(node: fx.Node) -> str | None:
        # The joint graph adds ops (aliases of saved tensors, views) and may drop a few:
        # resynchronise on the next forward op with the same target.
        nonlocal cursor
        window = forward_ops[cursor : cursor + _RESYNC_WINDOW]
        key = _op_key(node)
        match = next((i for i, op in enumerate(window) if _op_key(op) == key), None)
        if match is None:
            return None
        cursor += match + 1
        return _module_of(window[match]) or ""

    _annotate(joint, parameters, buffers, loss, gradient_modules, matched)


RECORDED_MODULE = "tessel_module"
"""The key of `node.meta["custom"]` under which a trace records the module (its path in
the objective) whose forward made the node (`passes.module_joint`)."""


def annotate_recorded(
    joint: fx.Graph,
    parameters: dict[str, str],
    buffers: dict[str, str],
    loss: str,
    gradient_modules: dict[str, str],
) -> None:
    """`annotate` for a joint graph whose forward nodes recorded their module path as they
    were traced (`RECORDED_MODULE`)."""

    def recorded(node: fx.Node) -> str | None:
        path = (node.meta.get("custom") or {}).get(RECORDED_MODULE)
        if path is None:
            return None
        return _within_model(path)

    _annotate(joint, parameters, buffers, loss, gradient_modules, recorded, recorded)


def _annotate(
    joint: fx.Graph,
    parameters: dict[str, str],
    buffers: dict[str, str],
    loss: str,
    gradient_modules: dict[str, str],
    forward_module: Callable[[fx.Node], str | None],
    backward_module: Callable[[fx.Node], str | None] = lambda node: None,
) -> None:
    """Phases, and module paths: placeholders their parameter's or buffer's module,
    forward ops `forward_module`'s answer (else their inputs' most specific module),
    backward ops `backward_module`'s (else `_annotate_backward`'s guess)."""
    phase = "forward"
    for node in joint.nodes:
        if node.op == "placeholder":
            fqn = parameters.get(node.name) or buffers.get(node.name)
            node.meta["tessel_module"] = fqn.rpartition(".")[0] if fqn else ""
            node.meta["tessel_phase"] = "forward"
            continue
        if node.op != "call_function":
            continue
        node.meta["tessel_phase"] = phase
        if phase == "forward":
            path = forward_module(node)
            node.meta["tessel_module"] = _input_module(node) if path is None else path
        if node.name == loss:
            phase = "backward"
    _annotate_backward(joint, gradient_modules, backward_module)


def output_shapes(node: fx.Node) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensors a node produces, as traced."""
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(tuple(v.shape) for v in values if isinstance(v, torch.Tensor))


def _op_key(node: fx.Node) -> tuple:
    """What identifies an op across the two graphs: its target and output shapes."""
    return node.target, output_shapes(node)


def _annotate_backward(joint: fx.Graph, gradient_modules: dict[str, str],
                       recorded: Callable[[fx.Node], str | None]) -> None:
    """Module paths of backward nodes.

    A parameter's gradient is its module's. Most backward ops carry the module of the
    forward op autograd made them for (`recorded`: AOTAutograd's
    `copy_fwd_metadata_to_bw_nodes` copies a forward node's annotations to the backward
    nodes of its autograd sequence number), so identical blocks' backward is attributed
    alike (`planner.search.symmetry` ties them). The rest are guessed walking back from
    the gradients, from two hints: the innermost module enclosing all the node's users (a
    weight gradient's matmul feeds only that weight's gradient), and the most specific
    module among the forward values it reads (an attention backward reads its own block's
    saved query, key and value). The more specific hint wins.
    """
    backward = [n for n in joint.nodes if n.meta.get("tessel_phase") == "backward"]
    for node in reversed(backward):
        if node.name in gradient_modules:
            node.meta["tessel_module"] = gradient_modules[node.name]
            continue
        path = recorded(node)
        if path is not None:
            node.meta["tessel_module"] = path
            continue
        users = [u.meta.get("tessel_module") for u in node.users if u.op != "output"]
        enclosing = _common_module([u for u in users if u])
        read = _input_module(node, phase="forward")
        node.meta["tessel_module"] = max((enclosing, read), key=_depth)


def _depth(path: str) -> int:
    return path.count(".") + 1 if path else 0


def _common_module(paths: list[str]) -> str:
    if not paths:
        return ""
    parts = [p.split(".") for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _input_module(node: fx.Node, phase: str | None = None) -> str:
    """The most specific module path among the node's inputs (of one phase, if given)."""
    paths = [
        a.meta.get("tessel_module", "")
        for a in node.all_input_nodes
        if a.meta.get("tessel_module") is not None
        and (phase is None or a.meta.get("tessel_phase") == phase)
    ]
    return max(paths, key=lambda p: (_depth(p), len(p)), default="")
