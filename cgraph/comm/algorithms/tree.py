"""Binomial-tree reduce and broadcast, and the tree allreduce built from them.

Ranks are renumbered relative to the root (v = (rank - root) mod p). Rank v's
parent is v with its lowest set bit cleared; its children are v + m for every
power of two m below that bit (all powers below p for the root). Seed 003
calls the allreduce "Recursive-Allreduce".

    p = 6, root 0           reduce: leaves first, children in increasing m
         0                  broadcast: parents first, children in decreasing m
       / | \\
      1  2  4               ceil(log2 p) rounds each way
         |  |
         3  5

Only the root computes the final value; everyone else receives its bytes.
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.partition import flat_view
from cgraph.comm.transport import Transport
from cgraph.comm.types import ReduceOp, combine


def _children(v: int, p: int) -> list[int]:
    """Relative ranks of v's children, smallest subtree first."""
    low = v & -v if v else 1 << max(0, (p - 1).bit_length())
    kids = []
    m = 1
    while m < low and v + m < p:
        kids.append(v + m)
        m <<= 1
    return kids


def _reduce(transport: Transport, acc: np.ndarray, op: ReduceOp, root: int) -> None:
    """Fold the subtree below this rank into ``acc`` and pass it up (root keeps it)."""
    p, me = transport.world_size, transport.rank
    v = (me - root) % p
    kids = _children(v, p)
    if kids:
        incoming = np.empty_like(acc)
        for child in kids:
            transport.recv(incoming, (child + root) % p)
            combine(op, acc, incoming, out=acc)
    if v:
        transport.send(acc, (v - (v & -v) + root) % p)


def reduce(
    transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM, root: int = 0
) -> None:
    """Reduce every rank's ``buf`` into ``buf`` on ``root``; other buffers stay unchanged.

    Raises:
        ValueError: ``root`` out of range or ``buf`` not a contiguous array.
    """
    flat = flat_view(buf)
    _check_root(transport, root)
    if transport.world_size == 1 or flat.size == 0:
        return
    v = (transport.rank - root) % transport.world_size
    inner = v != 0 and bool(_children(v, transport.world_size))
    _reduce(transport, flat.copy() if inner else flat, op, root)


def broadcast(transport: Transport, buf: np.ndarray, root: int = 0) -> None:
    """Copy ``root``'s ``buf`` into every rank's ``buf`` along the binomial tree.

    Raises:
        ValueError: ``root`` out of range or ``buf`` not a contiguous array.
    """
    flat = flat_view(buf)
    _check_root(transport, root)
    p = transport.world_size
    if p == 1 or flat.size == 0:
        return
    v = (transport.rank - root) % p
    if v:
        transport.recv(flat, (v - (v & -v) + root) % p)
    for child in reversed(_children(v, p)):
        transport.send(flat, (child + root) % p)


def allreduce_tree(transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> None:
    """In-place allreduce: binomial reduce to rank 0, then binomial broadcast."""
    flat = flat_view(buf)
    if transport.world_size == 1 or flat.size == 0:
        return
    _reduce(transport, flat, op, 0)
    broadcast(transport, flat, 0)


def _check_root(transport: Transport, root: int) -> None:
    if not 0 <= root < transport.world_size:
        raise ValueError(f"root {root} is outside 0..{transport.world_size - 1}")
