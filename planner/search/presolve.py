"""Exact and symmetry reductions of the intra-op assignment problem before it is solved.

- `contract_followers`: a simple op that runs where its operand arrives merges into the
  op that makes the operand (Alpa's operator merging).
- `prune_dominated`: choices another choice of the node beats everywhere are dropped.

- `tie_nodes`: nodes told to take the same choice become one node (identical blocks of a
  model take the same layout, as AutoParallel links the decision variables of repeated
  layers). Their costs and memory add up; their edges start or end at the leader.
- `merge_parallel_edges`: edges between the same two nodes become one, their matrices
  summed. Exact, and it is where tying pays: block k's edge u_k -> v_k and block k+1's
  u_{k+1} -> v_{k+1} are one edge after tying, so the ILP builds one transport block of
  edge variables for all the blocks instead of one per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solver import AssignmentProblem, SharedCost, SharedRead


@dataclass
class Tying:
    """How to expand the choices of a tied problem to the original nodes."""

    kept: list[int]
    """Index in the tied problem -> original node."""
    leader_of: list[int]
    """Original node -> the original node whose choice it takes (itself if kept)."""

    def expand(self, reduced_choices: list[int]) -> list[int]:
        choice = dict(zip(self.kept, reduced_choices))
        return [choice[leader] for leader in self.leader_of]


def tie_nodes(problem: AssignmentProblem,
              groups: list[list[int]]) -> tuple[AssignmentProblem, Tying]:
    """The problem in which the nodes of each group take one choice, that of its first
    node (all must have the same number of choices, index i meaning the same layout).
    Any assignment of the tied problem expands to one of the original with the same cost,
    memory and shared costs paid."""
    n = len(problem.node_costs)
    leader_of = list(range(n))
    for group in groups:
        for v in group[1:]:
            if len(problem.node_costs[v]) != len(problem.node_costs[group[0]]):
                raise ValueError(f"node {v} and its leader {group[0]} differ in choices")
            leader_of[v] = group[0]
    costs = [c.astype(float).copy() for c in problem.node_costs]
    memory = [m.astype(float).copy() for m in problem.node_memory]
    for v, leader in enumerate(leader_of):
        if leader != v:
            costs[leader] += costs[v]
            memory[leader] += memory[v]
    node_triggers = [{(leader_of[v], i) for v, i in s.node_triggers}
                     for s in problem.shared_costs]
    edge_triggers: list[set] = [set() for _ in problem.shared_costs]
    edges, new_edge = [], {}
    for k, (u, v, m) in enumerate(problem.edges):
        lu, lv = leader_of[u], leader_of[v]
        if lu == lv:  # both ends take one choice: only the diagonal is ever paid
            costs[lu] += np.diag(m)
            for s, (nt, _) in enumerate(zip(node_triggers, edge_triggers)):
                nt.update((lu, i) for kk, i, j in problem.shared_costs[s].edge_triggers
                          if kk == k and i == j)
            continue
        new_edge[k] = len(edges)
        edges.append((lu, lv, m))
    for s, shared in enumerate(problem.shared_costs):
        edge_triggers[s].update((new_edge[k], i, j) for k, i, j in shared.edge_triggers
                                if k in new_edge)
    kept = [v for v in range(n) if leader_of[v] == v]
    index = {v: i for i, v in enumerate(kept)}
    tied = AssignmentProblem(
        [costs[v] for v in kept], [memory[v] for v in kept],
        [(index[u], index[v], m) for u, v, m in edges], problem.memory_limit,
        [SharedCost(s.cost, sorted((index[v], i) for v, i in nt), sorted(et))
         for s, nt, et in zip(problem.shared_costs, node_triggers, edge_triggers)],
        reads=[SharedRead(index[leader_of[read.producer]], read.prices,
                          tuple((index[leader_of[v]], needs) for v, needs in read.readers))
               for read in problem.reads],
    )
    return tied, Tying(kept, leader_of)


def merge_parallel_edges(problem: AssignmentProblem) -> AssignmentProblem:
    """The same problem with the edges between any two nodes summed into one (either
    direction: a reversed edge is transposed). Edges a shared cost triggers on are kept
    apart, as their triggers name single entries of their own matrix."""
    triggered = {k for s in problem.shared_costs for k, _, _ in s.edge_triggers}
    merged: dict[tuple[int, int], int] = {}
    edges: list[list] = []
    new_index = {}
    for k, (u, v, m) in enumerate(problem.edges):
        if k in triggered:
            new_index[k] = len(edges)
            edges.append([u, v, m])
            continue
        key = (min(u, v), max(u, v))
        oriented = m if u <= v else m.T
        if key in merged:
            edges[merged[key]][2] = edges[merged[key]][2] + oriented
        else:
            merged[key] = len(edges)
            edges.append([key[0], key[1], oriented])
    shared = [SharedCost(s.cost, list(s.node_triggers),
                         [(new_index[k], i, j) for k, i, j in s.edge_triggers])
              for s in problem.shared_costs]
    return AssignmentProblem(list(problem.node_costs), list(problem.node_memory),
                             [(u, v, m) for u, v, m in edges], problem.memory_limit, shared,
                             reads=_merged_reads(problem.reads))


def _merged_reads(reads: list[SharedRead]) -> list[SharedRead]:
    """Reads of one producer by the same readers needing the same placements (identical
    blocks, once tied) as one read, their prices summed: they need the same placements
    under any choice, so the sum of their costs is the merged read's."""
    merged: dict[tuple, SharedRead] = {}
    for read in reads:
        key = (read.producer, read.prices.shape,
               tuple((v, needs.tobytes()) for v, needs in read.readers))
        if key in merged:
            merged[key] = SharedRead(read.producer, merged[key].prices + read.prices,
                                     read.readers)
        else:
            merged[key] = read
    return list(merged.values())


@dataclass
class Contraction:
    """How to expand the solution of a contracted problem to the original nodes."""

    kept: list[int]
    """Index in the contracted problem -> original node."""
    follows: dict[int, tuple[int, np.ndarray]]
    """Original node -> (the node it follows, its choice for each of that node's choices)."""

    def expand(self, reduced_choices: list[int], num_nodes: int) -> list[int]:
        choice: dict[int, int] = dict(zip(self.kept, reduced_choices))

        def resolve(v: int) -> int:
            if v not in choice:
                leader, mapping = self.follows[v]
                choice[v] = int(mapping[resolve(leader)])
            return choice[v]

        return [resolve(v) for v in range(num_nodes)]

    def root(self, v: int) -> tuple[int, np.ndarray | None]:
        """The kept node v was merged into, and v's choice for each of its choices (None
        where v was kept)."""
        mapping = None
        while v in self.follows:
            v, f = self.follows[v]
            mapping = f if mapping is None else mapping[f]
        return v, mapping


def contract_followers(problem: AssignmentProblem) -> tuple[AssignmentProblem, Contraction]:
    """Merge each follower node into the producer it follows.

    Alpa's operator merging (Zheng et al. 2022, section 5.1): a simple op (view, permute,
    elementwise) runs in whatever placement its operand arrives in, so it needs no
    decision of its own. Its costs fold into the producer and its consumers' edges start
    from the producer, so the ILP keeps one decision per chain of simple ops. Any solution
    of the contracted problem expands to one of the original with the same cost.
    """
    n = len(problem.node_costs)
    costs = [c.astype(float).copy() for c in problem.node_costs]
    memory = [m.astype(float).copy() for m in problem.node_memory]
    edges: dict[int, list] = {k: [u, v, m] for k, (u, v, m) in enumerate(problem.edges)}
    in_edges: dict[int, list[int]] = {v: [] for v in range(n)}
    out_edges: dict[int, list[int]] = {v: [] for v in range(n)}
    for k, (u, v, _) in edges.items():
        out_edges[u].append(k)
        in_edges[v].append(k)
    node_triggers = [set(s.node_triggers) for s in problem.shared_costs]
    edge_triggers = [set(s.edge_triggers) for s in problem.shared_costs]
    follows: dict[int, tuple[int, np.ndarray]] = {}

    reading = {v for read in problem.reads for v, _ in read.readers}
    for v in sorted(problem.followers):
        if v in reading:  # its input is a shared move, not an edge to fold
            continue
        u, f = problem.followers[v]
        while u in follows:  # the leader was merged itself: follow its leader
            u, g = follows[u]
            f = f[g]
        if u == v or any(edges[k][0] != u for k in in_edges[v]):
            continue
        f = np.asarray(f)
        rows = np.arange(len(f))
        costs[u] += costs[v][f]
        memory[u] += memory[v][f]
        for k in list(in_edges[v]):
            _, _, m = edges.pop(k)
            out_edges[u].remove(k)
            costs[u] += m[rows, f]
            for nt, et in zip(node_triggers, edge_triggers):
                for kk, i, j in [t for t in et if t[0] == k]:
                    et.discard((kk, i, j))
                    nt.update((u, int(r)) for r in rows if r == i and f[r] == j)
        in_edges[v].clear()
        for nt in node_triggers:
            for w, j in [t for t in nt if t[0] == v]:
                nt.discard((w, j))
                nt.update((u, int(i)) for i in np.flatnonzero(f == j))
        for kk in list(out_edges[v]):
            _, w, mm = edges[kk]
            moved = mm[f, :]
            out_edges[v].remove(kk)
            for nt, et in zip(node_triggers, edge_triggers):
                old = [t for t in et if t[0] == kk]
                et.difference_update(old)  # rewrite all at once: old and new may coincide
                for _, j, jw in old:
                    for i in np.flatnonzero(f == j):
                        if w != u:
                            et.add((kk, int(i), jw))
                        elif i == jw:
                            nt.add((u, int(i)))
            if w == u:  # the follower feeds back into its leader: a diagonal cost
                costs[u] += np.diag(moved)
                edges.pop(kk)
                in_edges[u].remove(kk)
            else:
                edges[kk] = [u, w, moved]
                out_edges[u].append(kk)
        follows[v] = (u, f)

    kept = [v for v in range(n) if v not in follows]
    new_index = {v: i for i, v in enumerate(kept)}
    edge_ids = sorted(edges)
    new_edge = {k: i for i, k in enumerate(edge_ids)}
    shared = [
        SharedCost(
            s.cost,
            sorted((new_index[v], i) for v, i in nt),
            sorted((new_edge[k], i, j) for k, i, j in et),
        )
        for s, nt, et in zip(problem.shared_costs, node_triggers, edge_triggers)
    ]
    contraction = Contraction(kept, follows)
    reads = []
    for read in problem.reads:
        leader, f = contraction.root(read.producer)
        prices = read.prices if f is None else read.prices[f]
        reads.append(SharedRead(new_index[leader], prices,
                                tuple((new_index[v], needs) for v, needs in read.readers)))
    reduced = AssignmentProblem(
        [costs[v] for v in kept],
        [memory[v] for v in kept],
        [(new_index[edges[k][0]], new_index[edges[k][1]], edges[k][2]) for k in edge_ids],
        problem.memory_limit,
        shared,
        reads=reads,
    )
    return reduced, contraction


@dataclass
class Pruning:
    """Which choices of each node a pruned problem kept."""

    kept: list[np.ndarray]
    """kept[v][i]: the original index of choice i of node v in the pruned problem."""

    def expand(self, choices: list[int]) -> list[int]:
        return [int(self.kept[v][i]) for v, i in enumerate(choices)]


def prune_dominated(problem: AssignmentProblem) -> tuple[AssignmentProblem, Pruning]:
    """Drop every choice another choice of the same node dominates: no more node cost, no
    more memory, and no more cost on any edge whatever the neighbour chooses (rows of the
    node's outgoing edge matrices, columns of its incoming ones, compared elementwise).
    Any assignment that uses a dominated choice costs at least as much as the one that
    swaps in its dominator, and needs no less memory, so the pruned problem has the same
    optimum (ties keep the lowest index). A shared read's producer compares its moves,
    its readers only choices that read the value at one placement. Choices a shared
    cost names are kept, and
    dominate nothing, since the costs they trigger are not elementwise. Repeated until
    nothing changes: pruning a neighbour's choices removes matrix columns, which can make
    more rows comparable.
    """
    n = len(problem.node_costs)
    kept = [np.arange(len(c)) for c in problem.node_costs]
    pinned: list[set[int]] = [set() for _ in range(n)]
    for shared in problem.shared_costs:
        for v, i in shared.node_triggers:
            pinned[v].add(i)
        for k, i, j in shared.edge_triggers:
            u, w, _ = problem.edges[k]
            pinned[u].add(i)
            pinned[w].add(j)
    outgoing: list[list[int]] = [[] for _ in range(n)]
    incoming: list[list[int]] = [[] for _ in range(n)]
    for k, (u, w, _) in enumerate(problem.edges):
        outgoing[u].append(k)
        incoming[w].append(k)

    def profile(v: int) -> np.ndarray:
        """One row per kept choice of v: its node cost, memory and every edge cost it
        can incur, over the neighbours' kept choices."""
        rows = kept[v]
        parts = [problem.node_costs[v][rows, None], problem.node_memory[v][rows, None]]
        for k in outgoing[v]:
            _, w, m = problem.edges[k]
            parts.append(m[np.ix_(rows, kept[w])])
        for k in incoming[v]:
            u, _, m = problem.edges[k]
            parts.append(m[np.ix_(kept[u], rows)].T)
        # A shared read: the producer's moves, compared placement by placement, and the
        # placement a reader needs, which must be the same (one-hot, compared
        # elementwise: whether a move is shared depends on the other readers).
        for read in problem.reads:
            if read.producer == v:
                parts.append(read.prices[rows])
            for w, needs in read.readers:
                if w == v:
                    parts.append(np.eye(read.prices.shape[1])[needs[rows]])
        return np.hstack([np.asarray(p, dtype=float) for p in parts])

    changed = True
    while changed:
        changed = False
        for v in range(n):
            if len(kept[v]) < 2:
                continue
            rows = profile(v)
            free = np.array([int(i) not in pinned[v] for i in kept[v]])
            # dominates[a, b]: choice a is nowhere worse than b.
            dominates = (rows[:, None, :] <= rows[None, :, :]).all(axis=2)
            dominates &= free[:, None] & free[None, :]
            equal = dominates & dominates.T
            drop = np.zeros(len(rows), dtype=bool)
            for b in range(len(rows)):
                # b goes if something strictly better dominates it, or an equal one
                # with a lower index survives.
                strict = dominates[:, b] & ~equal[:, b]
                tie = equal[:b, b] & ~drop[:b]
                drop[b] = strict.any() or tie.any()
            if drop.any():
                kept[v] = kept[v][~drop]
                changed = True
    return restrict(problem, kept), Pruning(kept)


def restrict(problem: AssignmentProblem, kept: list[np.ndarray]) -> AssignmentProblem:
    """The problem with node v's choices narrowed to `kept[v]` (original indices, in
    order); a shared cost's triggers on dropped choices go with them."""
    edges = [(u, w, m[np.ix_(kept[u], kept[w])]) for u, w, m in problem.edges]
    where = [{int(i): r for r, i in enumerate(k)} for k in kept]
    shared = [
        SharedCost(
            s.cost,
            [(v, where[v][i]) for v, i in s.node_triggers if i in where[v]],
            [(k, where[u][i], where[w][j]) for k, i, j in s.edge_triggers
             for u, w, _ in [problem.edges[k]] if i in where[u] and j in where[w]],
        )
        for s in problem.shared_costs
    ]
    reads = [SharedRead(read.producer, read.prices[kept[read.producer]],
                        tuple((v, needs[kept[v]]) for v, needs in read.readers))
             for read in problem.reads]
    return AssignmentProblem(
        [c[k] for c, k in zip(problem.node_costs, kept)],
        [m[k] for m, k in zip(problem.node_memory, kept)],
        edges, problem.memory_limit, shared, reads=reads,
    )
