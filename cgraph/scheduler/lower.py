"""Lowering: a graph and its channel plan -> one op list per actor.

Each actor runs its methods (CALL nodes, and the COLLECTIVE nodes it is a
member of) in bind order. Around each method: obtain every input it has not
obtained yet in this execution (READ from an intra / shm / cross-node channel,
RECV from a communicator), COMPUTE, then publish each value it makes (WRITE to
its non-communicator channels, SEND once per communicator reader).

Communicator SEND/RECV are rendezvous, as in Ray (NCCL without group calls): a
SEND blocks until the peer reaches the matching RECV. So the naive order can
deadlock on a legal DAG. Here f and h send over NCCL, bound in the order
f, h, g, k:

    n1 = a.f(n0) :nccl         naive: each actor sends first, both wait
    n2 = b.h(n0) :nccl           a | R0 C1 [SEND1>b] RECV2<b C4 W4
    n3 = b.g(n1)                 b | R0 C2 [SEND2>a] RECV1<a C3 W3
    n4 = a.k(n2)               co-scheduled: b receives first
    return [n3, n4]              a | R0 C1 SEND1>b RECV2<b C4 W4
                                 b | R0 C2 RECV1<a SEND2>a C3 W3

The naive lanes are dry-run (``deadlock.DryRun``); whenever every unfinished
actor is blocked, one "meeting" is arranged and the run goes on:

1. an actor is blocked at a comm op: bring each partner's matching op to the
   partner's head, past the ops it does not depend on;
2. else meet at a comm op further along a blocked actor's current run of
   non-compute ops (moving it and its partners' ops forward);
3. else let a blocked actor compute its next method before the SENDs it is
   stuck at (a SEND may wait; nothing on the actor depends on it).

A move carries the op's local dependencies with it (``_NEEDS``), never lets
a method (COMPUTE, COLLECTIVE) pass another, and is taken only if everything
moved completes at once, so each meeting completes an op and the loop ends. With bind orders
that agree with the dataflow this always finishes; what is still stuck is a
real deadlock, left for ``find_deadlock`` to report.
"""

from __future__ import annotations

from collections.abc import Callable

from cgraph.ir.graph import Graph, Node, NodeKind
from cgraph.scheduler.channels import ChannelKind, ChannelPlan, ValueMap, map_values
from cgraph.scheduler.deadlock import DryRun
from cgraph.scheduler.ops import COMM_KINDS, ActorId, NodeId, Op, OpKind, Schedule

_OBTAIN = {
    ChannelKind.INTRA: OpKind.READ,
    ChannelKind.SHM: OpKind.READ,
    ChannelKind.CROSS_NODE: OpKind.READ,
    ChannelKind.COMM: OpKind.RECV,
}
"""The op a reader uses to obtain a value, by the kind of its channel."""


def lower(graph: Graph, plan: ChannelPlan) -> Schedule:
    """Build every actor's ops for one execution (actors without ops are left out).

    Args:
        graph: the DAG.
        plan: its channels, from ``plan_channels(graph)``.

    Returns:
        The schedule; COMPUTE order is each actor's bind order.

    Raises:
        KeyError: ``plan`` lacks a channel the graph needs (a plan for another graph).
    """
    values = map_values(graph)
    lanes = {a.id: _lower_actor(graph, plan, values, a.id) for a in graph.actors}
    return _co_schedule({a: ops for a, ops in lanes.items() if ops}, values)


def _program(graph: Graph, values: ValueMap, actor: ActorId) -> list[Node]:
    """The actor's methods and collectives, in bind order."""
    colls = [n for n in graph.nodes if n.kind is NodeKind.COLLECTIVE and actor in values.members[n.id]]
    return sorted([*graph.actor_nodes(actor), *colls], key=graph.order_key)


def _obtain(plan: ChannelPlan, value: NodeId, actor: ActorId) -> Op:
    spec = plan.for_reader(value, actor)
    if spec is None:
        raise KeyError(f"the channel plan has no channel from {value} to {actor}: plan_channels(graph) first")
    kind = _OBTAIN[spec.kind]
    return Op(actor, kind, value, (spec.writer,) if kind is OpKind.RECV else ())


def _publish(plan: ChannelPlan, value: NodeId, actor: ActorId) -> list[Op]:
    specs = plan.for_node(value)
    ops = [Op(actor, OpKind.WRITE, value)] if any(s.kind is not ChannelKind.COMM for s in specs) else []
    return ops + [Op(actor, OpKind.SEND, value, s.readers) for s in specs if s.kind is ChannelKind.COMM]


def _lower_actor(graph: Graph, plan: ChannelPlan, values: ValueMap, actor: ActorId) -> list[Op]:
    ops: list[Op] = []
    obtained: set[NodeId] = set()
    for node in _program(graph, values, actor):
        reads = values.inputs[node.id]
        if node.kind is NodeKind.COLLECTIVE:
            members = values.members[node.id]
            reads = (reads[members.index(actor)],)
            body = Op(actor, OpKind.COLLECTIVE, node.id, members)
        else:
            body = Op(actor, OpKind.COMPUTE, node.id)
        for value in reads:
            if value not in obtained:
                obtained.add(value)
                ops.append(_obtain(plan, value, actor))
        ops.append(body)
        for value in values.outputs.get(node.id, ()):
            if values.holder[value] == actor:
                ops += _publish(plan, value, actor)
    return ops


# --------------------------------------------------------------------------- co-scheduling
_Need = tuple[OpKind, NodeId]


def _needs_obtained(values: ValueMap, op: Op) -> tuple[_Need, ...]:
    reads = values.inputs[op.node]
    if op.kind is OpKind.COLLECTIVE:
        reads = tuple(v for v in reads if values.holder[v] == op.actor)
    return tuple((kind, v) for v in reads for kind in (OpKind.READ, OpKind.RECV))


def _needs_made(values: ValueMap, op: Op) -> tuple[_Need, ...]:
    made = values.producer[op.node]
    extra = ((OpKind.WRITE, op.node),) if op.kind is OpKind.SEND else ()
    return ((OpKind.COMPUTE, made), (OpKind.COLLECTIVE, made), *extra)


_NEEDS: dict[OpKind, Callable[[ValueMap, Op], tuple[_Need, ...]]] = {
    OpKind.READ: lambda values, op: (),
    OpKind.RECV: lambda values, op: (),
    OpKind.COMPUTE: _needs_obtained,
    OpKind.COLLECTIVE: _needs_obtained,
    OpKind.WRITE: _needs_made,
    OpKind.SEND: _needs_made,
}
"""The ops of its own lane that must come before an op (a SEND keeps its WRITE before it)."""


_METHODS = (OpKind.COMPUTE, OpKind.COLLECTIVE)
"""Ops that run a bound method: they keep the bind order among themselves."""


def _runs_now(run: DryRun, op: Op) -> bool:
    if op.kind is OpKind.READ:
        return run.can_read(op.node)
    return op.kind in (OpKind.COMPUTE, OpKind.WRITE)


def _closure(run: DryRun, values: ValueMap, actor: ActorId, target: int) -> list[int] | None:
    """Indices to bring to the head so that ``lane[target]`` can run next, or None.

    The target's local dependencies after the head come along, then the WRITEs
    of anything computed. None if one of them would block, or if a method
    (COMPUTE or COLLECTIVE) would pass another method.
    """
    lane, head = run.lanes[actor], run.head[actor]
    want = set(_NEEDS[lane[target].kind](values, lane[target]))
    picked = [target]
    for i in range(target - 1, head - 1, -1):
        if (lane[i].kind, lane[i].node) in want:
            if not _runs_now(run, lane[i]):
                return None
            picked.append(i)
            want.update(_NEEDS[lane[i].kind](values, lane[i]))
    made = {(lane[i].kind, lane[i].node) for i in picked}
    for i in range(target + 1, len(lane)):
        if lane[i].kind in (OpKind.COMPUTE, OpKind.COLLECTIVE):
            break
        if lane[i].kind is OpKind.WRITE and made & set(_NEEDS[OpKind.WRITE](values, lane[i])):
            picked.append(i)
    picked.sort()
    crossed = set(range(head, picked[-1])) - set(picked)
    if any(lane[i].kind in _METHODS for i in picked) and any(lane[i].kind in _METHODS for i in crossed):
        return None
    return picked


def _partners(run: DryRun, op: Op) -> list[tuple[ActorId, int | None]]:
    """For a comm op, each partner not already at its matching op, and that op's index."""
    if op.kind is OpKind.COLLECTIVE:
        wanted = [(m, Op(m, OpKind.COLLECTIVE, op.node, op.peers)) for m in op.peers if m != op.actor]
    else:
        other = OpKind.RECV if op.kind is OpKind.SEND else OpKind.SEND
        wanted = [(op.peer, Op(op.peer, other, op.node, (op.actor,)))]
    out: list[tuple[ActorId, int | None]] = []
    for actor, want in wanted:
        lane, head = run.lanes.get(actor, []), run.head.get(actor, 0)
        key = (want.kind, want.node, want.peers)
        index = next((i for i in range(head, len(lane)) if (lane[i].kind, lane[i].node, lane[i].peers) == key), None)
        if not (index == head and actor in run.waiting):  # else it is there already
            out.append((actor, index))
    return out


def _meet(run: DryRun, values: ValueMap, actor: ActorId, index: int) -> dict[ActorId, list[int]] | None:
    """Moves that let the comm op at ``lanes[actor][index]`` complete right away, or None."""
    moves: dict[ActorId, list[int]] = {}
    if index != run.head[actor]:
        picked = _closure(run, values, actor, index)
        if picked is None:
            return None
        moves[actor] = picked
    for partner, where in _partners(run, run.lanes[actor][index]):
        picked = None if where is None else _closure(run, values, partner, where)
        if picked is None:
            return None
        moves[partner] = picked
    return moves


def _find_meeting(run: DryRun, values: ValueMap) -> dict[ActorId, list[int]] | None:
    stuck = [a for a in run.lanes if a in run.waiting]
    for actor in stuck:  # 1. partners come to a blocked comm op
        if run.waiting[actor].kind in COMM_KINDS and (moves := _meet(run, values, actor, run.head[actor])):
            return moves
    for actor in stuck:  # 2. meet further along the current run of non-compute ops
        lane = run.lanes[actor]
        for i in range(run.head[actor] + 1, len(lane)):
            if lane[i].kind in (OpKind.COMPUTE, OpKind.WRITE):
                break
            if lane[i].kind in COMM_KINDS and (moves := _meet(run, values, actor, i)):
                return moves
    for actor in stuck:  # 3. compute the next method before the SENDs that wait
        lane = run.lanes[actor]
        nxt = next((i for i in range(run.head[actor], len(lane)) if lane[i].kind is OpKind.COMPUTE), None)
        if nxt is not None and (picked := _closure(run, values, actor, nxt)) is not None:
            return {actor: picked}
    return None


def _co_schedule(lanes: dict[ActorId, list[Op]], values: ValueMap) -> Schedule:
    run = DryRun(lanes)
    run.run()
    while run.waiting and (moves := _find_meeting(run, values)) is not None:
        for actor, picked in moves.items():
            lane, head, chosen = run.lanes[actor], run.head[actor], set(picked)
            rest = [lane[i] for i in range(head, len(lane)) if i not in chosen]
            lane[head:] = [lane[i] for i in picked] + rest
            run.unwait(actor)
        run.run()
    return {actor: tuple(ops) for actor, ops in run.lanes.items()}
