"""The point-to-point transport the collective algorithms run over.

Every algorithm is written against four calls: ``send``, ``recv``,
``sendrecv`` and ``node_of``. Messages between one (src, dst) pair are matched
in FIFO order, with no tags, so peers must issue their collectives in the same
order with equal counts (as with an MPI communicator).

``sendrecv`` exists because a rendezvous transport (one where ``send`` returns
only once the receiver has the data) deadlocks a naive exchange::

    rank 0: send(x, 1); recv(y, 1)      both block in send: neither reaches recv
    rank 1: send(x, 0); recv(y, 0)

    rank 0: sendrecv(x, 1, y, 1)        the send is posted, then the recv runs,
    rank 1: sendrecv(x, 0, y, 0)        then the send is waited for: no cycle

The transports: ``comm.cpu.mesh`` and ``comm.cpu.framed`` (shared memory on a
node), ``comm.cpu.links`` (sockets between nodes), ``comm.torch.transport``
(a torch process group). The tests' in-memory fabric (ranks as threads, and a
rendezvous mode where a send blocks until the receiver copied it, the strictest
model, which every algorithm passes) is ``tests/fabric.py``.

``node_of(rank)`` says which node (machine) a rank sits on; the two-level
reduction-server algorithm and ``teams.node_team`` read it. By default every
rank is on node 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Transport(Protocol):
    """What an algorithm needs from the fabric: ranks, nodes and blocking p2p calls."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def node_of(self, rank: int) -> Hashable:
        """The node (machine) that ``rank`` sits on."""
        ...

    def send(self, buf: np.ndarray, dst: int) -> None:
        """Send the contiguous ``buf`` to ``dst``; ``buf`` may be reused on return."""
        ...

    def recv(self, buf: np.ndarray, src: int) -> None:
        """Fill the contiguous ``buf`` in place with the next message from ``src``."""
        ...

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        """Send to ``dst`` and receive from ``src`` without deadlocking an exchange."""
        ...


def node_layout(transport: Transport) -> tuple[Hashable, ...]:
    """The node of every rank, ``layout[r] == transport.node_of(r)``."""
    return tuple(transport.node_of(r) for r in range(transport.world_size))


def byte_view(buf: np.ndarray) -> np.ndarray:
    """The raw bytes of a C-contiguous array (every transport's buffers are) as a flat uint8 view."""
    return buf.reshape(-1).view(np.uint8)


def describe_layout(nodes: Sequence[Hashable], rank: int) -> str:
    """``rank 2 on node 9d1c04aa; ranks by node: 3f2a1b9c 0,1; 9d1c04aa 2,3``, for errors."""
    by_node: dict[str, list[int]] = {}
    for r, node in enumerate(nodes):
        by_node.setdefault(str(node)[:8], []).append(r)
    ranks = "; ".join(f"{node} {','.join(map(str, rs))}" for node, rs in by_node.items())
    return f"rank {rank} on node {str(nodes[rank])[:8]}; ranks by node: {ranks}"
