"""Hypothesis strategies for random cgraph values: Graphs, Ops, Schedules.

    from tests.unit.graph_strategies import graphs, schedules

    @given(graphs(max_actors=4, collectives=False))
    def test_something(graph): ...

``graphs()`` draws valid DAGs in creation (= bind) order: 1-8 actors with
random GPUs (and hosts, if asked); CALL nodes whose arguments are earlier
values, constants and input attributes (positional and keyword); random
``num_returns`` with some of their ITEM nodes; random transport hints
(nccl / auto / shm and flags); optional collectives; one or several outputs.
NCCL hints may land on GPU-less actors: plan such graphs with
``default_communicator="cpu"`` (or expect TransportError).
"""

from __future__ import annotations

from hypothesis import strategies as st

from cgraph.ir import Actor, Arg, Const, Graph, Node, NodeKind, Ref, TensorHint
from cgraph.scheduler.ops import Op, OpKind, Schedule, Stream

ACTOR_IDS = "abcdefgh"
METHODS = ("f", "g", "h", "step", "send", "recv")
KWARG_NAMES = ("k", "x", "y")


def _hints(transports: tuple[str, ...]) -> st.SearchStrategy[TensorHint | None]:
    hint = st.builds(
        TensorHint,
        transport=st.sampled_from(transports),
        static_shape=st.booleans(),
        direct_return=st.booleans(),
    )
    return st.none() | hint if transports else st.none()


class _Builder:
    """Accumulates nodes; knows which ids may be read and who holds what."""

    def __init__(self) -> None:
        self.nodes: list[Node] = [Node("n0", NodeKind.INPUT)]
        self.readable: list[str] = ["n0"]  # input, input attributes, single values
        self.held: dict[str, list[str]] = {}  # actor -> values it holds

    def new_id(self) -> str:
        return f"n{len(self.nodes)}"

    def add(self, node: Node, readable: bool = True) -> None:
        self.nodes.append(node)
        if readable:
            self.readable.append(node.id)
        if readable and node.actor is not None:
            self.held.setdefault(node.actor, []).append(node.id)


@st.composite
def _arg(draw: st.DrawFn, b: _Builder, n_consts: int) -> Arg:
    if draw(st.integers(0, 4)) == 0:
        return Const(draw(st.integers(0, n_consts - 1)))
    return Ref(draw(st.sampled_from(b.readable)))


@st.composite
def _call(draw: st.DrawFn, b: _Builder, actors: tuple[Actor, ...], hints: st.SearchStrategy[TensorHint | None], n_consts: int) -> None:
    actor = draw(st.sampled_from(actors)).id
    args = tuple(draw(st.lists(_arg(b, n_consts), max_size=3)))
    names = draw(st.lists(st.sampled_from(KWARG_NAMES), unique=True, max_size=2))
    kwargs = tuple((name, draw(_arg(b, n_consts))) for name in names)
    returns = draw(st.sampled_from([1, 1, 1, 2, 3]))
    call = Node(b.new_id(), NodeKind.CALL, actor, draw(st.sampled_from(METHODS)), args, kwargs,
                num_returns=returns, hint=draw(hints))
    b.add(call, readable=returns == 1)
    if returns > 1:
        keys = draw(st.lists(st.integers(0, returns - 1), min_size=1, unique=True))
        for key in keys:
            b.add(Node(b.new_id(), NodeKind.ITEM, actor, args=(Ref(call.id),), key=key, hint=draw(hints)))


@st.composite
def _input_attr(draw: st.DrawFn, b: _Builder) -> None:
    key = draw(st.integers(0, 2) | st.sampled_from(["key", "x"]))
    b.add(Node(b.new_id(), NodeKind.INPUT_ATTR, args=(Ref("n0"),), key=key))


@st.composite
def _collective(draw: st.DrawFn, b: _Builder) -> None:
    holders = sorted(a for a, vals in b.held.items() if vals)
    if len(holders) < 2:
        return
    members = draw(st.lists(st.sampled_from(holders), min_size=2, unique=True))
    args = tuple(Ref(draw(st.sampled_from(b.held[m]))) for m in members)
    coll = Node(b.new_id(), NodeKind.COLLECTIVE, method="allreduce", args=args)
    b.add(coll, readable=False)
    for i, member in enumerate(members):
        b.add(Node(b.new_id(), NodeKind.ITEM, member, args=(Ref(coll.id),), key=i))


@st.composite
def graphs(
    draw: st.DrawFn,
    *,
    max_actors: int = 8,
    max_steps: int = 12,
    transports: tuple[str, ...] = ("nccl", "auto", "shm"),
    hosts: bool = False,
    collectives: bool = True,
) -> Graph:
    """A random valid Graph (see the module docstring)."""
    n_actors = draw(st.integers(1, max_actors))
    actors = tuple(
        Actor(
            ACTOR_IDS[i],
            "Worker",
            gpus=draw(st.sampled_from([0.0, 1.0])),
            host=draw(st.sampled_from(["", "", "node2"])) if hosts else "",
        )
        for i in range(n_actors)
    )
    n_consts = 3
    hints = _hints(transports)
    b = _Builder()
    draw(_call(actors=actors, b=b, hints=hints, n_consts=n_consts))
    for _ in range(draw(st.integers(0, max_steps - 1))):
        step = draw(st.sampled_from(["call", "call", "call", "attr", "collective"]))
        if step == "call":
            draw(_call(b, actors, hints, n_consts))
        elif step == "attr":
            draw(_input_attr(b))
        elif collectives:
            draw(_collective(b))
    held = [v for vals in b.held.values() for v in vals]
    outputs = tuple(draw(st.lists(st.sampled_from(held), min_size=1, max_size=3, unique=True)))
    multi = len(outputs) > 1 or draw(st.booleans())
    return Graph(actors, tuple(b.nodes), outputs, multi, tuple(range(n_consts)))


# --------------------------------------------------------------------------- schedules
_NODE_IDS = st.integers(0, 999).map(lambda i: f"n{i}") | st.sampled_from(["x", "out_1", "a-b"])


@st.composite
def ops(draw: st.DrawFn, actor: str | None = None) -> Op:
    """A random Op (any kind, stream and peers), optionally on a given actor."""
    who = actor or draw(st.sampled_from(ACTOR_IDS))
    kind = draw(st.sampled_from(list(OpKind)))
    peers: tuple[str, ...] = ()
    if kind in (OpKind.SEND, OpKind.RECV):
        peers = (draw(st.sampled_from(ACTOR_IDS)),)
    elif kind is OpKind.COLLECTIVE:
        peers = tuple(draw(st.lists(st.sampled_from(ACTOR_IDS), min_size=1, max_size=4, unique=True)))
    stream = draw(st.sampled_from(list(Stream)))
    ahead = kind is OpKind.RECV and stream is Stream.COMM and draw(st.booleans())  # ``@comm+1``
    return Op(who, kind, draw(_NODE_IDS), peers, stream, ahead=ahead)


@st.composite
def schedules(draw: st.DrawFn, max_actors: int = 4, max_ops: int = 8) -> Schedule:
    """A random Schedule (not necessarily valid): non-empty lanes of random ops."""
    actors = draw(st.lists(st.sampled_from(ACTOR_IDS), min_size=1, max_size=max_actors, unique=True))
    return {a: tuple(draw(st.lists(ops(a), min_size=1, max_size=max_ops))) for a in actors}
