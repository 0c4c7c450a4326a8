"""Analytical communication cost: the alpha-beta model of collectives.

Each collective costs a latency term (alpha per step) plus a bandwidth term (bytes on
the wire per device / link bandwidth), using the ring algorithms' step counts and
volumes from Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 2005), and the bus-bandwidth factors in NCCL's
performance notes (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md).
"""

from __future__ import annotations

from planner.cluster import LinkSpec

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)


def collective_time(kind: str, nbytes: float, group_size: int, link: LinkSpec) -> float:
    """Seconds for one collective of `kind` among `group_size` ranks over `link`.

    `nbytes` is the full (unsharded) tensor: the all-reduce buffer, the all-gather
    output, the reduce-scatter input, the all-to-all buffer of one rank, or the message
    of a send/recv. With n ranks, alpha = latency and bw = bandwidth:

    - all_reduce (ring = reduce-scatter + all-gather): 2(n-1)/n * nbytes/bw + 2(n-1) alpha
    - all_gather, reduce_scatter, all_to_all:          (n-1)/n * nbytes/bw + (n-1) alpha
    - send_recv (point to point):                      nbytes/bw + alpha

    A group of one rank communicates nothing and costs 0.
    """
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(
            f"Unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}."
        )
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
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
