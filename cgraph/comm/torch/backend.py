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
(``comm.torch.transport``), with the ranks' Ray nodes as the node layout, so the
reduction server's hierarchy follows the real nodes. "native" is the backend's
own allreduce; "auto" picks among it and cgraph's algorithms as on the "cpu"
backend (``autotune.Tuner``: calibrated on the group's first "auto" call, with
"native" one more candidate, modelled as ring times its measured ratio; a call
measures for at most ``autotune.AUTO_SHARE`` of the group's timeout, so that a
rank measuring on one team keeps its peers on another from timing out)::

    auto, 4 ranks on 2 nodes:  measure every candidate at FIT_BYTES, "native" too
                               + ranks (0 1) inside a node, (0 2) across: alpha_inter, beta_inter
    later auto calls           the same pick on every rank, no messages (trials, probes aside)

Before each call the ranks compare signatures (dtype, shape, op, root or
algorithm; ``signatures``), because gloo kills the process on a size mismatch.
Failures of the backend (a timeout, a dead peer) become
``CollectiveTimeoutError`` / ``CollectiveError`` naming the group and rank.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from cgraph.comm import algorithms, signatures
from cgraph.comm.communicator import Communicator, as_reduce_op, split_chunks
from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S
from cgraph.comm.teams import Team
from cgraph.comm.tensor_views import working
from cgraph.comm.torch.process_group import ProcessGroupCommunicator, process_group
from cgraph.comm.transport import describe_layout
from cgraph.comm.tuning.autotune import TunedComm, Tuner
from cgraph.comm.types import ReduceOp
from cgraph.errors import (
    CollectiveError,
    CollectiveGroupError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)

if TYPE_CHECKING:
    from typing import TypeVar

    import torch

    from cgraph._boundary import TorchObject
    from cgraph.comm.rendezvous import Hooks, Membership

    T = TypeVar("T")

NATIVE = "native"
"""The ``algorithm`` that runs the backend's own allreduce, and its name among "auto"'s
candidates; any name of ``cgraph.comm.algorithms.ALGORITHMS`` runs cgraph's over the
process group."""
AUTO_CODE = len(signatures.ALLREDUCE_ALGORITHMS)
""""auto"'s code in an allreduce signature (cgraph's algorithms have 0.., "native" -1), so
that a rank calling "auto" and one naming the algorithm it would pick still mismatch."""
FIT_BYTES: tuple[int, ...] = (64 << 10, 2 << 20)
"""What "auto" measures on these backends, ``FIT_REPEATS`` times at the larger size (and
2 * FIT_REPEATS + 1 at the smaller): every message of every candidate crosses a socket, and
on 2 cores that took 1.2 s for 4 ranks and 4 s for 8 (the "cpu" backend's three sizes up
to 32 MiB and 3 repeats: 6 s for 4). The model's terms carry the size beyond 2 MiB, the
ratio there holds, and each size class's trial settles close calls at its own size."""
FIT_REPEATS = 2


class TorchComm(TunedComm, Communicator):
    """One rank's side of a gloo / nccl group or team, as the imperative API promises it.

    The process group's calls go through one ``ProcessGroupCommunicator`` (the wrapper a
    compiled graph uses too); this class adds the API's promises. Every call first
    compares the ranks' signatures (``signatures``): a mismatch raises
    ``CollectiveMismatchError`` on every rank and the group stays usable. A failure inside
    torch (a timeout, a dead peer) breaks the group: later calls say so.
    """

    tuner: Tuner

    def __init__(self, make: Callable[[Team, str], tuple[TorchObject, TorchObject]], name: str, members: Team,
                 nodes: tuple[Hashable, ...], device: str) -> None:
        self._make, self._name, self._members, self._device = make, name, members, device
        self._prefix = f"{name}[{','.join(map(str, members.ranks))}]"
        pg, store = make(members, self._prefix)
        self._comm = ProcessGroupCommunicator.over(pg, store, "nccl" if device == "cuda" else "gloo", nodes)
        self._rank, self._size = self._comm.rank, self._comm.world_size
        self._nodes = nodes
        self._broken: str | None = None
        self.tuner = Tuner(self._comm.transport, {NATIVE: self._native}, self._guard, FIT_BYTES,
                           FIT_REPEATS, self._comm.timeout_s)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def nodes(self) -> tuple[Hashable, ...]:
        return self._nodes

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device(self._device)

    @property
    def algorithms(self) -> tuple[str, ...]:
        return (NATIVE, *sorted(algorithms.ALGORITHMS))

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        op = as_reduce_op(op)
        if algorithm not in ("auto", NATIVE, *algorithms.ALGORITHMS):
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of "
                             f"{['auto', NATIVE, *sorted(algorithms.ALGORITHMS)]}")
        self._agree(signatures.encode("allreduce", tensor, op, _code(algorithm)))
        if algorithm != "auto":
            self._run(tensor, op, algorithm)
            return
        nbytes = tensor.numel() * tensor.element_size()
        arm = self.tuner.arm(nbytes)
        if arm is not None and arm.due():  # now and then: the runner-up on a copy, timed
            with working(tensor, "numpy") as arr:
                self.tuner.probe(arm, arr, op)
            return
        self._run(tensor, op, self.tuner.choose(nbytes))

    def _run(self, tensor: torch.Tensor, op: ReduceOp, name: str) -> None:
        """The backend's own allreduce on ``tensor``, or cgraph's ``name`` over the process group."""
        if name == NATIVE:
            self._guard("allreduce", lambda: self._comm.allreduce(tensor, op))
            return
        with working(tensor, "numpy") as arr:
            options = self.tuner.options(name, arr.nbytes)
            self._guard("allreduce", lambda: algorithms.allreduce(self._comm.transport, arr, op, name, **options))

    def _native(self, buf: np.ndarray, op: ReduceOp) -> None:
        """The backend's own allreduce of a numpy buffer: "native" as ``autotune`` times it
        (inside the tuner's guard; on NCCL through a device copy, as cgraph's messages go)."""
        import torch

        host = torch.from_numpy(buf)
        tensor = host if self._device == "cpu" else host.to(self._device)
        self._comm.allreduce(tensor, op)
        if tensor is not host:
            host.copy_(tensor.cpu())

    def reduce(self, tensor: torch.Tensor, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> None:
        op = as_reduce_op(op)
        self._agree(signatures.encode("reduce", tensor, op, dst))
        self._guard("reduce", lambda: self._comm.reduce(tensor, dst, op))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._agree(signatures.encode("broadcast", tensor, None, src))
        self._guard("broadcast", lambda: self._comm.broadcast(tensor, src))

    def allgather(self, outs: Sequence[torch.Tensor], tensor: torch.Tensor, algorithm: str = "auto") -> None:
        self._agree(signatures.encode("allgather", tensor, None, _gather_code("allgather", algorithm)))
        if algorithm not in ("auto", NATIVE):  # cgraph's over the process group
            n, p = tensor.numel(), self.world_size
            with working(tensor, "numpy", write=False) as mine:
                whole = np.empty(n * p, dtype=mine.dtype)
                whole[self.rank * n : (self.rank + 1) * n] = mine.reshape(-1)
            self._guard("allgather", lambda: algorithms.allgather(
                self._comm.transport, whole, algorithm=algorithm))
            for r, out in enumerate(outs):
                with working(out, "numpy") as view:
                    view.reshape(-1)[:] = whole[r * n : (r + 1) * n]
            return
        self._guard("allgather", lambda: self._comm.allgather(list(outs), tensor))

    def reducescatter(self, out: torch.Tensor, parts: torch.Tensor | list[torch.Tensor], op: ReduceOp | str = ReduceOp.SUM,
                      algorithm: str = "auto") -> None:
        import torch

        op, parts = as_reduce_op(op), split_chunks(out, parts, self.world_size)
        self._agree(signatures.encode("reducescatter", out, op, _gather_code("reducescatter", algorithm)))
        if algorithm in ("auto", NATIVE):  # the backend's own
            self._guard("reducescatter", lambda: self._comm.reducescatter(out, parts, op))
            return
        whole = torch.cat([part.reshape(-1) for part in parts])  # cgraph's, over the process group
        n = out.numel()
        with working(whole, "numpy") as arr:
            self._guard("reducescatter", lambda: algorithms.reducescatter(
                self._comm.transport, arr, op, algorithm=algorithm))
        out.copy_(whole[self.rank * n : (self.rank + 1) * n].reshape(out.shape))

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        mine = self._tensor(signatures.encode("p2p", tensor))
        answer = self._tensor([0])
        self._guard("send", lambda: self._comm.send(mine, dst))
        self._guard("send", lambda: self._comm.recv(answer, dst))
        if int(answer[0]) != 1:
            raise self._mismatch(f"rank {dst} expected a different tensor: {_text(mine)} was sent")
        self._guard("send", lambda: self._comm.send(tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        mine = signatures.encode("p2p", tensor)
        theirs = self._tensor([0] * len(mine))
        self._guard("recv", lambda: self._comm.recv(theirs, src))
        ok = [int(x) for x in theirs.tolist()] == mine
        self._guard("recv", lambda: self._comm.send(self._tensor([int(ok)]), src))
        if not ok:
            raise self._mismatch(f"rank {src} sent {_text(theirs)}, this rank receives "
                                 f"{signatures.describe(mine)}")
        self._guard("recv", lambda: self._comm.recv(tensor, src))

    def barrier(self) -> None:
        self._agree(signatures.encode("barrier"))
        self._guard("barrier", self._comm.barrier)

    def split(self, team: Team) -> TorchComm:
        members = Team(tuple(self._members.ranks[r] for r in team.ranks))  # group ranks
        nodes = tuple(self.nodes[r] for r in team.ranks)
        child = TorchComm(self._make, self._name, members, nodes, self._device)
        child.tuner.inherit(self.tuner)
        return child

    def destroy(self) -> None:
        self._comm.destroy()

    # ------------------------------------------------------------------ internals
    def _agree(self, header: list[int]) -> None:
        """``signatures.agree``; on a mismatch, gather every rank's call and raise the same
        ``CollectiveMismatchError`` on every rank."""
        _, same = signatures.agree(0, header, self._max_allreduce)
        if same:
            return
        mine = self._tensor(header)
        gathered = [self._tensor([0] * len(header)) for _ in range(self.world_size)]
        self._guard("signature check", lambda: self._comm.allgather(gathered, mine))
        rows = [[int(x) for x in g.tolist()] for g in gathered]
        calls = "; ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(rows))
        raise self._mismatch(f"the ranks entered different calls ({calls})")

    def _max_allreduce(self, values: list[int]) -> list[int]:
        flag = self._tensor(values)
        self._guard("signature check", lambda: self._comm.allreduce(flag, ReduceOp.MAX))
        return [int(x) for x in flag.tolist()]

    def _mismatch(self, detail: str) -> CollectiveMismatchError:
        return CollectiveMismatchError(
            f"group {self._name!r}, rank {self.rank}: {detail}. Every rank must make the same "
            "calls in the same order with tensors of the same dtype and shape; nothing was "
            "sent, the group is still usable.", self._name, self.rank)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        import torch

        return torch.tensor(values, dtype=torch.int64, device=self._device)

    def _guard(self, what: str, call: Callable[[], T]) -> T:
        """``call()``; a failure inside torch breaks the group: this rank aborts its process
        group at once, which closes its connections, so a peer blocked on this rank fails
        now (it lost a peer) instead of at its timeout; later calls here say so."""
        if self._broken is not None:
            raise CollectiveGroupError(
                f"group {self._name!r}, rank {self.rank}: the process group broke on an earlier "
                f"error ({self._broken}); destroy_collective_group({self._name!r}) on every rank "
                "and create it again", self._name, self.rank)
        try:
            return call()
        except RuntimeError as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            timed_out = "timed out" in text.lower() or "timeout" in text.lower()
            self._broken = f"{what}: {text}"
            self._comm.abort()
            raise (CollectiveTimeoutError if timed_out else CollectiveError)(
                f"group {self._name!r}, rank {self.rank}: {what} failed in torch.distributed: "
                f"{text} (a peer did not arrive within timeout_s, or died; {describe_layout(self.nodes, self.rank)})",
                self._name, self.rank) from exc


def _text(header: torch.Tensor) -> str:
    return signatures.describe(header.tolist())


def _gather_code(kind: str, algorithm: str) -> int:
    """A reducescatter's or allgather's algorithm field: -1 the backend's own, else its index."""
    table = algorithms.REDUCESCATTER_ALGORITHMS if kind == "reducescatter" else algorithms.ALLGATHER_ALGORITHMS
    if algorithm in ("auto", NATIVE):
        return -1
    if algorithm not in table:
        raise ValueError(f"unknown {kind} algorithm {algorithm!r}; choose one of "
                         f"{['auto', NATIVE, *sorted(table)]}")
    return sorted(table).index(algorithm)


def _code(algorithm: str) -> int:
    """An allreduce's algorithm field in its signature (see ``AUTO_CODE``)."""
    if algorithm in ("auto", NATIVE):
        return AUTO_CODE if algorithm == "auto" else -1
    return signatures.algorithm_code(algorithm)


def _describe(row: list[int]) -> str:
    """``signatures.describe``, naming "auto" and "native" (this backend's codes)."""
    if row[0] != signatures.KINDS.index("allreduce") or row[2] not in (-1, AUTO_CODE):
        return signatures.describe(row)
    return f"{signatures.describe([*row[:2], -1, *row[3:]])} {'auto' if row[2] == AUTO_CODE else NATIVE}"


def connect(membership: Membership, hooks: Hooks) -> TorchComm:
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

    def make(members: Team, prefix: str) -> tuple[TorchObject, TorchObject]:
        """The process group of ``members`` (group ranks) as this rank sees it, and its store."""
        rank = members.team_rank(membership.rank)
        store = root.prefixed(prefix)
        return process_group(spec.backend, store, rank, members.size, timeout, local_host), store

    nodes = _exchange_nodes(root.prefixed("nodes"), membership.rank, spec.world_size, hooks.node)
    device = "cuda" if spec.backend == "nccl" else "cpu"
    return TorchComm(make, spec.name, Team(tuple(range(spec.world_size))), nodes, device)


def _exchange_nodes(store: TorchObject, rank: int, size: int, node: str) -> tuple[Hashable, ...]:
    store.set(str(rank), node)
    return tuple(store.get(str(r)).decode() for r in range(size))


def _local_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # unannotated in Ray
