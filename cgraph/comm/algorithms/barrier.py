"""Dissemination barrier: ceil(log2 p) rounds of empty messages.

In round k rank r signals r + 2^k and waits for r - 2^k. After round k every
rank has heard, directly or through others, from the 2^(k+1) ranks before it,
so after ceil(log2 p) rounds no rank leaves before all have arrived.

    p = 5     round 0: r -> r+1     round 1: r -> r+2     round 2: r -> r+4
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.transport import Transport


def barrier(transport: Transport) -> None:
    """Return on every rank only once every rank has called ``barrier``."""
    p, me = transport.world_size, transport.rank
    token_out = np.zeros(1, dtype=np.uint8)
    token_in = np.empty(1, dtype=np.uint8)
    distance = 1
    while distance < p:
        transport.sendrecv(token_out, (me + distance) % p, token_in, (me - distance) % p)
        distance <<= 1
