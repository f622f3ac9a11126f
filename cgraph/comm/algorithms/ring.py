"""Ring reduce-scatter, all-gather, and the ring allreduce built from them.

The buffer is cut into p balanced chunks. In the reduce-scatter each rank
passes a partial chunk to its right neighbour p-1 times, folding in the chunk
arriving from the left; rank r ends with chunk r fully reduced. The all-gather
then circulates each finished chunk once around the ring.

    p = 3, chunk c of rank r written rc       reduce-scatter step 0   step 1
    rank 0: 00 01 02                          0 sends 02 -> 1         0 sends 01+21 -> 1
    rank 1: 10 11 12                          1 sends 10 -> 2         1 sends 12+02 -> 2
    rank 2: 20 21 22                          2 sends 21 -> 0         2 sends 20+10 -> 0
    after: rank 0 holds chunk 0 = 00+20+10, rank 1 chunk 1, rank 2 chunk 2

Every element of the result is computed on exactly one rank and copied to the
others by the all-gather, so all ranks agree bitwise. ``allreduce_ring`` runs
the pair on slices of at most ``slice_bytes`` per chunk so large tensors need
one chunk of scratch and pipeline across slices.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import (
    Bounds,
    chunk_bounds,
    elems_per,
    flat_view,
    slice_bounds,
)
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine

SLICE_BYTES = 8 << 20
"""Default largest chunk message of ``allreduce_ring``: 8 MiB."""


def _bounds_for(transport: Transport, flat: np.ndarray, bounds: Bounds | None) -> Bounds:
    if bounds is None:
        return chunk_bounds(flat.size, transport.world_size)
    if len(bounds) != transport.world_size:
        raise ValueError(f"{len(bounds)} chunk bounds for {transport.world_size} ranks")
    return tuple(bounds)


def reducescatter(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    bounds: Bounds | None = None,
) -> np.ndarray:
    """Reduce ``buf`` across ranks so rank r's chunk r holds the result; return that view.

    Args:
        bounds: ``(start, stop)`` of each rank's chunk in the flattened buffer;
            balanced ``chunk_bounds`` by default. The rest of ``buf`` is left
            holding partial results.
    """
    flat = flat_view(buf)
    chunks = _bounds_for(transport, flat, bounds)
    p, me = transport.world_size, transport.rank
    mine = flat[chunks[me][0] : chunks[me][1]]
    if p == 1:
        return mine
    right, left = (me + 1) % p, (me - 1) % p
    incoming = np.empty(max(b - a for a, b in chunks), dtype=flat.dtype)
    for step in range(p - 1):
        sa, sb = chunks[(me - step - 1) % p]
        ra, rb = chunks[(me - step - 2) % p]
        target = flat[ra:rb]
        transport.sendrecv(flat[sa:sb], right, incoming[: rb - ra], left)
        combine(op, incoming[: rb - ra], target, out=target)
    return mine


def allgather(transport: Transport, buf: np.ndarray, bounds: Bounds | None = None) -> None:
    """Fill every rank's ``buf`` with chunk r taken from rank r (in place).

    Args:
        bounds: ``(start, stop)`` of each rank's chunk; balanced by default.
    """
    flat = flat_view(buf)
    chunks = _bounds_for(transport, flat, bounds)
    p, me = transport.world_size, transport.rank
    right, left = (me + 1) % p, (me - 1) % p
    for step in range(p - 1):
        sa, sb = chunks[(me - step) % p]
        ra, rb = chunks[(me - step - 1) % p]
        transport.sendrecv(flat[sa:sb], right, flat[ra:rb], left)


def allreduce_ring(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    *,
    slice_bytes: int = SLICE_BYTES,
) -> None:
    """In-place allreduce: ring reduce-scatter then ring all-gather, slice by slice."""
    flat = flat_view(buf)
    p = transport.world_size
    if p == 1 or flat.size == 0:
        return
    for a, b in slice_bounds(flat.size, p * elems_per(slice_bytes, flat.itemsize)):
        part = flat[a:b]
        reducescatter(transport, part, op)
        allgather(transport, part)
