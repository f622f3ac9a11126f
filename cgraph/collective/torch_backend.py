"""The "gloo" and "nccl" backends: a torch.distributed process group per cgraph group.

Each group gets its own ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` built
straight from a store, never through ``init_process_group``, so a process can
belong to many groups and torch's global default group stays untouched::

    rank r: root = connect_store(membership.store).prefixed("<group>.<nonce>")
    group:  root.prefixed("<group>[0,1,2,3]") -> ProcessGroupGloo(that store, r, p, options)
    team Team(0 2):  root.prefixed("<group>[0,2]") -> its own process group

The keys live in the group's store actor (a ``GroupStore`` is a ``KVStore``) and
go there by Ray calls: no TCP server is opened for them (``RayStore.prefixed``
does PrefixStore's job: see ``ray_store`` for why). Teams reuse the group's
store (no new rendezvous); building a team's process group waits until every
team member splits. The backend's own collectives do the work, except an
allreduce given one of cgraph's algorithms (``algorithm="ring"``,
``"reduction_server"``, ...): that runs over the process group's send/recv
(``comm.pg_transport``), with the ranks' Ray nodes as the node layout, so the
reduction server's hierarchy follows the real nodes. "auto" and "native" are
the backend's own allreduce. Before each call the ranks compare signatures
(dtype, shape, op, root or algorithm; ``signatures``), because gloo kills the
process on a size mismatch. Failures of the backend (a timeout, a dead peer)
become ``CollectiveTimeoutError`` / ``CollectiveError`` naming the group and rank.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from cgraph.collective import signatures
from cgraph.collective.backends import Hooks
from cgraph.collective.tensor_views import working
from cgraph.comm import algorithms
from cgraph.comm.pg_transport import ProcessGroupTransport
from cgraph.comm.process_group import process_group
from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S
from cgraph.comm.teams import Team
from cgraph.comm.types import ReduceOp, dist_op
from cgraph.errors import (
    CollectiveError,
    CollectiveGroupError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)

NATIVE = ("auto", "native")
"""The ``algorithm`` values that run the backend's own allreduce; any name of
``cgraph.comm.algorithms.ALGORITHMS`` runs cgraph's over the process group."""


class TorchComm:
    """One rank's side of a gloo / nccl group or team (the backend's ``GroupComm``).

    Every call first compares the ranks' signatures (``signatures``): a mismatch
    raises ``CollectiveMismatchError`` on every rank and the group stays usable.
    A failure inside torch (a timeout, a dead peer) breaks the process group:
    later calls say so.
    """

    def __init__(self, make: Callable[[Team, str], Any], name: str, members: Team,
                 nodes: tuple[Hashable, ...], device: str) -> None:
        self._make, self._name, self._members, self._device = make, name, members, device
        self._prefix = f"{name}[{','.join(map(str, members.ranks))}]"
        # the store stays referenced here: C++ holds the process group's, and pybind
        # loses a Python store's methods once no Python reference is left
        self.process_group, self._store = make(members, self._prefix)
        self.rank, self.world_size = self.process_group.rank(), self.process_group.size()
        self.nodes = nodes
        self._broken: str | None = None
        self._transport: ProcessGroupTransport | None = None  # made by the first algorithm call

    def allreduce(self, tensor: Any, op: ReduceOp, algorithm: str) -> None:
        if algorithm not in NATIVE:
            self._allreduce_with(tensor, op, algorithm)
            return
        self._agree(signatures.encode("allreduce", tensor, op))
        options = _dist().AllreduceOptions()
        options.reduceOp = _torch_op(op)
        self._wait("allreduce", lambda pg: pg.allreduce([tensor], options))

    def _allreduce_with(self, tensor: Any, op: ReduceOp, algorithm: str) -> None:
        """cgraph's ``algorithm`` over this process group (``ProcessGroupTransport``)."""
        if algorithm not in algorithms.ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of "
                             f"{[*NATIVE, *sorted(algorithms.ALGORITHMS)]}")
        self._agree(signatures.encode("allreduce", tensor, op, signatures.algorithm_code(algorithm)))
        if self._transport is None:
            self._transport = ProcessGroupTransport(self.process_group, self.nodes, self._device)
        transport = self._transport
        with working(tensor, "numpy") as arr:
            self._guard("allreduce", lambda: algorithms.allreduce(transport, arr, op, algorithm))

    def reduce(self, tensor: Any, dst: int, op: ReduceOp) -> None:
        self._agree(signatures.encode("reduce", tensor, op, dst))
        options = _dist().ReduceOptions()
        options.rootRank, options.reduceOp = dst, _torch_op(op)
        # torch may use a non-root's tensor as scratch; cgraph leaves it unchanged.
        work = tensor if self.rank == dst else tensor.clone()
        self._wait("reduce", lambda pg: pg.reduce([work], options))

    def broadcast(self, tensor: Any, src: int) -> None:
        self._agree(signatures.encode("broadcast", tensor, None, src))
        options = _dist().BroadcastOptions()
        options.rootRank = src
        self._wait("broadcast", lambda pg: pg.broadcast([tensor], options))

    def allgather(self, outs: Sequence[Any], tensor: Any) -> None:
        self._agree(signatures.encode("allgather", tensor))
        if tensor.is_complex():  # gloo gathers no complex type: gather their real views
            import torch

            tensor, outs = torch.view_as_real(tensor), [torch.view_as_real(o) for o in outs]
        self._wait("allgather", lambda pg: pg.allgather([list(outs)], [tensor]))

    def reducescatter(self, out: Any, parts: Sequence[Any], op: ReduceOp) -> None:
        import torch

        # Gloo has no reduce_scatter: allreduce the concatenation, keep this rank's part.
        self._agree(signatures.encode("reducescatter", out, op))
        whole = torch.cat([part.reshape(-1) for part in parts])
        options = _dist().AllreduceOptions()
        options.reduceOp = _torch_op(op)
        self._wait("reducescatter", lambda pg: pg.allreduce([whole], options))
        n = out.numel()
        out.copy_(whole[self.rank * n : (self.rank + 1) * n].reshape(out.shape))

    def send(self, tensor: Any, dst: int) -> None:
        mine = self._tensor(signatures.encode("p2p", tensor))
        answer = self._tensor([0])
        self._wait("send", lambda pg: pg.send([mine], dst, 0))
        self._wait("send", lambda pg: pg.recv([answer], dst, 0))
        if int(answer[0]) != 1:
            raise self._mismatch(f"rank {dst} expected a different tensor: {_text(mine)} was sent")
        self._wait("send", lambda pg: pg.send([tensor], dst, 0))

    def recv(self, tensor: Any, src: int) -> None:
        mine = signatures.encode("p2p", tensor)
        theirs = self._tensor([0] * len(mine))
        self._wait("recv", lambda pg: pg.recv([theirs], src, 0))
        ok = [int(x) for x in theirs.tolist()] == mine
        self._wait("recv", lambda pg: pg.send([self._tensor([int(ok)])], src, 0))
        if not ok:
            raise self._mismatch(f"rank {src} sent {_text(theirs)}, this rank receives "
                                 f"{signatures.describe(mine)}")
        self._wait("recv", lambda pg: pg.recv([tensor], src, 0))

    def barrier(self) -> None:
        self._agree(signatures.encode("barrier"))
        self._wait("barrier", lambda pg: pg.barrier())

    def split(self, team: Team) -> TorchComm:
        members = Team(tuple(self._members.ranks[r] for r in team.ranks))  # group ranks
        nodes = tuple(self.nodes[r] for r in team.ranks)
        return TorchComm(self._make, self._name, members, nodes, self._device)

    def destroy(self) -> None:
        shutdown = getattr(self.process_group, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except RuntimeError:
                pass  # already broken (a dead peer): nothing left to free
        self.process_group = None

    # ------------------------------------------------------------------ internals
    def _agree(self, header: list[int]) -> None:
        """Gather every rank's signature; raise the same mismatch on every rank."""
        mine = self._tensor(header)
        gathered = [self._tensor([0] * len(header)) for _ in range(self.world_size)]
        self._wait("signature check", lambda pg: pg.allgather([gathered], [mine]))
        rows = [[int(x) for x in g.tolist()] for g in gathered]
        if all(row == rows[0] for row in rows):
            return
        calls = "; ".join(f"rank {r}: {signatures.describe(row)}" for r, row in enumerate(rows))
        raise self._mismatch(f"the ranks entered different calls ({calls})")

    def _mismatch(self, detail: str) -> CollectiveMismatchError:
        return CollectiveMismatchError(
            f"group {self._name!r}, rank {self.rank}: {detail}. Every rank must make the same "
            "calls in the same order with tensors of the same dtype and shape; nothing was "
            "sent, the group is still usable.", self._name, self.rank)

    def _tensor(self, values: list[int]) -> Any:
        import torch

        return torch.tensor(values, dtype=torch.int64, device=self._device)

    def _wait(self, what: str, start: Callable[[Any], Any]) -> None:
        self._guard(what, lambda: start(self.process_group).wait())

    def _guard(self, what: str, call: Callable[[], Any]) -> None:
        """Run ``call``; a failure inside torch breaks the group (later calls say so)."""
        if self._broken is not None:
            raise CollectiveGroupError(
                f"group {self._name!r}, rank {self.rank}: the process group broke on an earlier "
                f"error ({self._broken}); destroy_collective_group({self._name!r}) on every rank "
                "and create it again", self._name, self.rank)
        try:
            call()
        except RuntimeError as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            timed_out = "timed out" in text.lower() or "timeout" in text.lower()
            self._broken = f"{what}: {text}"
            raise (CollectiveTimeoutError if timed_out else CollectiveError)(
                f"group {self._name!r}, rank {self.rank}: {what} failed in torch.distributed: "
                f"{text} (a peer did not arrive within timeout_s, or died; {self._layout()})",
                self._name, self.rank) from exc

    def _layout(self) -> str:
        """``rank 2 on node 9d1c04aa; ranks by node: 3f2a1b9c 0,1; 9d1c04aa 2,3``, for errors."""
        by_node: dict[str, list[int]] = {}
        for r, node in enumerate(self.nodes):
            by_node.setdefault(str(node)[:8], []).append(r)
        ranks = "; ".join(f"{node} {','.join(map(str, rs))}" for node, rs in by_node.items())
        return f"rank {self.rank} on node {str(self.nodes[self.rank])[:8]}; ranks by node: {ranks}"


def _text(header: Any) -> str:
    return signatures.describe(header.tolist())


def connect(membership: Any, hooks: Hooks) -> TorchComm:
    """This rank's ``TorchComm`` from its store ``Membership`` (gloo or nccl).

    Raises:
        RuntimeError: torch could not build the process group (a rank did not
            arrive within the rendezvous time: the message says "timed out").
    """
    from cgraph.comm.ray_store import connect_store

    spec = membership.spec
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    rendezvous_s = max(spec.timeout_s, RENDEZVOUS_TIMEOUT_S)
    root = connect_store(membership.store, rendezvous_s).prefixed(f"{spec.name}.{membership.nonce}")
    local_host = _local_ip()

    def make(members: Team, prefix: str) -> tuple[Any, Any]:
        """The process group of ``members`` (group ranks) as this rank sees it, and its store."""
        rank = members.team_rank(membership.rank)
        store = root.prefixed(prefix)
        return process_group(spec.backend, store, rank, members.size, timeout, local_host), store

    nodes = _exchange_nodes(root.prefixed("nodes"), membership.rank, spec.world_size, hooks.node)
    device = "cuda" if spec.backend == "nccl" else "cpu"
    return TorchComm(make, spec.name, Team(tuple(range(spec.world_size))), nodes, device)


def _exchange_nodes(store: Any, rank: int, size: int, node: str) -> tuple[Hashable, ...]:
    store.set(str(rank), node)
    return tuple(store.get(str(r)).decode() for r in range(size))


def _torch_op(op: ReduceOp) -> Any:
    return dist_op(op)


def _local_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _dist() -> Any:
    import torch.distributed as dist

    return dist
