"""Lower a Plan to a per-rank program: the traced training step run on DTensors.

Each node's tensor inputs are explicitly redistributed to the placements the plan chose,
then the op runs on DTensors, so DTensor dispatches the local op and the only collectives
are the plan's redistributions (checked: an op whose output placement differs from the
plan's is an error, not a silent extra collective). A value moved to a placement is
reused by every consumer that needs it there. Gradients leave in their parameter's
placement; gradients that need an all-reduce go in the plan's buckets.

`trace_rank_program` records that execution with `make_fx` for one rank: local aten ops
and explicit `_c10d_functional` collectives, printable as Python.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from passes.dtensor_rules import parse_placements, placement_str, redistribute
from passes.strategies import SHAPE_ONLY_OPS, is_skipped
from passes.program import TracedProgram
from planner.vocabulary.plan import GradientBucket, Plan


_VIEW = torch.ops.aten.view.default


class PlanMismatchError(RuntimeError):
    """The plan does not describe this graph, or DTensor did not do what the plan says."""


class RankProgram:
    """One rank's view of a planned training step."""

    def __init__(
        self, program: TracedProgram, plan: Plan, mesh: DeviceMesh, stage: int = 0,
        layer: int | None = None,
    ) -> None:
        """`layer`: the stage's layer (counted from its first) whose own program this is,
        where the stage runs its layers one program each (`Stage.layer_operators`)."""
        self.stage = plan.stages[stage]
        if list(mesh.shape) != list(self.stage.mesh_shape):
            raise PlanMismatchError(
                f"the plan is for mesh {self.stage.mesh_shape} but the mesh is "
                f"{list(mesh.shape)}"
            )
        operators = (self.stage.operators if layer is None
                     else self.stage.layer_operators[layer])
        if operators is None:
            raise PlanMismatchError(
                f"stage {stage} of the plan has no operator shardings; plan with --mesh, "
                "or a model traced as a graph (--gpus with a model of your own)"
            )
        self.operators = operators
        if graph_fingerprint(program) != self.operators.graph_fingerprint:
            raise PlanMismatchError(
                "the plan was made for a different graph; plan this model again"
            )
        self.program = program
        self.plan = plan
        self.mesh = mesh
        self.replicated = tuple(Replicate() for _ in range(mesh.ndim))
        self._bucketed = {m for b in self.operators.gradient_buckets for m in b.members}
        self._fallbacks = {f.node for f in self.operators.fallback_ops}

    # -- state -------------------------------------------------------------------------

    def parameter_placements(self) -> dict[str, tuple]:
        return {fqn: parse_placements(p) for fqn, p in self.stage.parameters.items()}

    def shard(self, full: torch.Tensor, placements: tuple) -> DTensor:
        """This rank's shard of a full tensor every rank holds: a local slice, no
        communication."""
        return distribute_tensor(full.detach(), self.mesh, placements, src_data_rank=None)

    def shard_inputs(self, inputs: tuple[torch.Tensor, ...]) -> list[DTensor]:
        names = self.program.user_inputs
        placements = self.operators.inputs
        return [self.shard(x, parse_placements(placements[n])) for n, x in zip(names, inputs)]

    # -- one step ----------------------------------------------------------------------

    def run(
        self,
        params: dict[str, DTensor],
        buffers: dict[str, DTensor],
        inputs: list[DTensor],
    ) -> tuple[torch.Tensor, dict[str, DTensor]]:
        """Forward and backward of one step: (replicated loss, gradients by parameter FQN
        in their parameter's placement)."""
        env, moved = self.bind(params, buffers, inputs)
        self.run_nodes(env, moved)
        output = next(n for n in self.program.graph.nodes if n.op == "output")
        return self._finish(output, env, moved)

    def bind(
        self, params: dict[str, DTensor], buffers: dict[str, DTensor], inputs: list[DTensor]
    ) -> tuple[dict[str, Any], dict[tuple[str, tuple], DTensor]]:
        """A fresh environment holding the placeholders' values; user inputs past
        `inputs` are left for the caller to bind (a pipeline stage's received gradients)."""
        env: dict[str, Any] = {}
        input_iter = iter(inputs)
        for node in self.program.graph.nodes:
            if node.op != "placeholder":
                continue
            if node.name in self.program.parameters:
                env[node.name] = params[self.program.parameters[node.name]]
            elif node.name in self.program.buffers:
                env[node.name] = buffers[self.program.buffers[node.name]]
            else:
                value = next(input_iter, None)
                if value is not None:
                    env[node.name] = value
        return env, {}

    def run_nodes(
        self, env: dict[str, Any], moved: dict, only: set[str] | None = None,
        skip: set[str] | None = None,
    ) -> None:
        """Run the op nodes in graph order (those in `only`, none in `skip`)."""
        for node in self.program.graph.nodes:
            if node.op != "call_function" or is_skipped(node):
                continue
            if (only is not None and node.name not in only) or (skip and node.name in skip):
                continue
            env[node.name] = self._call(node, env, moved)

    def move(self, name: str, env: dict[str, Any], moved: dict, placements: tuple) -> DTensor:
        """The value of node `name` in `placements` (moved once, then reused)."""
        return self._move(self.program.nodes[name], env, moved, placements)

    def _call(self, node: fx.Node, env: dict[str, Any], moved: dict) -> Any:
        if node.target is operator.getitem:
            producer, index = node.args
            return env[producer.name][index]
        sharding = self.operators.nodes[node.name]
        if node.target in SHAPE_ONLY_OPS or not sharding.inputs:
            return self._replicated_call(node, env, like_only=True)
        if node.name in self._fallbacks:
            return self._replicated_call(node, env, like_only=False, moved=moved)
        wanted = iter(parse_placements(p) for p in sharding.inputs)

        def arg(a: Any) -> Any:
            if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor):
                return self._move(a, env, moved, next(wanted))
            return env[a.name] if isinstance(a, fx.Node) else a

        args, kwargs = torch.utils._pytree.tree_map(arg, (node.args, node.kwargs))
        if node.target is _VIEW:
            args = (_contiguous(args[0]), *args[1:])
        out = node.target(*args, **kwargs)
        produced = sharding.produced or sharding.outputs[0]
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, DTensor) and placement_str(first.placements) != produced:
            raise PlanMismatchError(
                f"{node.name} ({node.target}): DTensor produced {placement_str(first.placements)}, "
                f"the plan expects {produced}"
            )
        if sharding.produced is not None:
            out = redistribute(out, parse_placements(sharding.outputs[0]))
        return out

    def _replicated_call(
        self, node: fx.Node, env: dict[str, Any], like_only: bool, moved: dict | None = None
    ) -> Any:
        """Run an op on full replicated tensors: ops with no sharding rule, and ops that
        only read their inputs' shapes (then a blank tensor of the right shape stands in)."""

        def arg(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            value = a.meta.get("val")
            if isinstance(value, torch.Tensor):
                if like_only:
                    return torch.zeros(value.shape, dtype=value.dtype)
                return self._move(a, env, moved, self.replicated).to_local()
            return env[a.name]

        args, kwargs = torch.utils._pytree.tree_map(arg, (node.args, node.kwargs))
        out = node.target(*args, **kwargs)
        return torch.utils._pytree.tree_map(
            lambda t: (
                DTensor.from_local(t, self.mesh, self.replicated, run_check=False)
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor)
                else t
            ),
            out,
        )

    def _move(self, node: fx.Node, env: dict[str, Any], moved: dict, placements: tuple) -> DTensor:
        value = env[node.name]
        if tuple(value.placements) == tuple(placements):
            return value
        key = (node.name, tuple(placements))
        if key not in moved:
            moved[key] = redistribute(value, placements)
        return moved[key]

    def _finish(
        self, output: fx.Node, env: dict[str, Any], moved: dict
    ) -> tuple[torch.Tensor, dict[str, DTensor]]:
        nodes = self.program.nodes
        values = {"loss": env[self.program.loss]}
        grads: dict[str, DTensor] = {}
        for grad_name, fqn in self.program.gradients.items():
            values[fqn] = env[grad_name]
        for bucket in self.operators.gradient_buckets:
            values.update(self.reduce_bucket(bucket, values))
        param_placements = self.parameter_placements()
        for grad_name, fqn in self.program.gradients.items():
            grad = values[fqn]
            if fqn not in self._bucketed:
                grad = self._move(nodes[grad_name], env, moved, param_placements[fqn])
            grads[fqn] = grad
        loss = values["loss"]
        if "loss" not in self._bucketed:
            loss = self._move(nodes[self.program.loss], env, moved, self.replicated)
        return loss.to_local(), grads

    def reduce_bucket(
        self, bucket: GradientBucket, values: dict[str, DTensor]
    ) -> dict[str, DTensor]:
        """All-reduce a bucket's members as one flat buffer, as DDP does."""
        members = [values[m] for m in bucket.members]
        for m, value, before in zip(bucket.members, members, bucket.placements_before):
            if placement_str(value.placements) != before:
                raise PlanMismatchError(
                    f"gradient of {m} is {placement_str(value.placements)}, the plan's bucket "
                    f"expects {before}"
                )
        locals_ = [v.to_local() for v in members]
        flat = torch.cat([t.reshape(-1) for t in locals_])
        for dims in bucket.mesh_dims:
            (dim,) = dims
            flat = funcol.all_reduce(flat, "sum", (self.mesh, dim))
        out = {}
        offset = 0
        for m, value, local, before, after in zip(
            bucket.members, members, locals_, bucket.placements_before, bucket.placements_after
        ):
            piece = flat[offset : offset + local.numel()].view(local.shape)
            offset += local.numel()
            if "avg" in before:
                piece = piece / _group_size(self.mesh, bucket.mesh_dims)
            out[m] = DTensor.from_local(
                piece,
                self.mesh,
                parse_placements(after),
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
        return out


def _contiguous(value: DTensor) -> DTensor:
    """A view valid on the full tensor can be invalid on a shard whose memory is laid out
    differently (a column slice of a row-major tensor); copy such shards first."""
    local = value.to_local()
    if local.is_contiguous():
        return value
    return DTensor.from_local(
        local.contiguous(),
        value.device_mesh,
        value.placements,
        run_check=False,
        shape=value.shape,
        stride=value.stride(),
    )


def _group_size(mesh: DeviceMesh, mesh_dims: list[list[int]]) -> int:
    size = 1
    for dims in mesh_dims:
        for d in dims:
            size *= mesh.size(d)
    return size


def graph_fingerprint(program: TracedProgram) -> str:
    """A short hash of the graph's nodes, ops and shapes."""
    import hashlib

    h = hashlib.sha256()
    for node in program.graph.nodes:
        value = node.meta.get("val")
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        h.update(f"{node.name}|{node.op}|{node.target}|{shape};".encode())
    return h.hexdigest()[:16]
