"""Communicator groups of a compiled graph: made on the driver, opened in the actors.

The planner decided the groups (``scheduler.groups``: members, rank order, kind;
the channel plan's text shows them as ``group nccl = cuda_ipc a,b via nccl``).
Here the driver makes what each kind of group needs (``GROUP_KINDS``), plus one
side channel per COMM channel (shared memory on the driver's node, a socket when
an end lives on another node; likewise the watchers' flags), and ships each
actor a ``CommProgram`` in ``ActorProgram.comm``; the actor opens its
communicators on its first communicator op (``comm_ops``).

    kind      made on the driver                     opened in the actor          abort() does
    cpu       one shm link per ordered rank pair     CpuCommunicator(links)       close the links
    gloo      a key store actor (ray_store)          ProcessGroupCommunicator     abort the process group
    nccl      a key store actor (ray_store)          ProcessGroupCommunicator     abort the process group
    cuda_ipc  data + ack shm links                   CudaIpcCommunicator(links)   close the links
    custom    a copy of the user's object, checked   initialized at compile       the user's abort()
                                                     (custom_comm)

Every group has a *control* channel that carries nothing: the driver closes it
at teardown or after a death, a member after its communicator's fault
(``comm_faults``), and each member's watcher thread then aborts its communicator.

``CommResources`` joins the
graph's channel resources: ``close()`` (teardown, or the monitor after a
death) closes every link, side channel and watcher flag, which wakes or aborts
every rank; ``unlink()`` removes the segments and drops the stores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cgraph.channels.shm_channel import ShmChannel
from cgraph.comm.communicator import Communicator, missing_methods
from cgraph.errors import CompileError
from cgraph.ir import Graph, Node, NodeKind, Ref, TensorHint
from cgraph.runtime.comm_faults import BoardHandle, FaultBoard
from cgraph.runtime.custom_comm import drop, initialize_custom, make_custom, open_custom
from cgraph.runtime.endpoints import node_channel
from cgraph.runtime.gpu_placement import bind_assigned_gpu
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler.channels import ChannelKind, ChannelSpec, CommGroup

if TYPE_CHECKING:
    from cgraph.dag import FrontEnd
    from cgraph.scheduler import Planned

SIDE_BUFFER = 4096
"""First slot size of a side channel (metadata is small; a larger item grows it once)."""


@dataclass(frozen=True)
class GroupEndpoint:
    """What one actor needs to open its communicator of one group (picklable)."""

    name: str
    kind: str  # a key of GROUP_KINDS
    rank: int
    world_size: int
    payload: Any  # kind-specific: link ends, a rendezvous, the user's object
    control: Any = None  # a reader handle closed to abort the group (shm: any member may; socket: the driver)
    nodes: tuple[str, ...] = ()  # each member's Ray node ("" for the driver's), by rank
    ready: bool = False  # a user communicator initialized at compile (``custom_comm``)
    board: BoardHandle | None = None  # this member's end of the group's FaultBoard (one node only)


@dataclass(frozen=True)
class EdgeEndpoint:
    """One end of a communicator channel: the value ``node`` to or from ``peer``."""

    node: str
    peer: str
    peer_rank: int
    group: str
    side: Any  # the side channel's writer (sender) or reader (receiver) handle (shm or socket)
    hint: TensorHint | None
    method: str  # the producing method, for errors


@dataclass(frozen=True)
class CollectiveEndpoint:
    node: str
    method: str  # allreduce | allgather | reducescatter
    op: str
    input: str  # this member's input value
    output: str  # this member's result (an ITEM node), "" if unused
    group: str
    algorithm: str = "auto"  # allreduce: "auto" (the communicator's choice) or an ALGORITHMS name


@dataclass(frozen=True)
class CommProgram:
    """``ActorProgram.comm``: the actor's groups and communicator ops."""

    groups: dict[str, GroupEndpoint]
    sends: dict[tuple[str, str], EdgeEndpoint]  # (node, reader actor)
    recvs: dict[tuple[str, str], EdgeEndpoint]  # (node, writer actor)
    collectives: dict[str, CollectiveEndpoint] = field(default_factory=dict)


@dataclass
class CommResources:
    """Everything the driver made for a graph's communicators."""

    channels: list[Any] = field(default_factory=list)  # ShmChannel or SocketChannel
    keep_alive: list[Any] = field(default_factory=list)  # store actors serving rendezvous
    programs: dict[str, CommProgram] = field(default_factory=dict)
    sockets: dict[str, Any] = field(default_factory=dict)  # the graph's secret, tls: for sockets
    # how long a NCCL group's first handshake (in the first execution) waits for every rank:
    # the graph's get_timeout, since a get gives up then anyway; None: the rendezvous default
    rendezvous_timeout_s: float | None = None
    ready: list[Any] = field(default_factory=list)  # user communicators initialized at compile

    def program_of(self, actor: str) -> CommProgram | None:
        """``ActorProgram.comm`` of ``actor`` (None if it has no communicator op)."""
        return self.programs.get(actor)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def unlink(self) -> None:
        for channel in self.channels:
            channel.unlink()
        import ray

        for actor in self.keep_alive:  # end the store actors now: members may hold handles
            if ray.is_initialized():  # after ray.shutdown() they are gone (and a call would start Ray again)
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        self.keep_alive.clear()
        drop(self.ready)  # those of a graph torn down before its loops opened them
        self.ready.clear()


# --------------------------------------------------------------------------- kinds
def _make_cpu(res: CommResources, tag: str, name: str, n: int, obj: Any) -> list[Any]:
    from cgraph.comm.cpu.mesh import create_links

    channels, ends = create_links(tag, name, n)
    res.channels += channels
    return list(ends)


def _make_ipc(res: CommResources, tag: str, name: str, n: int, obj: Any) -> list[Any]:
    from cgraph.comm.cuda_ipc import create_ipc_links

    channels, ends = create_ipc_links(tag, name, n)
    res.channels += channels
    return list(ends)


def _make_store(res: CommResources, tag: str, name: str, n: int, obj: Any) -> list[Any]:
    from cgraph.comm.torch.process_group import StoreRendezvous

    prefix, timeout = f"cgraph/{tag}/{name}", res.rendezvous_timeout_s
    rendezvous, store = StoreRendezvous.create(prefix) if timeout is None else StoreRendezvous.create(prefix, timeout)
    res.keep_alive.append(store)
    return [rendezvous] * n


def _open_cpu(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.cpu.mesh import CpuCommunicator

    return CpuCommunicator(g.payload)


def _open_ipc(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.cuda_ipc import CudaIpcCommunicator

    bind_assigned_gpu()
    return CudaIpcCommunicator(g.payload)


def _open_nccl(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.torch.process_group import ProcessGroupCommunicator

    bind_assigned_gpu()
    return ProcessGroupCommunicator(g.payload, g.rank, g.world_size, "nccl")


def _open_gloo(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.torch.process_group import ProcessGroupCommunicator

    return ProcessGroupCommunicator(g.payload, g.rank, g.world_size, "gloo", nodes=g.nodes)


@dataclass(frozen=True)
class GroupKind:
    make: Callable[[CommResources, str, str, int, Any], list[Any]]  # one payload per rank
    open: Callable[[GroupEndpoint], Communicator]


GROUP_KINDS: dict[str, GroupKind] = {
    "cpu": GroupKind(_make_cpu, _open_cpu),
    "gloo": GroupKind(_make_store, _open_gloo),
    "nccl": GroupKind(_make_store, _open_nccl),
    "cuda_ipc": GroupKind(_make_ipc, _open_ipc),
    "custom": GroupKind(make_custom, open_custom),
}
"""Per kind of group: driver-side make, actor-side open (a test checks every kind)."""


def open_group(endpoint: GroupEndpoint) -> Communicator:
    """Open this actor's communicator of a group (in the actor)."""
    return GROUP_KINDS[endpoint.kind].open(endpoint)


# --------------------------------------------------------------------------- user objects
def _user_object(group: CommGroup, communicators: Mapping[str, Any], handles: Mapping[str, Any]) -> Any:
    """A "custom" group's communicator object, as cgraph runs it and checked; None otherwise."""
    if group.kind != "custom":
        return None
    obj = _as_cgraph(group.transport, communicators[group.transport], group.members, handles)
    _check_custom(group.transport, obj)
    return obj


def _as_cgraph(name: str, obj: Any, members: tuple[str, ...], handles: Mapping[str, Any]) -> Any:
    """A user's communicator as cgraph runs it: a subclass of Ray's ``Communicator`` is
    wrapped (``RayCommunicator``: its ranks read here, from the members' handles)."""
    from ray.experimental.channel.communicator import Communicator as RayBase

    if not isinstance(obj, RayBase):
        return obj
    from cgraph.comm.ray_communicator import RayCommunicator, ranks_of

    try:
        return RayCommunicator(obj, ranks_of(obj, [handles[m] for m in members], list(members)))
    except ValueError as exc:
        raise CompileError(f"communicator {name}: {exc}") from None


def _check_custom(name: str, obj: Any) -> None:
    missing = missing_methods(obj)
    if missing:
        raise CompileError(
            f"communicator {name} ({type(obj).__name__}) lacks {', '.join(missing)}; subclass "
            "cgraph.Communicator and implement initialize, rank, "
            "world_size, send and recv"
        )
    import ray.cloudpickle as cloudpickle

    try:
        cloudpickle.dumps(obj)  # type: ignore[no-untyped-call]  # unannotated in Ray
    except Exception as exc:  # noqa: BLE001
        raise CompileError(
            f"communicator {name} ({type(obj).__name__}) cannot be pickled ({type(exc).__name__}: "
            f"{exc}); cgraph ships one copy to every member actor, so keep connections out of "
            "__init__ and open them in initialize()"
        ) from exc


# --------------------------------------------------------------------------- setup
def setup_communicators(front: FrontEnd, planned: Planned, tag: str, options: CompileOptions,
                        sockets: dict[str, Any] | None = None) -> CommResources:
    """Make every group and side channel of a planned graph (on the driver).

    Args:
        front: the front end (``handles`` and ``communicators``, "custom:<name>" -> object).
        planned: the scheduler's result (graph, channel plan, schedule).
        tag: the compiled graph's tag (names the segments).
        sockets: ``secret`` and ``tls`` for the side and abort channels that are sockets.

    Returns:
        The resources (close and unlink them at teardown), with each actor's ``CommProgram``.

    Raises:
        CompileError: an unknown communicator, a user communicator that lacks a
            method, cannot be pickled or raises in ``initialize`` (run here in its
            actors, ``custom_comm``), or NCCL actors that share some GPUs.
    """
    graph: Graph = planned.graph
    plan = planned.plan
    res = CommResources(sockets=sockets or {}, rendezvous_timeout_s=options.get_timeout)
    if not plan.groups:
        return res
    try:
        hosts = {a.id: a.host for a in graph.actors}
        objects = {g.name: _user_object(g, front.communicators, front.handles) for g in plan.groups}
        programs: dict[str, CommProgram] = {}
        for group in plan.groups:
            for actor, endpoint in _make_group(res, tag, group, objects[group.name], hosts).items():
                _program_of(programs, actor).groups[group.name] = endpoint
        for spec in plan.channels:
            if spec.kind is ChannelKind.COMM:
                _add_edge(res, programs, graph, plan.group(spec.transport), spec, tag, options)
        for group in plan.groups:
            for node_id in group.collectives:
                _add_collective(programs, graph, graph.node(node_id), group)
        labels = {a.id: f"{a.id} ({a.cls})" for a in graph.actors}
        res.ready = initialize_custom(front.handles, programs, labels, res.rendezvous_timeout_s)
    except BaseException:
        res.unlink()
        raise
    res.programs = programs
    return res


def _program_of(programs: dict[str, CommProgram], actor: str) -> CommProgram:
    if actor not in programs:
        programs[actor] = CommProgram({}, {}, {}, {})
    return programs[actor]


def _make_group(res: CommResources, tag: str, group: CommGroup, obj: Any,
                hosts: Mapping[str, str]) -> dict[str, GroupEndpoint]:
    kind, n = GROUP_KINDS[group.kind], len(group.members)
    payloads = kind.make(res, tag, group.name, n, obj)
    controls: list[Any] = [None] * n
    boards: list[BoardHandle | None] = [None] * n
    if not any(hosts[m] for m in group.members):
        shared = ShmChannel.create(tag, f"{group.name}.abort", num_readers=n, max_inflight=1, buffer_size=64)
        board = FaultBoard.create(tag, group.name, n)
        res.channels += [shared, board]
        controls = [shared.reader_handle(rank) for rank in range(n)]
        boards = [board.handle(rank) for rank in range(n)]
    else:  # members on other nodes: one channel each, closed by the driver
        for rank, member in enumerate(group.members):
            channel = node_channel(tag, f"{group.name}.abort{rank}", ("", hosts[member]),
                                   max_inflight=1, buffer_size=64, **res.sockets)
            res.channels.append(channel)
            controls[rank] = channel.reader_handle(0)
    return {
        actor: GroupEndpoint(f"{tag}/{group.name}", group.kind, rank, n, payloads[rank], controls[rank],
                             tuple(hosts[m] for m in group.members), board=boards[rank])
        for rank, actor in enumerate(group.members)
    }


def _add_edge(
    res: CommResources, programs: dict[str, CommProgram], graph: Graph, group: CommGroup,
    spec: ChannelSpec, tag: str, options: CompileOptions,
) -> None:
    (reader,) = spec.readers
    hosts = (graph.actor(spec.writer).host, graph.actor(reader).host)
    side = node_channel(tag, f"{spec.id}.side", hosts, max_inflight=options.max_inflight_executions,
                        buffer_size=SIDE_BUFFER, **res.sockets)
    res.channels.append(side)
    method = _method_of(graph, spec.node)
    rank = group.members.index
    _program_of(programs, spec.writer).sends[(spec.node, reader)] = EdgeEndpoint(
        spec.node, reader, rank(reader), group.name, side.writer_handle(), spec.hint, method)
    _program_of(programs, reader).recvs[(spec.node, spec.writer)] = EdgeEndpoint(
        spec.node, spec.writer, rank(spec.writer), group.name, side.reader_handle(0), spec.hint, method)


def _add_collective(programs: dict[str, CommProgram], graph: Graph, node: Node, group: CommGroup) -> None:
    options = {k: graph.constants[a.index] for k, a in node.kwargs if not isinstance(a, Ref)}
    outputs = {
        n.key: n.id for n in graph.nodes
        if n.kind is NodeKind.ITEM and n.args and n.args[0] == Ref(node.id)
    }
    op = options.get("op", "sum")
    for i, actor in enumerate(group.members):
        arg = node.args[i]
        assert isinstance(arg, Ref), node
        _program_of(programs, actor).collectives[node.id] = CollectiveEndpoint(
            node.id, str(node.method), str(getattr(op, "value", op)), arg.node, outputs.get(i, ""), group.name,
            str(options.get("algorithm", "auto")),
        )


def _method_of(graph: Graph, node_id: str) -> str:
    node = graph.node(node_id)
    if node.kind is NodeKind.ITEM and node.args and isinstance(node.args[0], Ref):
        node = graph.node(node.args[0].node)
    return str(node.method or node.kind.value)
