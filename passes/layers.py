"""Group a traced training step into layers, and layers into templates.

A 96-layer model is one embedding, one block template used 96 times, and one head: the
search solves each template once and reuses the answer. Repeated blocks are found from
module paths (children of a ModuleList: `layers.0`, `layers.1`, ...) and confirmed by a
structural hash of their forward subgraphs (ops and shapes in order), so two blocks share
a template only when they compute the same thing. A model with no repeated blocks is cut
into layers of balanced FLOPs, as Alpa's layer clustering does.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from cost_models.compute import tensor_bytes
from passes.strategies import is_saved_for_backward, node_flops
from passes.annotation import output_shapes
from passes.program import TracedProgram

# A module path component that indexes a ModuleList: "layers.3" -> prefix "layers", 3.
_INDEXED = re.compile(r"^(?P<prefix>.*?\b\w+)\.(?P<index>\d+)(?:\.|$)")


@dataclass
class Layer:
    name: str
    """Module path of the layer ("model.layers.3"), or "embedding"/"head"/"layer.K"."""
    template: str
    """Structural hash shared by layers that compute the same thing."""
    nodes: list[str] = field(default_factory=list)
    """Forward op nodes of the layer, in graph order."""
    parameters: list[str] = field(default_factory=list)
    """Fully qualified names of the parameters the layer owns."""
    flops: float = 0.0
    """Forward FLOPs of the layer."""
    num_parameters: int = 0
    """Elements of the parameters the layer owns."""
    saved_bytes: int = 0
    """Bytes of the layer's forward values that the backward reads (its activations)."""
    source: str = ""
    """Name of the traced layer whose nodes these are: itself, or for a block of a model
    traced at reduced depth, the traced block of the same template."""


def find_layers(program: TracedProgram, balanced_layers: int = 4) -> list[Layer]:
    """The layers of `program` in forward order."""
    forward = [
        n for n in program.graph.nodes
        if n.op == "call_function" and n.meta.get("tessel_phase") == "forward"
        and isinstance(n.meta.get("val"), (torch.Tensor, tuple, list))
    ]
    blocks = _repeated_blocks(forward)
    if not blocks:
        return _balanced(program, forward, balanced_layers)
    layers: list[Layer] = []
    first = min(i for i, n in enumerate(forward) if _block_of(n, blocks) is not None)
    last = max(i for i, n in enumerate(forward) if _block_of(n, blocks) is not None)
    before, after = forward[:first], forward[last + 1 :]
    if before:
        layers.append(Layer("embedding", "", [n.name for n in before]))
    grouped: dict[str, list[fx.Node]] = {}
    for node in forward[first : last + 1]:
        grouped.setdefault(_block_of(node, blocks) or _nearest(grouped), []).append(node)
    layers += [Layer(name, "", [n.name for n in nodes]) for name, nodes in grouped.items()]
    if after:
        layers.append(Layer("head", "", [n.name for n in after]))
    _describe_all(program, layers)
    return layers


def _repeated_blocks(forward: list[fx.Node]) -> list[str]:
    return repeated_blocks([node.meta.get("tessel_module") or "" for node in forward])


def repeated_blocks(paths: list[str]) -> list[str]:
    """Of the module paths of a forward's ops, the children of the ModuleList that holds
    the most ops (`layers.0`, `layers.1`, ...); none unless there are two or more."""
    counts: dict[str, dict[str, int]] = {}
    for path in paths:
        match = _INDEXED.match(path)
        if match:
            block = f"{match['prefix']}.{match['index']}"
            counts.setdefault(match["prefix"], {}).setdefault(block, 0)
            counts[match["prefix"]][block] += 1
    if not counts:
        return []
    prefix = max(counts, key=lambda p: sum(counts[p].values()))
    return list(counts[prefix]) if len(counts[prefix]) > 1 else []


def _block_of(node: fx.Node, blocks: list[str]) -> str | None:
    return block_of(node.meta.get("tessel_module") or "", blocks)


def block_of(path: str, blocks: list[str]) -> str | None:
    """The block of `blocks` the module at `path` is in, if any."""
    return next((b for b in blocks if path == b or path.startswith(b + ".")), None)


def _nearest(grouped: dict[str, list[fx.Node]]) -> str:
    """Ops between blocks that belong to none (a residual add) join the block before."""
    return next(reversed(grouped))


def _is_view(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _storage_root(node: fx.Node) -> fx.Node:
    """The node whose memory a view chain shares (a view costs no memory of its own)."""
    while _is_view(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _activation_bytes(nodes: list[fx.Node]) -> int:
    """Bytes kept for the backward: each saved value's storage once, and not the
    parameters (a transposed weight saved for the weight gradient is a view of it)."""
    roots = {_storage_root(n) for n in nodes if is_saved_for_backward(n)}
    return sum(tensor_bytes(r.meta.get("val")) for r in roots if r.op != "placeholder")


def _describe_all(program: TracedProgram, layers: list[Layer]) -> None:
    owned: set[str] = set()
    by_fqn = {fqn: name for name, fqn in program.parameters.items()}
    for layer in layers:
        _describe(program, layer)
        # A shared parameter (a tied embedding and LM head) belongs to the first layer
        # that reads it, so parameter counts add up to the model's.
        layer.parameters = [p for p in layer.parameters if p not in owned]
        owned.update(layer.parameters)
        layer.num_parameters = sum(
            program.nodes[by_fqn[p]].meta["val"].numel() for p in layer.parameters
        )


def _describe(program: TracedProgram, layer: Layer) -> None:
    nodes = [program.nodes[n] for n in layer.nodes]
    position = {n.name: i for i, n in enumerate(nodes)}
    digest = hashlib.sha256()
    for node in nodes:
        # Inputs as offsets within the layer (or "outside"): the same wiring, not names.
        wiring = tuple(position.get(a.name, -1) for a in node.all_input_nodes)
        digest.update(f"{node.target}|{output_shapes(node)}|{wiring};".encode())
    layer.template = digest.hexdigest()[:12]
    params = {
        program.parameters[a.name]
        for node in nodes
        for a in node.all_input_nodes
        if a.name in program.parameters
    }
    layer.parameters = sorted(params)
    layer.flops = sum(node_flops(node) for node in nodes)
    layer.saved_bytes = _activation_bytes(nodes)
    layer.source = layer.name


def _balanced(program: TracedProgram, forward: list[fx.Node], count: int) -> list[Layer]:
    """Contiguous runs of forward ops with about equal FLOPs (Alpa's layer clustering,
    without its communication term)."""
    flops = [node_flops(n) for n in forward]
    total = sum(flops) or 1.0
    layers: list[Layer] = []
    current: list[str] = []
    accumulated = 0.0
    for node, f in zip(forward, flops):
        current.append(node.name)
        accumulated += f
        if accumulated >= total * (len(layers) + 1) / count and len(layers) < count - 1:
            layers.append(Layer(f"layer.{len(layers)}", "", current))
            current = []
    if current:
        layers.append(Layer(f"layer.{len(layers)}", "", current))
    _describe_all(program, layers)
    return layers
