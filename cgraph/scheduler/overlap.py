"""Overlap: communicator ops on their own stream, RECVs issued early.

Every SEND / RECV / COLLECTIVE moves to the communication stream, and every
RECV is hoisted as early as its dependencies allow, so it runs while the
COMPUTEs it passed run. Ray's overlap example (three senders, one receiver,
NCCL edges; ``@comm`` omitted):

    n1 = s1.send(n0) :nccl      lowered
    n2 = s2.send(n0) :nccl        r | RECV1<s1 C4 W4 RECV2<s2 C5 W5 RECV3<s3 C6 W6
    n3 = s3.send(n0) :nccl      overlapped
    n4 = r.recv(n1)               r | RECV1<s1 RECV2<s2 RECV3<s3 C4 W4 C5 W5 C6 W6
    n5 = r.recv(n2)
    n6 = r.recv(n3)             (each sender: R0 C<i> SEND<i>>r, unchanged)

A RECV on actor x may not pass:

- an earlier comm op of x (SEND, RECV or COLLECTIVE): x's comm ops run one
  after another on its one comm stream, so a RECV hoisted above a SEND to
  another actor would hold that SEND until its own sender arrives (the
  simulator, ``simulate``, predicts the cost: see its tests);
- any op of x that its matching SEND depends on, through program order,
  WRITE -> READ, and rendezvous pairs / collectives taken as one event.

The last rule needs "happens before" between all ops of the lowered
schedule: they are numbered in one topological order and each one's ancestors
are a Python-int bitset, so the latest op of x among the SEND's ancestors is
one ``bit_length`` away (conservative where an earlier RECV of x moves too).
Each hoist alone is then safe; several together can close a cycle, so the
result is dry-run, and while it deadlocks one RECV blocked in the wait-for
cycle is pinned to its lowered place and the rest are hoisted again (each
round pins one more RECV; the lowered schedule is the worst case).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from cgraph.scheduler.deadlock import find_deadlock, pair_key
from cgraph.scheduler.ops import COMM_KINDS, ActorId, NodeId, Op, OpKind, Schedule, Stream


def overlap(schedule: Schedule) -> Schedule:
    """Put comm ops on the communication stream and hoist every RECV.

    Args:
        schedule: a deadlock-free schedule (it is not modified).

    Returns:
        A new schedule. COMPUTE order and every other op's relative order are
        kept; a schedule that already deadlocks is only moved to the stream.
    """
    marked = {actor: tuple(_on_stream(op) for op in ops) for actor, ops in schedule.items()}
    order = _happens_before(marked)
    if order is None:
        return marked
    pinned: dict[ActorId, set[int]] = {actor: set() for actor in marked}
    hoisted = {actor: _place(ops, _anchors(order, actor, ops, set())) for actor, ops in marked.items()}
    while (deadlock := find_deadlock(hoisted)) is not None:
        actor = _pin(marked, deadlock.ops(hoisted), pinned)
        if actor is None:
            return marked  # cannot happen (see _pin); the lowered order is safe
        ops = marked[actor]  # pins change only their own lane's anchors
        hoisted[actor] = _place(ops, _anchors(order, actor, ops, pinned[actor]))
    return hoisted


def _on_stream(op: Op) -> Op:
    return replace(op, stream=Stream.COMM) if op.kind in COMM_KINDS else op


@dataclass(frozen=True)
class _Order:
    """Happens-before over a schedule's ops (ops numbered in a topological order)."""

    slot: dict[ActorId, list[int]]  # lane position -> topological number
    ancestors: list[int]  # topological number -> bitset of the numbers before it
    lane_mask: dict[ActorId, int]  # the bits of one lane's ops
    lane_pos: dict[ActorId, dict[int, int]]  # topological number -> lane position
    sends: dict[tuple[NodeId, ActorId, ActorId], tuple[ActorId, int]]  # pair -> SEND's place


def _events(schedule: Schedule) -> tuple[dict[ActorId, list[int]], int]:
    """One event per op; a SEND and its RECV, or a collective's ops, share one."""
    events: dict[object, int] = {}
    slot: dict[ActorId, list[int]] = {}
    for actor, ops in schedule.items():
        ids = []
        for pos, op in enumerate(ops):
            if op.kind in (OpKind.SEND, OpKind.RECV):
                key: object = pair_key(op)
            elif op.kind is OpKind.COLLECTIVE:
                key = ("coll", op.node)
            else:
                key = (actor, pos)
            ids.append(events.setdefault(key, len(events)))
        slot[actor] = ids
    return slot, len(events)


def _edges(schedule: Schedule, slot: dict[ActorId, list[int]], n: int) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in range(n)]
    writes: dict[NodeId, list[int]] = {}
    reads: dict[NodeId, list[int]] = {}
    for actor, ops in schedule.items():
        ids = slot[actor]
        for pos, op in enumerate(ops):
            if pos:
                succ[ids[pos - 1]].append(ids[pos])
            if op.kind is OpKind.WRITE:
                writes.setdefault(op.node, []).append(ids[pos])
            elif op.kind is OpKind.READ:
                reads.setdefault(op.node, []).append(ids[pos])
    for node, writers in writes.items():
        for w in writers:
            succ[w].extend(reads.get(node, ()))
    return succ


def _happens_before(schedule: Schedule) -> _Order | None:
    """The happens-before order of ``schedule``, or None if it has a cycle."""
    slot, n = _events(schedule)
    succ = _edges(schedule, slot, n)
    indegree = [0] * n
    for targets in succ:
        for t in targets:
            indegree[t] += 1
    queue, number = deque(i for i in range(n) if indegree[i] == 0), [0] * n
    ancestors, done = [0] * n, 0
    while queue:
        event = queue.popleft()
        number[event], done = done, done + 1
        below = ancestors[event] | (1 << number[event])
        for t in succ[event]:
            ancestors[t] |= below  # indexed by event; the bits are topological numbers
            indegree[t] -= 1
            if indegree[t] == 0:
                queue.append(t)
    if done < n:
        return None
    anc = [0] * n
    for event in range(n):
        anc[number[event]] = ancestors[event]
    numbered = {actor: [number[e] for e in ids] for actor, ids in slot.items()}
    sends = {
        pair_key(op): (actor, pos)
        for actor, ops in schedule.items()
        for pos, op in enumerate(ops)
        if op.kind is OpKind.SEND
    }
    return _Order(
        slot=numbered,
        ancestors=anc,
        lane_mask={a: sum(1 << i for i in set(nums)) for a, nums in numbered.items()},
        lane_pos={a: {num: pos for pos, num in enumerate(nums)} for a, nums in numbered.items()},
        sends=sends,
    )


def _needed(order: _Order, actor: ActorId, recv: Op) -> int | None:
    """The ops of ``actor`` that the RECV's matching SEND depends on, as a bitset."""
    place = order.sends.get(pair_key(recv))
    if place is None:
        return None  # no matching SEND (verify reports it): the RECV stays put
    sender, k = place
    if k == 0:
        return 0
    before = order.slot[sender][k - 1]
    return (order.ancestors[before] | (1 << before)) & order.lane_mask[actor]


def _last(order: _Order, actor: ActorId, bits: int) -> int:
    """The lane position of the latest op in ``bits`` (-1 if none)."""
    return order.lane_pos[actor][bits.bit_length() - 1] if bits else -1


def _anchors(order: _Order, actor: ActorId, ops: tuple[Op, ...], pinned: set[int]) -> dict[int, int]:
    """For each RECV to hoist (all but the ``pinned``), the staying op it goes right after.

    A RECV stays after the ops its SEND needs and the last comm op before it. When one of those is itself hoisted, it stays
    after that RECV's anchor instead (hoisted RECVs with one anchor keep their
    order); hoisted RECVs are masked out of "needed" so that the ops before
    them still count.
    """
    anchors: dict[int, int] = {}  # -1: first in the lane
    hoisted = 0  # bits of the RECVs given an anchor so far
    last_comm = -1
    for pos, op in enumerate(ops):
        if op.kind is OpKind.RECV:
            if pos not in pinned:
                needed = _needed(order, actor, op)
                bounds = [last_comm]
                if needed is None:
                    bounds.append(pos - 1)
                else:
                    bounds += [_last(order, actor, needed & ~hoisted), _last(order, actor, needed & hoisted)]
                anchors[pos] = max(anchors.get(b, b) for b in bounds)
                hoisted |= 1 << order.slot[actor][pos]
        if op.kind in COMM_KINDS:
            last_comm = pos
    return anchors


def _place(ops: tuple[Op, ...], anchors: dict[int, int]) -> tuple[Op, ...]:
    """Move each op in ``anchors`` right after its anchor, keeping their order."""
    after: dict[int, list[Op]] = {}
    for pos in sorted(anchors):
        after.setdefault(anchors[pos], []).append(ops[pos])
    out = list(after.get(-1, ()))
    for pos, op in enumerate(ops):
        if pos not in anchors:
            out.append(op)
            out += after.get(pos, ())
    return tuple(out)


def _pin(marked: Schedule, blocked: tuple[Op, ...], pinned: dict[ActorId, set[int]]) -> ActorId | None:
    """Pin the first RECV among a deadlock's blocked ops to its lowered place.

    Hoisting only moves RECVs earlier, so a wait-for cycle that the lowered
    schedule did not have runs through a RECV that moved: each round pins one
    more, and the lowered schedule itself is the worst case.

    Returns:
        The actor whose RECV was pinned, or None if there was none to pin.
    """
    for op in blocked:
        pos = marked[op.actor].index(op)
        if op.kind is OpKind.RECV and pos not in pinned[op.actor]:
            pinned[op.actor].add(pos)
            return op.actor
    return None
