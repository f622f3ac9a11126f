"""Test fabric: collective ranks as threads of one process, no Ray, no sockets.

    endpoints = LocalTransport.create(4)                 one endpoint per rank
    run_ranks(endpoints, lambda t: allreduce(t, buf))    one thread per rank, results in rank order
    cost_params = measure()                              the cost model fitted on this fabric

``LocalTransport`` implements ``cgraph.comm.transport.Transport`` in memory. Sends
are buffered (the data is copied into the (src, dst) queue) unless the endpoints
are created with ``rendezvous=True``: then a send hands over a reference and
blocks until the receiver has copied it, the strictest model, which every
algorithm passes. A peer that never answers makes a receive fail after
``timeout`` seconds with ``ChannelTimeoutError``; when one rank of ``run_ranks``
fails, the fabric is closed and the others fail at once with
``ChannelClosedError``. ``LocalArena`` is a node's shared workspace for ranks
that are threads (the "shared" allreduce).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from cgraph.comm.algorithms import allreduce, barrier
from cgraph.comm.cpu.arena import size_class
from cgraph.comm.tuning.cost_model import CostParams, Sample, candidates, fit
from cgraph.comm.types import ReduceOp
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0


@dataclass(eq=False)
class _Message:
    data: np.ndarray
    taken: bool = False


@dataclass(eq=False)
class _Channel:
    """The FIFO of one (src, dst) pair; one condition guards queue and hand-over."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    queue: deque[_Message] = field(default_factory=deque)


class _Fabric:
    """State shared by the endpoints of one ``LocalTransport.create`` call."""

    def __init__(self, nodes: tuple[Hashable, ...], rendezvous: bool, timeout: float) -> None:
        n = len(nodes)
        self.nodes = nodes
        self.rendezvous = rendezvous
        self.timeout = timeout
        self.channels = {(s, d): _Channel() for s in range(n) for d in range(n)}
        self.closed: str | None = None
        self.workspaces: dict[Hashable, dict[str, np.ndarray]] = {node: {} for node in nodes}

    def close(self, reason: str) -> None:
        self.closed = reason
        for channel in self.channels.values():
            with channel.cond:
                channel.cond.notify_all()

    def wait(self, channel: _Channel, ready: Callable[[], bool], what: str) -> None:
        """Block on ``channel`` until ``ready()``; the caller holds ``channel.cond``."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            if self.closed is not None:
                raise ChannelClosedError(f"{what}: the transport was closed ({self.closed})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeoutError(
                    f"{what}: no progress in {self.timeout:g} s. The peer never matched this "
                    "call; every rank must issue the same collectives, in the same order, "
                    "with equal element counts and dtypes."
                )
            channel.cond.wait(left)


class LocalTransport:
    """One rank's endpoint of an in-memory fabric (see the module docstring)."""

    def __init__(self, fabric: _Fabric, rank: int) -> None:
        self._fabric = fabric
        self._rank = rank
        node = fabric.nodes[rank]
        local = [r for r, n in enumerate(fabric.nodes) if n == node].index(rank)
        self.arena = LocalArena(fabric.workspaces[node], local)
        """The node's shared workspace (``algorithms.shared``), in process."""

    @classmethod
    def create(
        cls,
        world_size: int,
        node_of: Sequence[Hashable] | Callable[[int], Hashable] | None = None,
        *,
        rendezvous: bool = False,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> list[LocalTransport]:
        """One endpoint per rank of a new fabric.

        Args:
            world_size: number of ranks (>= 1).
            node_of: the node of each rank, as a sequence or a function of the
                rank; ``None`` puts every rank on node 0.
            rendezvous: make ``send`` block until the receiver has the data.
            timeout: seconds a call may wait for its peer before failing.

        Raises:
            ValueError: ``world_size < 1`` or ``node_of`` has the wrong length.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        if node_of is None:
            nodes: tuple[Hashable, ...] = (0,) * world_size
        elif callable(node_of):
            nodes = tuple(node_of(r) for r in range(world_size))
        else:
            nodes = tuple(node_of)
        if len(nodes) != world_size:
            raise ValueError(f"node_of names {len(nodes)} ranks, world_size is {world_size}")
        fabric = _Fabric(nodes, rendezvous, timeout)
        return [cls(fabric, r) for r in range(world_size)]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self._fabric.nodes)

    def node_of(self, rank: int) -> Hashable:
        return self._fabric.nodes[rank]

    def __repr__(self) -> str:
        mode = "rendezvous" if self._fabric.rendezvous else "buffered"
        return f"LocalTransport(rank={self._rank}, world_size={self.world_size}, {mode})"

    def abort(self, reason: str) -> None:
        """Close the whole fabric: every blocked or later call on any endpoint fails."""
        self._fabric.close(reason)

    def send(self, buf: np.ndarray, dst: int) -> None:
        message = self._post(buf, dst)
        self._await_taken(message, dst)

    def recv(self, buf: np.ndarray, src: int) -> None:
        _check_contiguous(buf, "recv")
        channel = self._channel(src, self._rank)
        what = f"rank {self._rank} recv from rank {src}"
        with channel.cond:
            self._fabric.wait(channel, lambda: bool(channel.queue), what)
            message = channel.queue.popleft()
            try:
                _copy_message(message.data, buf, what)
            finally:
                message.taken = True
                channel.cond.notify_all()

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        message = self._post(sendbuf, dst)
        self.recv(recvbuf, src)
        self._await_taken(message, dst)

    # ------------------------------------------------------------------ internals
    def _channel(self, src: int, dst: int) -> _Channel:
        if not (0 <= src < self.world_size and 0 <= dst < self.world_size):
            raise ValueError(
                f"rank {self._rank}: peer out of range in ({src} -> {dst}), "
                f"world_size is {self.world_size}"
            )
        return self._fabric.channels[(src, dst)]

    def _post(self, buf: np.ndarray, dst: int) -> _Message:
        _check_contiguous(buf, "send")
        channel = self._channel(self._rank, dst)
        if self._fabric.closed is not None:
            raise ChannelClosedError(
                f"rank {self._rank} send to rank {dst}: the transport was closed "
                f"({self._fabric.closed})"
            )
        data = buf if self._fabric.rendezvous else buf.copy()
        message = _Message(data, taken=not self._fabric.rendezvous)
        with channel.cond:
            channel.queue.append(message)
            channel.cond.notify_all()
        return message

    def _await_taken(self, message: _Message, dst: int) -> None:
        if message.taken:
            return
        channel = self._channel(self._rank, dst)
        with channel.cond:
            what = f"rank {self._rank} send to rank {dst} (rendezvous)"
            self._fabric.wait(channel, lambda: message.taken, what)


def _check_contiguous(buf: np.ndarray, call: str) -> None:
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
        raise ValueError(f"{call} needs a C-contiguous numpy array, got {type(buf).__name__}")


def _copy_message(data: np.ndarray, buf: np.ndarray, what: str) -> None:
    if data.dtype != buf.dtype or data.size != buf.size:
        raise ValueError(
            f"{what}: message of {data.size} x {data.dtype} does not fit a buffer of "
            f"{buf.size} x {buf.dtype}; the ranks issued different collectives or counts"
        )
    np.copyto(buf.reshape(-1), data.reshape(-1))


def run_ranks(endpoints: Sequence[LocalTransport], fn: Callable[[LocalTransport], T]) -> list[T]:
    """Run ``fn(endpoint)`` on one thread per rank and return the results in rank order.

    If any rank raises, the fabric is closed so the others stop, and the first
    original error (not one caused by the closing) is re-raised.
    """
    results: list[T | None] = [None] * len(endpoints)
    errors: list[tuple[float, int, BaseException]] = []

    def body(ep: LocalTransport) -> None:
        try:
            results[ep.rank] = fn(ep)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append((time.monotonic(), ep.rank, exc))
            ep.abort(f"rank {ep.rank} raised {type(exc).__name__}")

    threads = [threading.Thread(target=body, args=(ep,), daemon=True) for ep in endpoints]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = [e for e in errors if not isinstance(e[2], ChannelClosedError)] or errors
        raise min(first, key=lambda e: e[0])[2]
    return results  # type: ignore[return-value]


class LocalArena:
    """The workspace of ranks that are threads of one process (tests, ``LocalTransport``)."""

    def __init__(self, shared: dict[str, np.ndarray], node_rank: int) -> None:
        self._shared, self._node_rank, self._k, self._turn = shared, node_rank, 0, 1

    def turn(self) -> int:
        self._turn ^= 1
        return self._turn

    def view(self, nbytes: int, barrier: Callable[[], None]) -> np.ndarray:
        k = size_class(nbytes)
        if k > self._k:  # every rank of the node decides alike: same sizes, same order
            if self._node_rank == 0:
                self._shared["region"] = np.zeros(1 << k, dtype=np.uint8)
            barrier()
            self._k = k
        return self._shared["region"]


# --------------------------------------------------------------------------- cost samples
def sample(
    transport_factory: Callable[[int], Sequence[LocalTransport]] = LocalTransport.create,
    world_sizes: Sequence[int] = (2, 4),
    nbytes: Sequence[int] = (1 << 10, 1 << 16, 1 << 20),
    algorithms: Sequence[str] | None = None,
    repeats: int = 3,
) -> list[Sample]:
    """Time float32 SUM allreduces on fresh endpoints, one thread per rank.

    A sample is the slowest rank's time from a barrier to the end of its
    allreduce, each rank's best of ``repeats``.
    """
    names = tuple(algorithms or candidates())
    out = []
    for p in world_sizes:
        endpoints = transport_factory(p)
        for name in names:
            for size in nbytes:
                timed = functools.partial(_time_one, algorithm=name, nbytes=size, repeats=repeats)
                elapsed = run_ranks(endpoints, timed)
                out.append(Sample(name, p, size, max(elapsed)))
    return out


def _time_one(transport: LocalTransport, algorithm: str, nbytes: int, repeats: int) -> float:
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    best = math.inf
    for _ in range(repeats):
        barrier(transport)
        start = time.perf_counter()
        allreduce(transport, buf, ReduceOp.SUM, algorithm)
        best = min(best, time.perf_counter() - start)
    return best


def measure(
    transport_factory: Callable[[int], Sequence[LocalTransport]] = LocalTransport.create,
    **options: object,
) -> CostParams:
    """``fit(sample(transport_factory, **options))``: measure a few sizes and fit."""
    return fit(sample(transport_factory, **options))  # type: ignore[arg-type]
