"""Analytical communication cost: the alpha-beta model of collectives.

Each collective costs a latency term (alpha per step) plus a bandwidth term (bytes on
the wire per device / link bandwidth). Sources:

- ring algorithms' step counts and volumes: Thakur, Rabenseifner & Gropp, "Optimization
  of Collective Communication Operations in MPICH" (IJHPCA 2005);
- the bus-bandwidth factors (2(n-1)/n for all-reduce, (n-1)/n for all-gather and
  reduce-scatter): NCCL's performance notes (github.com/NVIDIA/nccl-tests,
  doc/PERFORMANCE.md);
- tree all-reduce: NCCL's double binary tree (NVIDIA developer blog, "Massively Scale Your
  Deep Learning Training with NCCL 2.4", 2019), after Sanders, Speck & Traeff, "Two-tree
  algorithms for full bandwidth broadcast, reduction and scan" (Parallel Computing 2009):
  every rank sends and receives the whole buffer once up and once down the trees, in
  2 * depth pipelined steps.

`collective_time` prices one collective over one given link. `group_collective_time`
prices it for a group of ranks on a `Cluster`: it picks the link from where the group
lies (one scale-up domain or several), scales the link's bandwidth by the device's
fitted `Efficiency`, and for all-reduce takes the faster of ring and tree, as NCCL does.
"""

from __future__ import annotations

import math
import weakref

from planner.vocabulary.cluster import Cluster, LinkSpec
from planner.vocabulary.plan import COLLECTIVE_KINDS


def check_kind(kind: str) -> None:
    """ValueError unless `kind` is one of COLLECTIVE_KINDS."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(
            f"Unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}."
        )


def _check_args(kind: str, nbytes: float, group_size: int) -> None:
    check_kind(kind)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")


def collective_time(kind: str, nbytes: float, group_size: int, link: LinkSpec) -> float:
    """Seconds for one ring collective of `kind` among `group_size` ranks over `link`.

    `nbytes` is the full (unsharded) tensor: the all-reduce buffer, the all-gather
    output, the reduce-scatter input, the all-to-all buffer of one rank, or the message
    of a send/recv. With n ranks, alpha = latency and bw = bandwidth:

    - all_reduce (ring = reduce-scatter + all-gather): 2(n-1)/n * nbytes/bw + 2(n-1) alpha
    - all_gather, reduce_scatter, all_to_all:          (n-1)/n * nbytes/bw + (n-1) alpha
    - send_recv (point to point):                      nbytes/bw + alpha

    A group of one rank communicates nothing and costs 0.
    """
    _check_args(kind, nbytes, group_size)
    if group_size == 1:
        return 0.0

    n = group_size
    alpha = link.latency_us * 1e-6
    bandwidth = link.bandwidth_gbs * 1e9
    if kind == "all_reduce":
        return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * alpha
    if kind == "send_recv":
        return nbytes / bandwidth + alpha
    # all_gather, reduce_scatter, all_to_all: each rank sends (n-1)/n of the buffer.
    return (n - 1) / n * nbytes / bandwidth + (n - 1) * alpha


def tree_all_reduce_time(nbytes: float, group_size: int, link: LinkSpec) -> float:
    """Seconds for a double-binary-tree all-reduce: 2 nbytes/bw + 2 ceil(log2 n) alpha.

    More bytes than the ring's 2(n-1)/n * nbytes but logarithmically many steps, so
    it wins for small buffers and large groups.
    """
    _check_args("all_reduce", nbytes, group_size)
    if group_size == 1:
        return 0.0
    depth = math.ceil(math.log2(group_size))
    return 2 * nbytes / (link.bandwidth_gbs * 1e9) + 2 * depth * link.latency_us * 1e-6


def effective_link(cluster: Cluster, group_stride: int, group_size: int,
                   point_to_point: bool = False) -> LinkSpec:
    """The link a group's collectives cross, at the bandwidth collectives reach on it.

    The scale-up link at `bandwidth * efficiency.intra_node_bandwidth` when the group
    stays in one domain (on a torus, in the share of its dimensions the group spans:
    `Cluster.torus_share`); otherwise the scale-out link per device at `bandwidth *
    efficiency.inter_node_bandwidth` for the whole collective, because a ring (or a
    tree) is as slow as its slowest hop: on a fabric of tiers, the narrowest tier the
    group crosses (`Cluster.scale_out_link`). Latency is the crossed link's per step: a
    ring spanning domains is charged every step at the scale-out latency, the same
    slowest-hop reasoning (pessimistic by the few steps that stay inside a domain), but
    for a WAN tier's, paid only by the steps between data centres.
    """
    efficiency = cluster.device.efficiency
    if cluster.spans_domains(group_stride, group_size):
        link = cluster.scale_out_link(group_stride, group_size, point_to_point)
        fraction = efficiency.inter_node_bandwidth
    else:
        link = cluster.intra_node
        fraction = efficiency.intra_node_bandwidth * cluster.torus_share(group_stride,
                                                                           group_size)
    return link.model_copy(update={"bandwidth_gbs": link.bandwidth_gbs * fraction})


def _node_rings(link: LinkSpec, cluster: Cluster, group_stride: int, group_size: int) -> LinkSpec:
    """A ring that spans domains crosses each domain boundary once per channel, and NCCL
    runs one channel per NIC: the g group members of a domain together push the ring's
    whole volume through their g network links, so the ring runs at g times the
    per-device scale-out bandwidth (capped by the scale-up link that feeds them). This is
    why NCCL's bus bandwidth across DGX nodes is the node's NIC total, not one GPU's. g is
    the fewest members any group has in a domain (`Cluster.ranks_per_domain`): the ring
    is as fast as its narrowest crossing, and the slowest group prices the collective
    (a block straddling a rack boundary off-centre, or ending in a part-filled rack)."""
    g = cluster.ranks_per_domain(group_stride, group_size)
    scale_up = cluster.intra_node.bandwidth_gbs * cluster.device.efficiency.intra_node_bandwidth
    return link.model_copy(update={"bandwidth_gbs": min(g * link.bandwidth_gbs, scale_up)})


def all_to_all_across_time(
    nbytes: float, group_size: int, ranks_per_domain: int, link: LinkSpec
) -> float:
    """Seconds for an all-to-all whose group spans domains, over the scale-out `link`.

    Each rank sends 1/n of its buffer to every other rank. With g group members per
    domain, n - g of those peers lie in other domains, so (n - g)/n of the buffer crosses
    the scale-out link: (n - g)/n * nbytes/bw + (n - 1) alpha. The (g - 1)/n for peers
    in the same domain moves meanwhile over the faster scale-up link and is never the
    larger share once the group spans two domains or more (g <= n/2), so it adds nothing.
    With one member per domain (g = 1) this is the ring formula's (n-1)/n. Where domains
    hold different numbers of members (a part-filled last domain, a block straddling a
    boundary), pass the fewest: that rank sends the most across, and the slowest rank
    finishes the collective.
    """
    _check_args("all_to_all", nbytes, group_size)
    if group_size == 1:
        return 0.0
    n, g = group_size, ranks_per_domain
    alpha = link.latency_us * 1e-6
    return (n - g) / n * nbytes / (link.bandwidth_gbs * 1e9) + (n - 1) * alpha


def group_collective_time(
    kind: str, nbytes: float, group_size: int, group_stride: int, cluster: Cluster
) -> float:
    """Seconds for one collective among `group_size` ranks spaced `group_stride` apart.

    Ranks are numbered domain-major (node-major), so `group_stride` 1 is consecutive GPUs
    of a node and `group_stride` 8 on a DGX is one GPU per node. The link and its
    achieved bandwidth come from `effective_link`; then:

    - all_reduce: min(ring, tree) -- NCCL picks the faster algorithm per size;
    - all_gather, reduce_scatter: ring, as in `collective_time`;
    - all_to_all: ring volume inside one domain; across domains only the share bound
      for other domains crosses the scale-out link (`all_to_all_across_time`);
    - send_recv: one message between neighbours of the group (pipeline stages
      `group_stride` ranks apart; pass the whole pipeline as the group, so the slowest
      stage boundary decides): the scale-up link if the group shares a domain, else the
      scale-out link.
    """
    # A search prices the same few collectives thousands of times on one cluster.
    table = _memo(cluster)
    key = (kind, nbytes, group_size, group_stride)
    seconds = table.get(key)
    if seconds is None:
        _check_args(kind, nbytes, group_size)
        seconds = 0.0
        if group_size > 1:
            # Launching and synchronizing the ranks: a barrier's depth grows as log2 of
            # the group.
            depth = math.ceil(math.log2(group_size))
            overhead = cluster.device.efficiency.collective_overhead_us * 1e-6 * depth
            seconds = overhead + _group_time(kind, nbytes, group_size, group_stride, cluster)
        table[key] = seconds
    return seconds


_MEMOS: dict[int, tuple[weakref.ref, dict]] = {}


def _memo(cluster: Cluster) -> dict:
    """The prices already computed on `cluster` (this very object: clusters are copied,
    never changed in place), dropped with it."""
    entry = _MEMOS.get(id(cluster))
    if entry is not None and entry[0]() is cluster:
        return entry[1]
    key = id(cluster)
    table: dict = {}
    _MEMOS[key] = (weakref.ref(cluster, lambda _, key=key: _MEMOS.pop(key, None)), table)
    return table


def _group_time(
    kind: str, nbytes: float, group_size: int, group_stride: int, cluster: Cluster
) -> float:
    link = effective_link(cluster, group_stride, group_size, kind == "send_recv")
    spans = cluster.spans_domains(group_stride, group_size)
    if kind == "all_to_all" and spans:
        local = cluster.ranks_per_domain(group_stride, group_size)
        return all_to_all_across_time(nbytes, group_size, local, link)
    if spans and kind != "send_recv":
        link = _node_rings(link, cluster, group_stride, group_size)
    ring = collective_time(kind, nbytes, group_size, link)
    if kind == "all_reduce":
        return min(ring, tree_all_reduce_time(nbytes, group_size, link))
    return ring
