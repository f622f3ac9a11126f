"""CPU communicator: NCCL's semantics for CPU tensors between processes of one host.

Every ordered pair of ranks has its own shared-memory channel (a *link*), made
by the driver and attached in the actors; messages between one pair arrive in
the order they were sent. ``send`` copies the tensor's bytes into the link's
next slot (blocking only when ``LINK_SLOTS`` messages are unread), ``recv``
copies the next message out of it and frees the slot::

    rank 0 ──link 0>1──► rank 1        3 ranks: 6 links
       ▲ ◄──link 1>0───┘   │           links[src][dst], one writer, one reader
       └───link 2>0──── rank 2 ...

The collectives are cgraph's algorithms (``cgraph.collective``) run over the
links through ``LinkTransport``, which implements the collective package's
``Transport`` protocol on numpy views of the tensors: a ring allreduce by
default (any name of ``ALGORITHMS``), ring allgather and reducescatter, tree
broadcast, dissemination barrier. A buffered link is at least as permissive as
NCCL's rendezvous, so a schedule that runs under NCCL runs here.

Closing any link (the driver does, on teardown or when an actor dies) wakes a
rank blocked on it with ``ChannelClosedError``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cgraph.channels.communicator import Communicator, as_reduce_op, split_chunks
from cgraph.channels.shm_channel import ShmChannel, ShmHandle
from cgraph.collective import algorithms
from cgraph.collective.types import ReduceOp

if TYPE_CHECKING:
    import torch

LINK_SLOTS = 2
"""Unread messages a link holds before ``send`` waits (>= 1 is as live as rendezvous)."""

LINK_BUFFER = 64 << 10
"""First size of a link slot; a larger message grows the slot once."""


@dataclass(frozen=True)
class LinkEnds:
    """One rank's ends of a link mesh (picklable): ``out[j]`` writes to j, ``inp[j]`` reads j."""

    rank: int
    world_size: int
    out: tuple[ShmHandle | None, ...]
    inp: tuple[ShmHandle | None, ...]


def create_links(tag: str, name: str, world_size: int) -> tuple[list[ShmChannel], list[LinkEnds]]:
    """Create the links of a ``world_size``-rank mesh (on the driver).

    Returns:
        The channels (to close and unlink at teardown) and each rank's ends.
    """
    channels: dict[tuple[int, int], ShmChannel] = {}
    try:
        for src in range(world_size):
            for dst in range(world_size):
                if src != dst:
                    channels[(src, dst)] = ShmChannel.create(
                        tag, f"{name}.{src}>{dst}", num_readers=1,
                        max_inflight=LINK_SLOTS, buffer_size=LINK_BUFFER,
                    )
    except BaseException:
        for ch in channels.values():
            ch.unlink()
        raise
    ends = [
        LinkEnds(
            rank,
            world_size,
            tuple(channels[(rank, j)].writer_handle() if j != rank else None for j in range(world_size)),
            tuple(channels[(j, rank)].reader_handle(0) if j != rank else None for j in range(world_size)),
        )
        for rank in range(world_size)
    ]
    return list(channels.values()), ends


class LinkTransport:
    """``cgraph.collective.Transport`` over one rank's links (numpy buffers)."""

    def __init__(self, ends: LinkEnds) -> None:
        self._rank, self._size = ends.rank, ends.world_size
        self._out = [h.attach() if h is not None else None for h in ends.out]
        self._inp = [h.attach() if h is not None else None for h in ends.inp]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def node_of(self, rank: int) -> Hashable:
        return 0  # one host

    def send(self, buf: np.ndarray, dst: int) -> None:
        self._peer(self._out, dst).write(buf)

    def recv(self, buf: np.ndarray, src: int) -> None:
        reader = self._peer(self._inp, src)
        message = reader.read()
        try:
            if not isinstance(message, np.ndarray) or message.dtype != buf.dtype or message.size != buf.size:
                got = f"{message.size} x {message.dtype}" if isinstance(message, np.ndarray) else repr(message)
                raise ValueError(
                    f"rank {self._rank} recv from rank {src}: message of {got} does not fit a buffer "
                    f"of {buf.size} x {buf.dtype}; the ranks issued different calls or shapes"
                )
            np.copyto(buf.reshape(-1), message.reshape(-1))
        finally:
            reader.release()

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        self.send(sendbuf, dst)  # buffered: the send returns before the peer reads
        self.recv(recvbuf, src)

    def close(self) -> None:
        """Close every link of this rank (wakes blocked peers too)."""
        for end in (*self._out, *self._inp):
            if end is not None:
                end.close()

    def detach(self) -> None:
        for end in (*self._out, *self._inp):
            if end is not None:
                end.detach()

    def _peer(self, ends: list[Any], peer: int) -> Any:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no link to rank {peer} in a group of {self._size}")
        return ends[peer]


class CpuCommunicator(Communicator):
    """A communicator for CPU tensors over shared-memory links (see the module docstring).

    Args:
        ends: this rank's link ends, from ``create_links`` on the driver.
        algorithm: the allreduce algorithm (a name of ``cgraph.collective.algorithms.ALGORITHMS``);
            the ``algorithm`` attribute may be changed between calls (on every rank alike).
    """

    def __init__(self, ends: LinkEnds, algorithm: str = "ring") -> None:
        if algorithm not in algorithms.ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; use one of {sorted(algorithms.ALGORITHMS)}")
        self._transport = LinkTransport(ends)
        self.algorithm = algorithm
        self._closed = False

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def world_size(self) -> int:
        return self._transport.world_size

    @property
    def transport(self) -> LinkTransport:
        return self._transport

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._transport.send(_bytes_of(tensor.detach().contiguous()), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        with _Writable(tensor, raw=True) as flat:
            self._transport.recv(flat, src)

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM) -> None:
        with _Writable(tensor) as flat:
            algorithms.allreduce(self._transport, flat, as_reduce_op(op), self.algorithm)

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> None:
        import torch

        n, p = tensor.numel(), self.world_size
        if len(out) != p:
            raise ValueError(f"allgather: got {len(out)} output tensors for a group of {p} ranks")
        whole = torch.empty(p * n, dtype=tensor.dtype)
        whole[self.rank * n : (self.rank + 1) * n] = tensor.detach().reshape(-1).cpu()
        with _Writable(whole) as flat:
            algorithms.allgather(self._transport, flat, _even(n, p))
        for r, part in enumerate(out):
            part.copy_(whole[r * n : (r + 1) * n].reshape(part.shape))

    def reducescatter(
        self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM
    ) -> None:
        import torch

        n, p = out.numel(), self.world_size
        whole = torch.cat([c.detach().reshape(-1).cpu() for c in split_chunks(out, tensors, p)])
        with _Writable(whole) as flat:
            mine = algorithms.reducescatter(self._transport, flat, as_reduce_op(op), _even(n, p))
            result = torch.from_numpy(mine.copy())
        out.copy_(result.reshape(out.shape).to(out.dtype))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        with _Writable(tensor, raw=True) as flat:
            algorithms.broadcast(self._transport, flat, src)

    def barrier(self) -> None:
        algorithms.barrier(self._transport)

    def abort(self) -> None:
        self._transport.close()

    def destroy(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.detach()


def _even(n: int, p: int) -> tuple[tuple[int, int], ...]:
    return tuple((r * n, (r + 1) * n) for r in range(p))


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The raw bytes of a contiguous tensor as a uint8 array (any dtype, bfloat16 too)."""
    import torch

    return tensor.cpu().reshape(-1).view(torch.uint8).numpy()


class _Writable:
    """A flat numpy view of a tensor to work on in place, copied back if it had to be a copy.

    ``raw=True`` views the bytes (for moves); otherwise the elements, in a
    dtype numpy can reduce (bfloat16 and friends go through float32).
    """

    def __init__(self, tensor: torch.Tensor, raw: bool = False) -> None:
        self._tensor, self._raw = tensor, raw
        self._work: Any = None

    def __enter__(self) -> np.ndarray:
        import torch

        t = self._tensor
        direct = t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad
        if self._raw:
            self._work = t if direct else t.detach().contiguous().cpu()
            return self._work.reshape(-1).view(torch.uint8).numpy()
        numpy_ok = t.dtype in _numpy_dtypes()
        self._work = t if direct and numpy_ok else t.detach().cpu().to(t.dtype if numpy_ok else torch.float32).contiguous()
        return self._work.reshape(-1).numpy()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self._work is not self._tensor:
            with _no_grad():
                self._tensor.copy_(self._work.reshape(self._tensor.shape))


def _no_grad() -> Any:
    import torch

    return torch.no_grad()


@functools.cache
def _numpy_dtypes() -> frozenset[Any]:
    """torch dtypes numpy can hold (and reduce) without a conversion."""
    import torch

    return frozenset({
        torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
        torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    })
