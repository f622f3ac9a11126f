"""Allreduce algorithms over a point-to-point ``Transport``, selected by name.

    allreduce(transport, buf, ReduceOp.SUM, algorithm="ring")

runs in place on ``buf`` (a C-contiguous numpy array, any shape; the element
order is the flattened order). Every rank must call with the same algorithm,
op, element count, dtype and options. ``ALGORITHMS`` maps each name to its
function; ``cgraph.comm.cost_model`` has a cost formula for each row.
The building blocks (reduce, broadcast, allgather, reducescatter, barrier)
are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cgraph.comm.algorithms.barrier import barrier
from cgraph.comm.algorithms.butterfly import allreduce_butterfly
from cgraph.comm.algorithms.chain import allreduce_chain
from cgraph.comm.algorithms.reduction_server import allreduce_reduction_server
from cgraph.comm.algorithms.ring import allgather, allreduce_ring, reducescatter
from cgraph.comm.algorithms.star import allreduce_star
from cgraph.comm.algorithms.tree import allreduce_tree, broadcast, reduce
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp

AllreduceFn = Callable[..., None]
"""``fn(transport, buf, op, **options)``: an in-place allreduce."""

ALGORITHMS: dict[str, AllreduceFn] = {
    "star": allreduce_star,
    "chain": allreduce_chain,
    "tree": allreduce_tree,
    "butterfly": allreduce_butterfly,
    "ring": allreduce_ring,
    "reduction_server": allreduce_reduction_server,
}
"""Every allreduce algorithm by name (one row per algorithm; a test checks the cost model has each)."""


def allreduce(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    algorithm: str = "ring",
    **options: Any,
) -> None:
    """Reduce ``buf`` across all ranks of ``transport``, in place, with ``algorithm``.

    Args:
        options: passed to the algorithm (``slice_bytes`` for chain, ring and
            reduction_server; ``depth`` for reduction_server).

    Raises:
        ValueError: unknown algorithm, or ``buf`` not a writeable contiguous array.
    """
    try:
        fn = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown allreduce algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}"
        ) from None
    fn(transport, buf, op, **options)


__all__ = [
    "ALGORITHMS",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "reduce",
    "reducescatter",
]
