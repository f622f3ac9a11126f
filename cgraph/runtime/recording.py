"""Recording what every actor did: one event per op per execution, off by default.

    compile(dag, timeline=True)            (or CGRAPH_TIMELINE=path.json)
      actor loop   a recording loop: stamps = [now()]; for step: step(); stamps.append(now())
                   then one add_run(execution, labels, stamps, sizes) per execution
      comm thread  the body of an op on the comm stream, timed where it runs (one event)
      driver       execute() and get() of each execution
    compiled.timeline(path)                asks each actor for its events (``fetch``),
                                           puts every clock on the driver's axis

An event is ``(op, track, execution, start_ns, end_ns, nbytes)``: ``op`` the op's
text form (``a.C1``, ``d.RECV1<a@comm``), ``track`` "loop" or "comm" (the thread
that ran it), ``nbytes`` the bytes of arrays and tensors the op moved (READ, WRITE,
SEND, RECV, COLLECTIVE; None for a compute, or a value with no buffer to count),
times from ``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for
every process of a machine). Off, nothing is wrapped and nothing is recorded:
the loop runs the same steps as before. On, the loop pays one clock read and one
list append per op, and each actor keeps rings of the last ``timeline_executions``
executions (bounded memory); the loop and comm threads append without a lock (a
deque's append is atomic), and a snapshot from Ray's call thread copies again if
an append raced it.

Clocks of actors on the driver's node are the driver's clock (offset 0, exact).
For an actor on another node, ``fetch`` returns its clock next to the driver's
send and receive times of that call: offset = actor - midpoint, uncertainty =
half the round trip (said in the trace's metadata).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from cgraph._boundary import UserValue

if TYPE_CHECKING:
    from ray.dag.compiled_dag_node import _ExecutableTaskRecord

Event = tuple[str, str, int, int, int, int | None]
"""(op text, track, execution, start_ns, end_ns, nbytes)."""
Run = tuple[int, tuple[str | None, ...], list[int], list[int | None]]
"""One execution of a loop: (execution, step labels, step boundaries in ns, bytes per step)."""

_KEEP_GRAPHS = 4
"""Recorders a process keeps (most recent graphs first): a graph's events outlive its loop
until fetched, and a long-lived actor must not keep every graph's."""
_RECORDERS: collections.OrderedDict[str, Recorder] = collections.OrderedDict()
_REGISTRY_LOCK = threading.Lock()

_T = TypeVar("_T")


class Owner(Protocol):
    """What ``Recorder.timed`` reads the execution index from (``At``, or a loop's context)."""

    @property
    def execution(self) -> int: ...


class Recorder:
    """The ring of one process's events for one graph (see the module docstring)."""

    def __init__(self, capacity: int, runs: int = 1) -> None:
        self._events: collections.deque[Event] = collections.deque(maxlen=max(capacity, 1))
        self._runs: collections.deque[Run] = collections.deque(maxlen=max(runs, 1))

    def add(self, op: str, track: str, execution: int, start_ns: int, end_ns: int,
            nbytes: int | None = None) -> None:
        self._events.append((op, track, execution, start_ns, end_ns, nbytes))  # atomic: no lock needed

    def add_run(self, execution: int, labels: tuple[str | None, ...], stamps: list[int],
                sizes: list[int | None]) -> None:
        """One execution of the loop: step ``i`` (``labels[i]``; None: not an event of the
        loop) ran from ``stamps[i]`` to ``stamps[i + 1]`` and moved ``sizes[i]`` bytes."""
        self._runs.append((execution, labels, stamps, sizes))

    def snapshot(self) -> list[Event]:
        """The events so far (copied while the loop and comm threads may still append)."""
        events, runs = _copy(self._events), _copy(self._runs)
        for execution, labels, stamps, sizes in runs:
            events += [(label, "loop", execution, stamps[i], stamps[i + 1], sizes[i])
                       for i, label in enumerate(labels) if label is not None]
        return events

    def timed(self, op: str, track: str, owner: Owner, run: Callable[[], _T],
              size: Callable[[_T], int | None] | None = None) -> Callable[[], _T]:
        """``run`` wrapped so that each call that returns adds one event (its start and end);
        ``owner.execution`` is the execution it belongs to (read when the call starts);
        ``size(returned value)`` gives the event's bytes. A call that raises (the loop
        ending at teardown, an abort) adds none."""
        now, append = time.perf_counter_ns, self._events.append

        def recorded() -> _T:
            index, start = owner.execution, now()
            value = run()
            end = now()
            append((op, track, index, start, end, size(value) if size is not None else None))
            return value

        return recorded


def nbytes(value: UserValue, depth: int = 0) -> int | None:
    """Bytes of the arrays and tensors in ``value`` (lists, tuples and dicts looked into
    two levels deep); None when there is none to count (a plain object is pickled: its
    size is not known without pickling it again). One dict lookup per value's type
    decides how (an ``int`` costs ~0.1 us: the loop pays it per READ and WRITE)."""
    kind = type(value)
    sizer = _SIZERS.get(kind)
    if sizer is None:
        sizer = _SIZERS[kind] = _sizer(kind)
    return sizer(value, depth)


def _sizer(kind: type) -> Callable[[UserValue, int], int | None]:
    if issubclass(kind, bytes | bytearray):
        return lambda value, depth: len(value)
    if isinstance(getattr(kind, "nbytes", None), property | types.GetSetDescriptorType | types.MemberDescriptorType):
        return lambda value, depth: value.nbytes if type(value.nbytes) is int else None
    if issubclass(kind, list | tuple | dict):
        return _items_size
    return lambda value, depth: None


def _items_size(value: list[object] | tuple[object, ...] | dict[object, object], depth: int) -> int | None:
    if depth >= 2:
        return None
    sizes = [nbytes(item, depth + 1) for item in (value.values() if isinstance(value, dict) else value)]
    counted = [size for size in sizes if size is not None]
    return sum(counted) if counted else None


_SIZERS: dict[type, Callable[[UserValue, int], int | None]] = {}
NO_BUFFER = frozenset({int, float, bool, complex, str, type(None)})
"""Types whose values ``nbytes`` never counts (a caller on a hot path checks this first)."""


def _copy(ring: collections.deque[_T]) -> list[_T]:
    while True:
        try:
            return list(ring)
        except RuntimeError:  # appended during the copy ("deque mutated"): copy again
            continue


class At:
    """A fixed execution index, for ``Recorder.timed``'s ``owner`` (a comm-thread body)."""

    __slots__ = ("execution",)

    def __init__(self, execution: int) -> None:
        self.execution = execution


def register(tag: str, capacity: int, runs: int = 1) -> Recorder:
    """This process's recorder of graph ``tag`` (made once; older graphs' are dropped)."""
    with _REGISTRY_LOCK:
        recorder = _RECORDERS.get(tag)
        if recorder is None:
            recorder = _RECORDERS[tag] = Recorder(capacity, runs)
            while len(_RECORDERS) > _KEEP_GRAPHS:
                _RECORDERS.popitem(last=False)
        return recorder


@dataclass(frozen=True)
class Fetched:
    """What ``fetch`` returns: the events, and this process's clock and node when asked."""

    events: list[Event]
    clock_ns: int
    node: str


def fetch(_instance: object, tag: str) -> Fetched:
    """Run in an actor (``__ray_call__``): its events of graph ``tag`` (empty if none)."""
    import ray

    with _REGISTRY_LOCK:
        recorder = _RECORDERS.get(tag)
    events = recorder.snapshot() if recorder is not None else []
    return Fetched(events, time.perf_counter_ns(), ray.get_runtime_context().get_node_id())


# --------------------------------------------------------------------------- Ray's events
RAY_EVENTS_ATTR = "__ray_cgraph_events"
"""The actor attribute Ray's event profiling (``RAY_CGRAPH_ENABLE_PROFILING``) appends to."""

_TASK_READS = frozenset({"R", "RECV"})
_TASK_WRITES = frozenset({"W", "SEND"})


def ray_task_events(instance: object, steps: list[tuple[str, str] | None]) -> Callable[[list[int]], None]:
    """Ray Compiled Graphs' event profiling on a recording loop: per method call (a Ray
    "task") and execution, a READ, a COMPUTE and a WRITE ``_ExecutableTaskRecord`` appended
    to the actor's ``__ray_cgraph_events`` list, as Ray's loop does with the switch on.

    ``steps`` are the loop's steps: ``(op kind, method)`` per op (kind ``"R"``, ``"C"``,
    ``"COLL"``...), None for a wait before a compute. A task's READ spans the reads (and
    waits) since the previous task, its WRITE the writes and sends right after it; either
    may be empty (a value passed inside the actor), as a zero-length event. The returned
    function takes one execution's step boundaries (``add_run``'s ``stamps``).
    """
    import ray
    from ray.dag.compiled_dag_node import _ExecutableTaskRecord

    context = ray.get_runtime_context()
    who = {"actor_classname": type(instance).__name__, "actor_name": context.get_actor_name() or "",
           "actor_id": context.get_actor_id() or ""}
    tasks: list[tuple[str, int, int, int]] = []  # (method, first read step, compute step, end of writes)
    first_read: int | None = None
    for i, step in enumerate(steps):
        if step is None or step[0] in _TASK_READS:
            first_read = i if first_read is None else first_read
        elif step[0] in ("C", "COLL"):
            end = i + 1
            while end < len(steps) and steps[end] is not None and steps[end][0] in _TASK_WRITES:  # type: ignore[index]
                end += 1
            tasks.append((step[1], i if first_read is None else first_read, i, end))
            first_read = None
    if not hasattr(instance, RAY_EVENTS_ATTR):
        setattr(instance, RAY_EVENTS_ATTR, [])
    events: list[_ExecutableTaskRecord] = getattr(instance, RAY_EVENTS_ATTR)

    def record(stamps: list[int]) -> None:
        for bind_index, (method, read, compute, end) in enumerate(tasks):
            for operation, start, stop in (("READ", read, compute), ("COMPUTE", compute, compute + 1),
                                           ("WRITE", compute + 1, end)):
                events.append(_ExecutableTaskRecord(
                    method_name=method, bind_index=bind_index, operation=operation,
                    start_t=stamps[start] / 1e9, end_t=stamps[stop] / 1e9, **who))

    return record


def torch_profiling(directory: str | None) -> contextlib.AbstractContextManager[object]:
    """Ray's ``RAY_CGRAPH_ENABLE_TORCH_PROFILING``: the actor's loop runs under torch's
    profiler (CPU, and CUDA where there is a GPU), which writes one trace file for this actor
    into ``directory`` when the loop ends (teardown). None: nothing is wrapped."""
    if directory is None:
        return contextlib.nullcontext()
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, with_stack=True,
                                  on_trace_ready=torch.profiler.tensorboard_trace_handler(directory))

