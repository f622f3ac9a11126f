"""NCCL communicator: torch.distributed's ``ProcessGroupNCCL``, joined through a store actor.

    driver                                       actor (rank r of n)
    start_store_actor() on the driver's node ──►  RayStore(actor).prefixed(prefix)
    NcclRendezvous(actor, prefix, timeout_s)      ProcessGroupNCCL(that store, r, n)

The rendezvous keys (NCCL's unique id among them) live in a ``KVStore`` actor
(``cgraph.collective.ray_store``) and travel by Ray calls: no TCP server is
opened for them, so only the graph's Ray cluster can read or write them.

The process group is built directly (no ``init_process_group``, so no global
default group is touched and one actor may belong to several graphs' groups);
NCCL's unique id travels through the store. Calls are enqueued with
``self.stream`` as the current stream: ProcessGroupNCCL makes its internal
NCCL stream wait for it, and ``Work.wait()`` makes ``self.stream`` wait for the
NCCL stream, so the CPU never blocks and work queued on ``self.stream`` after a
call sees its result. ``synchronize`` blocks the CPU until that stream is done.

``abort`` (from any thread: the actor's watcher calls it when the driver closes
the graph) aborts the NCCL communicators, so a call blocked on a dead peer
fails instead of hanging. Every call here needs CUDA and cannot run on a CPU
machine; ``NcclRendezvous`` (the driver's side, and the store a rank connects)
needs only Ray and torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cgraph.channels.communicator import GpuCommunicator, as_reduce_op, split_chunks
from cgraph.collective.rendezvous import RENDEZVOUS_TIMEOUT_S
from cgraph.collective.types import ReduceOp, dist_op

if TYPE_CHECKING:
    import torch

TIMEOUT = timedelta(minutes=30)
"""NCCL's own watchdog timeout; cgraph's teardown aborts long before it fires."""

@dataclass(frozen=True)
class NcclRendezvous:
    """Where the members meet (picklable): a store actor's handle, a key prefix, and how
    long a rank waits for the others' keys."""

    store: Any  # a KVStore actor (ray_store)
    prefix: str
    timeout_s: float = RENDEZVOUS_TIMEOUT_S

    @classmethod
    def create(cls, prefix: str, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> tuple[NcclRendezvous, Any]:
        """Start a store actor on this node (the driver's).

        Args:
            prefix: the group's keys are ``<prefix>/<key>`` in the store.
            timeout_s: how long a rank waits for the others' keys (the first handshake).

        Returns:
            The rendezvous record to ship, and the actor's handle (keep it until teardown:
            Ray ends the actor once every handle is dropped).
        """
        from cgraph.collective.ray_store import start_store_actor

        actor = start_store_actor()
        return cls(actor, prefix, timeout_s), actor

    def connect(self) -> Any:
        """This rank's store (a ``torch.distributed.Store``; keep it as long as its process group)."""
        from cgraph.collective.ray_store import connect_store

        return connect_store(self.store, self.timeout_s).prefixed(self.prefix)


class NcclCommunicator(GpuCommunicator):
    """One rank of a NCCL group (see the module docstring).

    Raises:
        RuntimeError: CUDA or torch's NCCL backend is not available here.
    """

    def __init__(self, rendezvous: NcclRendezvous, rank: int, world_size: int) -> None:
        import torch
        import torch.distributed as dist

        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise RuntimeError(
                "the NCCL communicator needs CUDA and a torch built with NCCL; on CPU actors "
                'compile with default_communicator="cpu" (the CPU communicator)'
            )
        # referenced here as long as the process group: C++ holds only its own reference,
        # and pybind loses a Python store's methods once no Python reference is left
        self._store = rendezvous.connect()
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = TIMEOUT
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._pg = dist.ProcessGroupNCCL(self._store, rank, world_size, options)
        self._stream = torch.cuda.Stream(self._device)
        self._rank, self._size = rank, world_size
        self._lock = threading.Lock()
        self._done = False

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._run(lambda: self._pg.send([tensor], dst, 0))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._run(lambda: self._pg.recv([tensor], src, 0))

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM) -> None:
        import torch.distributed as dist

        opts = dist.AllreduceOptions()
        opts.reduceOp = _torch_op(op)
        self._run(lambda: self._pg.allreduce([tensor], opts))

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> None:
        self._run(lambda: self._pg.allgather([list(out)], [tensor]))

    def reducescatter(
        self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM
    ) -> None:
        import torch.distributed as dist

        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _torch_op(op)
        parts = [p.contiguous() for p in split_chunks(out, tensors, self._size)]
        self._run(lambda: self._pg.reduce_scatter([out], [parts], opts))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self._run(lambda: self._pg.broadcast([tensor], opts))

    def synchronize(self) -> None:
        self._stream.synchronize()

    def abort(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._pg.abort()

    def destroy(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        shutdown = getattr(self._pg, "shutdown", None) or self._pg.abort
        shutdown()

    def _run(self, call: Any) -> None:
        import torch

        if self._done:
            from cgraph.errors import ChannelClosedError

            raise ChannelClosedError("the NCCL communicator was aborted (teardown or a failed peer)")
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            call().wait()  # the current stream (self._stream) waits; the CPU does not


def _torch_op(op: ReduceOp | str) -> Any:
    return dist_op(as_reduce_op(op))
