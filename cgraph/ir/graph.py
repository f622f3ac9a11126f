"""cgraph's Graph IR: frozen records with stable string ids.

The front end (``cgraph.dag``) reads a Ray DAG once and produces a ``Graph``;
everything after that (the scheduler, the visualizer, the runtime) reads only
this value. Actors are ``"a"``, ``"b"``, ...; nodes are ``"n0"``, ``"n1"``, ...
in creation order (a topological order: a node is created after its arguments).

    with InputNode() as inp:                 actor a = Worker(gpus=0)
        x = a.f.bind(inp[0])                 actor b = Worker(gpus=0)
        y = b.g.bind(x, k=inp.k)     ──►     n0 = input
        dag = MultiOutputNode([x, y])        n1 = n0[0]
                                             n2 = a.f(n1)
                                             n3 = n0.k
                                             n4 = b.g(n2, k=n3)
                                             return [n2, n4]

Constant arguments are kept out of the IR's text: they print as ``$k``, an index
into ``Graph.constants`` (the values stay on the driver).

``Node.order`` is the per-actor execution order key. By default it is the
node's position; the front end sets it from Ray's bind index, so an actor runs
its methods in the order they were bound, as Ray does.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

ActorId = str
NodeId = str

DRIVER: ActorId = "driver"
"""The pseudo-actor that writes the input and reads the outputs."""


class NodeKind(enum.Enum):
    INPUT = "input"  # the InputNode: the whole argument of execute()
    INPUT_ATTR = "input_attr"  # inp[0] / inp.key
    CALL = "call"  # actor.method.bind(...)
    ITEM = "item"  # one return value of a call with num_returns > 1
    COLLECTIVE = "collective"  # reserved for cgraph.collective DAG nodes


@dataclass(frozen=True, slots=True)
class Ref:
    """An argument that is the value of another node."""

    node: NodeId

    def __str__(self) -> str:
        return self.node


@dataclass(frozen=True, slots=True)
class Const:
    """An argument that is a constant, ``Graph.constants[index]``."""

    index: int

    def __str__(self) -> str:
        return f"${self.index}"


Arg = Ref | Const


@dataclass(frozen=True, slots=True)
class TensorHint:
    """A tensor-transport type hint on a node's output edges.

    ``transport`` is "auto", "shm", "nccl", or "custom:<name>" for a
    user-supplied communicator registered under ``<name>`` at compile time.
    """

    transport: str = "auto"
    device: str = "default"
    static_shape: bool = False
    direct_return: bool = False

    def __str__(self) -> str:
        flags = []
        if self.static_shape:
            flags.append("static_shape")
        if self.direct_return:
            flags.append("direct_return")
        if self.device != "default":
            flags.append(f"device={self.device}")
        return self.transport + (f"[{','.join(flags)}]" if flags else "")


@dataclass(frozen=True, slots=True)
class Actor:
    """One Ray actor taking part in the graph."""

    id: ActorId
    cls: str = "Actor"  # class name, for people
    gpus: float = 0.0
    host: str = ""  # Ray node the actor lives on; "" = unknown / same as driver
    devices: tuple[str, ...] | None = None  # GPU ids Ray assigned a GPU actor; None = not asked

    def __str__(self) -> str:
        gpus = f"{self.gpus:g}"
        host = f", host={self.host}" if self.host else ""
        devices = "" if self.devices is None else f", devices={'+'.join(self.devices) or '-'}"
        return f"actor {self.id} = {self.cls}(gpus={gpus}{host}{devices})"


@dataclass(frozen=True, slots=True)
class Node:
    """One node of the graph.

    - INPUT: no fields.
    - INPUT_ATTR: ``args == (Ref(input),)``, ``key`` int (``inp[0]``) or str (``inp.k``).
    - CALL: ``actor``, ``method``, ``args``, ``kwargs``, ``num_returns``, ``order``.
    - ITEM: ``args == (Ref(call),)``, ``key`` the int index, ``actor`` the call's actor.
    - COLLECTIVE: ``method`` the collective, ``args`` one Ref per member,
      ``kwargs`` its options as constants; members' results are ITEM nodes.
    """

    id: NodeId
    kind: NodeKind
    actor: ActorId | None = None
    method: str | None = None
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    key: int | str | None = None
    num_returns: int = 1
    hint: TensorHint | None = None
    order: int = -1  # per-actor execution order key; -1 = position in the graph

    def inputs(self) -> tuple[NodeId, ...]:
        """Ids of the nodes this node reads, in argument order, without repeats."""
        seen: dict[NodeId, None] = {}
        for arg in (*self.args, *(a for _, a in self.kwargs)):
            if isinstance(arg, Ref):
                seen.setdefault(arg.node, None)
        return tuple(seen)

    def __str__(self) -> str:
        return format_node(self)


@dataclass(frozen=True, slots=True)
class Graph:
    """A whole DAG. ``nodes`` is in creation (topological) order."""

    actors: tuple[Actor, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[NodeId, ...]
    multi_output: bool = False
    constants: tuple[object, ...] = field(default=(), compare=False, hash=False)
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        index = {n.id: i for i, n in enumerate(self.nodes)}
        object.__setattr__(self, "_index", index)

    def node(self, node_id: NodeId) -> Node:
        return self.nodes[self._index[node_id]]

    def has_node(self, node_id: NodeId) -> bool:
        return node_id in self._index

    def position(self, node_id: NodeId) -> int:
        return self._index[node_id]

    def actor(self, actor_id: ActorId) -> Actor:
        for actor in self.actors:
            if actor.id == actor_id:
                return actor
        raise KeyError(actor_id)

    def order_key(self, node: Node) -> tuple[int, int]:
        pos = self._index[node.id]
        return (node.order if node.order >= 0 else pos, pos)

    def actor_nodes(self, actor_id: ActorId) -> tuple[Node, ...]:
        """The CALL nodes of one actor, in its execution (bind) order."""
        calls = [n for n in self.nodes if n.kind is NodeKind.CALL and n.actor == actor_id]
        return tuple(sorted(calls, key=self.order_key))

    def consumers(self) -> dict[NodeId, tuple[NodeId, ...]]:
        """For each node, the nodes that read it (in graph order)."""
        out: dict[NodeId, list[NodeId]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for src in n.inputs():
                out[src].append(n.id)
        return {k: tuple(v) for k, v in out.items()}

    def input_node(self) -> Node | None:
        for n in self.nodes:
            if n.kind is NodeKind.INPUT:
                return n
        return None

    def producer_actor(self, node_id: NodeId) -> ActorId:
        """The actor whose process holds a node's value (the driver for input nodes)."""
        node = self.node(node_id)
        if node.kind in (NodeKind.INPUT, NodeKind.INPUT_ATTR):
            return DRIVER
        assert node.actor is not None, node
        return node.actor

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __str__(self) -> str:
        return format_graph(self)


# --------------------------------------------------------------------------- text form
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _format_key(key: int | str) -> str:
    if isinstance(key, str) and _IDENT.match(key):
        return f".{key}"
    return f"[{key!r}]"


def format_node(node: Node, position: int | None = None) -> str:
    """One node as a line of text (``n3 = a.f(n1, $0)``)."""
    if node.kind is NodeKind.INPUT:
        rhs = "input"
    elif node.kind in (NodeKind.INPUT_ATTR, NodeKind.ITEM):
        assert node.key is not None
        rhs = f"{node.args[0]}{_format_key(node.key)}"
    else:
        parts = [str(a) for a in node.args] + [f"{k}={v}" for k, v in node.kwargs]
        callee = f"{node.actor}.{node.method}" if node.kind is NodeKind.CALL else f"{node.method}"
        rhs = f"{callee}({', '.join(parts)})"
        if node.num_returns != 1:
            rhs += f" returns={node.num_returns}"
        if node.order >= 0 and node.order != position:
            rhs += f" order={node.order}"
    if node.hint is not None:
        rhs += f" :{node.hint}"
    return f"{node.id} = {rhs}"


def format_graph(graph: Graph) -> str:
    """The whole graph, one line per actor and node, then the ``return`` line."""
    lines = [str(a) for a in graph.actors]
    lines += [format_node(n, i) for i, n in enumerate(graph.nodes)]
    outs = ", ".join(graph.outputs)
    lines.append(f"return [{outs}]" if graph.multi_output else f"return {outs}")
    return "\n".join(lines)
