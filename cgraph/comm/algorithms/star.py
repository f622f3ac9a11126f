"""Star allreduce: every rank sends to rank 0, which reduces and sends the result back.

    1 ─┐            ┌─> 1
    2 ─┼─> 0 (op) ──┼─> 2        2(p-1) messages through rank 0, one after another
    3 ─┘            └─> 3

Rank 0 folds contributions in rank order, so the result is
``((x0 op x1) op x2) op x3`` and every rank receives rank 0's bytes.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import flat_view
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine


def allreduce_star(transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> None:
    """In-place allreduce through rank 0 (reduce, then broadcast)."""
    flat = flat_view(buf)
    p, me = transport.world_size, transport.rank
    if p == 1 or flat.size == 0:
        return
    if me != 0:
        transport.send(flat, 0)
        transport.recv(flat, 0)
        return
    incoming = np.empty_like(flat)
    for src in range(1, p):
        transport.recv(incoming, src)
        combine(op, flat, incoming, out=flat)
    for dst in range(1, p):
        transport.send(flat, dst)
