"""A compiled graph's communicator groups, wired on the driver for its actors.

The planner decided the groups (``scheduler.groups``: members, rank order, kind;
the channel plan's text shows them as ``group nccl = cuda_ipc a,b via nccl``).
Here the driver makes each group through its kind's row (``comm.kinds``: shm
links, a store actor, the user's checked object), adds one side channel per COMM
channel (shared memory on the driver's node, a socket when an end lives on another
node; likewise the abort channels), and ships each actor a ``CommProgram`` in
``ActorProgram.comm``; the actor opens its communicators when its loop starts
(``executor``, ``comm_ops``, through ``comm.kinds.open_group``): making a torch
group is collective, so no member may wait for another's output first.

    kind      abort() does
    cpu       close the links
    gloo      abort the process group
    nccl      abort the process group
    cuda_ipc  close the links
    custom    the user's abort()

Every group has a *control* channel that carries nothing: the driver closes it
at teardown or after a death, a member after its communicator's fault
(``comm_faults``), and each member's watcher thread then aborts its communicator.
A group with a member on another node has one socket control per member, linked
in the driver's control server so that a member's close closes them all: a fault
on one node aborts the group on every node at once.

``CommResources`` joins the
graph's channel resources: ``close()`` (teardown, or the monitor after a
death) closes every link, side channel and watcher flag, which wakes or aborts
every rank; ``unlink()`` removes the segments and drops the stores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from cgraph._boundary import ActorHandle, UserValue
from cgraph.channels.shm_channel import ShmChannel
from cgraph.channels.socket_channel import SocketChannel
from cgraph.comm.custom import as_cgraph, drop, initialize_custom
from cgraph.comm.kinds import KINDS, GroupEndpoint, Made
from cgraph.ir import Graph, Node, NodeKind, Ref, TensorHint
from cgraph.runtime.comm_faults import BoardHandle, FaultBoard
from cgraph.runtime.endpoints import node_channel, socket_channel
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler.channels import ChannelKind, ChannelSpec, CommGroup

if TYPE_CHECKING:
    from cgraph.channels.shm_channel import ShmHandle
    from cgraph.channels.socket_endpoint import SocketHandle
    from cgraph.comm.kinds import Payload
    from cgraph.dag import FrontEnd
    from cgraph.scheduler import Planned

SIDE_BUFFER = 4096
"""First slot size of a side channel (metadata is small; a larger item grows it once)."""


class SocketOptions(TypedDict, total=False):
    """``node_channel``'s arguments for the channels that are sockets."""

    secret: bytes | None  # the graph's: socket endpoints prove they know it
    tls: bool  # they run TLS first


@dataclass(frozen=True)
class EdgeEndpoint:
    """One end of a communicator channel: the value ``node`` to or from ``peer``."""

    node: str
    peer: str
    peer_rank: int
    group: str
    side: ShmHandle | SocketHandle  # the side channel's writer (sender) or reader (receiver) handle (shm or socket)
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

    channels: list[ShmChannel | SocketChannel | FaultBoard] = field(default_factory=list)
    keep_alive: list[ActorHandle] = field(default_factory=list)  # store actors serving rendezvous
    programs: dict[str, CommProgram] = field(default_factory=dict)
    sockets: SocketOptions = field(default_factory=SocketOptions)  # the graph's secret, tls: for sockets
    # how long a NCCL group's first handshake (in the first execution) waits for every rank:
    # the graph's get_timeout, since a get gives up then anyway; None: the rendezvous default
    rendezvous_timeout_s: float | None = None
    ready: list[tuple[ActorHandle, tuple[str, int]]] = field(default_factory=list)  # user communicators initialized at compile

    def add(self, made: Made) -> list[Payload]:
        """Keep what the driver made for one group (released at teardown); its payloads."""
        self.channels += made.channels
        self.keep_alive += made.keep_alive
        return made.payloads

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


# --------------------------------------------------------------------------- setup
def setup_communicators(front: FrontEnd, planned: Planned, tag: str, options: CompileOptions,
                        sockets: SocketOptions | None = None) -> CommResources:
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
            actors, ``comm.custom``), or NCCL actors that share some GPUs.
    """
    graph: Graph = planned.graph
    plan = planned.plan
    res = CommResources(sockets=sockets or {}, rendezvous_timeout_s=options.get_timeout)
    if not plan.groups:
        return res
    try:
        hosts = {a.id: a.host for a in graph.actors}
        objects = {g.name: as_cgraph(g.transport, front.communicators[g.transport], g.members, front.handles)
                   if g.kind == "custom" else None for g in plan.groups}
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


def _make_group(res: CommResources, tag: str, group: CommGroup, obj: UserValue | None,
                hosts: Mapping[str, str]) -> dict[str, GroupEndpoint]:
    n = len(group.members)
    payloads = res.add(KINDS[group.kind].make(tag, group.name, n, obj, res.rendezvous_timeout_s))
    controls: list[ShmHandle | SocketHandle | None] = [None] * n
    boards: list[BoardHandle | None] = [None] * n
    if not any(hosts[m] for m in group.members):
        shared = ShmChannel.create(tag, f"{group.name}.abort", num_readers=n, max_inflight=1, buffer_size=64)
        board = FaultBoard.create(tag, group.name, n)
        res.channels += [shared, board]
        controls = [shared.reader_handle(rank) for rank in range(n)]
        boards = [board.handle(rank) for rank in range(n)]
    else:  # members on other nodes: a socket each (also on this node), closed together
        channels = [socket_channel(tag, f"{group.name}.abort{rank}", 1, **res.sockets)
                    for rank in range(n)]
        res.channels += channels
        SocketChannel.link_closing(channels)
        controls = [channel.reader_handle(0) for channel in channels]
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
