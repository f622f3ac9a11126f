"""What ``execute`` returns, and the reading half of a compiled graph behind it.

Refs and futures are read once, with ``get()`` or ``ray.get`` / ``await``:
``CompiledRef`` subclasses Ray's ``CompiledDAGRef`` so that ``ray.get(ref)`` and
``ray.get([ref, ...])`` dispatch to ``ref.get()`` exactly as they do for Ray's own
compiled refs (``CompiledFuture`` likewise Ray's ``CompiledDAGFuture``). A ref reads
through its graph (the ``Results`` protocol), which asks its ``Outputs``.

``CompiledGraph`` owns one ``Outputs`` (and one ``GraphState``, which both read):
the output channels are read one execution at a time, strictly in execution
order (reading execution 5 first buffers 0..4, within ``max_buffered_results``);
a multi-output execution's outputs are each read once, and an error in any of
them is every output's result, as in Ray. ``Outputs.lock`` guards the reading;
``discard`` (a ref dropped unread, from ``__del__``) takes it itself, or queues
the drop for whoever holds it.

    GraphState    failure (the monitor's verdict), torn_down, closed_error(cause)
    Outputs       get(i, timeout, output), discard(i, output): for refs
                  keep_inputs / drop_inputs / expect / make_room: for execute()
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, NoReturn, Protocol

from ray.experimental.compiled_dag_ref import CompiledDAGFuture, CompiledDAGRef

from cgraph._boundary import UserValue
from cgraph.errors import (
    CapacityError,
    ChannelClosedError,
    ChannelTimeoutError,
    GraphTornDownError,
    RefConsumedError,
    RuntimeGraphError,
    TimeoutError,
    add_note,
    with_compat,
)
from cgraph.runtime.error_value import ErrorValue
from cgraph.runtime.monitor import DEATH_GRACE_S
from cgraph.runtime.node_loss import PROBE_S
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.where import ASK_TIMEOUT_S

if TYPE_CHECKING:
    from cgraph.runtime.endpoints import CopyingReader
    from cgraph.runtime.recording import Recorder


VERDICT_S = DEATH_GRACE_S + ASK_TIMEOUT_S + PROBE_S + 2.0
"""How long a waiter whose channel closed under it waits for the monitor's verdict: the
death grace, the where-record's question to every actor, the raylet's probe, and slack."""


class GraphState:
    """Whether a graph still runs, and why not: the monitor's verdict, or its teardown."""

    def __init__(self) -> None:
        self.failure: RuntimeGraphError | None = None
        self.torn_down = False
        self.failed = threading.Event()  # set with ``failure``, by the monitor

    def fail(self, error: RuntimeGraphError) -> None:
        """The monitor's verdict (the first one stays); wakes who waits for it."""
        if self.failure is None:
            self.failure = with_compat(error)
        self.failed.set()

    def check_usable(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.torn_down:
            raise with_compat(
                GraphTornDownError("this compiled graph was torn down; compile the DAG again to run it")
            )

    def closed_error(self, cause: ChannelClosedError | None = None) -> RuntimeGraphError:
        """Why a driver channel closed under a waiter: the monitor's verdict, else teardown.

        A channel that closes or ends while the graph is not torn down (a socket whose
        writer vanished, a survivor's loop that ended on a lost peer) closes before the
        monitor has said why (it waits ``DEATH_GRACE_S`` for a death, then asks where
        each actor is and whether a node was lost): the waiter waits ``VERDICT_S`` for
        its verdict, and reports the channel's own error if none comes.
        """
        if not self.torn_down:  # a close the user did not ask for: a failure the monitor is reporting
            self.failed.wait(VERDICT_S)
            if self.failure is None and cause is not None:
                return with_compat(cause)
        if self.failure is not None:
            return self.failure
        return with_compat(
            GraphTornDownError("the compiled graph was torn down while waiting for a result")
        )


class WouldBlock(Exception):  # noqa: N818 - control flow between execute() and its callers
    """A non-blocking submit (execute_async's first try) would have to wait."""


class OutputEnds(Protocol):
    """What ``Outputs`` reads through: the driver's endpoints (``compiled_graph.DriverEndpoints``)."""

    @property
    def output_readers(self) -> Mapping[str, CopyingReader]: ...  # output node -> reader

    @property
    def output_spec(self) -> tuple[tuple[str, int | str | None], ...]: ...  # ("node", id) | ("input", key)


class Outputs:
    """Reads, buffers and hands out the outputs of executions (see the module docstring).

    Args:
        endpoints: the driver's endpoints (``output_readers``, ``output_spec``).
        multi_output: a MultiOutputNode's graph (one ref per output).
        recorder: the timeline's recorder, or None when the graph records none.
    """

    def __init__(self, options: CompileOptions, endpoints: OutputEnds, multi_output: bool,
                 recorder: Recorder | None, state: GraphState) -> None:
        self.options = options
        self._ep = endpoints
        self._multi_output = multi_output
        self._recorder = recorder
        self._state = state
        self.where: Callable[[], str] | None = None  # each actor's where-record, one line (set by the graph)
        self.lock = threading.RLock()
        self._dropped: collections.deque[tuple[int, int | None]] = collections.deque()
        self._next_read = 0
        self._partial: dict[str, UserValue] = {}
        self._results: dict[int, list[UserValue]] = {}
        self._discarded: set[int] = set()
        self._unread: dict[int, int] = {}  # multi-output: outputs not yet read or dropped
        self._inputs_kept: dict[int, tuple[tuple[UserValue, ...], dict[str, UserValue]]] = {}
        self._keeps_inputs = any(kind == "input" for kind, _ in endpoints.output_spec)
        # one output, a node's value: get() reads it straight from its channel (_get_single)
        self._single = (next(iter(endpoints.output_readers.values()))
                        if not multi_output and len(endpoints.output_readers) == 1
                        and [k for k, _ in endpoints.output_spec] == ["node"] else None)

    # ------------------------------------------------------------------ for execute()
    def keep_inputs(self, index: int, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> None:
        """Before execution ``index`` is written: an output that is the input itself needs them."""
        if self._keeps_inputs:
            self._inputs_kept[index] = (args, kwargs)

    def drop_inputs(self, index: int) -> None:
        """Execution ``index`` was never written."""
        self._inputs_kept.pop(index, None)

    def expect(self, index: int) -> None:
        """Execution ``index`` is written: each of its outputs is to be read or dropped."""
        if self._multi_output:
            self._unread[index] = len(self._ep.output_spec)

    @property
    def taken(self) -> int:
        """How many executions' results were taken from the output channels (read or kept)."""
        return self._next_read

    def make_room(self, submitted: int, blocking: bool) -> None:
        """Room for execution ``submitted`` in the channels; reads away executions whose
        refs were all dropped, if that is what fills them.

        With ``on_full="wait"`` it reads the oldest execution's results instead of
        raising, waiting up to ``submit_timeout`` for them, and keeps them for its refs.

        Raises:
            CapacityError: ``max_inflight_executions`` executions wait to be read (with
                "wait": the oldest did not finish within ``submit_timeout``, or keeping
                its result would pass ``max_buffered_results``).
            WouldBlock: ``blocking`` is False and a get() holds the lock, or it would wait.
        """
        try:
            self._make_room(submitted, blocking)
        except _Full as full:  # outside the lock: the message asks the actors where they are
            raise with_compat(CapacityError(
                f"execute waited {self.options.submit_timeout} s (submit_timeout) for "
                f"execution {full.index}, the oldest of {self.options.max_inflight_executions} in "
                "flight, to finish (on_full='wait'); nothing was submitted, the graph is "
                f"still usable. Where each actor is: {self._where_line()}")) from None
        except _NotYet as late:
            raise self._timeout_error(late.index, self.options.get_timeout) from None

    def _make_room(self, submitted: int, blocking: bool) -> None:
        limit = self.options.max_inflight_executions
        waits = self.options.on_full == "wait"
        deadline = deadline_after(self.options.submit_timeout) if waits else None
        while submitted - self._next_read >= limit:
            if not self.lock.acquire(blocking=blocking):  # a get() is reading: wait for it
                raise WouldBlock
            try:
                self._apply_dropped()
                if submitted - self._next_read < limit:
                    break
                if self._next_read not in self._discarded:
                    if waits:
                        if not blocking:
                            raise WouldBlock  # execute_async waits in a worker thread
                        self._wait_for_oldest(deadline)
                        continue
                    inflight = submitted - self._next_read
                    raise with_compat(CapacityError(
                        f"The compiled graph can't have more than {limit} in-flight executions, "
                        f"and you currently have {inflight} in-flight executions. Retrieve an "
                        "output using ray.get before submitting more requests or increase "
                        "`_max_inflight_executions`. (cgraph: their results are not yet taken "
                        "from the graph; call get() on earlier refs first, or compile with a "
                        "larger max_inflight_executions.)"))
                self._read_next(deadline=deadline_after(self.options.get_timeout))
            finally:
                self.lock.release()

    def _wait_for_oldest(self, deadline: float | None) -> None:
        """``on_full="wait"``: read the oldest execution in flight into the buffer (its
        refs read it from there). Hold ``lock``.

        Raises:
            CapacityError: the buffer is full.
            _Full: it did not finish by ``deadline`` (``make_room`` says so, outside the lock).
        """
        self._check_buffer_room()
        try:
            self._read_next(deadline)
        except _NotYet as late:
            raise _Full(late.index) from None

    # ------------------------------------------------------------------ for refs
    def get(self, index: int, timeout: float | None, output: int | None = None) -> UserValue:
        """Execution ``index``'s result, or only its output number ``output``."""
        try:
            if self._recorder is None:
                return self._take_result(index, timeout, output)
            start = time.perf_counter_ns()
            try:
                return self._take_result(index, timeout, output)
            finally:
                self._recorder.add("get", "driver", index, start, time.perf_counter_ns())
        except _NotYet as late:  # outside the lock: the message asks the actors where they are
            raise self._timeout_error(late.index, self.options.get_timeout if timeout is None else timeout) from None

    def _take_result(self, index: int, timeout: float | None, output: int | None = None) -> UserValue:
        if timeout is None:
            timeout = self.options.get_timeout
        deadline = deadline_after(timeout)
        with self.lock:
            if self._dropped:
                self._apply_dropped()
            if index not in self._results:
                if self._state.failure is not None:
                    raise self._state.failure
                if self._state.torn_down:
                    raise with_compat(GraphTornDownError(
                        "the compiled graph was torn down before this result was read"))
                if self._single is not None and index == self._next_read and not self._partial:
                    return self._get_single(index, deadline)
                try:
                    while self._next_read <= index:
                        if self._next_read < index:
                            self._check_buffer_room()
                        self._read_next(deadline, want=index)
                except _EarlyError as early:  # another output of it failed: so does this read
                    # As in Ray, the execution is finished: the error is every output's
                    # result, buffered for the other refs; its outputs still in flight are
                    # read away and dropped, also by execute() when it needs the room.
                    self._results[index] = [early.error] * len(self._ep.output_spec)
                    self._discarded.add(index)
                    if output is not None:
                        self._output_done(index)
                    raise early.error.to_exception() from None
            if output is None:
                return self._finish(self._results.pop(index))
            values = self._results[index]
            self._output_done(index)
            # as in Ray: an error in any output of an execution is every output's result
            error = next((v for v in (values[output], *values) if type(v) is ErrorValue), None)
            if error is not None:
                raise error.to_exception()
            return values[output]

    def ready(self, index: int, deadline: float | None) -> bool:
        """Whether ``get`` of execution ``index`` would answer without waiting (a value, or
        an error at once). Reads the executions up to ``index`` that have arrived, as a
        get() of a later ref does (their results wait in the buffer for their refs),
        waiting for them until ``deadline`` (None: no limit; past: not at all)."""
        if not self.lock.acquire(timeout=-1 if deadline is None else _remaining(deadline) or 0):
            return False  # a get() is reading in another thread: not ready by the deadline
        try:
            if self._dropped:
                self._apply_dropped()
            if index in self._results or index < self._next_read:
                return True  # read, or already taken by its ref (a second get raises at once)
            if self._state.failure is not None or self._state.torn_down:
                return True  # get raises at once
            while self._next_read <= index:
                if self._next_read < index:
                    self._check_buffer_room()  # full: get raises CapacityError at once (below)
                try:
                    self._read_next(deadline, want=index)
                except _NotYet:
                    return False
                except _EarlyError:
                    return True  # an output failed: get raises at once
            return True
        except RuntimeGraphError:
            return True  # the graph failed, or the buffer is full: get raises at once
        finally:
            self.lock.release()

    def _check_buffer_room(self) -> None:
        """Before taking an earlier execution's results to buffer them."""
        limit = self.options.max_buffered_results
        if len(self._results) >= limit and self._next_read not in self._discarded:
            raise with_compat(CapacityError(
                f"The compiled graph can't have more than {limit} buffered results, and you "
                f"currently have {len(self._results)} buffered results. Call `ray.get()` on "
                "CompiledDAGRef's (or await on CompiledDAGFuture's) to retrieve results, or "
                "increase `_max_buffered_results` if buffering is desired. (cgraph: a later "
                "execution was read before them; compile with a larger max_buffered_results.)"))

    def _get_single(self, index: int, deadline: float | None) -> UserValue:
        """``get`` of the next execution of a one-output graph, without the
        bookkeeping of several outputs (most calls: execute, then get)."""
        reader = self._single
        assert reader is not None  # only graphs with one output read this way
        try:
            value = reader.read(timeout=_remaining(deadline))
        except ChannelTimeoutError:
            raise _NotYet(index) from None
        except ChannelClosedError as exc:
            raise self._state.closed_error(exc) from None
        except RuntimeGraphError:
            raise
        except Exception as exc:  # noqa: BLE001 - the slot is released; the execution is read
            value = _unreadable(exc, index)
        reader.release()
        self._next_read += 1
        if type(value) is ErrorValue:
            raise value.to_exception()
        return value

    def _timeout_error(self, index: int, waited: float | None) -> Exception:
        """A get's timeout: where each actor is (``where.py``) when the get waited at least
        ``WHERE_AFTER_S`` (a poll with a tiny timeout does not ask every actor)."""
        where = (f" Where each actor is: {self._where_line()}" if waited is not None and waited >= WHERE_AFTER_S
                 else " (compiled.status() says where each actor is)")
        return with_compat(TimeoutError(
            f"execution {index} did not finish in time; the graph is still usable "
            f"and the result can be read again.{where}"))

    def _where_line(self) -> str:
        if self.where is None:
            return "unknown (this graph was started without cgraph.compile)"
        try:
            return self.where()
        except Exception as exc:  # noqa: BLE001 - the timeout itself must still be raised
            return f"unknown ({type(exc).__name__}: {exc})"

    def _output_done(self, index: int) -> bool:
        """One output of a multi-output execution is read or dropped; True when it was
        the last, and the execution's buffered result is gone."""
        left = self._unread.get(index, 1) - 1
        if left > 0:
            self._unread[index] = left
            return False
        self._unread.pop(index, None)
        self._forget(index)
        return True

    def _forget(self, index: int) -> None:
        """No ref will read execution ``index`` any more: drop its results, now if
        they are buffered, else when they are taken from the channels."""
        if self._results.pop(index, None) is None and index >= self._next_read:
            self._discarded.add(index)
        self._inputs_kept.pop(index, None)

    def discard(self, index: int, output: int | None = None) -> None:
        """A ref was dropped unread (from ``__del__``: any thread, any moment). Queued,
        and applied now only if ``lock`` is free: a get() may hold it for long."""
        if self._state.torn_down:
            return
        self._dropped.append((index, output))
        if self.lock.acquire(blocking=False):
            try:
                self._apply_dropped()
            finally:
                self.lock.release()

    def _apply_dropped(self) -> None:
        """With ``lock`` held: forget the results of the refs dropped unread."""
        while self._dropped:
            index, output = self._dropped.popleft()
            if output is None:
                self._forget(index)
            else:  # forgotten once no output of the execution is left to read
                self._output_done(index)

    def _read_next(self, deadline: float | None, want: int = -1) -> None:
        """Read every output of execution ``_next_read`` (resuming after a timeout).

        Raises ``_EarlyError`` when ``want`` is that execution and one of its outputs
        holds an error while others are still in flight (Ray raises it at once too);
        the outputs still to come are read by the next call.
        """
        index = self._next_read
        pending = [(n, r) for n, r in self._ep.output_readers.items() if n not in self._partial]
        if index == want and pending:  # an output that failed before: no need to wait for the rest
            error = next((v for v in self._partial.values() if type(v) is ErrorValue), None)
            if error is not None:
                raise _EarlyError(error)
        while pending:
            # one output: wait on it; several: wait on the first a little at a time,
            # taking any other that is already there, so an error is seen early
            wait = _remaining(deadline) if len(pending) == 1 else _poll(deadline)
            first = pending[0][0]
            for node, reader in pending:
                try:
                    value = reader.read(timeout=wait if node == first else 0)
                except ChannelTimeoutError:
                    continue
                except ChannelClosedError as exc:
                    raise self._state.closed_error(exc) from None
                except RuntimeGraphError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the slot is released
                    value = _unreadable(exc, index)
                reader.release()
                self._partial[node] = value
                if type(value) is ErrorValue and index == want and len(pending) > 1:
                    raise _EarlyError(value)
            pending = [(n, r) for n, r in pending if n not in self._partial]
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise _NotYet(index)
        self._store(index)

    def _store(self, index: int) -> None:
        """Execution ``index``'s outputs are all read: keep them for its refs. A dropped
        execution's are not built at all (``_forget`` already let its inputs go)."""
        if index in self._discarded:
            self._discarded.discard(index)
        else:
            self._results[index] = [self._output_value(kind, what, index)
                                    for kind, what in self._ep.output_spec]
        self._partial.clear()
        self._inputs_kept.pop(index, None)
        self._next_read += 1

    def _output_value(self, kind: str, what: int | str | None, index: int) -> UserValue:
        if kind == "node":
            assert isinstance(what, str)  # ("node", node id)
            return self._partial[what]
        args, kwargs = self._inputs_kept.get(index, ((), {}))
        if what is None:
            return args[0]
        return args[what] if isinstance(what, int) else kwargs[what]

    def _finish(self, values: list[UserValue]) -> UserValue:
        for value in values:
            if isinstance(value, ErrorValue):
                raise value.to_exception()
        return values if self._multi_output else values[0]


class _EarlyError(Exception):  # noqa: N818 - control flow inside this module
    def __init__(self, error: ErrorValue) -> None:
        self.error = error


class _NotYet(Exception):  # noqa: N818 - control flow inside this module (not a graph error)
    """Execution ``index`` did not finish by the deadline: a get raises ``TimeoutError``
    (built outside the lock), ``wait`` and ``on_full="wait"`` say so their own way."""

    def __init__(self, index: int) -> None:
        self.index = index


class _Full(_NotYet):
    """``on_full="wait"``: the oldest execution did not finish within ``submit_timeout``."""


WHERE_AFTER_S = 0.5
"""A get that waited at least this long says in its timeout where each actor is."""


_POLL_S = 0.01
"""While several outputs of one execution are awaited, how often the others are checked."""


def _poll(deadline: float | None) -> float:
    return _POLL_S if deadline is None else min(_POLL_S, max(0.0, deadline - time.monotonic()))


def deadline_after(timeout: float | None) -> float | None:
    """None or negative (Ray's -1): no deadline."""
    return None if timeout is None or timeout < 0 else time.monotonic() + timeout


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _unreadable(exc: Exception, index: int) -> ErrorValue:
    """An output the driver took but cannot unpickle (a class from a module only the
    actors have): that execution's error, not a gap that would shift every later
    result by one."""
    add_note(exc, "cgraph: the driver could not unpickle this output")
    return ErrorValue.capture(exc, actor="driver", method="<read output>", execution_index=index)


# --------------------------------------------------------------------------- refs and futures
class Results(Protocol):
    """What a ref reads its result from: the compiled graph (``CompiledGraph``)."""

    def get_id(self) -> str: ...

    def _get_result(self, index: int, timeout: float | None, output: int | None = None) -> UserValue: ...

    def _discard_result(self, index: int, output: int | None = None) -> None: ...

    def _result_ready(self, index: int, deadline: float | None) -> bool: ...


class _RayText:
    """Ray's text for a compiled ref or future (``CompiledDAGRef(<graph id>,
    execution_index=i, channel_index=k)``: ``k`` the output of a MultiOutputNode, None for
    a graph's whole result) and Ray's refusals to copy or pickle one."""

    _ray_name = ""

    def _fields(self) -> tuple[Results, int, int | None]:
        raise NotImplementedError

    def __str__(self) -> str:
        graph, index, output = self._fields()
        return f"{self._ray_name}({graph.get_id()}, execution_index={index}, channel_index={output})"

    __repr__ = __str__

    def __copy__(self) -> NoReturn:
        raise ValueError(f"{self._ray_name} cannot be copied.")

    def __deepcopy__(self, memo: dict[int, object]) -> NoReturn:
        raise ValueError(f"{self._ray_name} cannot be deep copied.")

    def __reduce__(self) -> NoReturn:
        raise ValueError(f"{self._ray_name} cannot be pickled. (cgraph: nor passed to another task "
                         "or actor; read it in the process that executed the graph.)")


class CompiledRef(_RayText, CompiledDAGRef):
    """The result of one execution. ``get()`` may be called once."""

    _ray_name = "CompiledDAGRef"

    def __init__(  # noqa: D107
        self, graph: Results, execution_index: int, output: int | None = None
    ) -> None:
        # Ray's __init__ expects its own CompiledDAG; set the fields we use directly.
        self._graph = graph
        self._execution_index = execution_index
        self._output = output  # which output of a MultiOutputNode; None: the whole result
        self._consumed = False

    @property
    def execution_index(self) -> int:
        """The index of the execution this ref belongs to (0 for the first ``execute``)."""
        return self._execution_index

    def get(self, timeout: float | None = None) -> UserValue:
        """Wait for and return this execution's result (a list for MultiOutputNode).

        Raises:
            cgraph.TaskError: a method in the graph raised (original type preserved).
            cgraph.TimeoutError: ``timeout`` expired (``None``: the graph's get_timeout;
                negative: no limit); the ref can be read again later.
            cgraph.CapacityError: reading it would buffer more than
                ``max_buffered_results`` earlier results; it can be read again later.
            cgraph.ActorDiedError: an actor of the graph died.
            cgraph.RefConsumedError: this ref was already read.
        """
        if self._consumed:
            raise RefConsumedError(
                "ray.get() can only be called once on a CompiledDAGRef, and it was already "
                f"called. (cgraph: the result of execution {self._execution_index} was already "
                "read; keep the value the first get() returned.)"
            )
        try:
            value = self._graph._get_result(self._execution_index, timeout, self._output)
        except (TimeoutError, CapacityError):
            raise  # still unread: get() may be called again
        except BaseException:
            self._consumed = True  # the error was this ref's result
            raise
        self._consumed = True
        return value

    def _fields(self) -> tuple[Results, int, int | None]:
        return self._graph, self._execution_index, self._output

    def _ready(self, deadline: float | None) -> bool:
        """Whether ``get()`` would answer at once (``cgraph.wait``), waiting until ``deadline``."""
        return self._consumed or self._graph._result_ready(self._execution_index, deadline)

    def _drop(self) -> None:
        """Give up this result unread (its slot is freed as if the ref were deleted)."""
        if not self._consumed:
            self._consumed = True
            self._graph._discard_result(self._execution_index, self._output)

    def __del__(self) -> None:
        graph = getattr(self, "_graph", None)
        if graph is not None and not self._consumed:
            graph._discard_result(self._execution_index, self._output)


class CompiledRefList(list):  # type: ignore[type-arg]
    """The refs of one execution of a MultiOutputNode graph, one per output.

    A plain list to Ray (``ray.get(refs)``, ``a, b = refs``, ``refs[1].get()``),
    as Ray's Compiled Graphs return; ``get()`` reads every output in order.
    """

    def get(self, timeout: float | None = None) -> list[UserValue]:
        """Every output's value, in order. An output's error is raised and the
        outputs after it are dropped (the execution was read as a whole); a
        timeout or a CapacityError leaves the unread ones readable."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        values = []
        for i, ref in enumerate(self):
            try:
                values.append(
                    ref.get(None if deadline is None else max(0.0, deadline - time.monotonic()))
                )
            except (TimeoutError, CapacityError):
                raise  # this one and the rest stay readable
            except BaseException:
                for rest in self[i + 1 :]:
                    rest._drop()
                raise
        return values


class CompiledFuture(_RayText, CompiledDAGFuture):
    """An awaitable result, from ``await compiled.execute_async(...)``; awaited once.

    Subclasses Ray's ``CompiledDAGFuture`` (``isinstance`` checks hold); the result
    is read by a worker thread, so the event loop never blocks.
    """

    _ray_name = "CompiledDAGFuture"

    def __init__(self, ref: CompiledRef) -> None:  # noqa: D107 - Ray's __init__ wants its own DAG
        self._ref = ref
        self._awaited = False

    def _fields(self) -> tuple[Results, int, int | None]:
        return self._ref._fields()

    def __await__(self) -> Generator[object, None, UserValue]:
        if self._awaited:
            raise RefConsumedError(
                "CompiledDAGFuture can only be awaited upon once, and it has already been "
                f"awaited upon. (cgraph: execution {self._ref.execution_index}.)")
        self._awaited = True
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self._ref.get).__await__()

    def __del__(self) -> None:
        pass  # the ref it holds gives its result up when it goes (CompiledRef.__del__)


class CompiledFutureList(list):  # type: ignore[type-arg]
    """One future per output of a MultiOutputNode; awaiting the list gives every value."""

    def __await__(self) -> Generator[object, None, list[UserValue]]:
        return asyncio.gather(*self).__await__()
