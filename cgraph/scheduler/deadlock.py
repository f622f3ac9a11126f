"""Deadlock detection: a dry run of one execution of a schedule.

Each actor walks its ops in order. What makes an op wait (the ``_STEPS`` table):

    READ v         until some actor has done WRITE v (a value that no op writes,
                   like the input n0, comes from the driver: always ready)
    COMPUTE, WRITE never
    SEND v>c       until c is at RECV v<a; the two complete together
    RECV v<h       until h is at SEND v>c (a rendezvous, like NCCL send/recv)
    COLLECTIVE v   until every member is at it

The run is event-driven: an actor runs until it blocks, registers what it
waits for, and is woken by the op that releases it, so each op is handled O(1)
times (1,000 nodes over 32 actors take a few ms). Every blocked op waits for
exactly one actor, so the wait-for graph is a functional graph; when the run
stops early the frontier and a cycle in that graph are the evidence:

    step | 0    | 1            | 2
    a    | a.C1 | [a.SEND1>b]  | a.RECV2<b    a.SEND1>b waits for b.RECV1<a,
    b    | b.C2 | [b.SEND2>a]  | b.RECV1<a    b.SEND2>a waits for a.RECV2<b

A READ whose WRITE comes later in its own lane is a cycle of length one.
Without a cycle (an op with no partner at all) the frontier is the evidence.

``DryRun`` is shared with ``lower``, which moves ops of a stuck run and lets
it continue; the run is confluent (an op that can complete stays able to until
it does), so the order in which actors are woken never changes the outcome.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cgraph.errors import DeadlockError
from cgraph.ir.graph import Graph, format_node
from cgraph.scheduler.channels import error_message
from cgraph.scheduler.ops import ActorId, NodeId, Op, OpKind, Schedule, format_grid

_PairKey = tuple[NodeId, ActorId, ActorId]  # (value, sender, receiver)


def pair_key(op: Op) -> _PairKey:
    """The key a SEND shares with its matching RECV."""
    if op.kind is OpKind.SEND:
        return (op.node, op.actor, op.peer)
    return (op.node, op.peer, op.actor)


class DryRun:
    """One execution of a schedule, run until every actor is finished or blocked.

    ``lanes`` are mutable copies; ``head[a]`` is the next step of actor ``a``;
    ``waiting[a]`` is the op ``a`` is blocked at. ``lower`` may reorder a lane
    after its head, then ``unwait`` the actor and ``run`` again.
    """

    def __init__(self, lanes: Mapping[ActorId, Sequence[Op]]) -> None:
        self.lanes: dict[ActorId, list[Op]] = {a: list(ops) for a, ops in lanes.items()}
        self.head: dict[ActorId, int] = dict.fromkeys(self.lanes, 0)
        self.waiting: dict[ActorId, Op] = {}
        self.writer: dict[NodeId, ActorId] = {}
        for actor, ops in self.lanes.items():
            for op in ops:
                if op.kind is OpKind.WRITE:
                    self.writer.setdefault(op.node, actor)
        self._written: set[NodeId] = set()
        self._readers: dict[NodeId, list[ActorId]] = {}
        self._pending: dict[_PairKey, ActorId] = {}
        self._arrived: dict[NodeId, set[ActorId]] = {}
        self._ready: deque[ActorId] = deque(self.lanes)

    def can_read(self, node: NodeId) -> bool:
        return node in self._written or node not in self.writer

    def run(self) -> None:
        """Advance every runnable actor until all are finished or blocked."""
        while self._ready:
            actor = self._ready.popleft()
            lane = self.lanes[actor]
            while self.head[actor] < len(lane):
                op = lane[self.head[actor]]
                if not _STEPS[op.kind](self, actor, op):
                    self.waiting[actor] = op
                    break
                self.head[actor] += 1

    def unwait(self, actor: ActorId) -> None:
        """Forget what a blocked actor waits for and make it runnable again."""
        op = self.waiting.pop(actor)
        if op.kind is OpKind.READ:
            self._readers[op.node].remove(actor)
        elif op.kind is OpKind.COLLECTIVE:
            self._arrived[op.node].discard(actor)
        elif self._pending.get(pair_key(op)) == actor:
            del self._pending[pair_key(op)]
        self._ready.append(actor)

    def waits_for(self) -> dict[ActorId, ActorId]:
        """For each blocked actor (in lane order), the actor it waits for."""
        out: dict[ActorId, ActorId] = {}
        for actor in self.lanes:
            op = self.waiting.get(actor)
            if op is None:
                continue
            if op.kind is OpKind.READ:
                out[actor] = self.writer[op.node]
            elif op.kind is OpKind.COLLECTIVE:
                arrived = self._arrived.get(op.node, set())
                out[actor] = next((m for m in op.peers if m not in arrived), actor)
            else:
                out[actor] = op.peer
        return out

    def _release(self, actor: ActorId, done: bool) -> None:
        del self.waiting[actor]
        if done:
            self.head[actor] += 1
        self._ready.append(actor)


def _step_free(run: DryRun, actor: ActorId, op: Op) -> bool:
    return True


def _step_write(run: DryRun, actor: ActorId, op: Op) -> bool:
    run._written.add(op.node)
    for reader in run._readers.pop(op.node, ()):
        run._release(reader, done=False)
    return True


def _step_read(run: DryRun, actor: ActorId, op: Op) -> bool:
    if run.can_read(op.node):
        return True
    run._readers.setdefault(op.node, []).append(actor)
    return False


def _step_pair(run: DryRun, actor: ActorId, op: Op) -> bool:
    key = pair_key(op)
    other = run._pending.get(key)
    if other is not None and other != actor:
        del run._pending[key]
        run._release(other, done=True)
        return True
    run._pending[key] = actor
    return False


def _step_collective(run: DryRun, actor: ActorId, op: Op) -> bool:
    arrived = run._arrived.setdefault(op.node, set())
    arrived.add(actor)
    if not arrived.issuperset(op.peers):
        return False
    del run._arrived[op.node]
    for member in arrived - {actor}:
        run._release(member, done=True)
    return True


_STEPS: dict[OpKind, Callable[[DryRun, ActorId, Op], bool]] = {
    OpKind.READ: _step_read,
    OpKind.COMPUTE: _step_free,
    OpKind.WRITE: _step_write,
    OpKind.SEND: _step_pair,
    OpKind.RECV: _step_pair,
    OpKind.COLLECTIVE: _step_collective,
}
"""How each kind of op runs in the dry run: True = done, False = blocked."""

_AWAITED: dict[OpKind, Callable[[Op, ActorId], Op]] = {
    OpKind.READ: lambda op, other: Op(other, OpKind.WRITE, op.node),
    OpKind.SEND: lambda op, other: Op(other, OpKind.RECV, op.node, (op.actor,)),
    OpKind.RECV: lambda op, other: Op(other, OpKind.SEND, op.node, (op.actor,)),
    OpKind.COLLECTIVE: lambda op, other: Op(other, OpKind.COLLECTIVE, op.node, op.peers),
}
"""For a blocked op, the op of the other actor that would release it."""


def _awaited(schedule: Schedule, op: Op, other: ActorId) -> str:
    want = _AWAITED[op.kind](op, other)
    for cand in schedule.get(other, ()):
        if (cand.kind, cand.node, cand.peers) == (want.kind, want.node, want.peers):
            return str(cand)
    return f"{want} (not in {other}'s schedule)"


@dataclass(frozen=True)
class Deadlock:
    """Why a schedule cannot finish.

    ``blocked``: each unfinished actor's step (the frontier); ``waits_for``:
    the actor each blocked actor waits for; ``cycle``: the blocked ops of a
    wait-for cycle, starting at the earliest actor (empty if there is none).
    """

    blocked: dict[ActorId, int]
    waits_for: dict[ActorId, ActorId]
    cycle: tuple[Op, ...]

    def ops(self, schedule: Schedule) -> tuple[Op, ...]:
        """The ops to explain: the cycle, or else every blocked op."""
        return self.cycle or tuple(schedule[a][s] for a, s in self.blocked.items())

    def describe(self, schedule: Schedule) -> str:
        """``a.SEND1>b waits for b.RECV1<a, ...`` and the grid marked ``<-- here``."""
        waits = ", ".join(
            f"{op} waits for {_awaited(schedule, op, self.waits_for[op.actor])}" for op in self.ops(schedule)
        )
        head = "wait-for cycle: " if self.cycle else "blocked, no cycle (an op has no partner): "
        return f"{head}{waits}\n{format_grid(schedule, self.blocked)}"


def _find_cycle(order: list[ActorId], waits_for: dict[ActorId, ActorId]) -> list[ActorId]:
    rank = {a: i for i, a in enumerate(order)}
    for start in order:
        path: dict[ActorId, None] = {}
        actor = start
        while actor in waits_for and actor not in path:
            path[actor] = None
            actor = waits_for[actor]
        if actor in path:
            loop = list(path)[list(path).index(actor):]
            first = loop.index(min(loop, key=rank.__getitem__))
            return loop[first:] + loop[:first]
    return []


def find_deadlock(schedule: Schedule) -> Deadlock | None:
    """Dry-run one execution of ``schedule``.

    Returns:
        None if every actor finishes; otherwise the ``Deadlock`` evidence.
    """
    run = DryRun(schedule)
    run.run()
    if not run.waiting:
        return None
    waits = run.waits_for()
    cycle = _find_cycle(list(waits), waits)
    return Deadlock(
        blocked={a: run.head[a] for a in waits},
        waits_for=waits,
        cycle=tuple(run.waiting[a] for a in cycle),
    )


_ADVICE: dict[OpKind, tuple[str, str]] = {
    OpKind.READ: (
        "an actor runs its methods in bind order (order=), so a method that needs a value "
        "made later by its own actor, directly or through other actors, can never run",
        "bind the methods in dataflow order, or put one of them on another actor",
    ),
    OpKind.SEND: (
        "a communicator SEND/RECV pair blocks until both actors reach it, and each actor "
        "runs its methods in bind order",
        "bind the methods of these actors in an order that agrees on both sides, or use "
        'with_tensor_transport(transport="shm") for one of the edges in the cycle',
    ),
    OpKind.COLLECTIVE: (
        "every member must reach a collective before any of them can leave it",
        "bind the collective and the methods around it in the same order on every member",
    ),
}
"""Why each kind of blocked op waits, and how to fix it (``raise_on_deadlock``)."""
_ADVICE[OpKind.RECV] = _ADVICE[OpKind.SEND]


def _where(schedule: Schedule, deadlock: Deadlock, graph: Graph | None) -> str:
    """One line per blocked op: the method its actor waits to run and the value it waits for."""
    lines = []
    for op in deadlock.ops(schedule):
        lane, step = schedule[op.actor], deadlock.blocked[op.actor]
        if graph is None or not graph.has_node(op.node):
            lines.append(f"{op} (step {step} of {op.actor})")
            continue
        nxt = next((o for o in lane[step:] if o.kind is OpKind.COMPUTE and graph.has_node(o.node)), None)
        runs = f"before {format_node(graph.node(nxt.node))}" if nxt else "after its last method"
        lines.append(f"{op.actor} waits {runs} for {format_node(graph.node(op.node))}")
    return "\n".join(lines)


def raise_on_deadlock(schedule: Schedule, graph: Graph | None = None) -> None:
    """Raise if ``schedule`` cannot finish one execution.

    Raises:
        DeadlockError: what (the cycle or frontier), where (with a graph: the
            methods waiting and the values they wait for, in text form), why,
            how to fix it, then the grid marked ``<-- here``. The ``Deadlock``
            is the error's ``evidence``.
    """
    deadlock = find_deadlock(schedule)
    if deadlock is None:
        return
    summary, grid = deadlock.describe(schedule).split("\n", 1)
    advice = dict.fromkeys(_ADVICE[op.kind] for op in deadlock.ops(schedule))
    message = error_message(
        f"the compiled schedule deadlocks: {summary}",
        _where(schedule, deadlock, graph),
        "; ".join(why for why, _ in advice),
        "; or ".join(fix for _, fix in advice),
    )
    raise DeadlockError(f"{message}\n{grid}", evidence=deadlock)
