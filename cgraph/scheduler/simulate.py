"""Predicting one execution: a schedule and each op's duration give its makespan.

    simulate(schedule, durations, machine=Machine.OWN_ENGINE) -> Prediction(makespan, tracks)
    critical_path(schedule, times)                            -> the ops that set the end

The model runs one execution with every channel empty and the driver's input
ready at 0. Each actor has a loop and a comm engine (its comm thread, or stream):

    loop    READ, COMPUTE, WRITE, and the comm ops that are not on the comm stream
            (without overlap a SEND or RECV blocks the loop), in lane order
    engine  the ops on the comm stream, in lane order; each is issued when the loop
            has run the ops before it in its lane

and two machines:

    OWN_ENGINE    the engine is its own hardware (a GPU's copy engines and NCCL):
                  an actor's loop and engine run at the same time
    SHARED_CORES  the engine shares the actor's core: at most one op of an actor
                  runs at a time (waiting for a partner costs nothing); with
                  ``cores=k``, also at most k ops of all actors at a time (the actors'
                  processes share k cores: this VM runs 5 processes on 2)

Beyond its resource and lane order, an op starts only after

    READ v         the WRITE of v (a value that no op writes is the driver's: ready at 0)
    COMPUTE n      the comm-stream ops of its actor that deliver n's arguments (``reads[n]``;
                   without ``reads``: every one before it in its lane), and every SEND of
                   the comm stream before it in its lane (the fence before user code)
    WRITE v        the comm-stream op of its actor that delivers v, if any
    SEND v, RECV v its partner: the pair runs as one op from when both can start, for the
                   SEND's duration (the RECV's if the SEND has none): the sender does the
                   work (NCCL's kernels end together; the CPU mesh's send is the copy, its
                   receive a view), and a recorded RECV is mostly its wait for the sender
    COLLECTIVE     every member, the same way, for the shortest member's duration (a
                   recorded member includes its wait for the others; the last waited least)

Ties go to the op that can start first (a list scheduler). On OWN_ENGINE every
resource's order is fixed, so start times are the longest paths of a max-plus
system: removing constraints never delays an op. Durations are seconds (any unit
works), keyed by the op's text without ``@comm`` (``"r.C4"``, ``"r.RECV1<s1"``),
so one table serves a schedule before and after the overlap pass. Pure: no Ray,
no clocks.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from cgraph.errors import DeadlockError
from cgraph.ir.graph import Graph, NodeKind
from cgraph.scheduler.ahead import renamed, unroll
from cgraph.scheduler.deadlock import pair_key
from cgraph.scheduler.ops import ActorId, NodeId, Op, OpKind, Schedule, Stream

Place = tuple[ActorId, int]  # (actor, position in its lane)


class Machine(enum.Enum):
    OWN_ENGINE = "comm on its own engine"
    SHARED_CORES = "comm sharing the actor's cores"


@dataclass(frozen=True)
class Span:
    """One op of the prediction, on the ``track`` ("loop" or "comm") that runs it."""

    op: Op
    track: str
    start: float
    end: float


@dataclass(frozen=True)
class Prediction:
    """The predicted execution: its makespan and each actor's ops in lane order."""

    machine: Machine
    makespan: float
    tracks: dict[ActorId, tuple[Span, ...]]

    def times(self) -> dict[str, tuple[float, float]]:
        """Each op's (start, end), keyed by ``op_key`` (for ``critical_path``)."""
        return {op_key(span.op): (span.start, span.end) for spans in self.tracks.values() for span in spans}


def op_key(op: Op) -> str:
    """The key of ``op`` in a durations table: its text without ``@comm`` (or ``+1``)."""
    return str(replace(op, stream=Stream.COMPUTE, ahead=False))


def compute_reads(graph: Graph) -> dict[NodeId, frozenset[NodeId]]:
    """For ``simulate``'s ``reads``: each CALL node's arguments, an ITEM also as its source."""
    out = {}
    for node in graph.nodes:
        if node.kind is NodeKind.CALL:
            args = set(node.inputs())
            args |= {src for arg in args if graph.node(arg).kind is NodeKind.ITEM
                     for src in graph.node(arg).inputs()}
            out[node.id] = frozenset(args)
    return out


def simulate(schedule: Schedule, durations: Mapping[str, float], *,
             machine: Machine = Machine.OWN_ENGINE,
             reads: Mapping[NodeId, Collection[NodeId]] | None = None,
             default: float = 0.0, cores: int | None = None) -> Prediction:
    """The predicted makespan and tracks of one execution of ``schedule`` (module docstring).

    Args:
        schedule: per actor, its ops in lane order (deadlock-free).
        durations: seconds per op, keyed by ``op_key``; a missing op takes ``default``.
        machine: where comm-stream ops run.
        reads: each COMPUTE node's argument nodes (``compute_reads(graph)``).
        cores: on ``SHARED_CORES``, how many cores all the actors share (None: one each).

    Raises:
        DeadlockError: if the schedule cannot finish (no op can start).
        ValueError: ``cores`` is below 1.
    """
    if cores is not None and cores < 1:
        raise ValueError(f"cores={cores}: the actors need at least one core")
    run = _Run(schedule, durations, machine, reads, default,
               cores if machine is Machine.SHARED_CORES else None)
    while run.left:
        group, start = run.next_group()
        run.commit(group, start)
    tracks = {actor: tuple(run.spans[(actor, i)] for i in range(len(ops))) for actor, ops in run.lanes.items()}
    makespan = max((span.end for spans in tracks.values() for span in spans), default=0.0)
    return Prediction(machine, makespan, tracks)


def simulate_executions(schedule: Schedule, durations: Mapping[str, float], executions: int, *,
                        machine: Machine = Machine.OWN_ENGINE,
                        reads: Mapping[NodeId, Collection[NodeId]] | None = None,
                        default: float = 0.0, cores: int | None = None) -> Prediction:
    """``simulate`` of ``executions`` executions in flight at once (``ahead.unroll``): the
    driver's inputs all ready at 0, each op of each execution taking its op's duration.
    The makespan over ``executions`` is the pipeline's time for them; a RECV run ahead
    (``@comm+1``) starts receiving the next execution where the lane issues it.

    The tracks hold the unrolled ops (``n1`` of execution 2 is ``n1.2``).
    """
    if executions < 1:
        raise ValueError(f"executions={executions}: simulate at least one")
    unrolled = unroll(schedule, executions)
    timed = {}
    wanted: dict[NodeId, frozenset[NodeId]] = {}
    for ops in schedule.values():
        obtained = {op.node for op in ops if op.stream is Stream.COMM and op.kind is not OpKind.SEND}
        for op in ops:
            key = op_key(op)
            for e in range(executions):
                if key in durations:
                    timed[op_key(renamed(op, e))] = durations[key]
                if op.kind is OpKind.COMPUTE:  # its arguments of its own execution
                    args = obtained if reads is None else reads.get(op.node, ())
                    wanted[f"{op.node}.{e}"] = frozenset(f"{v}.{e}" for v in args)
    return simulate(unrolled, timed, machine=machine, reads=wanted, default=default, cores=cores)


class _Run:
    """The state of one simulation: each resource's next op and when it is free."""

    def __init__(self, schedule: Schedule, durations: Mapping[str, float], machine: Machine,
                 reads: Mapping[NodeId, Collection[NodeId]] | None, default: float,
                 cores: int | None = None) -> None:
        self.lanes = {actor: tuple(ops) for actor, ops in schedule.items()}
        self.cores = [0.0] * cores if cores else []  # when each shared core is next free
        self.durations, self.default, self.machine = durations, default, machine
        self.queues: dict[tuple[ActorId, str], list[int]] = {}
        self.partners: dict[object, list[Place]] = {}
        writers: dict[NodeId, Place] = {}
        for actor, ops in self.lanes.items():
            for i, op in enumerate(ops):
                self.queues.setdefault((actor, _track(op)), []).append(i)
                if op.kind is OpKind.WRITE:
                    writers[op.node] = (actor, i)
                if op.kind in (OpKind.SEND, OpKind.RECV):
                    self.partners.setdefault(pair_key(op), []).append((actor, i))
                elif op.kind is OpKind.COLLECTIVE:
                    self.partners.setdefault(op.node, []).append((actor, i))
        self.after = {(actor, i): _dependencies(ops, actor, i, writers, reads)
                      for actor, ops in self.lanes.items() for i in range(len(ops))}
        self.heads = dict.fromkeys(self.queues, 0)
        self.free: dict[object, float] = {}
        self.spans: dict[Place, Span] = {}
        self.left = sum(len(ops) for ops in self.lanes.values())

    def _resource(self, place: Place) -> object:
        actor, i = place
        return actor if self.machine is Machine.SHARED_CORES else (actor, _track(self.lanes[actor][i]))

    def _at_head(self, place: Place) -> bool:
        actor, i = place
        queue = (actor, _track(self.lanes[actor][i]))
        return self.heads[queue] < len(self.queues[queue]) and self.queues[queue][self.heads[queue]] == i

    def next_group(self) -> tuple[list[Place], float]:
        """The op (a pair or collective: all its members) that can start first, and when."""
        best: tuple[list[Place], float] | None = None
        for (actor, _), queue in self.queues.items():
            head = self.heads[(actor, _)]
            if head == len(queue):
                continue
            op = self.lanes[actor][queue[head]]
            group = self.partners.get(_joint(op), [(actor, queue[head])]) if _joint(op) else [(actor, queue[head])]
            if not all(self._at_head(place) for place in group):
                continue
            deps = [dep for place in group for dep in self.after[place]]
            if any(dep not in self.spans for dep in deps):
                continue
            start = max([0.0, *(self.spans[dep].end for dep in deps),
                         *(self.free.get(self._resource(place), 0.0) for place in group),
                         *([min(self.cores)] if self.cores else [])])
            if best is None or start < best[1]:
                best = (group, start)
        if best is None:
            stuck = [str(self.lanes[a][q[self.heads[(a, t)]]]) for (a, t), q in self.queues.items()
                     if self.heads[(a, t)] < len(q)]
            raise DeadlockError(f"the schedule cannot finish; waiting: {', '.join(stuck)}")
        return best

    def commit(self, group: list[Place], start: float) -> None:
        ops = [self.lanes[a][i] for a, i in group]
        sends = [op for op in ops if op.kind is OpKind.SEND and op_key(op) in self.durations]
        given = [self.durations[op_key(op)] for op in (sends or ops) if op_key(op) in self.durations]
        end = start + (min(given) if given else self.default)
        if self.cores:  # one core does the group's work (a pair's copy, a method)
            self.cores[self.cores.index(min(self.cores))] = end
        for place in group:
            actor, i = place
            op = self.lanes[actor][i]
            self.spans[place] = Span(op, _track(op), start, end)
            self.heads[(actor, _track(op))] += 1
            self.free[self._resource(place)] = end
            self.left -= 1


BLOCKING = frozenset({OpKind.READ, OpKind.SEND, OpKind.RECV, OpKind.COLLECTIVE})
"""Ops that may wait inside their own span (a recorded one starts early and blocks)."""


def _track(op: Op) -> str:
    return "comm" if op.stream is Stream.COMM else "loop"


def _joint(op: Op) -> object | None:
    """The key an op shares with its partners (None: it runs alone)."""
    if op.kind in (OpKind.SEND, OpKind.RECV):
        return pair_key(op)
    return op.node if op.kind is OpKind.COLLECTIVE else None


def _dependencies(ops: tuple[Op, ...], actor: ActorId, i: int, writers: Mapping[NodeId, Place],
                  reads: Mapping[NodeId, Collection[NodeId]] | None) -> list[Place]:
    """What op ``i`` of ``actor``'s lane waits for besides its resource (module docstring)."""
    op, deps = ops[i], []
    on_comm = [j for j in range(i) if ops[j].stream is Stream.COMM]
    if op.stream is Stream.COMM:  # issued once the loop has run the ops before it
        loop_before = [j for j in range(i) if ops[j].stream is not Stream.COMM]
        deps += [(actor, loop_before[-1])] if loop_before else []
    if op.kind is OpKind.READ and op.node in writers:
        deps.append(writers[op.node])
    elif op.kind is OpKind.COMPUTE:
        wanted = None if reads is None else reads.get(op.node, ())
        deps += [(actor, j) for j in on_comm
                 if ops[j].kind is OpKind.SEND
                 or (ops[j].kind in (OpKind.RECV, OpKind.COLLECTIVE) and (wanted is None or ops[j].node in wanted))]
    elif op.kind in (OpKind.WRITE, OpKind.SEND):
        deps += [(actor, j) for j in on_comm if ops[j].kind is not OpKind.SEND and ops[j].node == op.node]
    return deps


def critical_path(schedule: Schedule, times: Mapping[str, tuple[float, float]], *,
                  reads: Mapping[NodeId, Collection[NodeId]] | None = None,
                  slack: float = 0.0) -> list[str]:
    """The chain of ops that set one execution's end, first to last (``op_key`` texts).

    ``times``: each op's (start, end), predicted (``Prediction.times()``) or recorded. From
    the op that ends last, step back again and again to what it waited for that ended
    last: the op before it on its resource, or a dependency (module docstring); for a
    pair or collective, any member's. A pair or collective ends when its first member
    does (a recorded send may return after its data arrived). ``slack`` tolerates
    recorded clocks (an end up to ``slack`` after the start still counts). A pair is
    named by the op reached (its RECV when the path comes from the receiver's side).
    """
    run = _Run(schedule, {}, Machine.OWN_ENGINE, reads, 0.0)
    known = {place: times[op_key(run.lanes[place[0]][place[1]])] for place in run.after
             if op_key(run.lanes[place[0]][place[1]]) in times}

    def group(place: Place) -> list[Place]:
        op = run.lanes[place[0]][place[1]]
        return [p for p in run.partners.get(_joint(op), [place]) if p in known] if _joint(op) else [place]

    def end(place: Place) -> tuple[float, float]:  # a pair ends when its data arrived: its earliest end
        return min(known[p][1] for p in group(place)), known[place][0]

    place = max(known, key=end, default=None)
    path: list[str] = []
    while place is not None:
        op = run.lanes[place[0]][place[1]]
        path.append(op_key(op))
        # a READ, pair or collective may have started early and waited inside: what it
        # waited for ended before it did
        bound = end(place)[0] if op.kind in BLOCKING else known[place][0]
        before = [dep for p in group(place) for dep in (*run.after[p], *_resource_before(run, p))]
        place = max((dep for dep in before if dep in known and end(dep)[0] <= bound + slack), key=end, default=None)
    return path[::-1]


def _resource_before(run: _Run, place: Place) -> list[Place]:
    actor, i = place
    queue = run.queues[(actor, _track(run.lanes[actor][i]))]
    k = queue.index(i)
    return [(actor, queue[k - 1])] if k else []
