"""Which nodes of a training step play the same part in identical blocks of the model.

A model's repeated blocks (the children of its ModuleList: `blocks.0`, `blocks.1`, ...)
compute the same thing on the same shapes, so the planner gives them the same layout, as
AutoParallel links the decision variables of repeated layers and as a user writes one
layer plan for all layers. Tying them removes the ILP's symmetric choices (block 0 split
one way and block 1 the other cost nearly alike, and the solver would have to tell them
apart) and, with the parallel edges merged (`presolve.merge_parallel_edges`), makes the
problem about one block's size whatever the depth.

Nodes are matched by the module path the trace annotated them with (`tessel_module`,
the block's index stripped), their op, their output shapes and their phase, in graph order
within each block, where every block has the same number of such nodes. Members with the
same strategies, index for index, are tied: a block whose node was offered other
strategies (the last block's backward, fed by the head's gradient, can be) keeps that
node to itself while the others are tied.
"""

from __future__ import annotations

from passes.layers import block_of, repeated_blocks
from passes.program import TracedProgram
from passes.strategies import NodeStrategies


def identical_block_groups(program: TracedProgram,
                           table: dict[str, NodeStrategies]) -> list[list[str]]:
    """Groups of node names, at most one member per repeated block, in block order; the
    first member of each group is the one to keep."""
    paths = {name: _module_path(program, name) for name in table}
    blocks = repeated_blocks(list(paths.values()))
    if not blocks:
        return []
    members: dict[tuple, dict[str, list[str]]] = {}
    for name in table:
        block = block_of(paths[name], blocks)
        if block is None:
            continue
        key = (paths[name][len(block):], *_signature(program, name))
        members.setdefault(key, {}).setdefault(block, []).append(name)
    groups = []
    for by_block in members.values():
        counts = {len(by_block.get(b, [])) for b in blocks}
        if len(counts) != 1:
            continue
        for k in range(counts.pop()):
            alike: list[list[str]] = []
            for name in (by_block[b][k] for b in blocks):
                group = next((g for g in alike if _same_strategies(table[g[0]], table[name])),
                             None)
                if group is None:
                    alike.append([name])
                else:
                    group.append(name)
            groups += [group for group in alike if len(group) > 1]
    return groups


def _module_path(program: TracedProgram, name: str) -> str:
    """The module a node came from; a parameter's is its own name (its module and role)."""
    if name in program.parameters:
        return program.parameters[name]
    return program.nodes[name].meta.get("tessel_module") or ""


def _signature(program: TracedProgram, name: str) -> tuple:
    node = program.nodes[name]
    value = node.meta.get("val")
    shapes = tuple(tuple(v.shape) for v in (value if isinstance(value, (tuple, list))
                                            else [value]) if hasattr(v, "shape"))
    # A placeholder's target is its own name, which differs from block to block.
    op = node.op if node.op == "placeholder" else str(node.target)
    return op, shapes, node.meta.get("tessel_phase", "")


def _same_strategies(a: NodeStrategies, b: NodeStrategies) -> bool:
    return len(a.strategies) == len(b.strategies) and all(
        s.inputs == t.inputs and s.outputs == t.outputs and s.produced == t.produced
        for s, t in zip(a.strategies, b.strategies))
