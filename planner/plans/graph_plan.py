"""The Plan of a graph plan (`planner/search/graph_space.py`'s candidate): every stage's
node shardings, parameter placements, the collectives and point-to-point transfers one of
its ranks issues per step (as `plan check` counts them) and its model state."""

from __future__ import annotations

import math
from typing import Any

from passes.stage_graph import (
    BOUNDARY,
    OVERFLOW_FLAG_BYTES,
    PRECISION_DTYPES,
    piece_numel,
    routes,
)
from cost_models.memory import state_element_bytes
from cost_models.model_flops import TRACED_FLOPS_COUNT, model_flops_utilization
from planner.vocabulary.cluster import Cluster, calibration_of
from planner.vocabulary.evidence import prediction_band
from planner.vocabulary.mesh_axes import logical_axes
from planner.vocabulary.plan import (
    CollectiveStats,
    Plan,
    Predicted,
    Provenance,
    Stage,
    StageMemory,
    tessel_version,
)
from planner.search.graph_prediction import Candidate
from planner.search.stage_solve import StageResult


def graph_plan(candidate: Candidate, cluster: Cluster, name: str,
               global_batch_size: int, model_spec: str | None = None,
               model_shape: dict[str, Any] | None = None) -> Plan:
    """The Plan of a candidate: every stage's node shardings, placements, collectives per
    step (as `plan check` counts them, point-to-point included) and memory. `model_spec`
    and `model_shape`: how the model was named (`file.py:function`, `gpt` and its shape
    flags, ...), which launch files build it by."""
    stages = []
    first_device = 0
    sizes = [math.prod(shape) for _, _, shape, _ in candidate.layout.stages]
    m = candidate.micro_batches
    # The precision the model was traced in (`GraphKnobs.precision`).
    dtypes = {v.dtype for v in candidate.layers.parameter_values().values()}
    precision = next((name for name, dtype in PRECISION_DTYPES.items()
                      if dtype in dtypes and name != "fp32"), "fp32")
    for k, ((first, last, shape, _), solve) in enumerate(zip(candidate.layout.stages,
                                                             candidate.solves)):
        parameters = {f: p for f, p in solve.parameters.items()
                      if not f.startswith(BOUNDARY + ".")}
        recompute = candidate.layout.recomputes(k)
        communication = _counts(solve, m, recompute, candidate.tie_collectives[k])
        for kind, (count, nbytes) in _p2p_counts(candidate, k, sizes).items():
            stats = communication.setdefault(kind, [0, 0])
            stats[0] += count * m
            stats[1] += nbytes * m
        if precision == "fp16":  # whether any rank's gradients overflowed (loss scaling)
            stats = communication.setdefault("all_reduce", [0, 0])
            stats[0] += 1
            stats[1] += OVERFLOW_FLAG_BYTES
        stages.append(Stage(
            layers=(first, last), first_device=first_device, num_devices=sizes[k],
            mesh_axes=logical_axes(len(shape)), mesh_shape=list(shape),
            parameters=parameters,
            communication={kind: CollectiveStats(count=c, bytes=b)
                           for kind, (c, b) in sorted(communication.items())},
            memory=_memory(solve, precision), operators=solve.operators,
            layer_operators=list(solve.layer_operators), recompute=recompute))
        first_device += sizes[k]
    flops = candidate.layers.flops() * 3 * m
    step = candidate.step_time_s
    devices = cluster.num_devices
    return Plan(
        model=name, cluster=cluster.name, num_gpus=devices,
        devices_per_host=min(cluster.devices_per_host, devices),
        devices_per_node=min(cluster.devices_per_node, devices),
        mesh_axes=["device"], mesh_shape=[devices],
        global_batch_size=global_batch_size, micro_batch_size=candidate.micro_batch_size,
        num_micro_batches=m, schedule=candidate.layout.schedule, precision=precision,
        recompute="full" if any(s.recompute for s in stages) else "none",
        stages=stages, layer_cuts=list(candidate.layers.cuts),
        predicted=Predicted(
            step_time_s=step, compute_s=candidate.compute_s,
            communication_s=max(candidate.communication_s, 0.0),
            memory_gib_per_gpu=max(candidate.memory_bytes) / 2**30, fits=candidate.fits,
            model_tflops_per_gpu=flops / step / devices / 1e12 if step else None,
            mfu=model_flops_utilization(flops, step, devices, cluster.device, precision)
            if step else None,
            flops_count=TRACED_FLOPS_COUNT if step else None,
        ).with_band(prediction_band("tessel", None, cluster.device.name,
                                    cluster.device.calibration is not None)),
        provenance=Provenance(model_spec=model_spec or name, model_shape=model_shape or {},
                              cluster=cluster.name,
                              cost_source="analytical",
                              calibration=calibration_of(cluster.device),
                              tessel_version=tessel_version()),
    )


def _counts(solve: StageResult, m: int, recompute: bool,
            ties: tuple = ()) -> dict[str, list[int]]:
    """Each kind's (count, bytes) one rank issues per step: every micro-batch's, the
    step's own, the first pass's again where the stage recomputes, and the sums of its
    tied weights' gradients (`planner.search.tied`)."""
    out: dict[str, list[int]] = {}
    for times, collectives in ((m, solve.per_micro_batch), (1, solve.per_step),
                              (m, solve.rerun if recompute else ()), (1, ties)):
        for c in collectives:
            stats = out.setdefault(c.kind, [0, 0])
            stats[0] += times
            stats[1] += times * c.nbytes
    return out


def _p2p_counts(candidate: Candidate, k: int,
                sizes: list[int]) -> dict[str, tuple[int, int]]:
    """Sends and receives of one micro-batch on the first rank of stage k (every rank of a
    stage when the routes are even, as they are between power-of-two submeshes)."""
    out = {"send": [0, 0], "recv": [0, 0]}
    stages = candidate.layout.stages
    # (earlier stage, later stage, the layer the cut between them is before)
    boundaries = []
    if k > 0:  # receive activations from k - 1, send their gradients back
        boundaries.append((k - 1, k, stages[k][0]))
    if k < len(stages) - 1:  # send activations to k + 1, receive gradients
        boundaries.append((k, k + 1, stages[k][1]))
    for earlier, later, layer in boundaries:
        tensors = candidate.layers.crossing(layer)
        activations, gradients = ("send", "recv") if k == earlier else ("recv", "send")
        for kind, senders, receivers in ((activations, sizes[earlier], sizes[later]),
                                         (gradients, sizes[later], sizes[earlier])):
            plan = routes(senders, receivers)
            i_send = kind == "send"
            for tensor in tensors:
                numel, size = tensor.numel(), tensor.element_size()
                if i_send:
                    messages = [(piece, pieces) for route in plan
                                for sender, piece, pieces in route if sender == 0]
                else:
                    messages = [(piece, pieces) for _, piece, pieces in plan[0]]
                for piece, pieces in messages:
                    out[kind][0] += 1
                    out[kind][1] += piece_numel(numel, piece, pieces) * size
    return {kind: (c, b) for kind, (c, b) in out.items() if c}


def _memory(solve: StageResult, precision: str) -> StageMemory:
    """The stage's training state split as the precision holds an element's
    (`cost_models.memory.state_element_bytes`)."""
    element = state_element_bytes(precision)
    total = element.params + element.grads + element.optimizer
    state = solve.cost.state_bytes
    return StageMemory(parameters_bytes=int(state * element.params // total),
                       gradients_bytes=int(state * element.grads // total),
                       optimizer_bytes=int(state * element.optimizer // total))
