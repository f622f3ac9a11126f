"""Run-ahead: receives of the next execution start while this one computes.

After the overlap pass every RECV waits on the comm stream for its sender, but
only once its own execution has begun: a pipeline stage receives execution i+1's
value after it has finished computing execution i. With several executions in
flight (``max_inflight_executions >= 2``) the sender may have sent it long
before. This pass lets such a RECV be *issued one execution ahead* (``@comm+1``):

    overlapped    b | b.RECV1<a@comm b.C2 b.W2
    run ahead     b | b.RECV1<a@comm+1 b.C2 b.W2
                  comm:  recv n1 (i+1) ──────────── recv n1 (i+2) ───
                  loop:      C2 (i) ── W2 (i) ── C2 (i+1) ── W2 (i+1)

An op ``RECV@comm+1`` at some place in the lane means: when the loop passes it in
execution i, the comm thread (or stream) begins receiving execution i+1's value;
execution i+1 finds it there (the loop starts by issuing execution 0's). It stands
right after the lane's last other comm op, so the comm queue keeps each
execution's ops in their order and only ever holds one execution's RECVs behind
the last op of the one before.

Which RECVs may run ahead. The comm ops of an actor run one after another in
lane order, and the loop never waits for a RECV issued ahead except where
execution i+1 uses its value, so the only new waits are the comm queue's. Such a
RECV starts before every op of its actor in execution i+1, so (as in the overlap
pass) it must not pass another comm op of its actor, nor any op of its actor that
its matching SEND depends on: the RECVs that run ahead are those that lead the
lane and whose SEND needs nothing of the actor in the same execution.

Why that cannot deadlock. Let a RECV of execution i+1 block the actor x's whole
lane (more than the runtime does: the loop goes on past it) from the end of
execution i. Its SEND, on y, waits only for ops of execution i+1 before it, none
of them x's (the rule above, which counts the pairs of x's other RECVs run ahead
as x's ops), and for ops of earlier executions, which x has all run. The pass
still dry-runs ``unroll``'s schedule of a few executions back to back in that
blocking form, and keeps the input schedule if it ever deadlocked; a property
test over random graphs checks that it never does.

``unroll`` is also the simulator's view of several executions in flight
(``simulate_executions``): values renamed per execution (``n1`` of execution 2 is
``n1.2``), each input ready at once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from cgraph.scheduler.deadlock import find_deadlock
from cgraph.scheduler.ops import COMM_KINDS, ActorId, NodeId, Op, OpKind, Schedule, Stream
from cgraph.scheduler.overlap import _happens_before, _needed

UNROLLED = 3
"""Executions the dry run puts back to back: every RECV run ahead meets the executions
on both sides of it."""


RENDEZVOUS_KINDS = frozenset({"gloo", "nccl", "custom"})
"""Group kinds whose data moves only once the receive is posted (NCCL's and gloo's
send/recv, and a user's communicator, shaped like NCCL's): there a receive issued
ahead lets the sender's transfer run while the receiver computes. The CPU
communicator's link takes the sender's copy without the receiver, one message ahead
already, and CUDA IPC's receiver maps the sender's memory; there, running ahead
gains nothing and would cost the receive its view of the link (measured: 22 ms
against 6 ms per execution for 32 MiB on the CPU communicator, ``bench_ahead.py``)."""


def run_ahead(schedule: Schedule, eligible: Callable[[Op], bool] = lambda op: True) -> Schedule:
    """Issue each leading RECV of the comm stream one execution ahead, where it is safe.

    Args:
        schedule: an overlapped, deadlock-free schedule (not modified).
        eligible: whether a RECV may run ahead at all (the pipeline: its group's kind is
            one of ``RENDEZVOUS_KINDS``).

    Returns:
        A new schedule; a lane with nothing to run ahead is unchanged.
    """
    order = _happens_before(schedule)
    if order is None:
        return dict(schedule)

    def free(actor: ActorId) -> Callable[[Op], bool]:
        return lambda op: eligible(op) and _needed(order, actor, op) == 0

    candidates = {actor: _leading_recvs(ops, free(actor)) for actor, ops in schedule.items()}
    ahead = {actor: _rotate(ops, candidates[actor]) for actor, ops in schedule.items()}
    if find_deadlock(unroll(ahead, UNROLLED, conservative=True)) is not None:
        return dict(schedule)  # never seen (tests/unit/test_scheduler_properties.py); the input is safe
    return ahead


def _leading_recvs(ops: tuple[Op, ...], free: Callable[[Op], bool]) -> set[int]:
    """The lane positions of the RECVs on the comm stream that come first in its comm order
    and are ``free`` (their SEND needs nothing of the actor): up to the first comm op
    that is not one of them, so none passes another comm op."""
    out = set()
    for pos, op in enumerate(ops):
        if op.kind is OpKind.RECV and op.stream is Stream.COMM and not op.ahead and free(op):
            out.add(pos)
        elif op.kind in COMM_KINDS:
            break
    return out


def _rotate(ops: tuple[Op, ...], positions: Collection[int]) -> tuple[Op, ...]:
    """``ops`` with the RECVs at ``positions`` issued one execution ahead, right after the
    last other comm op (at the front if there is none)."""
    if not positions:
        return ops
    moved = [replace(ops[pos], ahead=True) for pos in sorted(positions)]
    rest = [op for pos, op in enumerate(ops) if pos not in positions]
    last = max((i for i, op in enumerate(rest) if op.kind in COMM_KINDS), default=-1)
    return (*rest[:last + 1], *moved, *rest[last + 1:])


def execution_order(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """One execution's ops in the order they act on it: the RECVs issued ahead (in the
    execution before) first, as plain ``@comm`` RECVs, then the rest."""
    if not any(op.ahead for op in ops):
        return ops
    return (*(replace(op, ahead=False) for op in ops if op.ahead), *(op for op in ops if not op.ahead))


def in_execution_order(schedule: Schedule) -> Schedule:
    """``execution_order`` of every lane (the one-execution checks see this schedule)."""
    return {actor: execution_order(ops) for actor, ops in schedule.items()}


def unroll(schedule: Schedule, executions: int, *, conservative: bool = False) -> Schedule:
    """``executions`` executions back to back as one schedule, values renamed per execution.

    Each lane runs execution 0's RECVs issued ahead first, then each execution's ops,
    where a RECV issued ahead serves the next execution (the last execution's are
    dropped). ``conservative``: each such RECV stands at the end of the execution
    before instead of where it is issued (the deadlock dry run: see the module
    docstring).
    """
    if executions < 1:
        raise ValueError(f"executions={executions}: unroll at least one")
    lanes: Schedule = {}
    for actor, ops in schedule.items():
        lane = [renamed(op, 0) for op in ops if op.ahead]
        for e in range(executions):
            late: list[Op] = []
            for op in ops:
                if not op.ahead:
                    lane.append(renamed(op, e))
                elif e + 1 < executions:
                    (late if conservative else lane).append(renamed(op, e + 1))
            lane += late
        lanes[actor] = tuple(lane)
    return lanes


def renamed(op: Op, execution: int) -> Op:
    """``op`` of execution ``execution`` in ``unroll``'s schedule."""
    return replace(op, node=f"{op.node}.{execution}", ahead=False)


def _split(node: NodeId) -> tuple[NodeId, int]:
    """``n1.2`` -> (``n1``, 2): an unrolled value's node and execution."""
    name, _, execution = node.rpartition(".")
    return name, int(execution)
