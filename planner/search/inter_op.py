"""Inter-operator stage construction: layers -> pipeline stages -> submeshes, as a pure DP.

Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", OSDI 2022, Sec. 5.2 and Algorithm 1. The L layers are cut into contiguous stages,
each stage runs on one submesh, and the submeshes together use every device of the cluster
exactly once. With B micro-batches a synchronous pipeline (GPipe, 1F1B) takes

    T = sum of stage latencies + w * t_max,    t_max = the slowest stage's latency,

w = `paced_micro_batches(B)`, the micro-batches the slowest stage paces after the first: the
schedule's own time as `cost_models.pipeline_timing.one_chunk_seconds` gives it, which
the DP minimises rather than a formula of its own.

For a fixed bound t_max, F(s, l, d) is the least summed latency of layers l..L-1 cut into
exactly s stages on exactly d devices, with no stage slower than t_max:

    F(s, l, d) = min over l < j <= L and submeshes m with c = costs[l, j, m, s - 1] <= t_max
                 of c + F(s - 1, j, d - devices[m]),       F(0, L, 0) = 0,

where the last index of `costs` is the number of stages after the stage (its position from
the end: with 1F1B it has that many more micro-batches in flight, so memory, and hence
feasibility and the best intra-op plan, depend on it). Then T(t_max) = min_s F(s, 0, D) +
w * t_max, minimised over the candidate values of t_max: the distinct finite costs.

Three ways of keeping this fast without giving up exactness:

- Device counts are indexed in units of g = gcd(submesh sizes): every sum of submesh sizes is
  a multiple of g, so D' = D / g + 1 states (Alpa's submeshes (1, 2, 4, ..., M) and whole
  nodes (n, M) give g = 1 when 1-device submeshes are allowed, and D' = D + 1). Each step
  only reads the device counts that s - 1 stages can add up to, which for power-of-two
  sizes and few stages are a small share of D'.
- Device counts that cannot reach the cluster are never filled in: at most K stages of at
  most W units each (W: the widest submesh with any feasible stage), so after s stages
  from the end only d >= D' - 1 - (K - s) * W can still add up to all devices, and a
  problem with K * W below the cluster has no plan at all. When memory rules out wide
  submeshes (small micro-batches split over few replicas) this leaves few columns.
- The t_max candidates are searched by branch and bound rather than one by one. F_t falls as
  t rises, so between two evaluated candidates t_lo < t_hi every candidate t in between has
  F_t >= F_{t_hi} and T(t) >= F_{t_hi} + w * t: the interval is skipped when that bound
  reaches the best total found, or when F_{t_lo} == F_{t_hi} (no t in between beats t_lo).
  Alpa's early stop, "stop once w * t_max >= the best total", is this bound with F_{t_hi}
  replaced by 0. Optionally, and inexactly, `t_max_tolerance` merges candidates within a
  relative tolerance (Alpa skips candidates closer than a gap to the last one); the total is
  then within a factor (1 + tolerance) of the optimum.

Complexity. One evaluation of F at a given t_max costs O(sum over k, m of T_km(t) * D') time,
T_km(t) = the number of stages (l, j) on submesh m with k stages after them and cost <= t,
so O(L^2 * S * K' * D') at worst, with K' = min(K, L, max_stages) the most stages a plan can
have; it uses O(K' * L * D') memory for the tables (kept to rebuild the plan) and
O(L^2 * D') scratch. Of the N <= L^2 * S * K' distinct finite costs, the search evaluates
O(log N) to find where plans become feasible and about O(log N) per distinct value of F in
the window the bound leaves (N in the worst case); with the search off (`_prune=False`) it
is Algorithm 1's full sweep of N evaluations. At L = 96, S = 8, D = 128, K = 16, B = 64
that is 36 evaluations of 23,206 candidates, where Alpa's ascending sweep would reach ~12,900
before its early stop.

Kept apart from any driver (profiling, the intra-op ILP) so that it can be checked against
`stage_brute_force`, which enumerates every split and every submesh assignment.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.pipeline_timing import one_chunk_seconds, paced_micro_batches


@dataclass(frozen=True)
class StageChoice:
    first_layer: int
    """First layer of the stage (inclusive)."""
    last_layer: int
    """End of the stage's layers (exclusive)."""
    submesh: int
    """Index into the submesh list."""
    latency: float
    """Stage latency per micro-batch (forward + backward)."""


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[StageChoice, ...]
    total_latency: float
    """The pipeline's time, `pipeline_timing.one_chunk_seconds` of the stage latencies."""
    t_max: float
    """The largest stage latency."""


def stage_dp(
    costs: np.ndarray,
    submesh_devices: np.ndarray,
    num_devices: int,
    num_micro_batches: int,
    max_stages: int | None = None,
    t_max_tolerance: float = 0.0,
    *,
    num_stages: int | None = None,
    _prune: bool = True,
) -> StagePlan | None:
    """The plan of least pipeline latency (Alpa's Algorithm 1), or None if none is feasible.

    costs[i, j, s, k]: latency of a stage holding layers i..j-1 on submesh s when k stages
    follow it (shape [L, L + 1, S, K]; np.inf where infeasible). The chosen submeshes'
    devices (`submesh_devices`, shape [S]) add up to exactly `num_devices`. `num_stages`
    asks for exactly that many stages (a pipeline degree the user fixed). `_prune=False`
    evaluates every candidate t_max (for tests of the search).
    """
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be at least 1, got {num_micro_batches}")
    problem = _problem(costs, submesh_devices, num_devices, max_stages)
    if problem is None or (num_stages is not None and num_stages > len(problem.stages)):
        return None
    candidates = _candidates(problem, t_max_tolerance)
    if len(candidates) == 0:
        return None
    search = _branch_and_bound if _prune else _sweep
    index, total = search(
        lambda i: _least_sum(_tables(problem, candidates[i]), num_stages),
        candidates,
        paced_micro_batches(num_micro_batches),
    )
    if not math.isfinite(total):
        return None
    t_max = float(candidates[index])
    stages = _rebuild(problem, _tables(problem, t_max), t_max, num_stages)
    return _plan(stages, num_micro_batches)


def stage_brute_force(
    costs: np.ndarray,
    submesh_devices: np.ndarray,
    num_devices: int,
    num_micro_batches: int,
    max_stages: int | None = None,
    num_stages: int | None = None,
) -> StagePlan | None:
    """Enumerate every contiguous split of the layers and every assignment of submeshes to
    its stages that uses exactly `num_devices`; for tests on small instances."""
    costs = np.asarray(costs, dtype=float)
    sizes = [int(n) for n in np.asarray(submesh_devices)]
    most = _most_stages(costs.shape, max_stages)
    num_layers = costs.shape[0]
    best: StagePlan | None = None
    for bounds in _splits(num_layers, most):
        count = len(bounds) - 1
        if num_stages is not None and count != num_stages:
            continue
        for submeshes in _assignments(sizes, count, num_devices):
            stages = tuple(
                StageChoice(i, j, m, float(costs[i, j, m, count - 1 - n]))
                for n, (i, j, m) in enumerate(zip(bounds, bounds[1:], submeshes))
            )
            if not all(math.isfinite(s.latency) for s in stages):
                continue
            plan = _plan(stages, num_micro_batches)
            if best is None or plan.total_latency < best.total_latency:
                best = plan
    return best


# -- the problem, normalised -----------------------------------------------------------------


@dataclass(frozen=True)
class _Stages:
    """The feasible stages on one submesh with a given number of stages after them,
    sorted by first layer."""

    first: np.ndarray
    last: np.ndarray
    cost: np.ndarray


@dataclass(frozen=True)
class _Problem:
    stages: list[list[_Stages]]
    """stages[k][m]: stages on submesh m with k stages after them."""
    units: np.ndarray
    """Devices of each submesh, in units of their gcd."""
    capacity: int
    """The cluster's devices in those units."""
    num_layers: int
    widest: int
    """The most units any feasible stage takes."""


def _problem(
    costs: np.ndarray, submesh_devices: np.ndarray, num_devices: int, max_stages: int | None
) -> _Problem | None:
    """Check the shapes, and index the finite costs; None when no sum of submesh sizes can
    equal `num_devices`."""
    costs = np.asarray(costs, dtype=float)
    sizes = np.asarray(submesh_devices, dtype=np.int64)
    if costs.ndim != 4 or costs.shape[1] != costs.shape[0] + 1 or costs.shape[2] != len(sizes):
        raise ValueError(
            f"costs must have shape [L, L + 1, S, K] with S = {len(sizes)} submeshes, "
            f"got {costs.shape}"
        )
    if len(sizes) == 0 or (sizes <= 0).any():
        raise ValueError(f"submesh sizes must be positive, got {sizes.tolist()}")
    unit = int(np.gcd.reduce(sizes))
    if num_devices <= 0 or num_devices % unit:
        return None
    num_layers = costs.shape[0]
    most = _most_stages(costs.shape, max_stages)
    # A stage must hold at least one layer, whatever the caller put below the diagonal.
    empty = np.arange(num_layers + 1)[None, :] <= np.arange(num_layers)[:, None]
    stages = [
        [_finite_stages(np.where(empty, np.inf, costs[:, :, m, k])) for m in range(len(sizes))]
        for k in range(most)
    ]
    units = sizes // unit
    widest = max((int(units[m]) for per_k in stages for m, s in enumerate(per_k)
                  if len(s.cost)), default=0)
    if most * widest < num_devices // unit:
        return None  # even the most stages on the widest submeshes leave devices idle
    return _Problem(stages, units, num_devices // unit, num_layers, widest)


def _most_stages(shape: tuple[int, ...], max_stages: int | None) -> int:
    """A plan has at most one stage per layer, per position (K) and `max_stages`."""
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be at least 1, got {max_stages}")
    return min(shape[3], shape[0], max_stages or shape[0])


def _finite_stages(costs: np.ndarray) -> _Stages:
    first, last = np.nonzero(np.isfinite(costs))  # row-major: sorted by first layer
    return _Stages(first, last, costs[first, last])


def _candidates(problem: _Problem, tolerance: float) -> np.ndarray:
    """Sorted distinct finite stage costs; with a tolerance, the largest value of each run
    of values within a factor (1 + tolerance) of the run's smallest."""
    values = np.unique(
        np.concatenate([s.cost for per_k in problem.stages for s in per_k] + [np.empty(0)])
    )
    if tolerance <= 0 or len(values) == 0:
        return values
    kept = []
    start = values[0]
    for value, following in zip(values, list(values[1:]) + [math.inf]):
        if following > start * (1 + tolerance):
            kept.append(value)
            start = following
    return np.array(kept)


# -- the DP at one t_max ---------------------------------------------------------------------


def _tables(problem: _Problem, t_max: float) -> list[np.ndarray]:
    """F(s, ., .) for s = 0, 1, ...: arrays [L + 1, D' ] of least summed latency."""
    table = np.full((problem.num_layers + 1, problem.capacity + 1), np.inf)
    table[problem.num_layers, 0] = 0.0
    tables = [table]
    most = len(problem.stages)
    for count, per_submesh in enumerate(problem.stages, start=1):
        # The (at most most - count) stages before these take at most `widest` units each,
        # so fewer devices than what they leave can never add up to the cluster.
        least = problem.capacity - (most - count) * problem.widest
        table = _add_stage(table, per_submesh, problem.units, t_max, least)
        if not np.isfinite(table).any():
            break  # no s-stage suffix fits, so no longer one does
        tables.append(table)
    return tables


def _add_stage(
    after: np.ndarray, per_submesh: list[_Stages], units: np.ndarray, t_max: float,
    least: int = 0,
) -> np.ndarray:
    """F(s, l, d) = min over stages (l, j) on m with cost <= t_max of
    cost + F(s - 1, j, d - units[m]), from `after` = F(s - 1, ., .), for d >= `least`
    (the rest stays infinite)."""
    table = np.full_like(after, np.inf)
    finite = np.isfinite(after)
    live_rows, live_columns = finite.any(axis=1), np.flatnonzero(finite.any(axis=0))
    for stages, unit in zip(per_submesh, units):
        columns = live_columns[(live_columns + unit < after.shape[1])
                               & (live_columns + unit >= least)]
        keep = (stages.cost <= t_max) & live_rows[stages.last]
        if not keep.any() or len(columns) == 0:
            continue
        first, last, cost = stages.first[keep], stages.last[keep], stages.cost[keep]
        sums = cost[:, None] + after[np.ix_(last, columns)]
        starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])
        cells = np.ix_(first[starts], columns + unit)
        table[cells] = np.minimum(table[cells], np.minimum.reduceat(sums, starts))
    return table


def _least_sum(tables: list[np.ndarray], num_stages: int | None = None) -> float:
    """min over s >= 1 of F(s, 0, D), or F(num_stages, 0, D)."""
    if num_stages is not None:
        return float(tables[num_stages][0, -1]) if num_stages < len(tables) else math.inf
    return min((float(t[0, -1]) for t in tables[1:]), default=math.inf)


def _rebuild(
    problem: _Problem, tables: list[np.ndarray], t_max: float, num_stages: int | None = None
) -> list[StageChoice]:
    """Follow the argmins from F(s*, 0, D) down to F(0, L, 0)."""
    count = num_stages or 1 + int(np.argmin([t[0, -1] for t in tables[1:]]))
    layer, devices = 0, problem.capacity
    stages = []
    for s in range(count, 0, -1):
        target = tables[s][layer, devices]
        choice = next(
            StageChoice(layer, int(j), m, float(c))
            for m, (per_m, unit) in enumerate(zip(problem.stages[s - 1], problem.units))
            if unit <= devices
            for j, c in _starting_at(per_m, layer, t_max)
            if c + tables[s - 1][j, devices - unit] == target
        )
        stages.append(choice)
        layer, devices = choice.last_layer, devices - int(problem.units[choice.submesh])
    return stages


def _starting_at(stages: _Stages, layer: int, t_max: float) -> Iterator[tuple[int, float]]:
    lo, hi = np.searchsorted(stages.first, [layer, layer + 1])
    for j, c in zip(stages.last[lo:hi], stages.cost[lo:hi]):
        if c <= t_max:
            yield int(j), float(c)


# -- the search over t_max -------------------------------------------------------------------


def _sweep(
    least_sum: Callable[[int], float], candidates: np.ndarray, weight: int
) -> tuple[int, float]:
    """Algorithm 1 without early stop: evaluate every candidate."""
    totals = [least_sum(i) + weight * t for i, t in enumerate(candidates)]
    index = int(np.argmin(totals))
    return index, float(totals[index])


def _branch_and_bound(
    least_sum: Callable[[int], float], candidates: np.ndarray, weight: int
) -> tuple[int, float]:
    """The candidate index with the least F(t) + weight * t, and that total.

    F is non-increasing in t, so a candidate strictly between evaluated lo < hi scores at
    least F(hi) + weight * candidates[lo + 1], and no better than lo if F(lo) == F(hi).
    """
    last = len(candidates) - 1
    sums = {0: least_sum(0), last: least_sum(last)}

    def total(i: int) -> float:
        return sums[i] + weight * float(candidates[i])

    def key(i: int) -> tuple[float, int]:
        return total(i), i

    best = min(sums, key=key)
    intervals = [(0, last)]
    while intervals:
        lo, hi = intervals.pop()
        if hi - lo < 2 or sums[lo] == sums[hi]:
            continue
        if sums[hi] + weight * float(candidates[lo + 1]) >= total(best):
            continue
        mid = (lo + hi) // 2
        sums[mid] = least_sum(mid)
        best = min(best, mid, key=key)
        intervals += [(mid, hi), (lo, mid)]  # the lower half first: smaller t_max
    return best, total(best)


# -- plans -----------------------------------------------------------------------------------


def _plan(stages: Sequence[StageChoice], num_micro_batches: int) -> StagePlan:
    latencies = [s.latency for s in stages]
    return StagePlan(
        tuple(stages), one_chunk_seconds(latencies, num_micro_batches), float(max(latencies))
    )


def _splits(num_layers: int, most: int) -> Iterator[list[int]]:
    """Stage boundaries [0, ..., L] of every split into at most `most` contiguous stages."""
    for count in range(1, most + 1):
        for cuts in itertools.combinations(range(1, num_layers), count - 1):
            yield [0, *cuts, num_layers]


def _assignments(sizes: list[int], count: int, devices: int) -> Iterator[tuple[int, ...]]:
    """Every sequence of `count` submesh indices whose sizes add up to `devices`."""
    if count == 0:
        if devices == 0:
            yield ()
        return
    for m, size in enumerate(sizes):
        if size <= devices:
            for rest in _assignments(sizes, count - 1, devices - size):
                yield (m, *rest)
