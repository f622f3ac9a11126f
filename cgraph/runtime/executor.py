"""The actor side: one short loop per compiled graph.

    for op in program.ops:            a.R0  a.C1  a.W1  a.R4  a.C5  a.W5
        HANDLERS[op.kind](op, ctx)     │     │     │
                                      read  run   write
    ctx.end_execution()               release the slots read in this execution

The loop runs on the actor (started through ``actor.__ray_call__``) until a
channel it waits on is closed (teardown, or the driver noticed a failure), then
returns. A user exception becomes an ``ErrorValue`` that flows downstream in
place of the result; the loop itself never stops for one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from functools import partial
from types import CoroutineType
from typing import cast

from cgraph import _spans
from cgraph._boundary import UserValue
from cgraph.channels.base import ChannelReader
from cgraph.channels.intra_channel import IntraWriter
from cgraph.channels.opener import open_reader, open_writer
from cgraph.channels.shm_channel import ShmWriter
from cgraph.errors import ChannelClosedError, ChannelLostError, RuntimeGraphError, add_note
from cgraph.runtime import coverage_hook, switches
from cgraph.runtime.affinity import pin_thread
from cgraph.runtime.comm_ops import (
    CommState,
    Pending,
    comm_state,
    handle_collective,
    handle_recv,
    handle_send,
    issue_ahead,
)
from cgraph.runtime.endpoints import forget_local
from cgraph.runtime.error_value import ErrorValue
from cgraph.runtime.node_channels import watch_node
from cgraph.runtime.program import (
    ARG_CONST,
    ARG_VALUE,
    ActorProgram,
    ComputeSpec,
)
from cgraph.runtime.recording import (
    NO_BUFFER,
    Recorder,
    nbytes,
    ray_task_events,
    register,
    torch_profiling,
)
from cgraph.runtime.where import ENDED, track
from cgraph.scheduler.ops import Op, OpKind, Stream

METHOD_LOCK = threading.Lock()
"""The actor's method lock (one actor per Ray worker process): on a default actor, every
graph's loop holds it while a method runs, never while it waits (hosting.py)."""


def _locked(fn: Callable[..., UserValue], lock: threading.Lock) -> Callable[..., UserValue]:
    def call(*args: UserValue, **kwargs: UserValue) -> UserValue:
        with lock:
            return fn(*args, **kwargs)

    return call


class Context:
    """What the handlers share: the actor instance, channels and this execution's values."""

    def __init__(self, instance: object, program: ActorProgram) -> None:
        self.instance = instance
        self.program = program
        self.execution = 0
        self.values: dict[str, UserValue] = {}
        self.ahead_values: dict[str, UserValue] = {}  # the next execution's, received ahead (comm_ops)
        self.readers = {node: open_reader(h) for node, h in program.readers.items()}
        self.writers = {
            node: tuple(open_writer(h) for h in hs) for node, hs in program.writers.items()
        }
        # values written only to in-process channels: a Pending one passes through
        # unresolved, so a collective or RECV on the comm stream overlaps the compute
        # that follows it on this actor.
        self.in_process_only = frozenset(
            node
            for node, ws in self.writers.items()
            if ws and all(isinstance(w, IntraWriter) for w in ws)
        )
        self.fenced = after_overlapped_sends(program.ops)  # computes that wait for SENDs (comm_ops)
        self.where: list[int] | None = None  # the loop's where-record (where.py), once it runs
        self.delivered_at: dict[str, int] = {}  # set by set_ops
        self.methods: dict[str, Callable[..., UserValue]] = {}
        self.to_release: list[ChannelReader] = []
        self.comm_state: CommState | None = None  # the communicators' state, made by the first comm op (comm_ops)
        self.recorder: Recorder | None = None  # set when the graph records a timeline (recording.py)
        self.event_loop: asyncio.AbstractEventLoop | None = None  # for async methods, made on first use
        self.end_hooks: list[Callable[[], None]] = []  # run at the end of every execution
        self.close_hooks: list[Callable[[], None]] = []  # run once when the loop ends
        node = program.node_watch
        if node is not None:  # off the driver's node: the driver closes our node's channels
            opened = [*self.readers.values(), *(w for ws in self.writers.values() for w in ws)]
            self.close_hooks.append(watch_node(node, opened))

    def method(self, name: str) -> Callable[..., UserValue]:
        """The actor's method ``name``; on a default actor, called under the actor's
        method lock, so that no two graphs' loops run its methods at once (hosting.py)."""
        fn = self.methods.get(name)
        if fn is None:
            fn = getattr(self.instance, name)
            if self.program.serialize_methods:
                fn = _locked(fn, METHOD_LOCK)
            self.methods[name] = fn
        return fn

    def run_coroutine(self, coro: Coroutine[object, None, UserValue]) -> UserValue:
        """Finish an ``async def`` method's coroutine on this loop's own event loop.

        The loop thread has no running event loop (Ray runs ``__ray_call__`` of an
        async actor in a worker thread), so the coroutine runs to completion here;
        state tied to the actor's main event loop (its queues, locks) is not usable.
        """
        loop = self.event_loop
        if loop is None:
            loop = self.event_loop = asyncio.new_event_loop()
            self.close_hooks.append(loop.close)
        return loop.run_until_complete(coro)

    def value(self, node: str) -> UserValue:
        """The value of ``node`` in this execution, waiting for it if it is in flight (the
        where-record then names the comm op that delivers it, not the op that waits)."""
        value = self.values[node]
        if isinstance(value, Pending):
            where, position = self.where, self.delivered_at.get(node)
            if where is None or position is None:
                value = self.values[node] = value.result()
            else:
                was, where[1], where[2] = where[1], position, time.perf_counter_ns()
                value = self.values[node] = value.result()
                where[1], where[2] = was, time.perf_counter_ns()
        return value

    def set_ops(self, ops: tuple[Op, ...]) -> None:
        """Run ``ops`` from the next execution on (the start, or a switch of ``overlap="auto"``)."""
        self.program = replace(self.program, ops=ops)
        self.fenced = after_overlapped_sends(ops)
        self.delivered_at = _delivered(self.program)

    def end_execution(self) -> None:
        if self.end_hooks:  # communicator ops (the only source of Pending values) are here
            for node, value in list(self.values.items()):
                if type(value) is Pending:  # e.g. a RECV nobody consumed: finish it
                    self.values[node] = value.result()
            for hook in self.end_hooks:
                hook()
        for reader in self.to_release:
            reader.release()
        self.to_release.clear()
        self.values.clear()
        if self.ahead_values:
            self.values.update(self.ahead_values)
            self.ahead_values.clear()
        self.execution += 1

    def close(self) -> None:
        for hook in self.close_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - closing; the loop is ending anyway
                pass
        for reader in self.readers.values():
            reader.detach()
        for writers in self.writers.values():
            for writer in writers:
                writer.detach()
        handles = list(self.program.readers.values())
        handles += [h for hs in self.program.writers.values() for h in hs]
        forget_local(handles)


class _Upstream(Exception):  # noqa: N818 - control flow, never escapes this module
    def __init__(self, error: ErrorValue) -> None:
        self.error = error


Step = Callable[[], None]
"""One op of an actor's loop, bound to its node, channels and method (``HANDLERS``)."""


def read_step(op: Op, ctx: Context) -> Step:
    values, node = ctx.values, op.node
    reader, to_release = ctx.readers[node], ctx.to_release

    def read() -> None:
        try:
            values[node] = reader.read()
        except RuntimeGraphError:
            raise  # closed (the loop ends), a failed wait: the channel itself
        except Exception as exc:  # noqa: BLE001 - the value arrived but cannot be rebuilt here
            # (unpickling failed: a module this actor lacks, a failing __setstate__); the
            # slot is already released: this execution carries the error on, the loop lives
            values[node] = _transfer_error(ctx, node, exc, "could not be unpickled on this actor")
            return
        to_release.append(reader)

    return read


def write_step(op: Op, ctx: Context) -> Step:
    values, node, writers = ctx.values, op.node, ctx.writers[op.node]
    pass_pending = node in ctx.in_process_only  # the in-process reader waits on use
    if _forwards(op, ctx):
        return _forwarding_write(op, ctx)

    def write() -> None:
        value = values[node]
        if type(value) is Pending and not pass_pending:
            value = ctx.value(node)
        try:
            for writer in writers:
                writer.write(value)
        except RuntimeGraphError:
            raise
        except Exception as exc:  # noqa: BLE001 - nothing written to this writer (pickling
            # failed, no room for the slot): it and those after it carry the error instead
            error = _transfer_error(ctx, node, exc, "could not be sent")
            for rest in writers[writers.index(writer):]:
                rest.write(error)

    return write


def _forwards(op: Op, ctx: Context) -> bool:
    """Whether WRITE ``op`` may forward what it read instead of copying it: the lane's last
    op (no method of this execution sees the value after it, no other write copies from
    the slot it hands over) and one shared-memory writer (``shm_channel``'s Forwarding)."""
    writers = ctx.writers[op.node]
    return (op is ctx.program.ops[-1] and len(writers) == 1 and isinstance(writers[0], ShmWriter)
            and op.node not in ctx.in_process_only and os.environ.get(FORWARD_ENV, "1") != "0")


FORWARD_ENV = "CGRAPH_FORWARD"
"""``CGRAPH_FORWARD=0`` in an actor's environment: pass-throughs copy (benchmarks compare)."""


def _forwarding_write(op: Op, ctx: Context) -> Step:
    """A pass-through's WRITE: buffers of the value that lie in a slot this actor read
    stay there; the next reader views them and gives that slot back (zero-copy)."""
    values, node = ctx.values, op.node
    writer = cast(ShmWriter, ctx.writers[op.node][0])  # ``_forwards``: one shm channel
    held = ctx.to_release

    def write() -> None:
        value = values[node]
        if type(value) is Pending:
            value = ctx.value(node)
        try:
            taken = writer.write(value, forward_from=held)
        except RuntimeGraphError:
            raise
        except Exception as exc:  # noqa: BLE001 - as write_step: the value's error goes instead
            writer.write(_transfer_error(ctx, node, exc, "could not be sent"))
            return
        if taken is not None:
            held.remove(taken)  # its hold is the next reader's now

    return write


def _transfer_error(ctx: Context, node: str, exc: Exception, what: str) -> ErrorValue:
    """``exc``, raised moving node ``node``'s value between actors, as the value's error."""
    spec = ctx.program.computes.get(node)
    add_note(exc, f"cgraph: the value of node {node} {what} (actor {ctx.program.label}); "
                  "values cross actors pickled (Ray's cloudpickle)")
    return ErrorValue.capture(exc, actor=ctx.program.label,
                              method=spec.method if spec is not None else f"<{node}>",
                              execution_index=ctx.execution)


def compute_step(op: Op, ctx: Context) -> Step:
    """Run the node's method on its arguments; an upstream error is forwarded instead."""
    spec = ctx.program.computes[op.node]
    values, input_node = ctx.values, cast(str, ctx.program.input_node)  # None: no InputNode, so no ARG_INPUT
    fence = op.node in ctx.fenced  # a SEND may still read a tensor this method could update

    def resolve(kind: int, what: UserValue) -> UserValue:
        if kind == ARG_VALUE:
            value = values[what]
            if type(value) is Pending:
                value = ctx.value(what)
            if type(value) is ErrorValue:
                raise _Upstream(value)
            return value
        if kind == ARG_CONST:
            return what
        inputs, kwargs = values[input_node]  # ARG_INPUT: execute's arguments
        if what is None:
            return inputs[0]
        return inputs[what] if isinstance(what, int) else kwargs[what]

    def compute() -> None:
        # plain loops and no helper frames: this runs for every method of every execution
        if fence:
            comm_state(ctx).fence()
        args = []
        try:
            for kind, what in spec.args:
                args.append(resolve(kind, what))
            kwargs = {key: resolve(*arg) for key, arg in spec.kwargs} if spec.kwargs else {}
        except _Upstream as up:  # an upstream method failed: skip this one
            result: UserValue = up.error
        else:
            try:
                result = ctx.method(spec.method)(*args, **kwargs)
                if type(result) is CoroutineType:  # an async def method
                    result = ctx.run_coroutine(result)
                if spec.num_returns > 1:
                    result = _returns(spec, result)
            except Exception as exc:  # noqa: BLE001 - any user error travels downstream
                result = ErrorValue.capture(exc, actor=ctx.program.label, method=spec.method,
                                            execution_index=ctx.execution)
        if spec.num_returns == 1:
            values[spec.node] = result
            return
        for index, item in enumerate(spec.items):
            if item:
                values[item] = result if isinstance(result, ErrorValue) else result[index]

    return compute


def after_overlapped_sends(ops: tuple[Op, ...]) -> frozenset[str]:
    """The COMPUTE nodes that run after a SEND on the comm stream in one execution."""
    seen_send, nodes = False, []
    for op in ops:
        if op.kind is OpKind.SEND and op.stream is Stream.COMM:
            seen_send = True
        elif op.kind is OpKind.COMPUTE and seen_send:
            nodes.append(op.node)
    return frozenset(nodes)


def _returns(spec: ComputeSpec, result: Iterable[UserValue]) -> tuple[UserValue, ...]:
    """A ``num_returns > 1`` method's values, checked against the bound count."""
    result = tuple(result)
    if len(result) != spec.num_returns:
        raise ValueError(
            f"{spec.method} was bound with num_returns={spec.num_returns} "
            f"but returned {len(result)} values"
        )
    return result


def _comm_step(handler: Callable[[Op, Context], None]) -> Callable[[Op, Context], Step]:
    return lambda op, ctx: partial(handler, op, ctx)


HANDLERS: dict[OpKind, Callable[[Op, Context], Step]] = {
    OpKind.READ: read_step,
    OpKind.COMPUTE: compute_step,
    OpKind.WRITE: write_step,
    OpKind.SEND: _comm_step(handle_send),
    OpKind.RECV: _comm_step(handle_recv),
    OpKind.COLLECTIVE: _comm_step(handle_collective),
}
"""Per op kind, what builds its step once, at the start of the loop: a closure over
the node's reader, method and writers, so an iteration looks nothing up (what that
saves: docs/design-notes.md, "The executor's hot path")."""


def _recorded_execution(ctx: Context, steps: list[Step], where: list[int]) -> Callable[[], None]:
    """One execution of the loop, recorded: each step's end stamped with one clock read;
    an op of the comm stream is timed where its body runs, on the comm thread
    (``CommState.run``), so each op is one event; a COMPUTE's wait for values in
    flight is a step (and an event) of its own. Library code on this thread adds its
    own events through ``cgraph._spans`` (the collective library's calls)."""
    program = ctx.program
    assert program.timeline is not None
    comm_ops = sum(op.stream is Stream.COMM for op in program.ops)
    recorder = ctx.recorder = register(program.graph_tag, program.timeline * max(comm_ops, 1), program.timeline)
    timed: list[Step] = []
    positions: list[int] = []  # the op of each timed step, for the where-record
    labels: list[str | None] = []
    kinds: list[tuple[str, str] | None] = []  # (op kind, method) per step, for Ray's events
    sized: list[_Sized] = []
    for position, (op, step) in enumerate(zip(program.ops, steps, strict=True)):
        waits = _waiting(op, ctx) if op.kind is OpKind.COMPUTE and op.stream is not Stream.COMM else None
        if waits is not None:
            timed.append(waits)
            positions.append(position)
            labels.append(f"wait {op}")
            kinds.append(None)
        if op.kind is not OpKind.COMPUTE and op.stream is not Stream.COMM:
            sized.append(_Sized(len(timed), value_size(ctx, op.node)))
        timed.append(step)
        positions.append(position)
        labels.append(None if op.stream is Stream.COMM else str(op))
        kinds.append((op.kind.value, _method_of(op, program)))
    ray_events = ray_task_events(ctx.instance, kinds) if program.ray_events else None
    names, now, add = tuple(labels), time.perf_counter_ns, recorder.add_run
    _spans.bind(lambda text, start, end, size: recorder.add(text, "collective", ctx.execution, start, end, size))
    ctx.close_hooks.append(lambda: _spans.bind(None))

    steps_at = tuple(zip(positions, timed, strict=True))

    def run_one() -> None:
        stamps = [now()]
        mark = stamps.append
        for position, step in steps_at:
            where[1] = position
            where[2] = stamps[-1]
            step()
            mark(now())
        sizes: list[int | None] = [None] * len(names)
        for entry in sized:  # the values are still here until end_execution
            if entry.misses < _SIZE_TRIES:  # a node whose values never had a buffer: not looked at again
                got = sizes[entry.step] = entry.size()
                entry.misses = 0 if got is not None else entry.misses + 1
        add(ctx.execution, names, stamps, sizes)
        if ray_events is not None:
            ray_events(stamps)

    return run_one


def _switch(ctx: Context, switch: switches.Cell) -> bool:
    """Take the schedule the driver asked for (``switches.py``), now, between two
    executions; returns whether to record op events from now on."""
    schedules = ctx.program.schedules
    assert schedules is not None  # only auto graphs have a switch cell
    ctx.set_ops(schedules[switch.schedule])
    switch.switched_at = ctx.execution  # ``at`` stays: the loop never meets that execution again
    return switch.record


def _run_bare(ctx: Context, steps: list[Step], where: list[int], switch: switches.Cell | None) -> None:
    """Run executions until the channels close (an exception) or, with a switch cell, until
    the execution the driver named is next."""
    now = time.perf_counter_ns
    positioned = tuple(enumerate(steps))
    while True:
        for position, step in positioned:
            where[1] = position
            where[2] = now()
            step()
        ctx.end_execution()
        where[0] = ctx.execution
        if switch is not None and switch.at == ctx.execution:
            return


def _run_recorded(ctx: Context, run_one: Callable[[], None], where: list[int],
                  switch: switches.Cell | None) -> None:
    """``_run_bare`` for a recording loop."""
    while True:
        run_one()
        ctx.end_execution()
        where[0] = ctx.execution
        if switch is not None and switch.at == ctx.execution:
            return


def _method_of(op: Op, program: ActorProgram) -> str:
    """The method (or collective) an op belongs to, as Ray's events name it."""
    if op.kind is OpKind.COMPUTE:
        return program.computes[op.node].method
    if op.kind is OpKind.COLLECTIVE and program.comm is not None and op.node in program.comm.collectives:
        return program.comm.collectives[op.node].method
    return ""


@dataclass(slots=True)
class _Sized:
    """A recorded step that moves a value: its place among the steps, how to count the
    value's bytes (None while it is in flight), and how many values in a row had no buffer."""

    step: int
    size: Callable[[], int | None]
    misses: int = 0


_SIZE_TRIES = 8
"""A recording loop stops counting the bytes of a node's values after this many in a row
had no buffer (an edge's values keep their type: a few us per execution saved)."""


def value_size(ctx: Context, node: str) -> Callable[[], int | None]:
    """For a recorded event: the bytes of ``node``'s value (None while it is in flight)."""
    values = ctx.values

    def size() -> int | None:
        value = values.get(node)
        return None if type(value) in NO_BUFFER else nbytes(value)  # the common small values: one lookup

    return size


def _waiting(op: Op, ctx: Context) -> Step | None:
    """What a COMPUTE waits for before its method can run: its arguments still in flight
    on the comm stream, and the sends it is fenced behind (None: it can wait for nothing)."""
    spec = ctx.program.computes[op.node]
    args = {what for kind, what in (*spec.args, *(arg for _, arg in spec.kwargs)) if kind == ARG_VALUE}
    nodes = sorted(args & _in_flight(ctx.program))
    fenced = op.node in ctx.fenced
    if not nodes and not fenced:
        return None

    def wait() -> None:
        for node in nodes:
            if type(ctx.values.get(node)) is Pending:
                ctx.value(node)
        if fenced:
            comm_state(ctx).fence()

    return wait


def _delivered(program: ActorProgram) -> dict[str, int]:
    """Each value a comm op of ``program`` delivers (a RECV's, a collective's output), and
    the lane position of that op."""
    collectives = program.comm.collectives if program.comm is not None else {}
    out = {}
    for position, op in enumerate(program.ops):
        if op.kind is OpKind.RECV:
            out[op.node] = position
        elif op.kind is OpKind.COLLECTIVE and op.node in collectives and collectives[op.node].output:
            out[collectives[op.node].output] = position
    return out


def _in_flight(program: ActorProgram) -> set[str]:
    """The values this actor's comm stream delivers: RECVs and collective outputs on it."""
    return {node for node, position in _delivered(program).items()
            if program.ops[position].stream is Stream.COMM}


def run_actor_loop(instance: object, program: ActorProgram) -> str:
    """Run ``program`` until its channels close. Returns why it stopped.

    With ``overlap="auto"`` the loop may change schedules once, between two executions,
    when the driver asks (``switch.py``): it rebuilds its steps from the other op list."""
    measured = coverage_hook.trace_this_thread()
    unpin = pin_thread(program.cpu_affinity)
    ctx = Context(instance, program)
    where = ctx.where = track(program.graph_tag)  # [execution, op position, since]: read by status() (where.py)
    ctx.set_ops(program.ops)
    switch = switches.cell(program.graph_tag, program.actor) if program.schedules else None
    record = program.timeline is not None
    try:
        if program.comm is not None and program.comm.groups:
            # Open every communicator now, not at the first op that uses it: making a torch
            # group (gloo, NCCL) is collective, so a member whose first comm op waits on
            # another member's output would otherwise never join (design-notes).
            comm_state(ctx)
        with torch_profiling(program.torch_profiles):  # Ray's switch; a no-op otherwise
            while True:
                if any(op.ahead for op in ctx.program.ops):  # execution 0's, or the first after a switch
                    issue_ahead(ctx)
                steps = [HANDLERS[op.kind](op, ctx) for op in ctx.program.ops]
                if record:  # a loop of its own: unrecorded loops run the bare steps
                    _run_recorded(ctx, _recorded_execution(ctx, steps, where), where, switch)
                else:
                    _run_bare(ctx, steps, where, switch)
                assert switch is not None  # the loops return only to switch
                record = _switch(ctx, switch)
    except ChannelLostError as exc:  # a peer went away: say which, the monitor reports it
        return str(exc)
    except ChannelClosedError:
        return "closed"
    finally:
        where[1] = ENDED
        ctx.close()
        unpin()
        coverage_hook.save(measured)
