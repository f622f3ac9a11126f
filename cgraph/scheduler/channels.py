"""Channel planning: which channel carries each value to each reader.

A *value* is what one channel carries: the input ``n0`` (written by the
driver), a CALL node returning one value, or an ITEM node (one return of a
``num_returns > 1`` call, or one member's result of a COLLECTIVE). An
INPUT_ATTR node (``n0.key``) is not a value: its reader reads ``n0`` and
picks the attribute locally.

    actor a = W(gpus=1)                 n0.shm     driver -> a,b    shm
    actor b = W(gpus=1)                 n1.intra   a -> a           intra
    n0 = input                          n1>b.comm  a -> b           nccl
    n1 = a.f(n0) :nccl            ──►   n2.shm     b -> a,driver    shm
    n2 = b.g(n0, n1)                    n3.shm     a -> driver      shm
    n3 = a.h(n1, n2)
    return [n2, n3]

Per (value v held by h, reader actor c), the first rule that fits:

- ``c == h``: one INTRA channel (a queue inside the actor);
- a communicator hint (``nccl``, ``custom:<name>``, or ``auto`` between two
  GPU actors) and neither side is the driver: one COMM channel per reader;
- ``c`` on h's node (whichever node that is): the readers there share ONE SHM
  channel, made on that node;
- ``c`` on another node: the readers on that node share ONE CROSS_NODE channel
  (named after the first of them), so the value crosses each node boundary once:
  one TCP connection to that node, whose receiving end lands each value in
  shared memory there for every reader on it.

    actor a = W(gpus=0)                      n1.shm     a -> b        shm (node2)
    actor b = W(gpus=0, host=node2)          n1>c.xnode a -> c,driver xnode
    actor c = W(gpus=0)               ──►
    n1 = a.f(n0) (a on node2)
    n2 = b.g(n1); n3 = c.h(n1); return [n1, n2, n3]
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from cgraph.errors import DAGValidationError, GraphSyntaxError, TransportError
from cgraph.ir.graph import DRIVER, ActorId, Graph, Node, NodeId, NodeKind, TensorHint, format_node
from cgraph.ir.text import _parse_hint


# --------------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class ValueMap:
    """Where each value of a graph comes from and who reads it (see ``map_values``)."""

    values: tuple[NodeId, ...]  # value nodes, in graph order
    holder: dict[NodeId, ActorId]  # value -> the actor (or DRIVER) holding it
    producer: dict[NodeId, NodeId]  # value -> the CALL / COLLECTIVE / INPUT node making it
    inputs: dict[NodeId, tuple[NodeId, ...]]  # CALL / COLLECTIVE -> values it reads
    outputs: dict[NodeId, tuple[NodeId, ...]]  # CALL / COLLECTIVE -> values it makes
    readers: dict[NodeId, tuple[ActorId, ...]]  # value -> reader actors, DRIVER last
    first_consumer: dict[tuple[NodeId, ActorId], NodeId]  # (value, reader) -> a node reading it
    members: dict[NodeId, tuple[ActorId, ...]]  # COLLECTIVE -> member actors, in rank order

    def hint(self, graph: Graph, value: NodeId) -> TensorHint | None:
        """The value's type hint; an ITEM without one inherits its producer's."""
        node = graph.node(value)
        if node.hint is None and node.kind is NodeKind.ITEM:
            return graph.node(self.producer[value]).hint
        return node.hint


def error_message(what: str, where: str, why: str, fix: str) -> str:
    """The four-part layout of cgraph's compile errors (``where`` may span lines)."""
    where = where.replace("\n", "\n       ")
    return f"{what}\n  at:  {where}\n  why: {why}\n  fix: {fix}"


def _is_value(node: Node) -> bool:
    """Does ``node`` hold a value of its own (one channel's worth)?"""
    if node.kind is NodeKind.CALL:
        return node.num_returns == 1
    return node.kind in (NodeKind.INPUT, NodeKind.ITEM)


def _resolve(graph: Graph, user: Node | None, ref: NodeId) -> NodeId:
    """The value ``user`` (None: the output) reads: ``n0.key`` reads ``n0``.

    Reading a multi-return call or a collective as one value is an error.
    """
    src = graph.node(ref)
    if src.kind is NodeKind.INPUT_ATTR:
        return _resolve(graph, user, src.inputs()[0])
    if not _is_value(src):
        who, line = (user.id, format_node(user)) if user else ("the output", "return " + ", ".join(graph.outputs))
        if src.kind is NodeKind.COLLECTIVE:
            what, fix = "a collective", f"read one member's result, {src.id}[i]"
        else:
            what = f"a call with num_returns={src.num_returns}"
            fix = "read one result: `x, y = actor.f.options(num_returns=2).bind(...)`, then bind x or y"
        raise DAGValidationError(error_message(
            f"{who} reads {src.id}, {what}, as one value",
            f"{format_node(src)}\n{line}",
            f"each result of {src.id} is a value of its own ({src.id}[0], {src.id}[1], ...)",
            fix,
        ))
    return src.id


def _members(node: Node, used: tuple[NodeId, ...], holder: dict[NodeId, ActorId]) -> tuple[ActorId, ...]:
    members = tuple(holder[v] for v in used)
    if len(used) != len(node.args) or DRIVER in members or len(set(members)) != len(members):
        raise DAGValidationError(error_message(
            f"collective {node.id} has members {', '.join(members) or 'none'}",
            format_node(node),
            "a collective takes one tensor per member actor, each made on that actor",
            "pass one result of a different actor per member (not the input, not a constant)",
        ))
    return members


def _made(graph: Graph) -> tuple[dict[NodeId, ActorId], dict[NodeId, NodeId], dict[NodeId, tuple[NodeId, ...]]]:
    """holder and producer of every value; the values every CALL / COLLECTIVE makes."""
    holder: dict[NodeId, ActorId] = {}
    producer: dict[NodeId, NodeId] = {}
    made: dict[NodeId, list[tuple[int, int, NodeId]]] = {}
    for pos, node in enumerate(graph.nodes):
        if not _is_value(node):
            continue
        holder[node.id] = graph.producer_actor(node.id)
        producer[node.id] = node.inputs()[0] if node.kind is NodeKind.ITEM else node.id
        key = node.key if isinstance(node.key, int) else 0
        made.setdefault(producer[node.id], []).append((key, pos, node.id))
    outputs = {k: tuple(v for *_, v in sorted(items)) for k, items in made.items()}
    return holder, producer, outputs


def map_values(graph: Graph) -> ValueMap:
    """Index the values of ``graph``: holders, producers, readers, inputs and outputs of calls.

    Raises:
        DAGValidationError: a node or the output reads a multi-return call or a
            collective without indexing it, or a collective's members are not
            distinct actors.
    """
    holder, producer, outputs = _made(graph)
    inputs: dict[NodeId, tuple[NodeId, ...]] = {}
    members: dict[NodeId, tuple[ActorId, ...]] = {}
    reads: dict[NodeId, dict[ActorId, NodeId]] = {}
    for node in graph.nodes:
        if node.kind not in (NodeKind.CALL, NodeKind.COLLECTIVE):
            continue
        used = tuple(dict.fromkeys(_resolve(graph, node, r) for r in node.inputs()))
        inputs[node.id] = used
        if node.kind is NodeKind.COLLECTIVE:
            members[node.id] = _members(node, used, holder)
        for i, value in enumerate(used):
            reader = members[node.id][i] if node.kind is NodeKind.COLLECTIVE else node.actor
            reads.setdefault(value, {}).setdefault(reader or DRIVER, node.id)
    for out in graph.outputs:
        value = _resolve(graph, None, out)
        if holder[value] != DRIVER:  # the driver already holds its own input
            reads.setdefault(value, {}).setdefault(DRIVER, out)
    rank = {a.id: i for i, a in enumerate(graph.actors)}
    return ValueMap(
        values=tuple(holder),
        holder=holder,
        producer=producer,
        inputs=inputs,
        outputs=outputs,
        readers={v: tuple(sorted(r, key=lambda a: rank.get(a, len(rank)))) for v, r in reads.items()},
        first_consumer={(v, a): n for v, r in reads.items() for a, n in r.items()},
        members=members,
    )


# --------------------------------------------------------------------------- channels
class ChannelKind(enum.Enum):
    INTRA = "intra"  # writer and reader are the same actor
    SHM = "shm"  # shared memory, one writer, many readers on one host
    COMM = "comm"  # a communicator (NCCL, CPU stand-in, user-supplied)
    CROSS_NODE = "xnode"  # producer and reader on different Ray nodes


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """One channel: ``writer`` writes value ``node``; each of ``readers`` reads it."""

    id: str
    node: NodeId
    kind: ChannelKind
    writer: ActorId
    readers: tuple[ActorId, ...]
    transport: str
    hint: TensorHint | None = None

    def __str__(self) -> str:
        hint = f" :{self.hint}" if self.hint is not None else ""
        readers = ",".join(self.readers)
        return f"{self.id} = {self.kind.value} {self.writer} -> {readers} via {self.transport}{hint}"


@dataclass(frozen=True, slots=True)
class CommGroup:
    """One communicator (``scheduler.groups`` plans them): its members, in rank order, and
    what runs it. ``transport`` is what the edges and collectives asked for ("nccl",
    "gloo", "cpu", "custom:<name>"); ``kind`` what runs it ("nccl" becomes "cuda_ipc"
    when every member sits on one GPU); ``collectives`` the collective nodes it runs."""

    name: str
    transport: str
    kind: str
    members: tuple[ActorId, ...]
    collectives: tuple[NodeId, ...] = ()

    def __str__(self) -> str:
        runs = f" for {','.join(self.collectives)}" if self.collectives else ""
        return f"group {self.name} = {self.kind} {','.join(self.members)} via {self.transport}{runs}"


@dataclass(frozen=True, slots=True)
class ChannelPlan:
    """Every channel of a graph, in value order, and the communicator groups they use."""

    channels: tuple[ChannelSpec, ...]
    groups: tuple[CommGroup, ...] = ()
    _by_node: dict[NodeId, tuple[ChannelSpec, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _by_reader: dict[tuple[NodeId, ActorId], ChannelSpec] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        by_node: dict[NodeId, list[ChannelSpec]] = {}
        for spec in self.channels:
            by_node.setdefault(spec.node, []).append(spec)
            for reader in spec.readers:
                self._by_reader[(spec.node, reader)] = spec
        self._by_node.update({k: tuple(v) for k, v in by_node.items()})

    def for_node(self, node: NodeId) -> tuple[ChannelSpec, ...]:
        """The channels carrying value ``node`` (empty if nobody reads it)."""
        return self._by_node.get(node, ())

    def for_reader(self, node: NodeId, reader: ActorId) -> ChannelSpec | None:
        """The channel through which ``reader`` gets value ``node``, if any."""
        return self._by_reader.get((node, reader))

    def group(self, name: str) -> CommGroup:
        """The group called ``name`` (an edge's ``transport`` names its group)."""
        return next(g for g in self.groups if g.name == name)

    def group_of_collective(self, node: NodeId) -> CommGroup:
        """The group that runs collective ``node``."""
        return next(g for g in self.groups if node in g.collectives)

    def __str__(self) -> str:
        return format_channels(self)


def plan_channels(graph: Graph, *, default_communicator: str | None = None) -> ChannelPlan:
    """Choose a channel for every (value, reader actor) edge of ``graph``.

    Args:
        graph: the DAG.
        default_communicator: communicator for ``nccl`` edges whose actors lack
            GPUs (e.g. ``"cpu"``); without it such an edge is an error.

    Returns:
        The plan; channel ids are stable: ``n3.intra``, ``n3.shm``,
        ``n3>b.comm``, ``n3>b.xnode``.

    Raises:
        TransportError: an edge asks for NCCL between actors without GPUs.
        DAGValidationError: a node reads a multi-return call without indexing it.
    """
    values = map_values(graph)
    channels: list[ChannelSpec] = []
    for value in values.values:
        channels += _plan_value(graph, values, value, default_communicator)
    return ChannelPlan(tuple(channels))


def _plan_value(
    graph: Graph, values: ValueMap, value: NodeId, default_communicator: str | None
) -> list[ChannelSpec]:
    holder = values.holder[value]
    hint = values.hint(graph, value)
    intra: list[ChannelSpec] = []
    shm: list[ActorId] = []
    own: list[ChannelSpec] = []
    remote: dict[str, list[ActorId]] = {}  # reader host -> its readers
    for reader in values.readers.get(value, ()):
        if reader == holder:
            intra.append(ChannelSpec(f"{value}.intra", value, ChannelKind.INTRA, holder, (reader,), "intra", hint))
            continue
        kind, transport = _choose(graph, values, value, reader, default_communicator)
        if kind is ChannelKind.SHM:
            shm.append(reader)
        elif kind is ChannelKind.CROSS_NODE:
            remote.setdefault(_host(graph, reader), []).append(reader)
        else:  # one channel per reader, named after it
            own.append(ChannelSpec(f"{value}>{reader}.{kind.value}", value, kind, holder, (reader,), transport, hint))
    if shm:
        intra.append(ChannelSpec(f"{value}.shm", value, ChannelKind.SHM, holder, tuple(shm), "shm", hint))
    for readers in remote.values():  # one per node, named after its first reader
        own.append(ChannelSpec(f"{value}>{readers[0]}.xnode", value, ChannelKind.CROSS_NODE, holder,
                               tuple(readers), "xnode", hint))
    own.sort(key=lambda spec: spec.id)
    return intra + own


def _host(graph: Graph, actor: ActorId) -> str:
    return "" if actor == DRIVER else graph.actor(actor).host


def _has_gpu(graph: Graph, actor: ActorId) -> bool:
    return actor != DRIVER and graph.actor(actor).gpus > 0


def _choose(
    graph: Graph, values: ValueMap, value: NodeId, reader: ActorId, default_communicator: str | None
) -> tuple[ChannelKind, str]:
    """The kind and transport of the edge ``value -> reader`` (reader != holder)."""
    holder = values.holder[value]
    hint = values.hint(graph, value)
    transport = hint.transport if hint is not None else None
    if DRIVER not in (holder, reader):
        gpus = _has_gpu(graph, holder) and _has_gpu(graph, reader)
        if transport == "nccl" or (transport == "auto" and gpus):
            if gpus:
                return ChannelKind.COMM, "nccl"
            if default_communicator is not None:
                return ChannelKind.COMM, default_communicator
            raise _no_gpu_error(graph, values, value, reader)
        if transport is not None and transport.startswith("custom:"):
            return ChannelKind.COMM, transport
    if _host(graph, holder) != _host(graph, reader):
        return ChannelKind.CROSS_NODE, "xnode"
    return ChannelKind.SHM, "shm"  # on one node, whichever: shared memory made there


def _no_gpu_error(graph: Graph, values: ValueMap, value: NodeId, reader: ActorId) -> TransportError:
    consumer = values.first_consumer[(value, reader)]
    edge = f"{format_node(graph.node(value))} -> {format_node(graph.node(consumer))}"
    holder = values.holder[value]
    lacking = [graph.actor(a) for a in (holder, reader) if not _has_gpu(graph, a)]
    who = " and ".join(f"{a.id} ({a.cls}, gpus={a.gpus:g})" for a in lacking)
    who = f"actors {who} have" if len(lacking) > 1 else f"actor {who} has"
    return TransportError(error_message(
        f"edge {edge} uses transport 'nccl', but {who} no GPU",
        f"{format_node(graph.node(value))}\n{format_node(graph.node(consumer))}",
        "NCCL moves tensors between GPUs, so both actors need one",
        'use with_tensor_transport(transport="shm") or transport="auto" for this edge, '
        'give both actors num_gpus=1, or compile with a CPU communicator (default_communicator="gloo", '
        'or "cpu" for actors on the driver\'s node)',
    ))


# --------------------------------------------------------------------------- text form
_SPEC = re.compile(
    r"(?P<id>\S+) = (?P<kind>\w+) (?P<writer>\w+) -> (?P<readers>[\w,]+) "
    r"via (?P<transport>\S+?)(?: :(?P<hint>\S+))?\Z"
)
_GROUP = re.compile(
    r"group (?P<name>\S+) = (?P<kind>\w+) (?P<members>[\w,]+) via (?P<transport>\S+?)"
    r"(?: for (?P<collectives>[\w,]+))?\Z"
)
_KINDS = {k.value: k for k in ChannelKind}


def format_channels(plan: ChannelPlan) -> str:
    """One channel per line, ``n1>b.comm = comm a -> b via nccl :nccl``, then one line per
    communicator group, ``group nccl = cuda_ipc a,b via nccl for n4``."""
    return "\n".join([*(str(spec) for spec in plan.channels), *(str(g) for g in plan.groups)])


def parse_channels(text: str) -> ChannelPlan:
    """Inverse of ``format_channels``.

    Raises:
        GraphSyntaxError: naming the line that does not parse.
    """
    specs, groups = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.strip().startswith("group "):
            g = _GROUP.match(line.strip())
            if g is None:
                raise GraphSyntaxError(
                    f"line {lineno}: expected 'group NAME = KIND MEMBERS via TRANSPORT [for NODES]'\n    {line}")
            collectives = tuple(g["collectives"].split(",")) if g["collectives"] else ()
            groups.append(CommGroup(g["name"], g["transport"], g["kind"], tuple(g["members"].split(",")),
                                    collectives))
            continue
        m = _SPEC.match(line.strip())
        if m is None or m["kind"] not in _KINDS:
            raise GraphSyntaxError(
                f"line {lineno}: expected 'ID = KIND WRITER -> READERS via TRANSPORT [:HINT]'\n    {line}"
            )
        node = m["id"].split(".")[0].split(">")[0]
        hint = _parse_hint(m["hint"]) if m["hint"] else None
        readers = tuple(m["readers"].split(","))
        specs.append(ChannelSpec(m["id"], node, _KINDS[m["kind"]], m["writer"], readers, m["transport"], hint))
    return ChannelPlan(tuple(specs), tuple(groups))
