"""Weights that several stages of a graph plan hold (a weight tied across stages, as a
language model's embedding and output layer): each such stage keeps a copy and computes
its own share of the gradient. Once per step, after the micro-batches, every rank of those
stages brings its copy's gradient to replicated and one all-reduce over all of them sums
the shares (the first rank of each stage contributes its share, the others zeros: the sum
is the one a single process computes), so every copy takes the same optimizer step.
Megatron-LM's embedding group does the same between its first and last stage.

The stage DP prices a stage from its layers' solves, each layer holding the weight as its
own (a stage holding two of its readers counts its state twice) and without the sums; the
prediction of a layout (`graph_space.predict`) counts them exactly."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.distributed.tensor import Replicate

from cost_models.comm import collective_time
from cost_models.compute import tensor_bytes
from passes.dtensor_rules import (
    Collective,
    fake_mesh,
    parse_placements,
    redistribution,
    tensor_meta,
)
from passes.stage_graph import BOUNDARY
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.plan import tied_parameters
from planner.search.move_prices import CommModel


def tie_syncs(
    shapes: Sequence[tuple[int, ...]], parameters: Sequence[dict[str, str]],
    weights: dict[str, torch.Tensor], cluster: Cluster,
) -> list[tuple[tuple[Collective, ...], float]]:
    """Per stage (logical mesh `shapes[k]`, placements `parameters[k]`, laid out one after
    another from rank 0): the collectives one of its ranks issues per step to sum its
    tied weights' gradients with the other holders', and their time. `weights`: each
    parameter's value (meta is fine)."""
    sizes = [math.prod(shape) for shape in shapes]
    firsts = [sum(sizes[:k]) for k in range(len(sizes))]
    tied = tied_parameters([[f for f in p if not f.startswith(BOUNDARY + ".")]
                            for p in parameters])
    out: list[tuple[tuple[Collective, ...], float]] = []
    for k, shape in enumerate(shapes):
        collectives: list[Collective] = []
        seconds = 0.0
        held = [(fqn, holders) for fqn, holders in sorted(tied.items()) if k in holders]
        comm = CommModel(fake_mesh(shape), cluster) if held else None
        for fqn, holders in held:
            value = weights[fqn]
            replicated = tuple(Replicate() for _ in shape)
            moves = redistribution(comm.mesh, tensor_meta(value),
                                   parse_placements(parameters[k][fqn]), replicated)
            ranks = [r for h in holders for r in range(firsts[h], firsts[h] + sizes[h])]
            nbytes = tensor_bytes(value)
            per_node = cluster.devices_per_node
            link = (cluster.intra_node if ranks[0] // per_node == ranks[-1] // per_node
                    else cluster.inter_node)
            collectives += [*moves, Collective("all_reduce", (), nbytes)]
            seconds += sum(comm.time(c) for c in moves)
            seconds += collective_time("all_reduce", nbytes, len(ranks), link)
        out.append((tuple(collectives), seconds))
    return out
