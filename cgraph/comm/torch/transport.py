"""cgraph's ``Transport`` over a torch process group: the algorithms run on gloo and NCCL.

Every algorithm (``comm.algorithms``) is written against four calls: ``send``,
``recv``, ``sendrecv`` and ``node_of``. This transport makes them process-group
calls, so the star, chain, tree, butterfly, ring and reduction-server
algorithms run over gloo (any nodes, TCP) exactly as they run over the CPU
mesh::

    algorithms.allreduce(ProcessGroupTransport(pg, nodes), buf, op, "reduction_server")
        send(buf, dst)        pg.send([bytes of buf], dst, tag)   then wait
        recv(buf, src)        pg.recv([bytes of buf], src, tag)   then wait
        sendrecv(...)         both posted, the receive waited first: no exchange deadlocks
        node_of(r)            nodes[r] (Ray node ids, exchanged when the group was made)

Buffers are numpy arrays; each moves as its raw bytes (a ``uint8`` view), so
every numpy dtype travels, and on the CPU the torch tensor shares the array's
memory (no copy). On a CUDA process group (NCCL) each message is staged through
a device buffer: correct, one host-device copy each way, and not yet run on a
GPU (the algorithms reduce with numpy on the host). Messages between one pair
keep their order (one tag, and process groups match sends to receives in
order per pair), as the ``Transport`` protocol asks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from cgraph.comm.transport import byte_view

if TYPE_CHECKING:
    import torch

    from cgraph._boundary import TorchObject

TAG = 17
"""The tag of every message of the algorithms (the backend's own calls use tag 0)."""


class ProcessGroupTransport:
    """``cgraph.comm.transport.Transport`` over a torch process group (see the module docstring).

    Args:
        pg: a ``ProcessGroupGloo`` or ``ProcessGroupNCCL`` (this rank's).
        nodes: the node of every rank of ``pg``, by rank.
        device: where the process group's tensors live ("cpu" for gloo, "cuda" for NCCL).
    """

    def __init__(self, pg: TorchObject, nodes: Sequence[Hashable], device: str = "cpu") -> None:
        if len(nodes) != pg.size():
            raise ValueError(f"{len(nodes)} node ids for a process group of {pg.size()} ranks")
        self._pg, self._nodes, self._device = pg, tuple(nodes), device
        self._rank: int = pg.rank()
        self._size: int = pg.size()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def node_of(self, rank: int) -> Hashable:
        return self._nodes[rank]

    def send(self, buf: np.ndarray, dst: int) -> None:
        if buf.size:
            self._group().send([self._outgoing(buf)], self._peer(dst), TAG).wait()

    def recv(self, buf: np.ndarray, src: int) -> None:
        if buf.size:
            landing = self._landing(buf)
            self._group().recv([landing], self._peer(src), TAG).wait()
            self._land(buf, landing)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        sent = self._group().send([self._outgoing(sendbuf)], self._peer(dst), TAG) if sendbuf.size else None
        self.recv(recvbuf, src)
        if sent is not None:
            sent.wait()

    def close(self) -> None:
        """Drop the process group (its owner aborted it): later messages raise."""
        self._pg = None

    # ------------------------------------------------------------------ internals
    def _group(self) -> TorchObject:
        pg = self._pg
        if pg is None:
            from cgraph.errors import ChannelClosedError

            raise ChannelClosedError("the process group under this transport was aborted")
        return pg

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no peer {peer} in a group of {self._size}")
        return peer

    def _outgoing(self, buf: np.ndarray) -> torch.Tensor:
        import torch

        raw = byte_view(buf)
        if not raw.flags.writeable:  # torch wants writable memory to share it
            raw = raw.copy()
        tensor = torch.from_numpy(raw)
        return tensor if self._device == "cpu" else tensor.to(self._device)

    def _landing(self, buf: np.ndarray) -> torch.Tensor:
        import torch

        if self._device == "cpu" and buf.flags.writeable:
            return torch.from_numpy(byte_view(buf))  # the message lands in place
        return torch.empty(buf.nbytes, dtype=torch.uint8, device=self._device)

    def _land(self, buf: np.ndarray, landing: torch.Tensor) -> None:
        if landing.device.type == "cpu" and landing.data_ptr() == buf.ctypes.data:
            return  # it landed in place
        np.copyto(byte_view(buf), landing.cpu().numpy())
