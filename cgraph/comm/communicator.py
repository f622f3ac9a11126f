"""The ``Communicator`` interface: how tensors move between the actors of a group.

A communicator joins ``world_size`` processes (ranks ``0 .. world_size-1``).
Every call is matched by the peers it names, in the same order on every rank,
as with NCCL or MPI: a ``send(t, 1)`` on rank 0 pairs with the next
``recv(buf, 0)`` on rank 1; a collective must be called by every rank with
tensors of the same shape and dtype. Receives and collectives write into
tensors the caller allocated (``recv`` into a buffer of the agreed shape and
dtype), so nothing is allocated behind the caller's back.

    method                          result (in place)                      default below
    send(t, dst) / recv(buf, src)   buf on dst holds t                     abstract
    allreduce(t, op, algorithm)     t = op over every rank's t             star over send/recv
    allgather(outs, t, algorithm)   outs[r] = rank r's t                   star over send/recv
    reducescatter(out, ts, op, a.)  out = op over ranks of chunk `rank`    star over send/recv
    reduce(t, dst, op)              dst's t = op over every rank's t       star into dst
    broadcast(t, src)               t = src's t                            src sends to each rank
    barrier()                       returns once every rank called it      allreduce of one element
    synchronize()                   queued work (a GPU stream) is done     no-op (CPU: calls block)
    split(team)                     the communicator of a team of ranks    refused (no teams)
    nodes                           each rank's node (machine)             all on one node
    algorithms                      the names ``algorithm`` may take       none (only "auto")
    recv_view(shape, dtype, src)    (optional) a tensor viewing the        absent: recv into a buffer
                                    message where it arrived, and a lease

``algorithm`` is "auto" (the communicator's own choice) or a name the communicator
offers (cgraph's ``comm.algorithms``, "native" for a process group's own); the star
defaults offer none. A compiled graph passes it only when a DAG node names one, so a
user communicator whose collectives take no ``algorithm`` still runs every node that
leaves it "auto".

``stream`` is the ``torch.cuda.Stream`` a GPU communicator enqueues on (its
calls return before the data has moved; ``synchronize`` waits) and ``None`` on
the CPU, where every call blocks until its part is done. ``device`` is where
``recv`` buffers are allocated.

This is the one interface for a group of ranks: compiled graphs run their edges and
collective nodes through it, and the imperative API (``cgraph.collective``) its
groups. Implementations: for graphs ``CpuCommunicator`` (shared-memory links,
cgraph's collective algorithms), ``ProcessGroupCommunicator`` (torch.distributed's
gloo or NCCL), ``CudaIpcCommunicator`` (actors sharing one GPU); for the API each
backend's (``comm.kinds``): ``CpuComm`` (cgraph's algorithms over links that span
nodes, with teams and "auto"; it takes numpy arrays as well as CPU tensors, which is
what the API hands it) and ``TorchComm`` (a ``ProcessGroupCommunicator`` per team,
with the API's signature check and "auto"). Below every
algorithm sits the other interface, ``comm.transport.Transport``: point-to-point
messages of numpy arrays, not a group's calls. A user-supplied communicator
subclasses ``Communicator``: it must implement ``initialize``, ``rank``,
``world_size``, ``send`` and ``recv``; the collectives have the star defaults
below (correct with rendezvous point-to-point, slow for big groups), which it
may override. cgraph pickles the user's object, ships one copy to every member
actor and calls ``initialize(rank, world_size, group_name)`` there before any
other call; ``abort`` (optional) must make calls blocked in other threads fail.

``recv_view`` is an optional capability (found with ``view_receiver``, not a
method of the class): a communicator whose messages land in memory the
receiver can read in place returns ``(tensor, lease)``, the tensor valid until
``lease.release()``. The CPU communicator has it (a view of its shared-memory
link's slot); cgraph uses it for the last message an actor receives on a link
in an execution and releases the lease at the execution's end. Without it,
cgraph allocates a buffer and calls ``recv``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol

from cgraph.comm.types import TORCH_FN, ReduceOp

if TYPE_CHECKING:
    import torch

    from cgraph._boundary import TorchObject
    from cgraph.comm.teams import Team

REQUIRED = ("initialize", "send", "recv", "allreduce", "allgather", "reducescatter",
            "broadcast", "barrier", "synchronize", "destroy")
"""Methods a communicator object must have (``Communicator`` subclasses have them all)."""


def as_reduce_op(op: ReduceOp | str) -> ReduceOp:
    """``ReduceOp.SUM`` from ``ReduceOp.SUM``, ``"sum"`` or ``"SUM"``.

    Raises:
        ValueError: an unknown op name.
    """
    if isinstance(op, ReduceOp):
        return op
    try:
        return ReduceOp(str(getattr(op, "name", op)).lower())
    except ValueError:
        raise ValueError(
            f"unknown reduce op {op!r}; use one of {[o.value for o in ReduceOp]}"
        ) from None


def reduce_into(op: ReduceOp, acc: torch.Tensor, other: torch.Tensor) -> None:
    """``acc = op(acc, other)`` in place, with torch."""
    import torch

    getattr(torch, TORCH_FN[op])(acc, other, out=acc)


class ViewLease(Protocol):
    """What ``recv_view`` returns with its tensor: the view is valid until ``release()``."""

    def release(self) -> None: ...


def view_receiver(
    comm: Communicator,
) -> Callable[[tuple[int, ...], torch.dtype, int], tuple[torch.Tensor, ViewLease]] | None:
    """``comm.recv_view`` (the optional zero-copy receive, see the module docstring), or None."""
    fn = getattr(comm, "recv_view", None)
    return fn if callable(fn) else None


def missing_methods(obj: object) -> list[str]:
    """The interface methods ``obj`` lacks (empty for a usable communicator)."""
    return [name for name in REQUIRED if not callable(getattr(obj, name, None))]


class Communicator(ABC):
    """A group of ranks that move torch tensors between each other.

    Subclass it to bring your own transport: implement ``initialize``, ``rank``,
    ``world_size``, ``send`` and ``recv``; the collectives default to a star
    through rank 0 over ``send``/``recv``. Calls are matched per peer pair in
    the order issued, as in NCCL; receives and collectives fill tensors the
    caller allocated. cgraph pickles the object, ships a copy to every member
    actor and calls ``initialize`` there first, at compile. A call that raises
    fails that execution with its exception and, for the rest of the compiled
    graph, the group (``cgraph.CommunicatorError``). Pass it per edge
    (``TorchTensorType(transport=obj)``) or as ``compile(dag,
    default_communicator=obj)``. docs/transports.md has the whole contract.
    """

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:  # noqa: B027 - optional hook
        """Called once in each member process before any other call.

        Built-in communicators are created initialised; a user communicator
        connects to its peers here, not in ``__init__`` (which runs on the driver).
        A compiled graph calls it during ``compile``, in every member at once (on
        the actor's default thread); an exception here fails ``compile``.

        Args:
            rank: this member's rank.
            world_size: the number of members.
            group_name: unique per compiled graph and group: use it in rendezvous keys.
        """

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank, ``0 .. world_size-1``."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """The number of ranks in the group."""

    @property
    def device(self) -> torch.device:
        """Where ``recv`` buffers are allocated (the CPU unless overridden)."""
        import torch

        return torch.device("cpu")

    @property
    def stream(self) -> TorchObject:
        """The ``torch.cuda.Stream`` calls are enqueued on; ``None`` when calls block."""
        return None

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send ``tensor`` to rank ``dst`` (matched by its next ``recv`` from this rank)."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Fill ``tensor`` (shape and dtype agreed with the sender) from rank ``src``."""

    @property
    def nodes(self) -> tuple[Hashable, ...]:
        """The node (machine) of every rank, by rank; all on one node unless overridden."""
        return (0,) * self.world_size

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The names a collective's ``algorithm`` may take besides "auto" (none by default)."""
        return ()

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        """Reduce ``tensor`` across ranks in place; rank 0 reduces in rank order."""
        only_auto(self, "allreduce", algorithm)
        op = as_reduce_op(op)
        if self.rank != 0:
            self.send(tensor, 0)
            self.recv(tensor, 0)
            return
        incoming = tensor.new_empty(tensor.shape)
        for src in range(1, self.world_size):
            self.recv(incoming, src)
            reduce_into(op, tensor, incoming)
        for dst in range(1, self.world_size):
            self.send(tensor, dst)

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor, algorithm: str = "auto") -> None:
        """``out[r]`` = rank r's ``tensor`` on every rank (``out`` has ``world_size`` buffers)."""
        only_auto(self, "allgather", algorithm)
        _check_parts(out, self.world_size, "allgather")
        out[self.rank].copy_(tensor)
        if self.rank != 0:
            self.send(tensor, 0)
            for part in out:
                self.recv(part, 0)
            return
        for src in range(1, self.world_size):
            self.recv(out[src], src)
        for dst in range(1, self.world_size):
            for part in out:
                self.send(part, dst)

    def reducescatter(
        self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
    ) -> None:
        """``out`` = op over ranks of their chunk number ``rank``.

        ``tensors`` is ``world_size`` tensors shaped like ``out``, or one tensor
        of ``world_size * out.numel()`` elements cut into equal chunks.
        """
        only_auto(self, "reducescatter", algorithm)
        op = as_reduce_op(op)
        parts = split_chunks(out, tensors, self.world_size)
        if self.rank != 0:
            for part in parts:
                self.send(part.contiguous(), 0)
            self.recv(out, 0)
            return
        acc = [part.clone() for part in parts]
        incoming = out.new_empty(out.shape)
        for src in range(1, self.world_size):
            for chunk in acc:
                self.recv(incoming, src)
                reduce_into(op, chunk, incoming)
        for dst in range(1, self.world_size):
            self.send(acc[dst], dst)
        out.copy_(acc[0])

    def reduce(self, tensor: torch.Tensor, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """Reduce every rank's ``tensor`` into rank ``dst``'s, in place; the others' stay as they were."""
        op = as_reduce_op(op)
        if self.rank != dst:
            self.send(tensor, dst)
            return
        incoming = tensor.new_empty(tensor.shape)
        for src in range(self.world_size):
            if src != dst:
                self.recv(incoming, src)
                reduce_into(op, tensor, incoming)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Copy rank ``src``'s ``tensor`` into every rank's ``tensor``."""
        if self.rank == src:
            for dst in range(self.world_size):
                if dst != src:
                    self.send(tensor, dst)
        else:
            self.recv(tensor, src)

    def barrier(self) -> None:
        """Return on every rank once every rank has called ``barrier``."""
        import torch

        self.allreduce(torch.zeros(1, device=self.device))
        self.synchronize()

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Block until the work this communicator queued is done (no-op when calls block)."""

    def split(self, team: Team) -> Communicator:
        """The communicator of ``team`` (ranks of this one), over this one's links.

        Raises:
            NotImplementedError: this communicator has no teams (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot split into teams")

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Make calls blocked in other threads fail (teardown, a dead peer). Idempotent."""

    def destroy(self) -> None:  # noqa: B027 - optional hook
        """Free this rank's resources. Idempotent; the group is unusable afterwards."""


def split_chunks(
    out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor], world_size: int
) -> list[torch.Tensor]:
    """The ``world_size`` input chunks of a reducescatter, each shaped like ``out``.

    Raises:
        ValueError: the inputs do not hold ``world_size`` chunks of ``out``'s size.
    """
    if isinstance(tensors, (list, tuple)):
        _check_parts(tensors, world_size, "reducescatter")
        return [t.reshape(out.shape) for t in tensors]
    if tensors.numel() != world_size * out.numel():
        raise ValueError(
            f"reducescatter: the input has {tensors.numel()} elements, expected "
            f"world_size * out.numel() = {world_size} * {out.numel()}"
        )
    return [c.reshape(out.shape) for c in tensors.reshape(world_size, -1).unbind(0)]


def only_auto(comm: Communicator, what: str, algorithm: str) -> None:
    """Refuse an ``algorithm`` other than "auto" where ``comm`` offers none to choose."""
    if algorithm != "auto":
        raise ValueError(f"{type(comm).__name__} offers no {what} algorithm to choose; got "
                         f"algorithm={algorithm!r}, use 'auto'")


def _check_parts(parts: Sequence[torch.Tensor], world_size: int, what: str) -> None:
    if len(parts) != world_size:
        raise ValueError(f"{what}: got {len(parts)} tensors for a group of {world_size} ranks")
