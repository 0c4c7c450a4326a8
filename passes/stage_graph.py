"""Cut a model's forward into layers, and layers into pipeline-stage programs.

Alpa's inter-op pass for any `nn.Module`: the forward of the training objective (model and
loss, core aten ops, as `passes.trace` decomposes it) is one list of ops in graph order. A
*layer* is a contiguous run of those ops; a *stage* is a contiguous run of layers. Cuts go
between repeated blocks where the model has them (`layers.0`, `layers.1`, ...), else where
Alpa's operator clustering puts them: about equal FLOPs per layer, and within that, the
position whose crossing tensors are fewest bytes.

A stage is traced as a training step of its own (`stage_program`), so the intra-op ILP and
the runtime treat it as they treat a whole model:
- the tensors entering the stage are parameters named `tessel_boundary.K`: their gradients,
  which the joint graph computes as it does any parameter's, are what the stage sends back;
- a stage that is not the last ends in the surrogate loss sum_K sum(out_K * grad_K), with
  each received gradient `grad_K` a user input: the backward of that loss is the backward
  of the stage given its outputs' gradients, so the stage's forward ops are the ones that
  do not depend on a `grad_K` (`backward_nodes`).
User inputs (the batch, labels) reach every stage directly; they are never sent, and what
a stage reads that is made from them alone without a gradient (integer positions, a causal
mask every block of a transformers model reads) it makes again (`ForwardGraph.recomputed`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from cost_models.compute import tensor_bytes
from passes.layers import block_of, repeated_blocks
from passes.strategies import node_flops
from passes.aten_joint import trace_aten_module
from passes.program import TracedProgram
from passes.trace import LossFn, export_forward

BOUNDARY = "tessel_boundary"
"""Name of the parameters that stand for a stage's incoming tensors."""
LOSS_SCALE = "tessel_loss_scale"
"""Name of the buffer an fp16 model's last stage multiplies its loss by (loss scaling: the
runtime sets it each step, so that small gradients do not underflow in fp16)."""
OVERFLOW_FLAG_BYTES = 4
"""What the all-reduce of whether any rank's scaled gradients overflowed carries (one
fp32), once per step of an fp16 model (`runtime.loss_scale`)."""

_aten = torch.ops.aten


@dataclass
class ForwardGraph:
    """The decomposed forward of a training objective, ending in its scalar loss."""

    graph: fx.Graph
    parameters: dict[str, str]
    """Placeholder name -> parameter FQN."""
    buffers: dict[str, str]
    """Placeholder name -> buffer FQN."""
    user_inputs: list[str]
    """Placeholder names of the model's inputs, in call order."""
    ops: list[fx.Node]
    """Every call_function node, in graph order."""
    loss: fx.Node

    def parameter_values(self) -> dict[str, torch.Tensor]:
        """Each parameter's traced value (meta), by FQN."""
        return {self.parameters[n.name]: n.meta["val"] for n in self.graph.nodes
                if n.op == "placeholder" and n.name in self.parameters}

    @cached_property
    def loss_scaled(self) -> bool:
        """Whether the model trains in fp16 (its parameters were cast to it), where its last
        stage scales the loss (`LOSS_SCALE`)."""
        return any(v.dtype == torch.float16 for v in self.parameter_values().values())

    def op_flops(self) -> np.ndarray:
        return np.array([node_flops(n) for n in self.ops], dtype=float)

    def crossing(self, cut: int) -> list[fx.Node]:
        """The tensors op `cut` and later read that ops before `cut` made, and that a stage
        starting at `cut` receives (graph order): all but those it computes again
        (`recomputed`)."""
        return [n for n in self._read_across(cut) if not self._made_again(n)]

    def recomputed(self, cut: int) -> list[fx.Node]:
        """The crossing tensors a stage starting at `cut` computes again rather than
        receives: those with no gradient (integer positions, a causal mask) made from the
        model's inputs alone."""
        return [n for n in self._read_across(cut) if self._made_again(n)]

    def _made_again(self, node: fx.Node) -> bool:
        return node in self.input_only and not node.meta["val"].is_floating_point()

    def _read_across(self, cut: int) -> list[fx.Node]:
        later = set(self.ops[cut:])
        return [
            n for n in self.ops[:cut]
            if isinstance(n.meta.get("val"), torch.Tensor) and any(u in later for u in n.users)
        ]

    @cached_property
    def input_only(self) -> set[fx.Node]:
        """Ops whose value depends on nothing but the model's inputs (no parameter or
        buffer) through ops that draw no random numbers: any stage can compute it again."""
        inputs = {n for n in self.graph.nodes if n.op == "placeholder"
                  and n.name in self.user_inputs}
        found: set[fx.Node] = set()
        for node in self.ops:
            tags = getattr(node.target, "tags", ())
            if torch.Tag.nondeterministic_seeded not in tags and all(
                    a in inputs or a in found for a in node.all_input_nodes):
                found.add(node)
        return found

    def can_cut(self, cut: int) -> bool:
        """Whether a stage may end before op `cut`: every tensor crossing it is a floating
        one in its own contiguous layout, or is `recomputed` after it. Not a tuple still to
        be unpacked; not a tensor without gradient that depends on parameters; not a view
        of another layout (a stage receives a contiguous buffer, and a view after it was
        traced for the layout it had). A parameter read on both sides (a tied weight) is
        held by the stages on each, whose gradients are summed once per step
        (`planner.search.tied`)."""
        return bool(self._cut_table[0][cut])

    def cut_bytes(self, cut: int) -> int:
        """Bytes of the tensors crossing position `cut` (those `crossing` lists)."""
        return int(self._cut_table[1][cut])

    @cached_property
    def _cut_table(self) -> tuple[np.ndarray, np.ndarray]:
        """`can_cut` and `cut_bytes` of every position 0..len(ops), from one sweep: a value
        made by op i and last read by op k crosses every position in (i, k]."""
        position = {node: i for i, node in enumerate(self.ops)}
        blocked = np.zeros(len(self.ops) + 2, dtype=np.int64)
        crossing = np.zeros(len(self.ops) + 2, dtype=np.int64)

        def spans(first: int, last: int, counts: np.ndarray, amount: int) -> None:
            counts[first + 1] += amount
            counts[last + 1] -= amount

        for i, node in enumerate(self.ops):
            readers = [position[u] for u in node.users if u in position]
            if not readers:
                continue
            value = node.meta.get("val")
            floating = isinstance(value, torch.Tensor) and value.is_floating_point()
            if floating:
                spans(i, max(readers), crossing, tensor_bytes(value))
            recomputed = isinstance(value, torch.Tensor) and self._made_again(node)
            if not (floating and value.is_contiguous() or recomputed):
                spans(i, max(readers), blocked, 1)
        return np.cumsum(blocked)[:-1] == 0, np.cumsum(crossing)[:-1]


def forward_graph(
    model: nn.Module, example_inputs: tuple[Any, ...], loss_fn: LossFn | None = None
) -> ForwardGraph:
    """Export `model` and its loss on `example_inputs` (meta tensors are fine) and
    decompose it to the core aten ops the joint graph uses."""
    exported = export_forward(model, example_inputs, loss_fn)
    signature = exported.graph_signature
    kinds = {spec.arg.name: (spec.kind.name, spec.target) for spec in signature.input_specs}
    strip = lambda fqn: fqn.removeprefix("model.")  # noqa: E731 - the objective's prefix
    parameters = {n: strip(t) for n, (k, t) in kinds.items() if k == "PARAMETER"}
    buffers = {n: strip(t) for n, (k, t) in kinds.items() if k == "BUFFER"}
    user_inputs = [n for n, (k, _) in kinds.items() if k == "USER_INPUT"]
    graph = exported.graph
    ops = [n for n in graph.nodes if n.op == "call_function"]
    output = next(n for n in graph.nodes if n.op == "output")
    # The objective's one user output; buffer updates (batch-norm statistics) come first.
    kinds = [spec.kind.name for spec in signature.output_specs]
    loss = output.args[0][kinds.index("USER_OUTPUT")]
    return ForwardGraph(graph, parameters, buffers, user_inputs, ops, loss)


def forward_at_batch(forward: ForwardGraph, old: int, new: int) -> ForwardGraph | None:
    """`forward` (traced with a batch of `old`) with its shapes propagated again for a batch
    of `new`: the same ops, without exporting the model again. None when the graph does
    not carry the batch through as one dim of its own: when some tensor's dims change
    other than `old` to `new` (a batch folded into another dim), a dim of `old` stays (a
    size written into the graph, or a weight as wide as the batch), or an op refuses the
    new shapes. The constants the graph holds may still be the old batch's (a mean's
    divisor): planning reads shapes only, and the runtime traces the model itself."""
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    for node in forward.graph.nodes:
        copies[node] = graph.node_copy(node, lambda n: copies[n])
    mode = FakeTensorMode()
    values: dict[fx.Node, Any] = {}
    try:
        for node, copied in copies.items():
            before = node.meta.get("val")
            if node.op == "placeholder":
                shape = list(before.shape)
                if node.name in forward.user_inputs and shape:
                    shape[0] = new
                with mode:
                    after = torch.empty(shape, dtype=before.dtype)
            elif node.op == "call_function":
                args, kwargs = torch.utils._pytree.tree_map(
                    lambda a: values[a] if isinstance(a, fx.Node) else a, (node.args, node.kwargs))
                with mode:
                    after = node.target(*args, **kwargs)
            elif node.op == "output":
                continue
            else:
                return None
            if not _batch_carried(before, after, old, new):
                return None
            values[node] = after
            copied.meta["val"] = after
            copied.meta.pop("tensor_meta", None)
    except Exception:  # noqa: BLE001 - an op that refuses the new shapes: export again
        return None
    return ForwardGraph(graph, dict(forward.parameters), dict(forward.buffers),
                        list(forward.user_inputs), [copies[n] for n in forward.ops],
                        copies[forward.loss])


def _batch_carried(before: Any, after: Any, old: int, new: int) -> bool:
    """Whether `after` is `before` with every dim of `old` become `new` and no other."""
    pairs = zip(torch.utils._pytree.tree_leaves(before), torch.utils._pytree.tree_leaves(after))
    for b, a in pairs:
        if isinstance(b, torch.Tensor) != isinstance(a, torch.Tensor):
            return False
        if isinstance(b, torch.Tensor) and (
                b.dim() != a.dim() or b.dtype != a.dtype
                or any(y != (new if x == old else x) for x, y in zip(b.shape, a.shape))):
            return False
    return True


# -- layers ---------------------------------------------------------------------------------


def layer_cuts(forward: ForwardGraph, count: int, balance: float = 0.25) -> list[int]:
    """Op positions [0, c_1, ..., len(ops)] of at most `count` layers.

    Repeated blocks (children of a ModuleList whose forward ops match) are one layer each,
    what comes before the first joining it and what comes after the last joining that.
    Otherwise each cut is placed, among the positions whose FLOPs before it are within
    `balance` of a layer's share of the target, where the fewest bytes cross (Alpa's
    operator clustering: balanced compute, little communication between stages)."""
    blocks = block_cuts(forward)
    if blocks is not None and len(blocks) - 1 >= 2:
        return blocks
    flops = forward.op_flops()
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    total = prefix[-1] or 1.0
    n = len(forward.ops)
    cuts = [0]
    for k in range(1, count):
        target = total * k / count
        window = total * balance / count
        later = [p for p in range(cuts[-1] + 1, n)
                 if prefix[p] > prefix[cuts[-1]] and prefix[p] < total and forward.can_cut(p)]
        if not later:
            break
        near = [p for p in later if abs(prefix[p] - target) <= window]
        if near:
            cuts.append(min(near, key=lambda p: (forward.cut_bytes(p), abs(prefix[p] - target))))
            continue
        # No position within the window (a few large ops): the nearest one, unless it is
        # nearer the next layer's target than this one's.
        nearest = min(later, key=lambda p: abs(prefix[p] - target))
        if abs(prefix[nearest] - target) < total / count / 2:
            cuts.append(nearest)
    cuts.append(n)
    return cuts


def block_cuts(forward: ForwardGraph, ends: bool = False) -> list[int] | None:
    """Cuts between the blocks of the ModuleList the forward runs through, if any: each
    cut at the first op of a block, the first block's absorbing the ops before it and the
    last block's those after it; with `ends`, what comes before the first block and after
    the last is a layer of its own (a transformer's embedding, its head and loss)."""
    paths = [module_path(node) for node in forward.ops]
    blocks = repeated_blocks(paths)
    owners = [block_of(path, blocks) for path in paths]
    starts, seen = [], set()
    for position, block in enumerate(owners):
        if block is not None and block not in seen:
            seen.add(block)
            starts.append(position)
    if len(starts) < 2:
        return None
    cuts = [0, *starts[1:], len(forward.ops)]
    if ends:
        after = 1 + max(p for p, block in enumerate(owners) if block == blocks[-1])
        cuts = sorted({*cuts, starts[0], after})
    if not all(forward.can_cut(p) for p in cuts[1:-1]):
        return None
    return cuts


def module_path(node: fx.Node) -> str:
    """The module an exported op was called from, relative to the model ('' at top)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.removeprefix("model.").removeprefix("model")


# -- stages ---------------------------------------------------------------------------------


@dataclass
class StageGraph:
    """The ops of layers [first, last) as a module of their own."""

    module: fx.GraphModule
    """Parameters by their FQNs in the model, plus `tessel_boundary.K` for the inputs."""
    inputs: list[torch.Tensor]
    """The tensors entering the stage (meta values), in `tessel_boundary.K` order."""
    outputs: list[torch.Tensor]
    """The tensors leaving it (meta values); none for the last stage."""
    user_inputs: list[int]
    """Positions of the model inputs the stage reads."""

    @property
    def is_last(self) -> bool:
        return not self.outputs


def stage_graph(
    forward: ForwardGraph, cuts: list[int], first: int, last: int,
    values: dict[str, torch.Tensor],
) -> StageGraph:
    """The stage of layers [first, last) of `forward` cut at `cuts`; `values` are the
    model's parameters and buffers by FQN (meta or real: only their shapes are read)."""
    begin, end = cuts[first], cuts[last]
    incoming = forward.crossing(begin) if begin > 0 else []
    outgoing = forward.crossing(end) if end < len(forward.ops) else []
    # What the stage computes again from the model's inputs, ahead of its own ops.
    again = _ancestry(forward.recomputed(begin)) if begin > 0 else set()
    ops = [node for node in forward.ops[:begin] if node in again] + forward.ops[begin:end]
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = {n.name: n for n in forward.graph.nodes if n.op == "placeholder"}
    read = {a for node in ops for a in node.all_input_nodes}
    used_inputs = [i for i, name in enumerate(forward.user_inputs) if placeholders[name] in read]
    for i in used_inputs:
        name = forward.user_inputs[i]
        env[placeholders[name]] = _with_meta(graph.placeholder(name), placeholders[name])
    gradients = [_with_meta(graph.placeholder(f"grad_{k}"), n) for k, n in enumerate(outgoing)]
    attributes: dict[str, Any] = {}
    for name, fqn in {**forward.parameters, **forward.buffers}.items():
        if placeholders[name] in read:
            env[placeholders[name]] = _with_meta(graph.get_attr(fqn), placeholders[name])
            attributes[fqn] = values[fqn]
    inputs = []
    for k, node in enumerate(incoming):
        target = f"{BOUNDARY}.{k}"
        value = node.meta["val"]
        attributes[target] = nn.Parameter(torch.empty(value.shape, dtype=value.dtype,
                                                      device="meta"))
        env[node] = _with_meta(graph.get_attr(target), node)
        inputs.append(value)
    for node in ops:
        env[node] = graph.node_copy(node, lambda n: env[n])
    if outgoing:
        terms = []
        for node, gradient in zip(outgoing, gradients):
            product = graph.call_function(_aten.mul.Tensor, (env[node], gradient))
            terms.append(graph.call_function(_aten.sum.default, (product,)))
        loss = terms[0]
        for term in terms[1:]:
            loss = graph.call_function(_aten.add.Tensor, (loss, term))
    else:
        loss = env[forward.loss]
        if forward.loss_scaled:
            attributes[LOSS_SCALE] = torch.ones((), dtype=torch.float32, device="meta")
            loss = graph.call_function(_aten.mul.Tensor, (loss, graph.get_attr(LOSS_SCALE)))
    graph.output(loss)
    module = fx.GraphModule(_Holder(attributes), graph)
    return StageGraph(module, inputs, [n.meta["val"] for n in outgoing], used_inputs)


def _ancestry(nodes: list[fx.Node]) -> set[fx.Node]:
    """`nodes` and every op they are computed from (placeholders left out)."""
    found: set[fx.Node] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if node.op == "call_function" and node not in found:
            found.add(node)
            todo.extend(node.all_input_nodes)
    return found


class _Holder(nn.Module):
    """Attributes by dotted name, as `fx.GraphModule` copies them from a root module."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        super().__init__()
        for fqn, value in attributes.items():
            owner = self
            *path, leaf = fqn.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            if isinstance(value, nn.Parameter):
                owner.register_parameter(leaf, value)
            else:
                owner.register_buffer(leaf, value)


def _with_meta(new: fx.Node, old: fx.Node) -> fx.Node:
    new.meta.update({k: v for k, v in old.meta.items() if k in ("val", "tensor_meta")})
    return new


def stage_program(stage: StageGraph, example_inputs: tuple[Any, ...]) -> TracedProgram:
    """The stage's training step as a joint graph: user inputs are the model inputs it
    reads, then one gradient per outgoing tensor."""
    inputs = [example_inputs[i] for i in stage.user_inputs]
    inputs += [torch.empty(v.shape, dtype=v.dtype, device="meta") for v in stage.outputs]
    return trace_aten_module(stage.module, tuple(inputs))


def boundary_parameters(program: TracedProgram) -> list[str]:
    """FQNs of the parameters that stand for incoming tensors, in order."""
    return sorted((f for f in program.parameters.values() if f.startswith(BOUNDARY + ".")),
                  key=lambda f: int(f.rsplit(".", 1)[1]))


def gradient_inputs(program: TracedProgram, num_model_inputs: int) -> list[str]:
    """Placeholder names of the received gradients (after the model inputs)."""
    return program.user_inputs[num_model_inputs:]


def backward_nodes(program: TracedProgram, gradient_placeholders: list[str]) -> set[str]:
    """Nodes that (transitively) read a received gradient: what runs once it arrives."""
    later: set[str] = set(gradient_placeholders)
    for node in program.graph.nodes:
        if node.op == "call_function" and any(a.name in later for a in node.all_input_nodes):
            later.add(node.name)
    return later


def surrogate_nodes(program: TracedProgram, gradient_placeholders: list[str]) -> frozenset[str]:
    """Nodes of a stage's program that a program of more layers has no counterpart of: the
    surrogate loss sum_K sum(out_K * grad_K) of a stage that is not the last, and its
    backward up to each out_K's gradient (which a longer stage computes from the next
    layer's backward instead). None for the last stage."""
    surrogate = set(gradient_placeholders)
    for node in program.graph.nodes if gradient_placeholders else ():
        if node.op != "call_function":
            continue
        inputs = [a.name for a in node.all_input_nodes]
        if node.meta.get("tessel_phase") == "forward":
            if any(a in surrogate for a in inputs):
                surrogate.add(node.name)
        elif inputs and all(a in surrogate for a in inputs):
            surrogate.add(node.name)
    return frozenset(surrogate - set(gradient_placeholders))


def stage_outputs(program: TracedProgram, gradient_placeholders: list[str]) -> list[str]:
    """Node names of the values the stage sends on: the first factor of each
    `out_K * grad_K` of the surrogate loss, in K order."""
    outputs = []
    for name in gradient_placeholders:
        node = program.nodes[name]
        product = next(u for u in node.users if u.target == _aten.mul.Tensor)
        other = [a for a in product.args if isinstance(a, fx.Node) and a is not node]
        outputs.append(other[0].name)
    return outputs


def on_meta_device(model: nn.Module) -> nn.Module:
    """`model` itself if it is on the meta device, else a copy there (tracing reads only
    shapes; the caller's weights stay untouched)."""
    if any(p.is_meta for p in model.parameters()):
        return model
    return copy.deepcopy(model).to("meta")


PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def floating_in(value: Any, dtype: torch.dtype | None) -> Any:
    """`value` in `dtype` if it is a floating tensor (and `dtype` is given); anything else
    as it is."""
    if dtype is not None and isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def in_precision(model: nn.Module, inputs: tuple[Any, ...],
                 precision: str) -> tuple[nn.Module, tuple[Any, ...]]:
    """`model` (on meta) and `inputs` with their floating parameters, buffers and tensors
    in `precision`'s dtype (the caller's model untouched); as they are for fp32."""
    dtype = PRECISION_DTYPES[precision]
    if dtype == torch.float32:
        return model, inputs
    return copy.deepcopy(model).to(dtype), tuple(floating_in(x, dtype) for x in inputs)


def micro_batch_inputs(example_inputs: tuple[Any, ...], size: int) -> tuple[Any, ...]:
    """Meta tensors like the example inputs with `size` along dim 0."""
    def resize(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return torch.empty((size, *x.shape[1:]), dtype=x.dtype, device="meta")
        return x

    return tuple(resize(x) for x in example_inputs)



# -- how the runtime moves values between and within stages -----------------------------


def syncs_each_micro_batch(before: Any, after: Any) -> bool:
    """Whether a gradient moving from placements `before` to `after` is synchronised every
    micro-batch rather than summed first: when the move shrinks it (a partial sum reduced
    into a shard), as FSDP does, so no rank holds a whole gradient it does not own."""
    return any(b.is_partial() and a.is_shard() for b, a in zip(before, after))


def routes(senders: int, receivers: int) -> list[list[tuple[int, int, int]]]:
    """How `senders` ranks that each hold a whole tensor hand it to `receivers` ranks that
    each need all of it: per receiver, (sender, piece, pieces) — the receiver gets piece
    `piece` of the flattened tensor cut in `pieces` from that sender.

    With no more senders than receivers, receiver j takes the whole tensor from sender
    j mod senders; with more, and a whole number k per receiver, each sender sends one of
    k pieces, so every link carries 1/k of the tensor."""
    if senders <= receivers or senders % receivers:
        return [[(j % senders, 0, 1)] for j in range(receivers)]
    k = senders // receivers
    return [[(j * k + r, r, k) for r in range(k)] for j in range(receivers)]


def piece_numel(numel: int, piece: int, pieces: int) -> int:
    """Elements of one piece, as `torch.tensor_split` cuts a flat tensor."""
    base, extra = divmod(numel, pieces)
    return base + (1 if piece < extra else 0)
