"""SEND, RECV and COLLECTIVE in the actor loop, inline or overlapped with compute.

The handlers move values through the actor's communicators (opened on the
first communicator op from ``ActorProgram.comm``, through ``comm.kinds``) with
the edge protocol of ``comm_channel``. Where an op runs depends on its stream, which the
overlap pass sets:

    op                 CPU communicator                    GPU communicator (comm.stream)
    a.SEND1>b          inline: blocks until sent           inline, enqueued on comm.stream after an
    b.RECV1<a          inline: blocks until received        event of the compute stream; the compute
                                                            stream waits for the result at once
    b.RECV1<a@comm     queued on the actor's comm thread   the comm thread enqueues on comm.stream;
                       (FIFO, schedule order); the value   the value is a Pending: its consumer
                       is a Pending its consumer waits on  waits (CPU) for the thread, then makes
                                                           the compute stream wait for an event

    overlap:  b | RECV1<a@comm RECV2<c@comm C3(n1) C4(n2)
              comm thread:  recv n1 ── recv n2 ──
              main thread:        wait n1 ─ C3 ───── wait n2 (already there) ─ C4

When an actor has a comm thread, every comm op of it goes through that
thread in schedule order, so pairs stay matched as the scheduler planned
them, and each op starts no later than if the lane ran one op at a time: a
schedule the deadlock check passed cannot deadlock here. At the end of an execution
the actor waits for its comm thread to finish that execution's ops (before
the shared-memory slots read in it are released, since a SEND may still be
copying out of one), then frees the link slots that its received views hold:
a RECV that is the lane's last read of its link (``last_link_reads``) gets
its last tensor as a view where the communicator offers ``recv_view``. A
communicator call that raises becomes the op's value (an error) and fails its
group for the rest of the graph (``comm_faults``); a channel closed by teardown
or by the driver after an actor died surfaces where the value is waited for
and ends the loop like any closed channel.

A SEND on the comm stream is still reading its tensor while the loop goes on,
and the actor's next method may update that tensor in place (an argument it
also received, or a tensor it keeps on ``self``). So user code never runs while
a SEND queued before it is in flight: the first COMPUTE after a ``SEND@comm``
*fences* (``CommState.fence``): on the CPU it waits for the send; on a GPU the
loop waits only until the comm thread has enqueued it, and the compute stream
waits for the send's end event, so the CPU runs ahead as before. RECVs and
collectives keep overlapping the compute that follows them.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from cgraph import _threads
from cgraph._boundary import UserValue
from cgraph.channels.opener import open_endpoint
from cgraph.comm import signatures
from cgraph.comm.communicator import Communicator, as_reduce_op
from cgraph.comm.kinds import open_group
from cgraph.comm.streams import Body, CudaStreams, InlineStreams, ModelStreams, streams_of
from cgraph.errors import (
    ChannelClosedError,
    CollectiveMismatchError,
    CommunicatorError,
    RuntimeGraphError,
)
from cgraph.runtime.comm_channel import EdgeReader, EdgeWriter, Encoded, Failed, encode
from cgraph.runtime.comm_faults import SETTLE_S, GroupFaults, Site, quietly
from cgraph.runtime.communicators import CollectiveEndpoint, CommProgram
from cgraph.runtime.error_value import ErrorValue
from cgraph.runtime.recording import At, Recorder, nbytes
from cgraph.scheduler.ops import Op, OpKind, Stream

if TYPE_CHECKING:
    import torch

    from cgraph.comm.kinds import GroupEndpoint
    from cgraph.runtime.program import ActorProgram


# --------------------------------------------------------------------------- ops in the loop
class LoopContext(Protocol):
    """What the communicator ops use of their actor loop's context (``executor.Context``)."""

    program: ActorProgram
    execution: int
    values: dict[str, UserValue]  # this execution's values (a Pending while in flight)
    ahead_values: dict[str, UserValue]  # the next execution's, received ahead (``ahead.py``)
    recorder: Recorder | None
    comm_state: CommState | None  # made by the first comm op (``comm_state``)
    end_hooks: list[Callable[[], None]]
    close_hooks: list[Callable[[], None]]

    def value(self, node: str) -> UserValue: ...


class Pending:
    """A value still in flight on the communication stream/thread.

    Handlers of overlapped communicator ops store one in ``ctx.values``; the
    first COMPUTE (or WRITE/SEND) that needs the value waits on it there and
    replaces it with the result, so compute only waits when it must.
    """

    __slots__ = ("_wait",)

    def __init__(self, wait: Callable[[], UserValue]) -> None:
        self._wait = wait

    def result(self) -> UserValue:
        return self._wait()


class CommState:
    """One actor loop's communicators, channel ends and comm thread."""

    def __init__(self, ctx: LoopContext) -> None:
        program = ctx.program.comm
        assert program is not None  # checked by comm_state()
        self.ctx = ctx
        self.program = program
        self.comms: dict[str, Communicator] = {}
        self.encoded: dict[str, Encoded | ErrorValue] = {}
        self.futures: list[Future[tuple[UserValue, list[torch.Tensor], object]]] = []
        self.next_futures: list[Future[tuple[UserValue, list[torch.Tensor], object]]] = []  # RECVs ahead
        self.sends: list[Pending] = []  # Pendings of SENDs on the comm stream not yet fenced
        self.writers: dict[tuple[str, str], EdgeWriter] = {}
        self.readers: dict[tuple[str, str], EdgeReader] = {}
        self.thread: ThreadPoolExecutor | None = None
        self.engines: dict[int, InlineStreams | CudaStreams | ModelStreams] = {}  # id(comm) -> its streams engine
        self.faults = GroupFaults(ctx.program.label, lambda: ctx.execution)
        ctx.close_hooks.append(self.close)  # first: whatever opens below gets closed
        for name, group in program.groups.items():
            comm = self.comms[name] = self._open(name, group)
            self.engines[id(comm)] = streams_of(comm)
        self.writers = {k: EdgeWriter(self.comms[e.group], e.peer_rank, open_endpoint(e.side), e.hint, e.node)
                        for k, e in program.sends.items()}
        schedules = ctx.program.schedules or {"": ctx.program.ops}  # auto: any it may switch to
        viewable = set.intersection(*(last_link_reads(ops, program) for ops in schedules.values()))
        self.readers = {k: EdgeReader(self.comms[e.group], e.peer_rank, open_endpoint(e.side), e.hint, e.node,
                                      view_last=k in viewable)
                        for k, e in program.recvs.items()}
        self.viewing = [r for r in self.readers.values() if r.viewer is not None]
        binders = [e.bind_thread for e in self.engines.values() if not isinstance(e, InlineStreams)]
        self.binder = binders[0] if binders else None  # the comm thread's, made by the first op on the comm stream
        ctx.end_hooks.append(self.end_execution)

    def _open(self, name: str, group: GroupEndpoint) -> Communicator:
        """This member's communicator of ``group``, made in a thread of its own while the
        group's control is watched: making a torch group waits for every rank, and a
        member that died before joining, or a teardown, then ends the wait by closing the
        control, not at the group's own timeout (the half-made group is left to it).

        Raises:
            ChannelClosedError: the control closed first.
        """
        made: Future[Communicator] = Future()
        woken = threading.Event()
        closed = self.faults.watch(name, group, on_close=woken.set)
        if closed is None:  # no control to watch (a bare test harness): make it here
            made.set_result(open_group(group))
        else:
            def make() -> None:
                try:
                    made.set_result(open_group(group))
                except BaseException as exc:  # noqa: BLE001 - raised below, in the loop's thread
                    made.set_exception(exc)
                woken.set()

            _threads.start(make, f"cgraph-open-{name}")
            woken.wait()
        if not made.done():
            raise ChannelClosedError(f"communicator group {name} was closed (teardown or a failure) while "
                                     f"actor {self.ctx.program.label} was making it")
        comm = made.result()  # or its making's error
        self.faults.adopt(name, comm)
        return comm

    def run(self, op: Op, comm: Communicator, body: Body) -> UserValue | Pending:
        """Run ``body`` for ``op``: inline without a comm thread; with one, on it (a
        ``Pending`` for an op of the comm stream, else its value, waited for)."""
        engine = self.engines[id(comm)]
        recorder = self.ctx.recorder
        if recorder is not None and op.stream is Stream.COMM:  # timed on the thread that runs it
            owner = At(self.ctx.execution + op.ahead)
            body = recorder.timed(str(replace(op, ahead=False)), "comm", owner, body, self._size(op))
        token = engine.mark()
        if self.thread is None:
            if op.stream is not Stream.COMM:
                return engine.join(*engine.run(token, body))
            # the first op of the comm stream (now, or after overlap="auto" switched to it)
            self.thread = ThreadPoolExecutor(1, "cgraph-comm", initializer=self.binder)
        # With a comm thread, every comm op goes through it, so they keep schedule order.
        future = self.thread.submit(engine.run, token, body)
        (self.next_futures if op.ahead else self.futures).append(future)
        pending = Pending(lambda: engine.join(*future.result()))
        if op.stream is not Stream.COMM:
            return pending.result()
        if op.kind is OpKind.SEND:
            self.sends.append(pending)
        return pending

    def _size(self, op: Op) -> Callable[[object], int | None]:
        """For a recorded event: the bytes a comm body moved (what it returned, for a SEND
        the value it sent)."""
        values = self.ctx.values
        if op.kind is OpKind.SEND:
            return lambda _: nbytes(values.get(op.node))
        return lambda result: nbytes(result[0] if type(result) is tuple else result)

    def fence(self) -> None:
        """Before user code runs: every SEND queued so far is done with its tensor
        (CPU: sent; GPU: the compute stream waits for the send's end event)."""
        sends, self.sends = self.sends, []
        for pending in sends:
            pending.result()

    def origin(self, method: str) -> Callable[[Exception], ErrorValue]:
        execution, actor = self.ctx.execution, self.ctx.program.label
        return lambda exc: ErrorValue.capture(exc, actor=actor, method=method, execution_index=execution)

    def end_execution(self) -> None:
        self.sends.clear()  # waited for below, with every other op of the execution
        futures, self.futures, self.next_futures = self.futures, self.next_futures, []
        for future in futures:  # not the RECVs issued ahead: they belong to the next execution
            future.result()
        self.encoded.clear()
        for reader in self.viewing:  # no op of this execution uses a received view any more
            reader.release()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=False, cancel_futures=True)
        for end in (*self.writers.values(), *self.readers.values()):
            quietly(end.detach)
        for comm in self.comms.values():
            quietly(comm.destroy)


def last_link_reads(ops: tuple[Op, ...], program: CommProgram) -> set[tuple[str, str]]:
    """The RECVs after which the lane reads nothing more from their link in an execution.

    A link (group, peer) holds one viewed message at a time, so only the last
    read of it may leave its message in place until the execution ends; a
    later RECV from the same peer, or any later collective of the group, reads
    it again. Under ``a: RECV1<b RECV2<b C3 COLLECTIVE4[cpu]``: none of the
    RECVs (the collective reads every link of its group); without the
    collective: RECV2. A link read by a RECV issued ahead holds no view: the next
    execution's message arrives while this one's would still be viewed.
    """
    read_later: set[tuple[str, int]] = set()
    collective_later: set[str] = set()
    last = set()
    for op in ops:  # a link read ahead (``@comm+1``) is read while this execution's views live
        if op.ahead:
            edge = program.recvs[(op.node, op.peer)]
            read_later.add((edge.group, edge.peer_rank))
    for op in reversed(ops):
        if op.kind is OpKind.COLLECTIVE:
            collective_later.add(program.collectives[op.node].group)
        elif op.kind is OpKind.RECV:
            edge = program.recvs[(op.node, op.peer)]
            link = (edge.group, edge.peer_rank)
            if link not in read_later and edge.group not in collective_later:
                last.add((op.node, op.peer))
            read_later.add(link)
    return last


def comm_state(ctx: LoopContext) -> CommState:
    state = ctx.comm_state
    if state is None:
        if ctx.program.comm is None:
            raise RuntimeGraphError(
                f"actor {ctx.program.label} has communicator ops but no communicator set-up "
                "(ActorProgram.comm is missing: a cgraph bug)"
            )
        state = ctx.comm_state = CommState(ctx)
    return state


# --------------------------------------------------------------------------- handlers
# Each body runs where its op runs (inline or on the comm thread, in schedule order);
# a group that failed calls no communicator again (comm_faults).
def handle_send(op: Op, ctx: LoopContext) -> None:
    state = comm_state(ctx)
    key = (op.node, op.peer)
    writer, endpoint = state.writers[key], state.program.sends[key]
    origin = state.origin(endpoint.method)
    item = state.encoded.get(op.node)
    if item is None:
        direct = endpoint.hint is not None and endpoint.hint.direct_return
        item = state.encoded[op.node] = encode(ctx.value(op.node), node=op.node, direct_return=direct, origin=origin)
    faults = state.faults
    site = Site(endpoint.group, f"send of node {op.node} to {op.peer} (rank {endpoint.peer_rank})",
                endpoint.method, ctx.execution)

    def body() -> tuple[UserValue, list[torch.Tensor]]:
        if faults.failed(site.group):  # an upstream error still says what went wrong first
            error = item if isinstance(item, ErrorValue) else faults.later(site)
            writer.skip(error, faults.failed(site.group))
            return None, []
        try:
            writer.send(item, origin)
        except Exception as exc:  # noqa: BLE001 - a fault of the group, or re-raised (comm_faults)
            writer.retract(faults.fault(site, exc), faults.failed(site.group))
            faults.spread(site.group)  # after Failed is written: the woken reader finds it
        return None, []

    state.run(op, writer.comm, body)


def handle_recv(op: Op, ctx: LoopContext) -> None:
    """Receive ``op``'s value: for this execution, or for the next one (``op.ahead``)."""
    if op.ahead:
        values, execution = ctx.ahead_values, ctx.execution + 1
    elif op.node in ctx.values:  # issued ahead by the loop's start or the schedule before a switch
        return
    else:
        values, execution = ctx.values, ctx.execution
    state = comm_state(ctx)
    key = (op.node, op.peer)
    reader, endpoint = state.readers[key], state.program.recvs[key]
    faults = state.faults
    site = Site(endpoint.group, f"recv of node {op.node} from {op.peer} (rank {endpoint.peer_rank})",
                endpoint.method, execution)

    def body() -> tuple[UserValue, list[torch.Tensor]]:
        if faults.failed(site.group):
            return _found(faults, site, reader.skip(SETTLE_S)) or faults.later(site), []
        try:
            value, tensors = reader.recv()
        except Exception as exc:  # noqa: BLE001 - a fault of the group, or re-raised (comm_faults)
            error = faults.fault(site, exc)
            faults.spread(site.group)
            woken = isinstance(error.cause, CommunicatorError)  # by the abort: the writer may know why
            found = _found(faults, site, reader.settle(SETTLE_S if woken else 0))
            return found or error, []
        if reader.failure is not None:  # the writer's group failed (the only news of it across nodes)
            faults.learn(site.group, reader.failure)
        return value, tensors

    values[op.node] = state.run(op, reader.comm, body)


def issue_ahead(ctx: LoopContext) -> None:
    """Receive, for this execution, the values that the lane's RECVs issued ahead (``@comm+1``)
    would have started in the execution before: at the loop's start, and after a switch
    from a schedule that did not issue them (``ahead.py``)."""
    for op in ctx.program.ops:
        if op.ahead and op.node not in ctx.values:
            handle_recv(replace(op, ahead=False), ctx)


def handle_collective(op: Op, ctx: LoopContext) -> None:
    state = comm_state(ctx)
    endpoint = state.program.collectives[op.node]
    comm = state.comms[endpoint.group]
    value = ctx.value(endpoint.input)
    origin = state.origin(endpoint.method)
    faults = state.faults
    site = Site(endpoint.group, f"{endpoint.method} of collective node {op.node}", endpoint.method, ctx.execution)

    def body() -> tuple[UserValue, list[torch.Tensor]]:
        if faults.failed(site.group):
            return value if isinstance(value, ErrorValue) else faults.later(site), []
        try:
            return run_collective(endpoint, comm, value, origin)
        except Exception as exc:  # noqa: BLE001 - a fault of the group, or re-raised (comm_faults)
            error = faults.fault(site, exc)
            faults.spread(site.group)
            return error, []

    result = state.run(op, comm, body)
    if endpoint.output:
        ctx.values[endpoint.output] = result


def _found(faults: GroupFaults, site: Site, found: Failed | None) -> ErrorValue | None:
    """The error of a writer's ``Failed`` item, unless it only says the group failed (this
    member says that itself, with the best it knows of why, learnt from the item)."""
    if found is None:
        return None
    faults.learn(site.group, found.failure)
    return None if isinstance(found.error.cause, CommunicatorError) else found.error


# --------------------------------------------------------------------------- collectives
def _allreduce(comm: Communicator, t: torch.Tensor, op: str, algorithm: str = "auto") -> torch.Tensor:
    out = t.clone()
    comm.allreduce(out, _summed(op), **_named(algorithm))
    return _averaged(comm, out, op)


def _named(algorithm: str) -> dict[str, str]:
    """The ``algorithm`` argument, given only when a node names one: a user communicator
    whose collectives take none still runs every node that leaves it "auto"."""
    return {} if algorithm == "auto" else {"algorithm": algorithm}


def _summed(op: str) -> str:
    """The communicator's op: "avg" (Ray's AVG) is a sum, divided afterwards (``_averaged``)."""
    return "sum" if op == "avg" else op


def _averaged(comm: Communicator, out: torch.Tensor, op: str) -> torch.Tensor:
    """``out`` divided by the member count for "avg" (the same sum on every member: the same bits)."""
    if op == "avg":
        out.div_(comm.world_size)
    return out


def _allgather(comm: Communicator, t: torch.Tensor, op: str, algorithm: str = "auto") -> torch.Tensor:
    import torch

    parts = [torch.empty_like(t) for _ in range(comm.world_size)]
    comm.allgather(parts, t)
    return torch.cat(parts) if t.dim() else torch.stack(parts)


def _reducescatter(comm: Communicator, t: torch.Tensor, op: str, algorithm: str = "auto") -> torch.Tensor:
    out = t.new_empty((t.shape[0] // comm.world_size, *t.shape[1:]))
    comm.reducescatter(out, t.contiguous(), _summed(op))
    return _averaged(comm, out, op)


COLLECTIVES: dict[str, Callable[[Communicator, torch.Tensor, str, str], torch.Tensor]] = {
    "allreduce": _allreduce,
    "allgather": _allgather,
    "reducescatter": _reducescatter,
}
"""Each collective a DAG node can run: (communicator, input tensor, op, algorithm) -> result tensor."""


def run_collective(
    endpoint: CollectiveEndpoint, comm: Communicator, value: UserValue, origin: Callable[[Exception], ErrorValue]
) -> tuple[UserValue, list[torch.Tensor]]:
    """One member's part of a collective node; a member's bad input fails it on every member.

    The members first agree (``signatures.agree``: one MAX allreduce of a few
    integers) on whether every input is usable and whether all have one dtype and
    shape. If an input is not usable, the
    lowest such rank broadcasts its error value, so every member's result is that
    error (whichever member's result the driver reads, it raises the original
    exception); if the signatures differ, every member's result is the same
    ``CollectiveMismatchError`` (gloo would abort the process on such a call).
    Either way no member is left blocked and nothing was sent: the group lives on.
    """
    import torch

    problem = _input_problem(endpoint, comm, value)
    error = value if isinstance(value, ErrorValue) else origin(ValueError(problem)) if problem else None
    mark = 0 if error is None else comm.world_size - comm.rank  # MAX picks the lowest failing rank
    sig = [0] * signatures.LENGTH if error is not None else _signature(endpoint, value)

    def max_allreduce(values: list[int]) -> list[int]:
        flag = torch.tensor(values, dtype=torch.int64, device=comm.device)
        comm.allreduce(flag, "max")
        comm.synchronize()
        return [int(x) for x in flag.tolist()]

    failing, same = signatures.agree(mark, sig, max_allreduce)
    if failing:
        return _share_error(comm, error, comm.world_size - failing), []
    if not same:
        return origin(_mismatch(endpoint, comm, sig)), []
    out = COLLECTIVES[endpoint.method](comm, value.detach().to(comm.device), endpoint.op, endpoint.algorithm)
    return out, [out]


def _signature(endpoint: CollectiveEndpoint, value: torch.Tensor) -> list[int]:
    op = None if endpoint.method == "allgather" else as_reduce_op(_summed(endpoint.op))
    return signatures.encode(endpoint.method, value, op)


def _mismatch(endpoint: CollectiveEndpoint, comm: Communicator, sig: list[int]) -> CollectiveMismatchError:
    """Every member's signature (one allgather, on this rare path), described."""
    import torch

    mine = torch.tensor(sig, dtype=torch.int64, device=comm.device)
    rows = [torch.empty_like(mine) for _ in range(comm.world_size)]
    comm.allgather(rows, mine)
    comm.synchronize()
    calls = "; ".join(f"rank {r}: {signatures.describe(row.tolist())}" for r, row in enumerate(rows))
    return CollectiveMismatchError(
        f"collective {endpoint.node}: the members' tensors differ ({calls}); every member must "
        "pass a tensor of the same dtype and shape. Nothing was sent: the next execution can run.",
        rank=comm.rank)


def _share_error(comm: Communicator, error: ErrorValue | None, src: int) -> ErrorValue:
    """Rank ``src``'s error value on every member: its pickled size, then its bytes, broadcast."""

    import torch

    data = pickle.dumps(error) if comm.rank == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=comm.device)
    comm.broadcast(size, src)
    comm.synchronize()
    if comm.rank == src:
        comm.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(comm.device), src)
        comm.synchronize()
        assert error is not None
        return error
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=comm.device)
    comm.broadcast(buf, src)
    comm.synchronize()
    return pickle.loads(buf.cpu().numpy().tobytes())  # type: ignore[no-any-return]


def _input_problem(endpoint: CollectiveEndpoint, comm: Communicator, value: UserValue) -> str | None:
    import torch

    if isinstance(value, ErrorValue):
        return value.message
    if endpoint.method not in COLLECTIVES:
        return f"collective {endpoint.node}: unknown collective {endpoint.method!r}; use one of {sorted(COLLECTIVES)}"
    offered = tuple(getattr(comm, "algorithms", ()))
    if endpoint.algorithm != "auto" and endpoint.algorithm not in offered:
        return (f"collective {endpoint.node} ({endpoint.method}): this group's communicator "
                f"({type(comm).__name__}) offers algorithm 'auto'{' or one of ' + str(list(offered)) if offered else ' only'}, "
                f"not {endpoint.algorithm!r}; the CPU communicator and gloo run cgraph's algorithms by name")
    if not isinstance(value, torch.Tensor):
        return f"collective {endpoint.node} takes one torch.Tensor per member, got {type(value).__name__}"
    if endpoint.op == "avg" and endpoint.method != "allgather" and not (value.is_floating_point() or value.is_complex()):
        return (f"collective {endpoint.node} ({endpoint.method}): op AVG divides the sum by the member count, "
                f"which needs a floating dtype, not {value.dtype}; use SUM, or a float tensor")
    if endpoint.method == "reducescatter" and (value.dim() == 0 or value.shape[0] % comm.world_size):
        return (f"collective {endpoint.node} (reducescatter): the first dimension of {tuple(value.shape)} "
                f"must be a multiple of the {comm.world_size} members")
    return None

