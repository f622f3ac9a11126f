"""Direct (pairwise) reduce-scatter and all-gather: every rank talks to every other.

In round d (1 .. p-1) rank r sends to r+d and receives from r-d, so each round
is a permutation and every message goes straight to the rank that owns its
chunk: one hop, whatever p is. This is the sharded exchange of a reduction
server (Herring / Fairring): each rank is the "server" of one shard.

    p = 3, shards s0 s1 s2       round 1: 0->1 1->2 2->0     round 2: 0->2 1->0 2->1
    reduce-scatter: rank r receives shard r from both others and folds it in
    all-gather:     rank r sends its finished shard r to both others

Rank r folds the incoming shards into its own in round order; only rank r
computes shard r, so all ranks agree bitwise after the all-gather.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import Bounds, flat_view
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine


def reducescatter_pairwise(
    transport: Transport, buf: np.ndarray, op: ReduceOp, bounds: Bounds
) -> None:
    """Reduce shard r of ``buf`` (at ``bounds[r]``) onto rank r by direct exchange."""
    flat = flat_view(buf)
    p, me = transport.world_size, transport.rank
    ma, mb = bounds[me]
    mine = flat[ma:mb]
    incoming = np.empty(mb - ma, dtype=flat.dtype)
    for d in range(1, p):
        dst, src = (me + d) % p, (me - d) % p
        transport.sendrecv(flat[bounds[dst][0] : bounds[dst][1]], dst, incoming, src)
        combine(op, mine, incoming, out=mine)


def allgather_pairwise(transport: Transport, buf: np.ndarray, bounds: Bounds) -> None:
    """Send shard r of ``buf`` from rank r to every other rank by direct exchange."""
    flat = flat_view(buf)
    p, me = transport.world_size, transport.rank
    mine = flat[bounds[me][0] : bounds[me][1]]
    for d in range(1, p):
        dst, src = (me + d) % p, (me - d) % p
        transport.sendrecv(mine, dst, flat[bounds[src][0] : bounds[src][1]], src)
