"""The "cpu" backend: cgraph's algorithms over shared-memory links within a node.

A group's store actor makes the mesh (``create_links``: one shm channel per
ordered pair of ranks) and hands each rank its ends; where the ranks span nodes,
``cpu.layout`` makes one mesh per node and TCP links between nodes on the first
call. ``FramedTransport`` stamps every message with the call it belongs to and
bounds every wait. Teams
reuse the mesh through ``TeamTransport`` with their own context, so a team's
messages can never be taken for the parent's::

    CpuComm("g", context "g")            allreduce -> ALGORITHMS[name] over FramedTransport
      .split(Team(0 2)) -> CpuComm       context "g[0,2]", TeamTransport(ranks 0 2)

Any error inside a call (a mismatch, a timeout, a closed link) aborts the
mesh: this rank tells the store why, then closes its links, which wakes the
peers blocked on them; they fail too, quoting the reason. A group stays
unusable after that (as an NCCL communicator after an error): destroy it and
create it again. ``CpuComm`` is a ``Communicator``: its calls take writeable
C-contiguous numpy arrays (what the API hands it, converting torch and cupy
tensors) or CPU torch tensors (viewed as numpy arrays).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from cgraph.comm import algorithms
from cgraph.comm.communicator import Communicator, as_reduce_op
from cgraph.comm.cpu import layout
from cgraph.comm.cpu.framed import FramedTransport
from cgraph.comm.cpu.layout import Links
from cgraph.comm.teams import Team, TeamTransport
from cgraph.comm.tensor_views import dtype_name
from cgraph.comm.transport import Transport, describe_layout, node_layout
from cgraph.comm.tuning.autotune import TunedComm, Tuner
from cgraph.comm.types import ReduceOp
from cgraph.errors import CollectiveError, CollectiveGroupError

if TYPE_CHECKING:
    import torch

    from cgraph.comm.rendezvous import Hooks, Membership

_T = TypeVar("_T")


class _Mesh:
    """What a group and its teams share: the links, the hooks, and why it was aborted.

    The links are settled on first use (``layout.settle``: where every rank
    sits decides which pairs share memory), so joining never waits for peers.
    """

    def __init__(self, settle: Callable[[], Links], hooks: Hooks) -> None:
        self._settle, self.hooks = settle, hooks
        self._links: Links | None = None
        self.aborted: str | None = None

    @property
    def links(self) -> FramedTransport:
        if self._links is None:
            self._links = self._settle()
            self._links.watch_peers(self._peer_died)
        return self._links.transport

    def _peer_died(self, rank: int, pid: int) -> None:
        """A rank of this node exited (``comm.peer_watch``): abort, waking this rank's waits."""
        self.abort(f"rank {rank} (pid {pid}) on this rank's node died")

    @property
    def settled(self) -> Links | None:
        return self._links

    def abort(self, reason: str) -> None:
        if self.aborted is not None:
            return
        self.aborted = reason
        with contextlib.suppress(Exception):  # best effort: the store may be gone
            self.hooks.report_abort(reason)
        if self._links is not None:
            self._links.transport.close()

    def check(self, rank: int) -> None:
        if self.aborted is not None:
            raise CollectiveGroupError(
                f"group {self.hooks.group!r} was aborted on rank {rank} by an earlier error "
                f"({self.aborted}); destroy_collective_group({self.hooks.group!r}) on every "
                f"rank and create it again{self._where(rank)}",
                self.hooks.group,
                rank,
            )

    def _where(self, rank: int) -> str:
        """Where the group spans nodes: which rank sits where (as the links' errors say)."""
        if self._links is None:
            return ""
        t = self._links.transport
        nodes = [t.node_of(r) for r in range(t.world_size)]
        return f". This is {describe_layout(nodes, rank)}" if len(set(nodes)) > 1 else ""


class CpuComm(TunedComm, Communicator):
    """One rank's side of a cpu group or team (the backend's ``Communicator``)."""

    def __init__(self, mesh: _Mesh, transport: Transport | None, context: str, rank: int,
                 world_size: int, timeout_s: float | None = None) -> None:
        self._mesh, self._team_t, self._context = mesh, transport, context
        self._rank, self._size = rank, world_size
        self._timeout_s = timeout_s  # the group's: "auto"'s first call measures within a share of it
        self._tuner: Tuner | None = None  # "auto"'s state, made on first use (``tuner``)

    @property
    def _t(self) -> Transport:
        """A team's transport, or the group's links (settled on first use)."""
        return self._mesh.links if self._team_t is None else self._team_t

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def nodes(self) -> tuple[Hashable, ...]:
        """The Ray node of every rank (waits, on first use, until every rank has joined)."""
        with self._call("settling the node layout"):
            return node_layout(self._t)

    @property
    def algorithms(self) -> tuple[str, ...]:
        return tuple(sorted(algorithms.ALGORITHMS))

    # ------------------------------------------------------------------ calls
    def allreduce(self, arr: np.ndarray | torch.Tensor, op: ReduceOp | str = ReduceOp.SUM,
                  algorithm: str = "auto") -> None:
        arr, op = _host(arr), as_reduce_op(op)
        if algorithm == "auto":
            arm = self.tuner.arm(arr.nbytes)
            if arm is not None and arm.due():
                self.tuner.probe(arm, arr, op)
                return
            name = self.tuner.choose(arr.nbytes)
        else:
            name = algorithm
        if name not in algorithms.ALGORITHMS:
            raise ValueError(
                f"unknown allreduce algorithm {algorithm!r}; choose 'auto' or one of "
                f"{sorted(algorithms.ALGORITHMS)}"
            )
        options = self.tuner.options(name, arr.nbytes)
        with self._call(f"allreduce {_desc(arr)} {op.value} {name}"):
            algorithms.allreduce(self._t, arr, op, name, **options)

    def reduce(self, arr: np.ndarray | torch.Tensor, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> None:
        arr, op = _host(arr), as_reduce_op(op)
        with self._call(f"reduce {_desc(arr)} {op.value} to {dst}"):
            algorithms.reduce(self._t, arr, op, root=dst)

    def broadcast(self, arr: np.ndarray | torch.Tensor, src: int) -> None:
        arr = _host(arr)
        with self._call(f"broadcast {_desc(arr)} from {src}"):
            algorithms.broadcast(self._t, arr, root=src)

    def allgather(self, outs: Sequence[np.ndarray] | Sequence[torch.Tensor], arr: np.ndarray | torch.Tensor,
                  algorithm: str = "auto") -> None:
        arr, outs = _host(arr), [_host(out) for out in outs]
        n, p = arr.size, self.world_size
        name = self._gather_scatter("allgather", algorithm)
        whole = np.empty(n * p, dtype=arr.dtype)
        whole[self.rank * n : (self.rank + 1) * n] = arr.reshape(-1)
        with self._call(f"allgather {_desc(arr)} {name}"):
            algorithms.allgather(self._t, whole, algorithm=name)
        for r, out in enumerate(outs):
            out.reshape(-1)[:] = whole[r * n : (r + 1) * n]

    def reducescatter(self, out: np.ndarray | torch.Tensor,
                      parts: np.ndarray | torch.Tensor | list[np.ndarray] | list[torch.Tensor],
                      op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        if not isinstance(parts, (list, tuple)):  # one array of world_size chunks
            parts = np.split(_host(parts).reshape(-1), self.world_size)
        out, parts, op = _host(out), [_host(part) for part in parts], as_reduce_op(op)
        name = self._gather_scatter("reducescatter", algorithm)
        whole = np.concatenate([part.reshape(-1) for part in parts]).astype(out.dtype, copy=False)
        with self._call(f"reducescatter {_desc(out)} {op.value} {name}"):
            mine = algorithms.reducescatter(self._t, whole, op, algorithm=name)
        out.reshape(-1)[:] = mine

    def _gather_scatter(self, kind: str, algorithm: str) -> str:
        """``algorithm`` for a reducescatter/allgather; "auto": two levels where there are two.

        The hierarchical one sends 1/L of the ring's bytes between nodes in m-1
        steps instead of p-1 (``cost_model.collective_terms``); on one node it is the
        ring itself, so "auto" needs no measurement to choose.
        """
        table = (algorithms.REDUCESCATTER_ALGORITHMS if kind == "reducescatter"
                 else algorithms.ALLGATHER_ALGORITHMS)
        if algorithm == "auto":
            return "hierarchical" if len(set(self.nodes)) > 1 else "ring"
        if algorithm not in table:
            raise ValueError(f"unknown {kind} algorithm {algorithm!r}; choose 'auto' or one of "
                             f"{sorted(table)}")
        return algorithm

    def send(self, arr: np.ndarray | torch.Tensor, dst: int) -> None:
        arr = _host(arr)
        with self._call(f"p2p {_desc(arr)}"):
            self._t.send(arr.reshape(-1), dst)

    def recv(self, arr: np.ndarray | torch.Tensor, src: int) -> None:
        arr = _host(arr)
        with self._call(f"p2p {_desc(arr)}"):
            self._t.recv(arr.reshape(-1), src)

    def barrier(self) -> None:
        with self._call("barrier"):
            algorithms.barrier(self._t)

    # ------------------------------------------------------------------ auto
    @property
    def tuner(self) -> Tuner:
        """This group's ``auto`` (``collective.tuner``), over its links."""
        if self._tuner is None:
            with self._call("settling the node layout"):
                transport = self._t
            self._tuner = Tuner(transport, guard=self._guarded, timeout_s=self._timeout_s)
        return self._tuner

    def _guarded(self, what: str, work: Callable[[], _T]) -> _T:
        with self._call(what):
            return work()

    # ------------------------------------------------------------------ teams, lifetime
    def split(self, team: Team) -> CpuComm:
        context = f"{self._context}[{','.join(map(str, team.ranks))}]"
        with self._call(f"split {context}"):
            parent = self._t
        child = CpuComm(self._mesh, TeamTransport(parent, team), context, team.team_rank(self.rank),
                        team.size, self._timeout_s)
        child.tuner.inherit(self.tuner)  # same ranks, same links: same calibration
        return child

    def destroy(self) -> None:
        """Drop this rank's mappings of the links, unlinking those it made (a team's: a no-op)."""
        settled = self._mesh.settled
        if self._team_t is None and settled is not None:
            settled.release()

    def unlink(self) -> None:
        """Remove this rank's links from /dev/shm (when the store is gone)."""
        settled = self._mesh.settled
        if settled is not None:
            settled.transport.unlink()

    @contextlib.contextmanager
    def _call(self, signature: str) -> Iterator[None]:
        self._mesh.check(self.rank)
        try:
            with self._mesh.links.calling((self._context, signature)):
                yield
        except CollectiveError as exc:
            self._mesh.abort(str(exc).split(". ")[0])
            raise self._explained(exc) from None
        except BaseException as exc:  # any other failure mid-call: the peers wait for this
            # rank's data, so wake them (they raise, naming it) instead of letting them time out
            self._mesh.abort(f"rank {self.rank} failed in {signature}: {type(exc).__name__}: {exc}")
            raise

    def _explained(self, exc: CollectiveError) -> CollectiveError:
        if not isinstance(exc, CollectiveGroupError) or "link is closed" not in str(exc):
            return exc
        reason = None
        with contextlib.suppress(Exception):
            reason = self._mesh.hooks.abort_reason()
        why = reason or ("no rank reported why: a peer died before it could, or the group was "
                         "destroyed from the driver")
        return type(exc)(f"{exc}; {why}", exc.group, exc.rank)


def connect(membership: Membership, hooks: Hooks) -> CpuComm:
    """This rank's ``CpuComm`` from its store ``Membership`` (cpu backend); never waits for peers."""
    spec = membership.spec
    layout.announce(membership, hooks.node)
    mesh = _Mesh(lambda: layout.settle(membership, hooks.node), hooks)
    return CpuComm(mesh, None, spec.name, membership.rank, spec.world_size, spec.timeout_s)


def _host(arr: np.ndarray | torch.Tensor) -> np.ndarray:
    """``arr`` itself (a numpy array), or a numpy view of a CPU torch tensor."""
    if isinstance(arr, np.ndarray):
        return arr
    if getattr(arr, "device", None) is not None and arr.device.type != "cpu":
        raise TypeError(f"the cpu backend takes host memory; got a tensor on {arr.device}")
    view: np.ndarray = arr.detach().numpy()
    return view


def _desc(arr: np.ndarray) -> str:
    return f"{dtype_name(arr)}{tuple(arr.shape)}"
