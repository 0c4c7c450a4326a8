"""The stage DP's cost array of a graph search (`graph_space`): every stage of layers
i..j on every logical mesh of every submesh, with the stages after it, priced from the
layer table's solves (or bounds), keeping its activations or recomputing them; and what
a stage holds and sends, as the exact prediction of a layout prices it too."""

from __future__ import annotations

import numpy as np

from cost_models.comm import collective_time
from cost_models.pipeline_schedule import in_flight
from passes.stage_graph import routes
from planner.vocabulary.cluster import Cluster
from planner.search.graph_knobs import GraphKnobs
from planner.search.layer_table import logical_meshes
from planner.search.stage_solve import StageCost


def stage_costs(table: dict, num_layers: int, sizes: list[int], m: int, most: int,
                capacity: float, cut_bytes: list[float], cluster: Cluster,
                knobs: GraphKnobs = GraphKnobs(), refused: set = frozenset(),
                layered: bool = False) -> tuple[np.ndarray, ChosenOptions]:
    """The stage DP's cost array from the layer table, and the option (logical mesh,
    lean, recompute) each entry came from; `refused` entries (first, last, mesh, lean,
    recompute, stages after) are left out. `layered`: each stage runs its layers as
    programs of their own (`planner.search.layered_stage`), which costs exactly the sum of
    their solves, rather than as one program, which this prices as that sum less the
    moves between its layers."""
    costs = np.full((num_layers, num_layers + 1, len(sizes), most), np.inf)
    chosen = ChosenOptions(costs.shape)
    for n, shape, lean, solves in _mesh_options(table, num_layers, sizes,
                                                cluster.devices_per_node, knobs.modes()):
        link = boundary_link(cluster, 2 * n)
        _fill(costs[:, :, sizes.index(n)], chosen, sizes.index(n), (shape, lean), solves, m,
              capacity, cut_bytes, n, link, knobs, refused, layered)
    return costs, chosen


class ChosenOptions:
    """Which (logical mesh, lean, recompute) priced each entry [first, last, submesh,
    stages after] of the cost array."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.index = np.full(shape, -1, dtype=np.int32)
        self.options: list[tuple[tuple[int, ...], bool, bool]] = []

    def __getitem__(self, entry: tuple[int, int, int, int]) -> tuple[tuple[int, ...], bool, bool]:
        return self.options[self.index[entry]]

    def number(self, option: tuple[tuple[int, ...], bool, bool]) -> int:
        if option not in self.options:
            self.options.append(option)
        return self.options.index(option)


def _fill(costs: np.ndarray, chosen: ChosenOptions, s: int, option: tuple,
          solves: list[StageCost], m: int, capacity: float, cut_bytes: list[float], n: int,
          link, knobs: GraphKnobs, refused: set, layered: bool) -> None:
    """Price every stage of layers i..j on one mesh `option` (shape, lean) of `n` devices,
    keeping its activations or recomputing them, into `costs` (submesh s's [first, last,
    stages after] slice), where it beats what is there, and note the option (shape, lean,
    recompute) in `chosen`.

    A recomputing stage keeps of each micro-batch in flight only its incoming tensors
    (layer i's) and holds one micro-batch's activations at a time, for one more first pass
    of its layers per micro-batch."""
    num_layers = len(solves)
    incoming = np.array([x.incoming_s for x in solves])
    outgoing = np.array([x.outgoing_s for x in solves])
    interior = np.array([x.micro_batch_s for x in solves])
    if not layered:
        interior -= incoming + outgoing
    checkpoint = np.array([x.checkpoint_bytes for x in solves])
    prefix = lambda a: np.concatenate([[0.0], np.cumsum(a)])  # noqa: E731
    p_int, p_out = prefix(interior), prefix(outgoing)
    p_sync, p_state, p_act, p_rerun = (
        prefix(np.array([getattr(x, f) for x in solves]))
        for f in ("step_comm_s", "state_bytes", "activation_bytes", "rerun_s"))
    first = np.arange(num_layers)[:, None]
    last = np.arange(num_layers + 1)[None, :]
    valid = last > first
    end = np.maximum(last - 1, 0) + 0 * first  # the stage's last layer
    # Ends: the first layer's incoming gradient, the last layer's outgoing tensors (part
    # of each layer's own time where the stage is layered).
    ends = 0.0 if layered else incoming[first] + outgoing[end]
    p2p = np.array([route_time(b, n, n, link) if b else 0.0 for b in cut_bytes])
    latency = (p_int[last] - p_int[first] + ends + 2 * (p2p[first] + p2p[last])
               + (p_sync[last] - p_sync[first]) / m)
    state, activations = p_state[last] - p_state[first], p_act[last] - p_act[first]
    # A layered stage's first pass moves every layer's outputs but its last's: again
    # where it recomputes.
    rerun = p_rerun[last] - p_rerun[first] + (p_out[end] - p_out[first] if layered else 0.0)
    for k in range(costs.shape[2]):
        # The last stage holds the last layer, and only it.
        where = valid & ((last == num_layers) == (k == 0))
        # A stage with k after it runs as the first of k + 1 (`in_flight`), its last
        # stage as the graph runtime runs it (`eager_last_stage`).
        held = int(in_flight(knobs.schedule, k + 1, 0, m, eager_last=True))
        for recompute in knobs.recomputations(last=k == 0):
            seconds = latency + (rerun if recompute else 0.0)
            memory = peak_stage_bytes(state, activations, checkpoint[first], held, recompute)
            better = where & (memory <= capacity) & (seconds < costs[:, :, k])
            for i, j, shape, lean, rc, after in refused:
                if (shape, lean, rc, after) == (*option, recompute, k):
                    better[i, j] = False
            costs[:, :, k] = np.where(better, seconds, costs[:, :, k])
            chosen.index[:, :, s, k][better] = chosen.number((*option, recompute))


def route_time(nbytes: float, senders: int, receivers: int, link) -> float:
    """One boundary's transfer per direction, as `routes` lays it out: the busiest rank's
    messages one after another (a sender with several receivers sends to each)."""
    plan = routes(senders, receivers)
    sent: dict[int, list[float]] = {}
    received = []
    for route in plan:
        received.append(sum(nbytes / pieces for _, _, pieces in route))
        for sender, _, pieces in route:
            sent.setdefault(sender, []).append(nbytes / pieces)
    messages = max([*sent.values(), *([r] for r in received)], key=sum)
    return sum(collective_time("send_recv", b, 2, link) for b in messages)


def boundary_link(cluster: Cluster, span: int):
    """The link between two neighbouring stages that hold `span` devices together: within
    a node while both fit in one."""
    return cluster.intra_node if span <= cluster.devices_per_node else cluster.inter_node


def _mesh_options(table: dict, num_layers: int, sizes: list[int], per_node: int,
                  modes: tuple[bool, ...]):
    """(devices, logical mesh, lean, every layer's cost on it) for each mesh the layer
    table holds all layers of, lean as `modes` allow."""
    for n in sizes:
        for shape in logical_meshes(n, per_node):
            for lean in modes:
                solves = [table.get((layer, shape, lean)) for layer in range(num_layers)]
                if all(x is not None for x in solves):
                    yield n, shape, lean, solves


def peak_stage_bytes(state: float, activations: float, checkpoint: float, held: int,
                     recompute: bool) -> float:
    """Peak bytes per device of a stage of `state` bytes holding `held` micro-batches: each
    one's `activations`, or, recomputing, each one's incoming tensors (`checkpoint`) and
    one micro-batch's activations."""
    if recompute:
        return state + held * checkpoint + activations
    return state + held * activations
