"""The one wrapper of a torch.distributed process group: "gloo" on CPUs, "nccl" on GPUs.

    driver                                       actor (rank r of n)
    StoreRendezvous.create(prefix) starts a  ──►  store = rendezvous.connect()
    store actor on the driver's node              pg = process_group(backend, store, r, n)
                                                   ProcessGroupCommunicator(rendezvous, r, n, backend)

    imperative API (comm.torch.backend)          ProcessGroupCommunicator.over(pg, store, backend, nodes)
                                                   inside TorchComm, one per group and team

``process_group`` builds every torch process group cgraph uses, and
``ProcessGroupCommunicator`` makes every call on one: a compiled graph's edges
and collective nodes use it as their ``Communicator``, and the imperative API's
``TorchComm`` holds one per group or team and adds what the API promises on top
(the signature check before each call, teams, "auto", errors naming the group).
So torch's calls, the NCCL device and stream, the error a lost peer gives, and
abort are written once.

The rendezvous keys (NCCL's unique id, gloo's pair addresses) live in a
``KVStore`` actor (``ray_store``) and travel by Ray calls: no TCP server is
opened for them, so only the graph's Ray cluster can read or write them. The
process group is built directly (``process_group``, the one place cgraph builds
a torch process group; the imperative collective API builds its groups here
too), never through ``init_process_group``: no global default group is touched
and one actor may belong to several graphs' groups.

The code is the same for both backends; what only NCCL needs is three named
lines (``_Cuda``): the device (the GPU Ray assigned, bound by the caller), a
dedicated ``torch.cuda.Stream``, and entering that device and stream around a
call. Under NCCL, ``Work.wait()`` makes ``self.stream`` wait for NCCL's internal
stream, so the CPU never blocks and work queued on ``self.stream`` after a call
sees its result; ``synchronize`` blocks the CPU until that stream is done.
Under gloo, ``stream`` is ``None`` and every call blocks until its part is done,
like the CPU mesh. CI runs this class with gloo; ``make gpu-check`` runs it
with NCCL.

``abort`` (from any thread: the actor's watcher calls it when the driver closes
the graph) aborts the group and drops this rank's process group. NCCL wakes a
call blocked on a peer; gloo's calls are woken when the peer's connections
close (every member aborts, or its process ends): measured with torch 2.13,
``ProcessGroupGloo.abort()`` and ``shutdown()`` leave a blocked ``recv``
waiting, while dropping the process group closes its connections.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from cgraph.comm import algorithms
from cgraph.comm.communicator import Communicator, as_reduce_op, split_chunks
from cgraph.comm.cpu.mesh import NumpyView
from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S
from cgraph.comm.torch.transport import ProcessGroupTransport
from cgraph.comm.types import ReduceOp, dist_op

if TYPE_CHECKING:
    import contextlib

    import torch

    from cgraph._boundary import ActorHandle, TorchObject

BACKENDS = ("gloo", "nccl")
WATCHDOG = timedelta(minutes=30)
"""How long one call may wait for its peers (a DAG edge waits for the next execution);
cgraph's teardown aborts long before it fires."""


def process_group(backend: str, store: TorchObject, rank: int, size: int, timeout: timedelta,
                  host: str | None = None) -> TorchObject:
    """A ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` of ``size`` ranks joined through ``store``.

    Args:
        backend: "gloo" or "nccl".
        store: a ``torch.distributed.Store`` (keep it referenced as long as the group).
        timeout: how long one call waits for its peers.
        host: gloo's address for its pair connections (this node's address); None: this
            process's Ray node address, else the loopback address.

    Raises:
        ValueError: an unknown backend.
    """
    import torch.distributed as dist

    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # missing from torch's stubs
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host or _node_address())]
        options._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, size, options)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    raise ValueError(f"unknown process-group backend {backend!r}; use one of {BACKENDS}")


# --------------------------------------------------------------------------- torch's calls
# How ``ProcessGroupCommunicator`` starts each of torch's collectives. Each returns
# torch's ``Work``.
def start_allreduce(pg: TorchObject, tensor: torch.Tensor, op: ReduceOp) -> TorchObject:
    import torch.distributed as dist

    options = dist.AllreduceOptions()
    options.reduceOp = dist_op(op)
    return pg.allreduce([tensor], options)


def start_reduce(pg: TorchObject, tensor: torch.Tensor, dst: int, op: ReduceOp) -> TorchObject:
    import torch.distributed as dist

    options = dist.ReduceOptions()
    options.rootRank, options.reduceOp = dst, dist_op(op)
    return pg.reduce([tensor], options)


def start_broadcast(pg: TorchObject, tensor: torch.Tensor, src: int) -> TorchObject:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = src, 0
    return pg.broadcast([tensor], options)


def start_allgather(pg: TorchObject, outs: Sequence[torch.Tensor], tensor: torch.Tensor) -> TorchObject:
    """Gloo gathers no complex dtype: complex tensors travel as their real views."""
    if tensor.is_complex():
        import torch

        tensor, outs = torch.view_as_real(tensor), [torch.view_as_real(o) for o in outs]
    return pg.allgather([list(outs)], [tensor])


def start_reducescatter(pg: TorchObject, out: torch.Tensor, parts: Sequence[torch.Tensor], op: ReduceOp) -> TorchObject:
    """``out`` = the reduction of every rank's ``parts[rank]`` (torch 2.13's gloo has it too)."""
    import torch.distributed as dist

    options = dist.ReduceScatterOptions()
    options.reduceOp = dist_op(op)
    return pg.reduce_scatter([out], [[p.contiguous() for p in parts]], options)


def backend_available(backend: str) -> bool:
    """True when this process can build a ``backend`` group (nccl: CUDA too); False without torch."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return False
    if backend == "gloo":
        return bool(dist.is_available() and dist.is_gloo_available())
    return bool(dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available())


@dataclass(frozen=True)
class StoreRendezvous:
    """Where the members meet (picklable): a store actor's handle, a key prefix, and how
    long a rank waits for the others' keys."""

    store: ActorHandle  # a KVStore actor (ray_store)
    prefix: str
    timeout_s: float = RENDEZVOUS_TIMEOUT_S

    @classmethod
    def create(cls, prefix: str, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> tuple[StoreRendezvous, ActorHandle]:
        """Start a store actor on this node (the driver's).

        Args:
            prefix: the group's keys are ``<prefix>/<key>`` in the store.
            timeout_s: how long a rank waits for the others' keys (the first handshake).

        Returns:
            The rendezvous record to ship, and the actor's handle (keep it until teardown:
            Ray ends the actor once every handle is dropped).
        """
        from cgraph.comm.ray_store import start_store_actor

        actor = start_store_actor()
        return cls(actor, prefix, timeout_s), actor

    def connect(self) -> TorchObject:
        """This rank's store (a ``torch.distributed.Store``; keep it as long as its process group)."""
        from cgraph.comm.ray_store import connect_store

        return connect_store(self.store, self.timeout_s).prefixed(self.prefix)


NcclRendezvous = StoreRendezvous  # the name it had when only NCCL used it


class ProcessGroupCommunicator(Communicator):
    """One rank of a gloo or NCCL group (see the module docstring).

    Args:
        rendezvous: where the ranks meet.
        rank, world_size: this rank and the group's size.
        backend: "gloo" (CPU tensors, calls block) or "nccl" (CUDA tensors on ``stream``).
        nodes: each rank's node, by rank (the reduction server's teams follow them); empty:
            every rank on one node.

    Raises:
        RuntimeError: the backend cannot run here (NCCL needs CUDA and a torch built with it).
    """

    def __init__(self, rendezvous: StoreRendezvous, rank: int, world_size: int, backend: str = "nccl",
                 nodes: Sequence[Hashable] = ()) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown process-group backend {backend!r}; use one of {BACKENDS}")
        if not backend_available(backend):
            raise RuntimeError(
                f"the {backend} communicator cannot run here: NCCL needs CUDA and a torch built with "
                'NCCL; on CPU actors compile with default_communicator="gloo" or "cpu"'
            )
        store = rendezvous.connect()
        self._adopt(process_group(backend, store, rank, world_size, WATCHDOG), store, backend,
                    nodes, own_stream=True)

    @classmethod
    def over(cls, pg: TorchObject, store: TorchObject, backend: str, nodes: Sequence[Hashable] = ()) -> ProcessGroupCommunicator:
        """Wrap a process group built elsewhere (the imperative API's groups and teams).

        Its calls run on the caller's current CUDA stream and return when that stream has
        them queued (NCCL) or when they are done (gloo), as ``torch.distributed``'s do;
        ``stream`` is None.

        Args:
            pg: this rank's process group (``process_group``).
            store: its store (kept referenced as long as the group).
            backend: "gloo" or "nccl".
            nodes: each rank's node, by rank; empty: one node.
        """
        comm = cls.__new__(cls)
        comm._adopt(pg, store, backend, nodes, own_stream=False)
        return comm

    def _adopt(self, pg: TorchObject, store: TorchObject, backend: str, nodes: Sequence[Hashable], own_stream: bool) -> None:
        import torch

        self.backend = backend
        self._cuda = _Cuda(own_stream) if backend == "nccl" else None
        self._device = self._cuda.device if self._cuda else torch.device("cpu")
        # referenced here as long as the process group: C++ holds only its own reference,
        # and pybind loses a Python store's methods once no Python reference is left
        self._store = store
        self._pg: TorchObject = pg
        self._rank, self._size = int(pg.rank()), int(pg.size())
        self._lock = threading.Lock()
        self._done = False
        self._transport: ProcessGroupTransport | None = None
        self._nodes = tuple(nodes) if nodes else (0,) * self._size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def stream(self) -> TorchObject:
        return self._cuda.stream if self._cuda else None

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._run(lambda pg: pg.send([tensor], dst, 0))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._run(lambda pg: pg.recv([tensor], src, 0))

    @property
    def nodes(self) -> tuple[Hashable, ...]:
        return self._nodes

    @property
    def algorithms(self) -> tuple[str, ...]:
        """"native" (the backend's own); on gloo also cgraph's, over its send/recv."""
        return ("native", *sorted(algorithms.ALGORITHMS)) if self.backend == "gloo" else ("native",)

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        """The backend's own allreduce ("auto" or "native"), or on gloo one of cgraph's
        algorithms by name, over this group's send/recv (not on NCCL's stream)."""
        if algorithm not in ("auto", "native"):
            if algorithm not in self.algorithms:
                raise ValueError(f"the {self.backend} communicator runs allreduce algorithm 'auto' or one "
                                 f"of {list(self.algorithms)}, not {algorithm!r}")
            self._allreduce_with(self._group(), tensor, as_reduce_op(op), algorithm)
            return
        self._run(lambda pg: start_allreduce(pg, tensor, as_reduce_op(op)))

    def _allreduce_with(self, pg: TorchObject, tensor: torch.Tensor, op: ReduceOp, name: str) -> None:
        with NumpyView(tensor) as flat:
            algorithms.allreduce(self.transport, flat, op, name)

    @property
    def transport(self) -> ProcessGroupTransport:
        """The process group's send/recv as cgraph's ``Transport``: cgraph's algorithms run on it."""
        if self._transport is None:
            self._transport = ProcessGroupTransport(self._group(), self._nodes, self._device.type)
        return self._transport

    @property
    def timeout_s(self) -> float | None:
        """How long one call waits for a peer; None where torch does not say."""
        timeout = getattr(getattr(self._pg, "options", None), "_timeout", None)
        return None if timeout is None else float(timeout.total_seconds())

    def reduce(self, tensor: torch.Tensor, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """The backend's own reduce into ``dst``; a non-root's tensor is left as it was
        (torch may use it as scratch, so a copy goes instead)."""
        work = tensor if self._rank == dst else tensor.clone()
        self._run(lambda pg: start_reduce(pg, work, dst, as_reduce_op(op)))

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor, algorithm: str = "auto") -> None:
        _native(self, "allgather", algorithm)
        self._run(lambda pg: start_allgather(pg, out, tensor))

    def reducescatter(
        self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
    ) -> None:
        _native(self, "reducescatter", algorithm)
        parts = split_chunks(out, tensors, self._size)
        self._run(lambda pg: start_reducescatter(pg, out, parts, as_reduce_op(op)))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._run(lambda pg: start_broadcast(pg, tensor, src))

    def barrier(self) -> None:
        self._run(lambda pg: pg.barrier())
        self.synchronize()

    def synchronize(self) -> None:
        if self._cuda and self._cuda.stream is not None:
            self._cuda.stream.synchronize()

    def abort(self) -> None:
        self._finish(lambda pg: pg.abort())

    def destroy(self) -> None:
        self._finish(lambda pg: (getattr(pg, "shutdown", None) or pg.abort)())

    def _finish(self, how: Callable[[TorchObject], object]) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            pg, self._pg = self._pg, None
            if self._transport is not None:
                self._transport.close()  # it held the process group too
        try:
            how(pg)
        except RuntimeError:
            pass  # already broken (a dead peer): nothing left to free
        del pg  # the last reference: gloo closes its connections, which wakes the peers

    def _group(self) -> TorchObject:
        """This rank's process group, unless the communicator was aborted."""
        pg = self._pg
        if pg is None:
            from cgraph.errors import ChannelClosedError

            raise ChannelClosedError(
                f"the {self.backend} communicator was aborted (teardown or a failed peer)")
        return pg

    def _run(self, call: Callable[[TorchObject], TorchObject]) -> None:
        pg = self._group()
        try:
            if self._cuda is None:
                call(pg).wait()  # gloo: blocks until this rank's part is done
                return
            with self._cuda.enter():
                call(pg).wait()  # the current stream (the comm stream) waits; the CPU does not
        except RuntimeError as exc:
            text = str(exc).splitlines()[0] if str(exc) else ""
            if any(mark in text for mark in _PEER_GONE):
                from cgraph.errors import ChannelLostError

                # a peer's process ended (or dropped the group): not this op's fault
                raise ChannelLostError(f"the {self.backend} communicator lost a peer: {text}") from exc
            raise


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""What gloo says when the other end of a pair went away."""


def _native(comm: ProcessGroupCommunicator, what: str, algorithm: str) -> None:
    if algorithm not in ("auto", "native"):
        raise ValueError(f"the {comm.backend} communicator runs {what} algorithm 'auto' or 'native', "
                         f"not {algorithm!r}")


class NcclCommunicator(ProcessGroupCommunicator):
    """``ProcessGroupCommunicator`` with the NCCL backend."""

    def __init__(self, rendezvous: StoreRendezvous, rank: int, world_size: int) -> None:
        super().__init__(rendezvous, rank, world_size, "nccl")


class _Cuda:
    """The only lines of this module that need CUDA: the device, the comm stream (a graph's
    communicator has its own; the API's calls run on the caller's), entering them."""

    def __init__(self, own_stream: bool) -> None:
        import torch

        self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device) if own_stream else None  # type: ignore[no-untyped-call]  # unannotated in torch

    def enter(self) -> contextlib.ExitStack[bool | None]:
        import contextlib

        import torch

        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        if self.stream is not None:
            stack.enter_context(torch.cuda.stream(self.stream))
        return stack


def _node_address() -> str:
    """This process's Ray node address (where gloo's peers on other nodes reach it)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # unannotated in Ray
    except Exception:  # noqa: BLE001 - no Ray worker here: the loopback address
        pass
    return "127.0.0.1"
