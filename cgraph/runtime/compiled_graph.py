"""The driver side of a compiled graph: ``execute``, ``get``, ``teardown``.

    execute(x) ──write (args, kwargs)──► input channel ──► actor loops ──► output channels
        │                                                                    │
        └── CompiledRef(i) ── get() ── reads executions in order ◄───────────┘
                                      (earlier ones are buffered)

Executions are numbered; output channels are read strictly in execution order,
so reading execution 5 first buffers the results of 0..4. As in Ray, at most
``max_inflight_executions`` executions may be submitted and not yet taken from
the output channels, and at most ``max_buffered_results`` taken but not yet
read; one more raises ``CapacityError`` instead of hanging. A failure anywhere
(an actor death seen by the monitor, a teardown) closes every channel, which
wakes every waiter on the driver and in every actor.

The reading half is an object the graph owns (``results.Outputs``). Two locks, so
that a get() waiting for a slow result never holds up execute() (``await
execute_async`` in one coroutine while another awaits a result):

    _submit_lock    execute(): the input channel and the execution counter
    _outputs.lock   get(): the output channels (read one execution at a time)
                    and the buffered results; execute() takes it only to read
                    away dropped executions when it is out of room

A ref dropped unread (``__del__``, from any thread) only queues its index;
whoever holds ``_outputs.lock`` next applies it.

``execute``'s arguments are checked where it is called, against how the DAG reads
them (``InputUsage``), with Ray's sentence first.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import ray

from cgraph._boundary import ActorHandle, UserValue
from cgraph._log import logger
from cgraph.errors import (
    ActorDiedError,
    CapacityError,
    ChannelClosedError,
    ChannelLostError,
    ChannelTimeoutError,
    ExecuteArgumentError,
    GraphTornDownError,
    NodeDiedError,
    RuntimeGraphError,
    TaskError,
    TimeoutError,
    register_compat,
    with_compat,
)
from cgraph.runtime import where
from cgraph.runtime.auto_overlap import AutoOverlap
from cgraph.runtime.monitor import WATCHER, LoopEnds, LoopMonitor
from cgraph.runtime.node_loss import node_lost
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.recording import Recorder
from cgraph.runtime.results import (
    CompiledFuture,
    CompiledFutureList,
    CompiledRef,
    CompiledRefList,
    GraphState,
    Outputs,
    WouldBlock,
)
from cgraph.runtime.timeline import TIMELINE_ENV, Track, collect, records
from cgraph.scheduler.decide import Decision

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelWriter
    from cgraph.ir import Graph
    from cgraph.runtime.endpoints import CopyingReader, FanOutWriter
    from cgraph.scheduler import Planned, Schedule

# Code written for Ray Compiled Graphs catches Ray's classes: cgraph's errors are
# instances of those too (and of cgraph's own, and of the user's exception type).
register_compat(TaskError, ray.exceptions.RayTaskError)
register_compat(ActorDiedError, ray.exceptions.ActorDiedError, ray.exceptions.RayChannelError)
register_compat(NodeDiedError, ray.exceptions.NodeDiedError, ray.exceptions.ActorDiedError,
                ray.exceptions.RayChannelError)
register_compat(
    TimeoutError, ray.exceptions.RayChannelTimeoutError, ray.exceptions.GetTimeoutError
)
register_compat(CapacityError, ray.exceptions.RayCgraphCapacityExceeded)
register_compat(GraphTornDownError, ray.exceptions.RayChannelError)
register_compat(ChannelLostError, ray.exceptions.RayChannelError)

_LIVE: weakref.WeakSet[CompiledGraph] = weakref.WeakSet()
_IDS = itertools.count()


@dataclass(frozen=True)
class InputUsage:
    """How the DAG reads ``execute``'s arguments, to check them at the call site."""

    whole: bool  # the InputNode itself is an argument somewhere
    positions: frozenset[int]
    keys: frozenset[str]

    @functools.cached_property
    def need(self) -> int:
        """How many positional arguments ``execute`` takes (as Ray counts them)."""
        return 1 if self.whole else max(self.positions, default=-1) + 1

    def check(self, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> None:
        """Raise ``ExecuteArgumentError`` (a ``ValueError``, with Ray's sentence first) when
        ``execute``'s arguments do not fit how the DAG reads them."""
        need = self.need
        if len(args) != need:
            raise ExecuteArgumentError(f"{_RAY} {need} positional args, got {len(args)}: {self._why()}")
        if self.whole and kwargs:
            raise ExecuteArgumentError(
                f"{_RAY} {need} positional args and no keyword arguments, got "
                f"{', '.join(sorted(kwargs))}: {self._why()}")
        for key in sorted(self.keys):
            if key not in kwargs:
                raise ExecuteArgumentError(
                    f"{_RAY} kwarg `{key}`: this graph reads inp.{key}; got keyword arguments "
                    f"{sorted(kwargs) or 'none'}")

    def _why(self) -> str:
        if self.whole:
            return ("this graph passes the InputNode itself to a method, so execute() takes exactly "
                    "one positional argument (use inp[i] / inp.key to read several)")
        if self.positions:
            return f"this graph reads inp[{self.need - 1}]"
        return "this graph reads no positional argument" + (
            f" (only inp.{sorted(self.keys)[0]} and other keywords)" if self.keys else "")


_RAY = "dag.execute() or dag.execute_async() must be called with"
"""Ray's sentence for execute() arguments that do not fit the DAG (users search for it)."""


class DriverResource(Protocol):
    """What the driver made for a graph (a channel, other nodes' segments, the communicators):
    closed at teardown or after a death, then unlinked."""

    def close(self) -> None: ...

    def unlink(self) -> object: ...


class Tracer(Protocol):
    """What the runtime uses of ``cgraph.visualize`` (the compiler hands it the module)."""

    def trace_of(self, tracks: Iterable[Track], notes: Mapping[str, str] | None = None) -> Mapping[str, object]: ...

    def collective_notes(self, graph: Graph) -> Mapping[str, str]: ...

    def explain(self, tracks: Iterable[Track], planned: Planned | None = None,
                cores: int | None = None) -> Mapping[str, object]: ...

    def durations(self, tracks: Iterable[Track]) -> dict[str, float]: ...

    def draw_timeline(self, tracks: Iterable[Track], path: str | os.PathLike[str], executions: int = 3) -> Path: ...


@dataclass
class DriverEndpoints:
    input_writer: ChannelWriter | FanOutWriter | None  # writes (args, kwargs), or None when no actor reads the input
    output_readers: dict[str, CopyingReader]  # output node -> reader
    output_spec: tuple[tuple[str, int | str | None], ...]  # per output position: ("node", id) | ("input", key)
    resources: list[DriverResource]  # channel resources to close and unlink at teardown


class CompiledGraph:
    """A compiled DAG, ready to execute many times. Build it with ``cgraph.compile``."""

    def __init__(
        self,
        *,
        graph: Graph,
        planned: Planned,
        options: CompileOptions,
        endpoints: DriverEndpoints,
        input_usage: InputUsage,
        loops: LoopEnds | None,
        labels: dict[str, str],
        multi_output: bool,
        handles: dict[str, ActorHandle] | None = None,
        on_teardown: Callable[[], None] = lambda: None,
        tag: str = "",
        auto: AutoOverlap | None = None,
    ) -> None:
        self.graph_id = next(_IDS)
        self.graph = graph
        self.planned = planned
        self.options = options
        self._ep = endpoints
        self._input_usage = input_usage
        self._loops = loops
        self._handles = handles or {}
        self._labels = labels
        self._multi_output = multi_output
        self._on_teardown = on_teardown
        self._submit_lock = threading.Lock()
        self._teardown_lock = threading.Lock()
        self._submitted = 0
        self._monitor: LoopMonitor | None = None
        self.drawer: Callable[..., str] | None = None  # compiler.draw_schedule(planned, filename, format=, ...): set by the compiler
        self.tracer: Tracer | None = None  # cgraph.visualize (trace_of, explain, draw_timeline): set by the compiler
        self._tag = tag
        self._auto = auto
        self._recorder = Recorder(2 * options.timeline_executions) if records(options) else None
        self._state = GraphState()
        self._outputs = Outputs(options, endpoints, multi_output, self._recorder, self._state)
        self._outputs.where = lambda: self.status().line()
        self._describer: where.Describer | None = None
        _LIVE.add(self)
        _torn_down_by_ray_shutdown(self)

    # ------------------------------------------------------------------ public API
    @property
    def schedule(self) -> Schedule:
        """Per actor id, the ops its loop runs for one execution (with
        ``overlap_gpu_communication="auto"``: the schedule chosen, or running until then)."""
        return self._auto.schedule() if self._auto is not None else self.planned.schedule

    @property
    def overlap_decision(self) -> Decision | None:
        """With ``overlap_gpu_communication="auto"``: what it chose, both predictions and the
        op durations behind them (``str()`` says it in a line); None until it decided (after
        ``auto_executions`` results were read) and for the other settings."""
        return self._auto.decision if self._auto is not None else None

    def execute(self, *args: UserValue, **kwargs: UserValue) -> CompiledRef | CompiledRefList:
        """Submit one execution; returns a ref to read its result from.

        For a MultiOutputNode, a list of refs, one per output (as Ray's Compiled
        Graphs return), each read on its own; the list's ``get()`` reads them all.

        Raises:
            cgraph.ExecuteArgumentError: the arguments do not match the DAG's InputNode use,
                or cannot be serialized (the graph is not affected).
            cgraph.CapacityError: ``max_inflight_executions`` executions are still in the
                graph's channels (their results not yet taken by a get()).
            cgraph.TimeoutError: the input could not be submitted within ``submit_timeout``.
            cgraph.GraphTornDownError: after ``teardown()``.
        """
        return self._execute(args, kwargs, blocking=True)

    def _execute(self, args: tuple[UserValue, ...], kwargs: dict[str, UserValue], blocking: bool) -> CompiledRef | CompiledRefList:
        """execute(); with ``blocking=False``, raises ``_WouldBlock`` (nothing
        submitted) where it would have to wait: for another execute, for room, or
        for the input channel."""
        if not self._submit_lock.acquire(blocking=blocking):
            raise WouldBlock
        try:
            self._state.check_usable()
            self._input_usage.check(args, kwargs)
            self._outputs.make_room(self._submitted, blocking)
            index = self._submitted
            if self._auto is not None and self._auto.decision is None:
                self._auto.observe(index + 1 - self._outputs.taken)
            if self._auto is not None and self._auto.due(self._outputs.taken):
                if not blocking:  # Ray calls and a simulation: not on an event loop's thread
                    raise WouldBlock
                self._decide_overlap(index)
            self._outputs.keep_inputs(index, args, kwargs)  # before the write: a fast reader may need them
            start = time.perf_counter_ns()
            try:
                if self._ep.input_writer is not None:
                    self._write_input(args, kwargs, blocking)
                if self._recorder is not None:
                    self._recorder.add("execute", "driver", index, start, time.perf_counter_ns())
            except BaseException:
                self._outputs.drop_inputs(index)
                raise
            self._outputs.expect(index)
            self._submitted = index + 1
        finally:
            self._submit_lock.release()
        if not self._multi_output:
            return CompiledRef(self, index)
        return CompiledRefList(CompiledRef(self, index, k) for k in range(len(self._ep.output_spec)))

    async def execute_async(self, *args: UserValue, **kwargs: UserValue) -> CompiledFuture | CompiledFutureList:
        """``fut = await compiled.execute_async(x); result = await fut``.

        For a MultiOutputNode, a list of futures, one per output (``await futs[0]``,
        ``asyncio.gather(*futs)``); awaiting the list itself gives every value.
        It never blocks the event loop: where the submit would wait (the input
        channel full, another thread submitting), it waits in a worker thread.
        """
        try:
            refs = self._execute(args, kwargs, blocking=False)
        except WouldBlock:
            loop = asyncio.get_running_loop()
            refs = await loop.run_in_executor(None, functools.partial(self._execute, args, kwargs, True))
        if isinstance(refs, CompiledRefList):
            return CompiledFutureList(CompiledFuture(ref) for ref in refs)
        return CompiledFuture(refs)

    def visualize(
        self,
        filename: str | None = None,
        format: str = "png",
        view: bool = False,
        channel_details: bool = False,
    ) -> str:
        """Write the schedule picture (moved ops in red when overlap is on).

        Ray Compiled Graphs' arguments and return type: the picture's DOT source as a
        ``str`` (its ``.path``: the file written), or for ``format="ascii"`` the
        schedule grid as text. See ``cgraph.CompiledPlan.visualize``.
        """
        if self.drawer is None:
            raise RuntimeError("this graph was started without cgraph.compile, which gives it a way to draw")
        return self.drawer(self.planned, filename, format=format, view=view, channel_details=channel_details)

    def timeline(self, path: str | os.PathLike[str] | None = None, executions: int = 3) -> Mapping[str, object] | Path:
        """The recorded executions as Chrome trace-event JSON (open it in ui.perfetto.dev),
        or as a Gantt picture when ``path`` ends in .png, .svg or .pdf.

        The trace has one process per actor (and the driver), one thread per track
        (the loop and the comm thread), flow arrows from each send to its receive.
        The picture draws the last ``executions`` executions, comm coloured apart
        from compute. Writes ``path`` and returns it when given; returns the trace
        (a dict) otherwise.

        Raises:
            RuntimeError: the graph was compiled without ``timeline=True`` (or
                ``CGRAPH_TIMELINE``), or without ``cgraph.compile``.
        """
        tracks = self._tracks()
        assert self.tracer is not None  # _tracks() raised without one
        if path is not None and Path(path).suffix.lower() in (".png", ".svg", ".pdf"):
            return self.tracer.draw_timeline(tracks, path, executions=executions)
        trace = self.tracer.trace_of(tracks, self.tracer.collective_notes(self.planned.graph))
        if path is None:
            return trace
        Path(path).write_text(json.dumps(trace))
        return Path(path)

    def timeline_summary(self) -> Mapping[str, object]:
        """What the recorded executions measured, and what the schedule simulator predicts.

        Returns a ``cgraph.visualize.TimelineSummary``: a mapping from each process
        (the driver and each actor's label) to its busy, idle, compute and comm time
        and overlap fraction, plus ``makespan`` (an execution's median span),
        ``critical_path`` (the ops that set the end of that execution, with their
        seconds), ``predicted`` (the simulator on the recorded op durations: this
        schedule without and with the overlap pass, comm on its own engine and
        sharing the actor's cores) and ``decision`` (what ``overlap="auto"`` chooses
        from them, on the model that fits the actors: ``scheduler.decide``).
        ``print()`` it for a report.

        Raises:
            RuntimeError: as ``timeline``.
        """
        tracks = self._tracks()
        assert self.tracer is not None  # _tracks() raised without one
        # the actors on this node share its cores (those this process may run on)
        return self.tracer.explain(tracks, self.planned, cores=len(os.sched_getaffinity(0)))

    def _tracks(self) -> list[Track]:
        if self._recorder is None or self.tracer is None:
            raise RuntimeError("this graph records no timeline: compile it with cgraph.compile(dag, "
                               f"timeline=True), or set {TIMELINE_ENV}=<file.json>")
        return collect(self._handles, self._labels, self._tag, self._recorder.snapshot())

    def teardown(self, kill_actors: bool = False, timeout: float | None = None) -> None:
        """Stop every actor loop and free every channel. Safe to call twice.

        Ray Compiled Graphs' signature: ``kill_actors=True`` also kills the graph's
        actors afterwards, as ``ray.kill`` does. ``timeout``: how long to wait for the
        loops to end (None: the ``teardown_timeout`` option, Ray's
        ``DAGContext.teardown_timeout``). With ``CGRAPH_TIMELINE=<file>`` the timeline
        is written there first.
        """
        if timeout is None:
            timeout = self.options.teardown_timeout
        with self._teardown_lock:
            if self._state.torn_down:
                if kill_actors:
                    self._kill_actors()
                return
            self._state.torn_down = True
        if self._recorder is not None and os.environ.get(TIMELINE_ENV) and self.tracer is not None:
            _quietly(lambda: logger.info("timeline written to %s", self.timeline(os.environ[TIMELINE_ENV])))
        try:
            self._stop(timeout)
        finally:
            if kill_actors:
                self._kill_actors()

    def _kill_actors(self) -> None:
        if ray.is_initialized():
            for handle in self._handles.values():
                _quietly(functools.partial(ray.kill, handle))

    def _stop(self, timeout: float) -> None:
        if self._monitor is not None:
            self._monitor.stop()
        for res in self._ep.resources:
            _quietly(res.close)
        if self._loops is not None and ray.is_initialized():
            self._loops.wait_all(timeout)
        if self._monitor is not None:
            self._monitor.join()
        WATCHER.join_if_idle()
        for res in self._ep.resources:
            _quietly(res.unlink)
        ends = [self._ep.input_writer, *self._ep.output_readers.values()]
        for end in ends:  # the driver's own endpoints: their sockets close now, not when collected
            if end is not None:
                _quietly(end.detach)
        _quietly(self._on_teardown)
        _LIVE.discard(self)

    @property
    def is_torn_down(self) -> bool:
        """Whether ``teardown()`` has run (or begun): the graph takes no more executions."""
        return self._state.torn_down

    is_teardown = is_torn_down  # Ray Compiled Graphs' name

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        """``with cgraph.compile(dag) as compiled:`` tears the graph down on leaving."""
        self.teardown()

    def status(self) -> where.GraphStatus:
        """Where each actor's loop is now: its execution, its op, for how long, and what
        it runs or waits for (the channel, and the actor at its other end). Asks every
        actor (one Ray call each, beside its loop; at most ``where.ASK_TIMEOUT_S``).

        Returns:
            A tuple of ``ActorWhere``, one per actor; ``print`` shows a table.
        """
        if self._describer is None:
            self._describer = where.Describer(
                self.schedule, self.planned.plan.channels,
                {n.id: n.method for n in self.graph.nodes if n.method}, self._where_labels())
        answers = where.ask(self._handles, self._tag)
        return where.GraphStatus(self._describer.describe(actor, answers[actor]) for actor in self._handles)

    def _where_labels(self) -> dict[str, str]:
        """ "a (Worker, node 0)": node 0 is the driver's, the others numbered as met."""
        nodes = self._node_numbers()
        return {a.id: f"{a.id} ({a.cls}, node {nodes[a.host]})" for a in self.graph.actors}

    def _node_numbers(self) -> dict[str, int]:
        """Each actor host's number in errors ("" and the driver's node id: 0)."""
        here = ray.get_runtime_context().get_node_id()
        nodes = {here: 0}
        for a in self.graph.actors:
            nodes.setdefault(a.host or here, len(nodes))
        return {"": 0, **nodes}

    def get_id(self) -> str:
        """This graph's id, as text (Ray Compiled Graphs' ``get_id``)."""
        return str(self.graph_id)

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None and not state.torn_down:
            _quietly(lambda: self.teardown(timeout=2.0))

    # ------------------------------------------------------------------ internals
    def _decide_overlap(self, index: int) -> None:
        """overlap="auto": decide from the recorded executions, and have every actor run
        the choice from execution ``index + 1`` on (``auto_overlap.py``). Holds the submit
        lock: execution ``index``'s input is not written yet. A failure keeps the running
        schedule (a dead actor fails the graph through its monitor anyway)."""
        assert self._auto is not None
        try:
            if self.tracer is None:
                raise RuntimeError("no visualize module: the graph was not made by cgraph.compile")
            tracks = collect(self._handles, self._labels, self._tag, [])
            decision = self._auto.choose(self.tracer.durations(tracks))
            self._auto.apply(decision, self._handles, self._tag, index + 1)
        except Exception as exc:  # noqa: BLE001 - the graph runs on, on the schedule it has
            self._auto.executions = index + self._auto.executions  # try again later
            logger.warning("overlap='auto' could not decide (%s: %s); the graph keeps %s",
                           type(exc).__name__, exc, self._auto.current)
            return
        self._describer = None  # status() describes the new schedule's ops
        logger.info("overlap='auto' from execution %d: %s", index + 1, decision)

    def _start_monitor(self, monitor: LoopMonitor) -> None:
        self._monitor = monitor

    def _get_result(self, index: int, timeout: float | None, output: int | None = None) -> UserValue:
        """For refs (``refs.Results``): execution ``index``'s result, or its output ``output``."""
        return self._outputs.get(index, timeout, output)

    def _result_ready(self, index: int, deadline: float | None) -> bool:
        """For ``cgraph.wait``: whether execution ``index``'s get answers at once."""
        return self._outputs.ready(index, deadline)

    def _discard_result(self, index: int, output: int | None = None) -> None:
        """For refs: the ref of ``index`` (or of its output ``output``) was dropped unread."""
        self._outputs.discard(index, output)

    def _fail(self, error: RuntimeGraphError) -> None:
        """Called by the monitor: remember why (with where every actor was, while the
        survivors' loops still wait), and wake every waiter. A failed graph runs no
        more: once its loops ended, its segments, sockets and stores go, now and not at
        teardown."""
        try:
            error = self._node_behind(error)
        except Exception:  # noqa: BLE001 - the diagnosis never stops the verdict
            logger.debug("cgraph: could not tell whether a node was lost", exc_info=True)
        if error.args and isinstance(error.args[0], str):
            error.args = (f"{error.args[0]} Where each actor was: {self._outputs._where_line()}",
                          *error.args[1:])
        self._state.fail(error)
        for res in self._ep.resources:
            _quietly(res.close)
        if self._loops is not None and ray.is_initialized():
            self._loops.wait_all(self.options.teardown_timeout)
        for res in self._ep.resources:
            _quietly(res.unlink)

    def _node_behind(self, error: RuntimeGraphError) -> RuntimeGraphError:
        """An actor's death on another node whose raylet went too (``node_loss``) is the
        node's loss: a ``NodeDiedError`` naming the node and the graph's actors on it."""
        if not isinstance(error, ActorDiedError) or isinstance(error, NodeDiedError):
            return error
        dead = next((a for a in self.graph.actors if self._labels[a.id] == error.actor), None)
        why = node_lost(dead.host) if dead is not None and dead.host else None
        if dead is None or why is None:
            return error
        on_it = ", ".join(self._labels[a.id] for a in self.graph.actors if a.host == dead.host)
        return NodeDiedError(
            f"node {self._node_numbers()[dead.host]} (Ray node {dead.host}) was lost while the compiled graph "
            f"was running: {why}; the graph's actors on it died with it: {on_it}. {error.args[0]}",
            actor=error.actor, node=dead.host)

    def _write_input(self, args: tuple[UserValue, ...], kwargs: dict[str, UserValue], blocking: bool) -> None:
        assert self._ep.input_writer is not None  # _execute writes only where an actor reads the input
        try:
            self._ep.input_writer.write((args, kwargs), timeout=self.options.submit_timeout if blocking else 0)
        except ChannelTimeoutError:
            if not blocking:
                raise WouldBlock from None
            raise with_compat(
                TimeoutError(
                    f"could not submit within submit_timeout={self.options.submit_timeout}s: "
                    "the first actors are still busy with earlier executions"
                )
            ) from None
        except ChannelClosedError as exc:
            raise self._state.closed_error(exc) from None
        except RuntimeGraphError:
            raise
        except Exception as exc:  # serialization failed before anything was written
            raise ExecuteArgumentError(
                f"execute() arguments cannot be sent to the actors: {type(exc).__name__}: {exc}"
            ) from exc


def _quietly(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # best-effort cleanup
        fn()


def _torn_down_by_ray_shutdown(graph: CompiledGraph) -> None:
    """Join the weak registry that ``ray.shutdown()`` tears down first (with
    ``teardown(kill_actors=True)``, ``ray.dag.compiled_dag_node``), as Ray's own graphs."""
    with contextlib.suppress(ImportError, AttributeError, TypeError):
        from ray.dag import compiled_dag_node

        compiled_dag_node._compiled_dags[f"cgraph-{graph.get_id()}"] = graph


@atexit.register
def _teardown_all() -> None:
    for graph in list(_LIVE):
        _quietly(functools.partial(graph.teardown, timeout=2.0))
