"""The schedule verifier: invariants every pass must keep.

``verify`` returns human-readable violations (empty = fine); ``check`` raises
``ScheduleInvariantError`` with them and the grid. Each rule is one function
in ``RULES``:

- every op names a node of the graph, and sits in its own actor's lane;
- every WRITE has its READs on each non-driver reader; every READ has its
  WRITE (or reads the driver's input); each read goes through a planned channel;
- every SEND v>c has exactly one RECV v<h on c, and the other way round;
- matched comm ops between two actors (SEND/RECV pairs, collectives they both
  join) come in the same relative order on both;
- each member of a collective joins it once, with the members in rank order;
- per-actor order respects the data: a COMPUTE after obtaining each input, a
  WRITE / SEND after the COMPUTE (or COLLECTIVE) making the value;
- each CALL node is computed exactly once; a value is obtained at most once
  per actor.

A RECV issued one execution ahead (``@comm+1``, ``ahead.py``) acts on an execution
before its other ops: the rules read each lane in ``execution_order``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cgraph.errors import ScheduleInvariantError
from cgraph.ir.graph import DRIVER, Graph, NodeKind
from cgraph.scheduler.ahead import in_execution_order
from cgraph.scheduler.channels import ChannelKind, ChannelPlan, ValueMap, map_values
from cgraph.scheduler.ops import ActorId, NodeId, Op, OpKind, Schedule, format_grid

_OBTAIN = (OpKind.READ, OpKind.RECV)
_MAKE = (OpKind.COMPUTE, OpKind.COLLECTIVE)


@dataclass(frozen=True)
class _Ctx:
    graph: Graph
    plan: ChannelPlan
    schedule: Schedule
    values: ValueMap
    count: Counter[tuple[ActorId, OpKind, NodeId, tuple[ActorId, ...]]]

    def has(self, actor: ActorId, kind: OpKind, node: NodeId, peers: tuple[ActorId, ...] = ()) -> int:
        return self.count[(actor, kind, node, peers)]


_NODE_KINDS: dict[OpKind, tuple[NodeKind, ...]] = {
    OpKind.READ: (NodeKind.INPUT, NodeKind.CALL, NodeKind.ITEM),
    OpKind.WRITE: (NodeKind.CALL, NodeKind.ITEM),
    OpKind.SEND: (NodeKind.CALL, NodeKind.ITEM),
    OpKind.RECV: (NodeKind.CALL, NodeKind.ITEM),
    OpKind.COMPUTE: (NodeKind.CALL,),
    OpKind.COLLECTIVE: (NodeKind.COLLECTIVE,),
}
"""The kinds of node each kind of op may name."""


def _rule_ops_exist(ctx: _Ctx) -> Iterator[str]:
    actors = {a.id for a in ctx.graph.actors}
    for lane, ops in ctx.schedule.items():
        if lane not in actors:
            yield f"lane {lane!r} is not an actor of the graph"
        for op in ops:
            if op.actor != lane:
                yield f"{op} sits in {lane}'s lane"
            if not ctx.graph.has_node(op.node):
                yield f"{op} names {op.node}, which is not in the graph"
            elif ctx.graph.node(op.node).kind not in _NODE_KINDS[op.kind]:
                yield f"{op} names a {ctx.graph.node(op.node).kind.value} node"
            elif op.kind is OpKind.COMPUTE and ctx.graph.node(op.node).actor != lane:
                yield f"{op} runs {op.node}, a method of {ctx.graph.node(op.node).actor}"


def _rule_channels_used(ctx: _Ctx) -> Iterator[str]:
    for spec in ctx.plan.channels:
        if spec.writer == DRIVER or spec.writer not in ctx.schedule:
            continue
        if spec.kind is ChannelKind.COMM:
            if not ctx.has(spec.writer, OpKind.SEND, spec.node, spec.readers):
                yield f"channel {spec.id} is never sent on ({Op(spec.writer, OpKind.SEND, spec.node, spec.readers)})"
        elif not ctx.has(spec.writer, OpKind.WRITE, spec.node):
            yield f"channel {spec.id} is never written ({Op(spec.writer, OpKind.WRITE, spec.node)})"


def _rule_reads_writes(ctx: _Ctx) -> Iterator[str]:
    for lane, ops in ctx.schedule.items():
        for op in ops:
            if op.kind is OpKind.WRITE:
                specs = [s for s in ctx.plan.for_node(op.node) if s.kind is not ChannelKind.COMM]
                if not specs or any(s.writer != lane for s in specs):
                    yield f"{op} has no channel of {lane} to write to"
                for reader in sorted({r for s in specs for r in s.readers} - {DRIVER}):
                    if not ctx.has(reader, OpKind.READ, op.node):
                        yield f"{op} is never read by {reader}"
            elif op.kind is OpKind.READ:
                spec = ctx.plan.for_reader(op.node, lane)
                if spec is None or spec.kind is ChannelKind.COMM:
                    yield f"{op} reads {op.node} through no planned channel"
                elif spec.writer != DRIVER and not ctx.has(spec.writer, OpKind.WRITE, op.node):
                    yield f"{op} reads {op.node}, which {spec.writer} never writes"


def _rule_pairs(ctx: _Ctx) -> Iterator[str]:
    for lane, ops in ctx.schedule.items():
        for op in ops:
            if op.kind not in (OpKind.SEND, OpKind.RECV):
                continue
            sender, receiver = (lane, op.peer) if op.kind is OpKind.SEND else (op.peer, lane)
            spec = ctx.plan.for_reader(op.node, receiver)
            if spec is None or spec.kind is not ChannelKind.COMM or spec.writer != sender:
                yield f"{op}: no communicator channel {op.node} {sender} -> {receiver} is planned"
            other, kind = (receiver, OpKind.RECV) if op.kind is OpKind.SEND else (sender, OpKind.SEND)
            n = ctx.has(other, kind, op.node, (lane,))
            if n != 1:
                yield f"{op} has {n} matching {Op(other, kind, op.node, (lane,))} (needs exactly one)"


def _comm_keys(schedule: Schedule) -> dict[ActorId, dict[ActorId, list[tuple[object, Op]]]]:
    """For each actor and peer, the comm ops that involve both, in lane order."""
    seqs: dict[ActorId, dict[ActorId, list[tuple[object, Op]]]] = {}
    for lane, ops in schedule.items():
        mine = seqs.setdefault(lane, {})
        for op in ops:
            if op.kind in (OpKind.SEND, OpKind.RECV):
                mine.setdefault(op.peer, []).append((("pair", *_pair(op)), op))
            elif op.kind is OpKind.COLLECTIVE:
                for peer in op.peers:
                    if peer != lane:
                        mine.setdefault(peer, []).append((("coll", op.node), op))
    return seqs


def _pair(op: Op) -> tuple[NodeId, ActorId, ActorId]:
    return (op.node, op.actor, op.peer) if op.kind is OpKind.SEND else (op.node, op.peer, op.actor)


def _rule_comm_order(ctx: _Ctx) -> Iterator[str]:
    seqs = _comm_keys(ctx.schedule)
    lanes = list(ctx.schedule)
    for i, a in enumerate(lanes):
        for b in lanes[i + 1:]:
            sa, sb = seqs[a].get(b, []), seqs[b].get(a, [])
            common = {k for k, _ in sa} & {k for k, _ in sb}
            fa = [(k, op) for k, op in sa if k in common]
            fb = [(k, op) for k, op in sb if k in common]
            for turn, ((ka, x), (kb, y)) in enumerate(zip(fa, fb, strict=False)):
                if ka != kb:
                    yield (
                        f"comm ops between {a} and {b} come in different orders: "
                        f"at their shared op #{turn}, {a} has {x} but {b} has {y}"
                    )
                    break


def _rule_collectives(ctx: _Ctx) -> Iterator[str]:
    for node, members in ctx.values.members.items():
        for member in members:
            n = ctx.has(member, OpKind.COLLECTIVE, node, members)
            if n != 1:
                yield f"{Op(member, OpKind.COLLECTIVE, node, members)} appears {n} times (needs once)"
    for ops in ctx.schedule.values():
        for op in ops:
            if op.kind is OpKind.COLLECTIVE and ctx.values.members.get(op.node) != op.peers:
                yield f"{op}: {op.node} is not a collective with members {','.join(op.peers)}"


def _rule_dependencies(ctx: _Ctx) -> Iterator[str]:
    for lane, ops in ctx.schedule.items():
        obtained: set[NodeId] = set()
        made: set[NodeId] = set()
        for op in ops:
            if op.kind in _OBTAIN:
                obtained.add(op.node)
            elif op.kind in _MAKE:
                reads = ctx.values.inputs.get(op.node, ())
                if op.kind is OpKind.COLLECTIVE:
                    reads = tuple(v for v in reads if ctx.values.holder[v] == lane)
                missing = [v for v in reads if v not in obtained]
                if missing:
                    yield f"{op} runs before {lane} obtains {', '.join(missing)}"
                made.add(op.node)
            elif ctx.values.producer.get(op.node) not in made:
                yield f"{op} comes before {lane} makes {op.node}"


def _rule_once(ctx: _Ctx) -> Iterator[str]:
    for node in ctx.graph.nodes:
        if node.kind is NodeKind.CALL:
            n = ctx.has(node.actor or DRIVER, OpKind.COMPUTE, node.id)
            if n != 1:
                yield f"{node.id} ({node.actor}.{node.method}) is computed {n} times on {node.actor} (needs once)"
    for lane, ops in ctx.schedule.items():
        got = Counter(op.node for op in ops if op.kind in _OBTAIN)
        for value, n in got.items():
            if n > 1:
                yield f"{lane} obtains {value} {n} times (at most once per execution)"


RULES: tuple[tuple[str, Callable[[_Ctx], Iterator[str]]], ...] = (
    ("ops exist", _rule_ops_exist),
    ("reads and writes", _rule_reads_writes),
    ("channels used", _rule_channels_used),
    ("send/recv pairs", _rule_pairs),
    ("comm order", _rule_comm_order),
    ("collectives", _rule_collectives),
    ("dependencies", _rule_dependencies),
    ("once", _rule_once),
)
"""Every invariant, by name; ``verify`` runs them in this order."""


def verify(graph: Graph, plan: ChannelPlan, schedule: Schedule) -> tuple[str, ...]:
    """Check ``schedule`` against ``graph`` and ``plan``.

    Returns:
        One line per broken invariant, ``"rule: what"``; empty if all hold.
    """
    schedule = in_execution_order(schedule)
    count = Counter((op.actor, op.kind, op.node, op.peers) for ops in schedule.values() for op in ops)
    ctx = _Ctx(graph, plan, schedule, map_values(graph), count)
    if any(not graph.has_node(op.node) for ops in schedule.values() for op in ops):
        return tuple(f"ops exist: {v}" for v in _rule_ops_exist(ctx))
    return tuple(f"{name}: {v}" for name, rule in RULES for v in rule(ctx))


def check(graph: Graph, plan: ChannelPlan, schedule: Schedule, pass_name: str) -> None:
    """``verify`` and raise if anything is broken.

    Raises:
        ScheduleInvariantError: listing every violation, then the grid.
    """
    violations = verify(graph, plan, schedule)
    if violations:
        listed = "\n".join(f"  - {v}" for v in violations)
        raise ScheduleInvariantError(
            f"after pass {pass_name!r} the schedule breaks {len(violations)} invariant(s) "
            f"(a cgraph bug; please report it with this message):\n{listed}\n{format_grid(schedule)}"
        )
