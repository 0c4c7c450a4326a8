"""One node for the identical views sibling modules take of one value.

A traced block reads one layer norm's output through three projections, and each
projection takes its own `view` of it (q, k and v alike): three nodes for one value. As
three values, moving that input to a placement (Megatron's all-gather before its
column-parallel QKV) is three moves, each paid and each run, where Megatron makes one;
as one value, its move is shared by the three readers (`solver.SharedRead`). Views only
(aliases: merging changes no number and no byte), and only within one parent module and
phase: a view two layers take of a shared buffer stays one per layer, which keeps the
layers alike (`passes.layers`).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx


def merge_sibling_views(graph_module: fx.GraphModule) -> None:
    """Merge, in place, every view node into an earlier identical one (same op, operands
    and arguments) of the same parent module and phase (`annotation`'s meta); views the
    graph returns stay, as their names are the program's outputs."""
    graph = graph_module.graph
    seen: dict[tuple, fx.Node] = {}
    merged = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not getattr(node.target, "is_view", False):
            continue
        if any(user.op == "output" for user in node.users):
            continue
        module = node.meta.get("tessel_module")
        if module is None:
            continue
        try:
            key = (node.target, _frozen(node.args), _frozen(node.kwargs),
                   module.rpartition(".")[0], node.meta.get("tessel_phase"))
            hash(key)
        except TypeError:  # a symbolic size: leave it be
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            merged = True
        else:
            seen[key] = node
    if merged:
        graph_module.recompile()


def _frozen(value: Any) -> Any:
    """`value` (an op's arguments) with its lists and dicts as tuples, to hash."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value
