"""CPU communicator: NCCL's semantics for CPU tensors between processes of one host.

Every ordered pair of ranks has its own shared-memory channel (a *link*), made
by the driver and attached in the actors; messages between one pair arrive in
the order they were sent. ``send`` copies the tensor's bytes into the link's
next slot (blocking only when ``LINK_SLOTS`` messages are unread), ``recv``
copies the next message out of it and frees the slot, and ``recv_view``
returns a tensor over the message where it lies, the slot taken until its
lease is released (one viewed message per link at a time)::

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
import math
import sys
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from cgraph.channels.opener import open_endpoint
from cgraph.channels.shm_channel import ShmChannel, ShmHandle
from cgraph.comm import algorithms
from cgraph.comm.communicator import Communicator, as_reduce_op, split_chunks
from cgraph.comm.types import ReduceOp

if TYPE_CHECKING:
    import torch

    from cgraph.channels.base import ChannelReader, ChannelWriter

LINK_SLOTS = 2
"""Unread messages a link holds before ``send`` waits (>= 1 is as live as rendezvous)."""

LINK_BUFFER = 64 << 10
"""First size of a link slot; a larger message grows the slot once."""

_UINT8 = np.dtype(np.uint8)

_End = TypeVar("_End")


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
    """``cgraph.collective.Transport`` over one rank's links.

    The collectives move numpy buffers; ``CpuCommunicator.send`` sends flat
    uint8 tensors, which the link's serializer rebuilds on the reader as a
    writable tensor over the slot: ``recv`` copies it out, ``view`` lends it.
    """

    def __init__(self, ends: LinkEnds) -> None:
        self._rank, self._size = ends.rank, ends.world_size
        self._out = cast("list[ChannelWriter | None]",
                         [open_endpoint(h) if h is not None else None for h in ends.out])
        self._inp = cast("list[ChannelReader | None]",
                         [open_endpoint(h) if h is not None else None for h in ends.inp])
        self._viewed: set[int] = set()  # peers whose last message a lease still views

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def node_of(self, rank: int) -> Hashable:
        return 0  # one host

    def send(self, buf: np.ndarray | torch.Tensor, dst: int) -> None:
        self._peer(self._out, dst).write(buf)

    def recv(self, buf: np.ndarray, src: int) -> None:
        _, array, reader = self._take(src, buf.dtype, buf.size)
        try:
            np.copyto(buf.reshape(-1), array.reshape(-1))
        finally:
            reader.release()

    def view(self, nbytes: int, src: int) -> tuple[torch.Tensor, Lease]:
        """The next message from ``src``, ``nbytes`` bytes, as a flat uint8 tensor where it lies.

        The link's slot stays taken, and the view valid, until the lease is
        released; a receive from ``src`` before that raises instead of freeing
        the slot under the view.
        """
        message, array, reader = self._take(src, _UINT8, nbytes)
        if isinstance(message, np.ndarray):  # an array from ``send``: read-only, so a copy
            import torch

            reader.release()
            return torch.from_numpy(array.copy()), Lease(self, src)
        self._viewed.add(src)
        return message, Lease(self, src)

    def end_view(self, src: int) -> None:
        """Free the slot of the message from ``src`` that a lease views (idempotent)."""
        if src in self._viewed:
            self._viewed.discard(src)
            self._peer(self._inp, src).release()

    def _take(self, src: int, dtype: np.dtype,
              size: int) -> tuple[np.ndarray | torch.Tensor, np.ndarray, ChannelReader]:
        """The next message from ``src``, its array form checked to fit ``size x dtype``, and the reader."""
        reader = self._peer(self._inp, src)
        if src in self._viewed:
            raise RuntimeError(
                f"rank {self._rank} recv from rank {src}: the previous message from rank {src} is "
                "still viewed; release its lease first (this receive would free its slot)"
            )
        message: np.ndarray | torch.Tensor = reader.read()  # what a peer's ``send`` wrote
        try:
            array = message if isinstance(message, np.ndarray) else _tensor_bytes(message)
            if array is None or array.dtype != dtype or array.size != size:
                got = f"{array.size} x {array.dtype}" if array is not None else repr(message)
                raise ValueError(
                    f"rank {self._rank} recv from rank {src}: message of {got} does not fit a buffer "
                    f"of {size} x {np.dtype(dtype)}; the ranks issued different calls or shapes"
                )
        except BaseException:
            reader.release()
            raise
        return message, array, reader

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        self.send(sendbuf, dst)  # buffered: the send returns before the peer reads
        self.recv(recvbuf, src)

    def close(self) -> None:
        """Close every link of this rank (wakes blocked peers too)."""
        for end in (*self._out, *self._inp):
            if end is not None:
                end.close()

    def detach(self) -> None:
        self._viewed.clear()
        for end in (*self._out, *self._inp):
            if end is not None:
                end.detach()

    def _peer(self, ends: list[_End | None], peer: int) -> _End:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no link to rank {peer} in a group of {self._size}")
        end = ends[peer]
        assert end is not None  # only this rank's own entry is None
        return end


class Lease:
    """Holds the link slot a received view lies in; ``release()`` frees it (idempotent)."""

    __slots__ = ("_transport", "_src")

    def __init__(self, transport: LinkTransport, src: int) -> None:
        self._transport, self._src = transport, src

    def release(self) -> None:
        self._transport.end_view(self._src)


class CpuCommunicator(Communicator):
    """A communicator for CPU tensors over shared-memory links (see the module docstring).

    Args:
        ends: this rank's link ends, from ``create_links`` on the driver.
        algorithm: what an allreduce's "auto" runs (a name of ``cgraph.comm.algorithms.ALGORITHMS``);
            a call may name another (on every rank alike).
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
        # A flat uint8 tensor: the link's serializer copies it once into the slot, and
        # the receiver gets a writable tensor over the slot (``recv_view``) or copies it.
        self._transport.send(_bytes_of(tensor.detach().contiguous()), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        with NumpyView(tensor, raw=True) as flat:
            self._transport.recv(flat, src)

    def recv_view(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> tuple[torch.Tensor, Lease]:
        """Receive without a copy: a tensor viewing the message in the link, valid until
        ``lease.release()`` (the optional capability of ``Communicator``).

        Only one message per peer can be viewed at a time: release the lease
        before the next receive from ``src`` (including collectives), or that
        receive raises ``RuntimeError``.
        """
        flat, lease = self._transport.view(math.prod(shape) * dtype.itemsize, src)
        try:
            return flat.view(dtype).reshape(shape), lease
        except BaseException:
            lease.release()
            raise

    @property
    def nodes(self) -> tuple[int, ...]:
        return (0,) * self.world_size  # one host

    @property
    def algorithms(self) -> tuple[str, ...]:
        return tuple(sorted(algorithms.ALGORITHMS))

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        name = self.algorithm if algorithm == "auto" else algorithm
        if name not in algorithms.ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose 'auto' or one of "
                             f"{sorted(algorithms.ALGORITHMS)}")
        with NumpyView(tensor) as flat:
            algorithms.allreduce(self._transport, flat, as_reduce_op(op), name)

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor, algorithm: str = "auto") -> None:
        import torch

        n, p = tensor.numel(), self.world_size
        if len(out) != p:
            raise ValueError(f"allgather: got {len(out)} output tensors for a group of {p} ranks")
        whole = torch.empty(p * n, dtype=tensor.dtype)
        whole[self.rank * n : (self.rank + 1) * n] = tensor.detach().reshape(-1).cpu()
        with NumpyView(whole) as flat:
            algorithms.allgather(self._transport, flat, algorithm=_one_node(algorithm))
        for r, part in enumerate(out):
            part.copy_(whole[r * n : (r + 1) * n].reshape(part.shape))

    def reducescatter(
        self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
    ) -> None:
        import torch

        p = self.world_size
        whole = torch.cat([c.detach().reshape(-1).cpu() for c in split_chunks(out, tensors, p)])
        with NumpyView(whole) as flat:
            mine = algorithms.reducescatter(self._transport, flat, as_reduce_op(op), algorithm=_one_node(algorithm))
            result = torch.from_numpy(mine.copy())
        out.copy_(result.reshape(out.shape).to(out.dtype))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        with NumpyView(tensor, raw=True) as flat:
            algorithms.broadcast(self._transport, flat, src)

    def barrier(self) -> None:
        algorithms.barrier(self._transport)

    def abort(self) -> None:
        self._transport.close()

    def destroy(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.detach()


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous tensor as a flat uint8 tensor (any dtype, bfloat16 too)."""
    import torch

    return tensor.cpu().reshape(-1).view(torch.uint8)


def _tensor_bytes(message: torch.Tensor) -> np.ndarray | None:
    """A flat uint8 tensor message as a numpy view; None for anything else."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(message, torch.Tensor) or message.dtype != torch.uint8 or message.dim() != 1:
        return None
    return message.numpy()  # type: ignore[no-any-return]


class NumpyView:
    """A flat numpy view of a tensor to work on in place, copied back if it had to be a copy.

    ``raw=True`` views the bytes (for moves); otherwise the elements, in a
    dtype numpy can reduce (bfloat16 and friends go through float32).
    """

    def __init__(self, tensor: torch.Tensor, raw: bool = False) -> None:
        self._tensor, self._raw = tensor, raw
        self._work: torch.Tensor = tensor  # the tensor worked on: this one, or a copy (__enter__)

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


def _no_grad() -> torch.no_grad:
    import torch

    return torch.no_grad()


@functools.cache
def _numpy_dtypes() -> frozenset[torch.dtype]:
    """torch dtypes numpy can hold (and reduce) without a conversion."""
    import torch

    return frozenset({
        torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
        torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    })


def _one_node(algorithm: str) -> str:
    """A reducescatter's or allgather's algorithm on one host: "auto" is the ring (the
    hierarchical one is the ring itself there)."""
    return "ring" if algorithm == "auto" else algorithm
