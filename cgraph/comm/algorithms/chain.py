"""Chain allreduce ("circle" in seed 003): reduce up a chain, send the result back down.

The buffer is cut into slices so the chain pipelines: while rank 1 folds
slice 0 into its own and forwards it, rank 0 already sends slice 1.

    up   (reduce)     0 ──s0──> 1 ──s0──> 2 ──s0──> 3      then s1, s2, ... behind it
    down (broadcast)  0 <──s0── 1 <──s0── 2 <──s0── 3      rank 3 holds the result

Critical path with S slices: 2(p + S - 2) slice-steps instead of 2(p - 1) whole
buffers. Every rank finishes up before it starts down, in the same order on every
rank, which keeps a rendezvous transport deadlock-free: the last rank only
sends down once its neighbour has forwarded the last slice up.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import elems_per, flat_view, slice_bounds
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine

SLICE_BYTES = 1 << 20
"""Default pipeline slice: 1 MiB."""


def allreduce_chain(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    *,
    slice_bytes: int = SLICE_BYTES,
) -> None:
    """In-place allreduce along the chain 0 -> 1 -> ... -> p-1 and back, pipelined."""
    flat = flat_view(buf)
    p, me = transport.world_size, transport.rank
    if p == 1 or flat.size == 0:
        return
    slices = slice_bounds(flat.size, elems_per(slice_bytes, flat.itemsize))
    incoming = np.empty(slices[0][1], dtype=flat.dtype)
    for a, b in slices:
        part = flat[a:b]
        if me > 0:
            transport.recv(incoming[: b - a], me - 1)
            combine(op, incoming[: b - a], part, out=part)  # lower ranks on the left
        if me < p - 1:
            transport.send(part, me + 1)
    for a, b in slices:
        if me < p - 1:
            transport.recv(flat[a:b], me + 1)
        if me > 0:
            transport.send(flat[a:b], me - 1)
