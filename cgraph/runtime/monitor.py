"""Watch the actor loops of the driver's compiled graphs and turn their end into an error.

An actor may run the loops of several graphs (``hosting.py``: one thread each). The
driver process has one ``LoopWatcher``: per actor with live loops, one pending call
(``hosting.wait_loops``, in the actor's ``"_ray_system"`` concurrency group) that returns
when a loop of this driver ends there, with how; one daemon thread waits (``ray.wait``)
on those calls and hands each end to its graph (``LoopEnds``). A call to an actor that
died fails: every graph with a loop there hears of the death.

Each graph's ``LoopMonitor`` turns its first end, while the graph is live, into the
graph's failure: the actor died (an ``ActorDiedError`` naming it), its loop crashed, or
one of its channels ended under it (the loop returns why: a ``ChannelLostError`` naming
the channel and the peer, since that actor is alive). A lost channel is often a dead
peer's doing, so the monitor waits a moment for a death to show and reports that
instead. Then it calls ``on_failure``, which closes every channel so that the driver's
``get()`` and every other actor's loop wake up.

A second driver process that runs graphs on the same actors has its own watcher; its
calls wait in the actor's ``"_ray_system"`` queue behind the first's, so it hears of a
loop that ended with the actor alive once the first driver's graphs there end, and of a
death at once (Ray fails every queued call of a dead actor).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import ray

from cgraph import _threads
from cgraph._boundary import ActorHandle
from cgraph.errors import ActorDiedError, ChannelLostError, RuntimeGraphError
from cgraph.runtime import hosting

if TYPE_CHECKING:
    from cgraph.runtime.program import ActorProgram

DEATH_GRACE_S = 3.0
POLL_S = 0.5  # the watcher's ray.wait: how soon it sees calls made while it waited, and a ray.shutdown()
START_TIMEOUT_S = 60.0

DIED = "died"


class Outcome(NamedTuple):
    kind: str  # DIED, hosting.RETURNED or hosting.FAILED
    text: str


class LoopEnds:
    """How one graph's loops ended, per actor, in the order the watcher learned it."""

    def __init__(self, actors: set[str]) -> None:
        self._actors = set(actors)
        self._ended: dict[str, Outcome] = {}
        self._queue: queue.SimpleQueue[tuple[str, Outcome] | None] = queue.SimpleQueue()
        self._all = threading.Event()
        self._lock = threading.Lock()
        if not actors:
            self._all.set()

    def put(self, actor: str, outcome: Outcome) -> None:
        with self._lock:
            if actor in self._ended:
                return
            self._ended[actor] = outcome
            if self._actors <= self._ended.keys():
                self._all.set()
        self._queue.put((actor, outcome))

    def next(self, timeout: float | None) -> tuple[str, Outcome] | None:
        """The next end (None: ``wake()`` was called, or none came within ``timeout``)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def wake(self) -> None:
        self._queue.put(None)

    def wait_all(self, timeout: float) -> bool:
        """Whether every loop of the graph ended within ``timeout`` seconds."""
        return self._all.wait(timeout)


@dataclass
class _Watched:
    handle: ActorHandle
    graphs: dict[str, tuple[str, LoopEnds]] = field(default_factory=dict)  # tag -> (actor id in graph, ends)
    call: ray.ObjectRef[dict[str, hosting.Ending]] | None = None


def _key(handle: ActorHandle) -> str:
    actor_id = getattr(handle, "_ray_actor_id", None)
    return actor_id.hex() if actor_id is not None else str(id(handle))


class LoopWatcher:
    """The driver's one watcher of its graphs' loops (``WATCHER``)."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._actors: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None  # runs while an actor is watched

    def start(self, handles: Mapping[str, ActorHandle], programs: Mapping[str, ActorProgram], tag: str) -> LoopEnds:
        """Start each actor's loop of graph ``tag`` and watch it; returns the graph's ends.

        Raises:
            ray.exceptions.RayError: an actor could not start its loop (it died, say).
        """
        ends = LoopEnds(set(programs))
        starts = [handles[a].__ray_call__.remote(hosting.start_loop, program, self.id)
                  for a, program in programs.items()]
        ray.get(starts, timeout=START_TIMEOUT_S)
        with self._lock:
            for actor in programs:
                watched = self._actors.setdefault(_key(handles[actor]), _Watched(handles[actor]))
                watched.graphs[tag] = (actor, ends)
                if watched.call is None:
                    watched.call = self._wait_call(watched.handle)
            if self._thread is None:
                self._thread = _threads.start(self._run, "cgraph-loop-watcher")
        return ends

    def join_if_idle(self, timeout: float = POLL_S + 1.0) -> None:
        """With no loop left to watch, wait until the thread has ended (a graph's teardown:
        after the last one, no thread of cgraph runs)."""
        with self._lock:
            thread = self._thread if not self._actors else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def live_actors(self) -> set[str]:
        """The Ray actor ids (hex) that run a loop of a live graph of this driver."""
        with self._lock:
            return {key for key, watched in self._actors.items() if watched.graphs}

    def _wait_call(self, handle: ActorHandle) -> ray.ObjectRef[dict[str, hosting.Ending]]:
        call: ray.ObjectRef[dict[str, hosting.Ending]] = handle.__ray_call__.options(
            concurrency_group="_ray_system").remote(hosting.wait_loops, self.id)
        return call

    def _run(self) -> None:
        while True:
            with self._lock:
                calls = {w.call: key for key, w in self._actors.items() if w.call is not None}
                if not calls:  # decided under the lock: start() then starts a new thread
                    self._actors.clear()
                    self._thread = None
                    return
            if not ray.is_initialized():  # ray.shutdown(): its graphs were torn down first
                self._forget()
                continue
            try:
                done, _ = ray.wait(list(calls), num_returns=1, timeout=POLL_S)
            except Exception:  # noqa: BLE001 - Ray shutting down under us
                self._forget()
                continue
            for call in done:
                self._resolve(calls[call], call)

    def _forget(self) -> None:
        with self._lock:
            self._actors.clear()

    def _resolve(self, key: str, call: ray.ObjectRef[dict[str, hosting.Ending]]) -> None:
        try:
            ended = {tag: Outcome(*ending) for tag, ending in ray.get(call, timeout=1.0).items()}
            gone: Outcome | None = None
        except ray.exceptions.RayActorError as exc:
            ended, gone = {}, Outcome(DIED, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - the watch itself failed: the loops are lost to us
            ended, gone = {}, Outcome(hosting.FAILED, f"{type(exc).__name__}: {exc}")
        with self._lock:
            watched = self._actors.get(key)
            if watched is None:
                return
            for tag, outcome in ended.items():
                entry = watched.graphs.pop(tag, None)
                if entry is not None:
                    entry[1].put(entry[0], outcome)
            if gone is None and not ended:  # none of ours runs there: the actor restarted
                gone = Outcome(DIED, "the actor restarted, and its loops with it were lost")
            if gone is not None:
                for actor, ends in watched.graphs.values():
                    ends.put(actor, gone)
                watched.graphs.clear()
            if watched.graphs:
                watched.call = self._wait_call(watched.handle)
            else:
                del self._actors[key]


WATCHER = LoopWatcher()


class LoopMonitor:
    """One graph's: its first loop end while it is live becomes its failure."""

    def __init__(
        self,
        ends: LoopEnds,
        labels: dict[str, str],
        on_failure: Callable[[RuntimeGraphError], None],
    ) -> None:
        self._ends = ends
        self._labels = labels
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._thread = _threads.start(self._run, "cgraph-monitor")

    def stop(self) -> None:
        self._stop.set()
        self._ends.wake()

    def join(self) -> None:
        """Wait until the thread has ended (``stop`` first)."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self._ends.next(timeout=None)
            if got is None or self._stop.is_set():
                continue
            error = self._describe(*got)
            if not isinstance(error, ActorDiedError):
                error = self._death_behind() or error
            if not self._stop.is_set():
                self._on_failure(error)
            return

    def _death_behind(self) -> ActorDiedError | None:
        """A loop that stopped on a lost channel often lost it because its peer died: an
        actor's death shows a moment later, and is the cause to report. Waits
        ``DEATH_GRACE_S`` for one."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            got = self._ends.next(timeout=left)
            if got is not None and got[1].kind == DIED:
                error = self._describe(*got)
                assert isinstance(error, ActorDiedError)
                return error
        return None

    def _describe(self, actor: str, outcome: Outcome) -> RuntimeGraphError:
        label = self._labels.get(actor, actor)
        if outcome.kind == DIED:
            return ActorDiedError(
                f"actor {label} died while the compiled graph was running: {outcome.text.rstrip('.')}. "
                "Tear the graph down and compile a new one with live actors.",
                actor=label,
            )
        if outcome.kind == hosting.FAILED:
            return ActorDiedError(f"the execution loop on actor {label} failed: {outcome.text}", actor=label)
        # the loop returned: the actor is alive, one of its channels ended under it
        return ChannelLostError(
            f"the execution loop on actor {label} stopped, the actor is alive: {outcome.text}; "
            "the graph cannot run any more"
        )
