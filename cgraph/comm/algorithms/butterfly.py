"""Butterfly allreduce (recursive doubling): log2 p pairwise exchanges of the whole buffer.

In round k, rank r exchanges with r XOR 2^k and both combine. After round k
each aligned block of 2^(k+1) ranks holds the same value. A world size that is
not a power of two is folded first: with p = 2^j + e, ranks 2^j .. p-1 send
their data to rank r - 2^j, which combines it in; the 2^j low ranks run the
butterfly; the extra ranks get the result back at the end.

    p = 6 (2^2 + 2)
    fold        4 -> 0, 5 -> 1
    round 0     0 <-> 1   2 <-> 3
    round 1     0 <-> 2   1 <-> 3
    unfold      0 -> 4, 1 -> 5

Bitwise agreement: both partners compute ``op(lower's value, higher's value)``
with the same operand order, and by induction both operands are already
identical on every rank of their block, so all ranks end with the same bytes.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import flat_view
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine


def allreduce_butterfly(transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> None:
    """In-place allreduce by recursive doubling, any world size (see the module docstring)."""
    flat = flat_view(buf)
    p, me = transport.world_size, transport.rank
    if p == 1 or flat.size == 0:
        return
    low = 1 << (p.bit_length() - 1)
    if me >= low:
        transport.send(flat, me - low)
        transport.recv(flat, me - low)
        return
    incoming = np.empty_like(flat)
    if me + low < p:
        transport.recv(incoming, me + low)
        combine(op, flat, incoming, out=flat)
    mask = 1
    while mask < low:
        partner = me ^ mask
        transport.sendrecv(flat, partner, incoming, partner)
        if me < partner:
            combine(op, flat, incoming, out=flat)
        else:
            combine(op, incoming, flat, out=flat)
        mask <<= 1
    if me + low < p:
        transport.send(flat, me + low)
