"""Trace a model and its loss into one aten-level training graph (forward + backward).

AOTAutograd's joint export traces the objective once (`passes.module_joint`): the forward
with shapes, dtypes and module paths on every node, and the backward of the model's own
ops, then decomposed (a fused `silu_backward`, say, not the backward of its
decomposition), so the graph the planner shards is the whole training step, as Alpa's
is. A model that tracer cannot take goes the longer way: `torch.export` (non-strict)
captures the forward, `_export_forward_backward` adds the backward, and failing export,
`torch.fx.symbolic_trace` first. The graph is the IR (`passes.program.TracedProgram`):
every node keeps `meta["val"]` and gains its module path and phase
(`passes.annotation`).
"""

from __future__ import annotations

import io
import linecache
import logging
import os
import warnings
from contextlib import contextmanager, redirect_stderr
from typing import Any, Callable, Iterator

import torch
from torch import nn

from passes.annotation import annotate, without_objective_prefix
from passes.module_joint import trace_objective
from passes.program import TracedProgram, decomposition_table
from passes.sibling_views import merge_sibling_views

LossFn = Callable[..., torch.Tensor]


class TraceError(RuntimeError):
    """The model could not be traced; the message says where and what to try."""


class TrainingObjective(nn.Module):
    """`model` followed by its loss, so that one export captures the whole objective.

    Without a loss function the loss is the mean of the squared first tensor output, which
    exercises every output element's gradient and needs no labels.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn | None = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: Any) -> torch.Tensor:
        output = self.model(*inputs)
        if self.loss_fn is not None:
            return self.loss_fn(output, *inputs)
        first = next(t for t in torch.utils._pytree.tree_leaves(output) if torch.is_tensor(t))
        return (first.float() * first.float()).mean()


def trace(
    model: nn.Module, example_inputs: tuple[Any, ...], loss_fn: LossFn | None = None
) -> TracedProgram:
    """Capture the training step of `model` on `example_inputs` as a joint aten graph.

    Parameter and buffer names are the model's own (no wrapper prefix).
    """
    objective = TrainingObjective(model, loss_fn)
    # The joint export rejects a parameter reached under two names (a tied embedding and
    # LM head), so each alias is traced as a parameter of its own and merged back after.
    with _untied(model) as aliases, _meta_as_fake_cpu(model, example_inputs) as example_inputs:
        program = _trace_once(objective, example_inputs)
        if program is not None:
            _merge_tied(program, aliases)
            return program
        exported, method = _export_forward(objective, example_inputs)
        # The joint export also rejects a parameter forward never reads (an unused layer,
        # or the name of a tied pair that is not the one called): such parameters are
        # traced frozen, so they stay in the program without a gradient.
        unused = _unused_parameters(exported)
        with _frozen(unused):
            if unused:
                exported, method = _export_forward(objective, example_inputs)
            try:
                table = decomposition_table(keep_attention=True)
                forward, joint = _joint(exported, table)
            except Exception:  # noqa: BLE001 - some models only trace with attention decomposed
                table = decomposition_table(keep_attention=False)
                forward, joint = _joint(exported, table)
    program = _program(joint, forward, method)
    _merge_tied(program, aliases)
    return program


def _trace_once(objective: nn.Module, example_inputs: tuple[Any, ...]) -> TracedProgram | None:
    """The joint graph in one trace (`passes.module_joint`), or None where that tracer
    fails and export's path (which handles more Python, and falls back to symbolic_trace)
    is to try."""
    for keep_attention in (True, False):  # some models only trace with attention decomposed
        try:
            with _quiet_torch_logs(), redirect_stderr(io.StringIO()):
                return trace_objective(objective, example_inputs,
                                       decomposition_table(keep_attention))
        except Exception:  # noqa: BLE001 - any failure tries the next way
            continue
    return None


def export_forward(
    model: nn.Module, example_inputs: tuple[Any, ...], loss_fn: LossFn | None = None
) -> Any:
    """The forward of `model` and its loss as an ExportedProgram of core aten ops (the ops
    of `trace`'s joint graph), without the backward: what `passes.stage_graph` cuts."""
    objective = TrainingObjective(model, loss_fn)
    with _meta_as_fake_cpu(model, example_inputs) as example_inputs:
        exported = _export(objective, example_inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return exported.run_decompositions(decomposition_table(keep_attention=True))


def _export_forward(objective: nn.Module, example_inputs: tuple[Any, ...]) -> tuple[Any, str]:
    """The exported forward and how it was captured: torch.export, else symbolic_trace."""
    try:
        return _export(objective, example_inputs), "torch.export"
    except TraceError:
        raise
    except Exception as export_error:  # noqa: BLE001 - any export failure tries the fallback
        return _export_via_symbolic_trace(objective, example_inputs, export_error), "symbolic_trace"


def _unused_parameters(exported: Any) -> list[nn.Parameter]:
    """Parameters requiring a gradient whose placeholder no op reads."""
    users = {n.name: len(n.users) for n in exported.graph.nodes if n.op == "placeholder"}
    return [
        exported.state_dict[spec.target]
        for spec in exported.graph_signature.input_specs
        if spec.kind.name == "PARAMETER" and users.get(spec.arg.name) == 0
        and exported.state_dict[spec.target].requires_grad
    ]


@contextmanager
def _frozen(parameters: list[nn.Parameter]) -> Iterator[None]:
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)


@contextmanager
def _meta_as_fake_cpu(model: nn.Module, inputs: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """Trace a meta-device model as fake CPU tensors: still no memory, but operators pick
    their CPU kernels (scaled-dot-product attention dispatches to the fused CPU flash
    kernel rather than the unfused math it chooses on meta)."""
    leaves = torch.utils._pytree.tree_leaves(inputs)
    tensors = [*model.parameters(), *model.buffers(), *leaves]
    if not any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors):
        yield inputs
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    cpu = torch.device("cpu")

    def fake(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_meta:
            return mode.fake_tensor_converter.from_meta_and_device(mode, t, cpu)
        return t

    originals: list[tuple[dict, str, Any]] = []
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for key, value in table.items():
                if value is None or not value.is_meta:
                    continue
                originals.append((table, key, value))
                swapped = fake(value)
                if isinstance(value, nn.Parameter):
                    swapped = nn.Parameter(swapped, requires_grad=value.requires_grad)
                table[key] = swapped
    try:
        yield torch.utils._pytree.tree_map(fake, inputs)
    finally:
        for table, key, value in originals:
            table[key] = value


@contextmanager
def _untied(model: nn.Module) -> Iterator[dict[str, str]]:
    """Give every second name of a shared parameter a stand-in parameter of its own, for
    the duration of the block; yields alias FQN -> the FQN the parameter keeps."""
    first_name: dict[int, str] = {}
    replaced: list[tuple[nn.Module, str, nn.Parameter]] = []
    aliases: dict[str, str] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in first_name:
            first_name[id(param)] = fqn
            continue
        owner_path, _, leaf = fqn.rpartition(".")
        owner = model.get_submodule(owner_path)
        stand_in = nn.Parameter(torch.empty_like(param), requires_grad=param.requires_grad)
        setattr(owner, leaf, stand_in)
        replaced.append((owner, leaf, param))
        aliases[fqn] = first_name[id(param)]
    try:
        yield aliases
    finally:
        for owner, leaf, param in replaced:
            setattr(owner, leaf, param)


def _merge_tied(program: TracedProgram, aliases: dict[str, str]) -> None:
    """Point the uses of each alias at the shared parameter and sum the two gradients, so
    the program has the model's own parameters, each with one gradient."""
    if not aliases:
        return
    graph = program.graph
    node_of = {fqn: name for name, fqn in program.parameters.items()}
    grad_of = {fqn: name for name, fqn in program.gradients.items()}
    output = next(n for n in graph.nodes if n.op == "output")
    for alias, kept in aliases.items():
        alias_node = program.nodes[node_of[alias]]
        alias_node.replace_all_uses_with(program.nodes[node_of[kept]])
        graph.erase_node(alias_node)
        del program.parameters[alias_node.name]
        if alias not in grad_of or kept not in grad_of:
            # Only one of the two names is read: its gradient is the parameter's.
            for name, fqn in list(program.gradients.items()):
                if fqn == alias:
                    program.gradients[name] = kept
            continue
        kept_grad, alias_grad = program.nodes[grad_of[kept]], program.nodes[grad_of[alias]]
        with graph.inserting_before(output):
            total = graph.call_function(torch.ops.aten.add.Tensor, (kept_grad, alias_grad))
        total.meta.update(kept_grad.meta)
        total.meta["val"] = kept_grad.meta["val"]
        outputs = [total if a is kept_grad else a for a in output.args[0] if a is not alias_grad]
        output.args = (tuple(outputs),)
        del program.gradients[kept_grad.name], program.gradients[alias_grad.name]
        program.gradients[total.name] = kept
    graph.lint()
    program.graph_module.recompile()
    program.__post_init__()


def _joint(exported: Any, table: dict) -> tuple[Any, Any]:
    """The decomposed forward (for module paths) and the joint forward-backward program."""
    from torch.export.exported_program import _decompose_exported_program
    from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forward = exported.run_decompositions(table)
        # What torch.export.experimental._export_forward_backward does, with our table.
        joint = _decompose_exported_program(
            exported,
            cia_to_decomp={},
            python_decomp_table=table,
            joint_loss_index=0,
            decompose_custom_triton_ops=False,
        )
        gm, signature = _copy_graph_module_and_signature(joint)
        _remove_detach_pass(gm, signature)
        return forward, joint._update(gm, signature)


def _export(objective: nn.Module, example_inputs: tuple[Any, ...]) -> Any:
    # A failed export also prints its partial graph to stderr.
    with _quiet_torch_logs(), warnings.catch_warnings(), redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return torch.export.export(objective, tuple(example_inputs), strict=False)


@contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """A failed export logs its partial graph at WARNING from several torch loggers (each
    with a level of its own); the TraceError already says what matters."""
    loggers = [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch")
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        # CRITICAL: fake tensors log a failed op's whole traceback at ERROR.
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _export_via_symbolic_trace(
    objective: nn.Module, example_inputs: tuple[Any, ...], export_error: Exception
) -> Any:
    """Retry through `torch.fx.symbolic_trace`, which handles some Python that export cannot."""
    try:
        traced = torch.fx.symbolic_trace(objective)
        return _export(traced, example_inputs)
    except Exception:  # noqa: BLE001 - report the export error, the more informative one
        raise TraceError(describe_trace_failure(export_error, objective.model)) from export_error


def describe_trace_failure(error: Exception, model: nn.Module | None = None) -> str:
    """One short message: the module and source line where tracing failed, why, and what
    to try."""
    frame = _failing_frame(error)
    where = ""
    if frame is not None:
        code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        module = _module_path(frame, model)
        where = (
            f" in {module}" if module else ""
        ) + f" at {frame.f_code.co_filename}:{frame.f_lineno}" + (f" ({code})" if code else "")
    reason, advice = _explain(error)
    return f"could not trace the model{where}: {reason.rstrip('.')}. {advice}"


# Frames of these files are the tracer's (and the code torch generates), not the model's.
_TRACER_FILES = (f"{os.sep}torch{os.sep}", __file__, "<string>", "<eval_with_key>")


def _failing_frame(error: Exception) -> Any:
    """The innermost frame of model code in the error's traceback."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    user = [f for f in frames if not any(part in f.f_code.co_filename for part in _TRACER_FILES)]
    return user[-1] if user else None


def _module_path(frame: Any, model: nn.Module | None) -> str:
    """'blocks.1 (Gate)' for a frame inside a submodule's method, else ''."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module):
            paths = {id(m): p for p, m in model.named_modules()} if model is not None else {}
            path = paths.get(id(owner))
            if path == "":
                return f"{type(owner).__name__} (the model)"
            return f"{path} ({type(owner).__name__})" if path else type(owner).__name__
        frame = frame.f_back
    return ""


def _explain(error: Exception) -> tuple[str, str]:
    """(why, what to try) for an export failure."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if "data-dependent" in text or "GuardOnDataDependent" in type(error).__name__:
        return (
            "Python control flow or a shape depends on tensor values "
            f"({first.split(' (unhinted')[0][:100]})",
            "Compute both branches and pick with torch.where, or move the decision out of "
            "forward.",
        )
    shapes = ("must have same", "size mismatch", "shape", "Expected size", "dimension")
    if isinstance(error, (RuntimeError, ValueError, IndexError)) and any(
            word in first for word in shapes):
        return (first[:200], "The example inputs do not fit the model: give inputs of the "
                "shapes its forward takes.")
    return (
        first[:200],
        "Try calling the model with use_cache=False, returning plain tensors, and "
        "avoiding data-dependent Python control flow in forward.",
    )


def _program(joint: Any, forward: Any, method: str) -> TracedProgram:
    signature = joint.graph_signature
    gm = joint.graph_module
    parameters = {
        spec.arg.name: without_objective_prefix(spec.target)
        for spec in signature.input_specs
        if spec.kind.name == "PARAMETER"
    }
    buffers = {
        spec.arg.name: without_objective_prefix(spec.target)
        for spec in signature.input_specs
        if spec.kind.name == "BUFFER"
    }
    user_inputs = [
        spec.arg.name for spec in signature.input_specs if spec.kind.name == "USER_INPUT"
    ]
    loss = next(s.arg.name for s in signature.output_specs if s.kind.name == "LOSS_OUTPUT")
    gradients = {
        s.arg.name: without_objective_prefix(s.target)
        for s in signature.output_specs
        if s.kind.name == "GRADIENT_TO_PARAMETER"
    }
    gradient_modules = {name: fqn.rpartition(".")[0] for name, fqn in gradients.items()}
    annotate(gm.graph, forward.graph, parameters, buffers, loss, gradient_modules)
    merge_sibling_views(gm)
    return TracedProgram(gm, parameters, buffers, user_inputs, loss, gradients, method)
