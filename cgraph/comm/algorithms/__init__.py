"""Collective algorithms over a point-to-point ``Transport``, selected by name.

    allreduce(transport, buf, ReduceOp.SUM, algorithm="ring")
    mine = reducescatter(transport, buf, ReduceOp.SUM, bounds, algorithm="hierarchical")
    allgather(transport, buf, bounds, algorithm="hierarchical")

run in place on ``buf`` (a C-contiguous numpy array, any shape; the element
order is the flattened order). Every rank must call with the same algorithm,
op, element count, dtype and options. ``ALGORITHMS`` (allreduce),
``REDUCESCATTER_ALGORITHMS`` and ``ALLGATHER_ALGORITHMS`` map each name to its
function; ``cgraph.comm.tuning.cost_model`` has a cost formula for each row. The
other building blocks (reduce, broadcast, barrier) are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from cgraph.comm.algorithms.barrier import barrier
from cgraph.comm.algorithms.butterfly import allreduce_butterfly
from cgraph.comm.algorithms.chain import allreduce_chain
from cgraph.comm.algorithms.hierarchical import allgather_hierarchical, reducescatter_hierarchical
from cgraph.comm.algorithms.partition import Bounds
from cgraph.comm.algorithms.reduction_server import allreduce_reduction_server
from cgraph.comm.algorithms.ring import allgather as allgather_ring
from cgraph.comm.algorithms.ring import allreduce_ring
from cgraph.comm.algorithms.ring import reducescatter as reducescatter_ring
from cgraph.comm.algorithms.shared import allreduce_shared, shares
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
    "shared": allreduce_shared,
}
"""Every allreduce algorithm by name (one row per algorithm; a test checks the cost model has each)."""

REDUCESCATTER_ALGORITHMS: dict[str, Callable[..., np.ndarray]] = {
    "ring": reducescatter_ring,
    "hierarchical": reducescatter_hierarchical,
}
"""``fn(transport, buf, op, bounds) -> view of my chunk``, by name (each has a cost row)."""

ALLGATHER_ALGORITHMS: dict[str, Callable[..., None]] = {
    "ring": allgather_ring,
    "hierarchical": allgather_hierarchical,
}
"""``fn(transport, buf, bounds)``, in place, by name (each has a cost row)."""

_T = TypeVar("_T")


def _lookup(table: dict[str, _T], kind: str, algorithm: str) -> _T:
    """``table[algorithm]``, or a ValueError naming the choices for ``kind``."""
    try:
        return table[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown {kind} algorithm {algorithm!r}; choose one of {sorted(table)}"
        ) from None


def runs_on(transport: Transport) -> tuple[str, ...]:
    """The algorithms that run as themselves over ``transport``: all but "shared" where it
    cannot (``shared.shares``: no node workspace, or nodes of one rank or unequal sizes;
    it would run another algorithm, which a measurement must not time under its name)."""
    return tuple(a for a in ALGORITHMS if a != "shared" or shares(transport))


def allreduce(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    algorithm: str = "ring",
    **options: int,
) -> None:
    """Reduce ``buf`` across all ranks of ``transport``, in place, with ``algorithm``.

    Args:
        options: passed to the algorithm (``slice_bytes`` for chain, ring and
            reduction_server; ``depth`` for reduction_server).

    Raises:
        ValueError: unknown algorithm, or ``buf`` not a writeable contiguous array.
    """
    _lookup(ALGORITHMS, "allreduce", algorithm)(transport, buf, op, **options)


def reducescatter(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    bounds: Bounds | None = None,
    algorithm: str = "ring",
) -> np.ndarray:
    """Reduce ``buf`` across ranks so rank r's chunk r holds the result; return that view.

    Args:
        bounds: ``(start, stop)`` of each rank's chunk in the flattened buffer;
            balanced by default. The rest of ``buf`` may hold partial results.
        algorithm: a name of ``REDUCESCATTER_ALGORITHMS``.

    Raises:
        ValueError: unknown algorithm, ``buf`` not a writeable contiguous array,
            or not one bound per rank.
    """
    fn = _lookup(REDUCESCATTER_ALGORITHMS, "reducescatter", algorithm)
    return fn(transport, buf, op, bounds)


def allgather(
    transport: Transport,
    buf: np.ndarray,
    bounds: Bounds | None = None,
    algorithm: str = "ring",
) -> None:
    """Fill every rank's ``buf`` with chunk r taken from rank r (in place).

    Args:
        bounds: ``(start, stop)`` of each rank's chunk; balanced by default.
        algorithm: a name of ``ALLGATHER_ALGORITHMS``.

    Raises:
        ValueError: unknown algorithm, ``buf`` not a writeable contiguous array,
            or not one bound per rank.
    """
    _lookup(ALLGATHER_ALGORITHMS, "allgather", algorithm)(transport, buf, bounds)


__all__ = [
    "ALGORITHMS",
    "ALLGATHER_ALGORITHMS",
    "REDUCESCATTER_ALGORITHMS",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "reduce",
    "reducescatter",
    "runs_on",
]
