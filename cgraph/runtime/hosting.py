"""In an actor: host the loops of any number of compiled graphs, each on a thread of its own.

An actor may run several live graphs (prefill and decode over one model, an RL loop's
rollout and training). Each graph's loop runs on its own thread (``start_loop``, a short
call), so that no graph waits for another to end. The driver learns how each loop ended
from one call per actor that waits (``wait_loops``): it runs in Ray's ``"_ray_system"``
concurrency group (one thread, which Ray makes for every actor) and returns as soon as a
loop of its driver ends, with how; a call to an actor that dies fails, which is how the
driver learns of a death. The actor's own calls run as before, on the threads Ray gives
them.

Two methods that graphs run on one *default* actor (one thread, in order: Ray's rule for
an actor without ``max_concurrency`` or ``async def``) never run at the same time: each
takes the actor's method lock (``executor.METHOD_LOCK``). The lock is held only while the user's
method runs, never while a loop waits for a channel, so it cannot join a wait cycle
(docs/design-notes.md, "Several graphs on one actor"). A threaded or async actor keeps
its own rule: no lock.
"""

from __future__ import annotations

import threading
import traceback
from typing import TYPE_CHECKING

from cgraph import _threads
from cgraph.runtime.executor import run_actor_loop

if TYPE_CHECKING:
    from cgraph.runtime.program import ActorProgram

RETURNED = "returned"  # the loop returned why it stopped: its channels closed or were lost
FAILED = "failed"  # the loop raised: a defect, reported with its traceback's last line

Ending = tuple[str, str]  # (RETURNED or FAILED, text)

_LOCK = threading.Lock()
_CHANGED = threading.Condition(_LOCK)
_RUNNING: dict[str, set[str]] = {}  # driver's watcher id -> tags of its graphs' loops running here
_ENDED: dict[str, dict[str, Ending]] = {}  # watcher id -> tag -> how its loop ended, not yet fetched


def start_loop(instance: object, program: ActorProgram, watcher: str) -> None:
    """Run ``program``'s loop on a new thread and return at once (``run_actor_loop``)."""
    tag = program.graph_tag
    with _LOCK:
        _RUNNING.setdefault(watcher, set()).add(tag)

    def run() -> None:
        ending: Ending
        try:
            ending = (RETURNED, run_actor_loop(instance, program))
        except BaseException as exc:  # noqa: BLE001 - every end is reported, a defect too
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            ending = (FAILED, last)
        _ended(watcher, tag, ending)

    try:
        _threads.start(run, f"cgraph-loop-{tag}")
    except BaseException:  # no thread (the process is out of them): no loop to wait for
        with _LOCK:
            _RUNNING.get(watcher, set()).discard(tag)
        raise


def _ended(watcher: str, tag: str, ending: Ending) -> None:
    with _LOCK:
        _RUNNING.get(watcher, set()).discard(tag)
        _ENDED.setdefault(watcher, {})[tag] = ending
        _CHANGED.notify_all()


def wait_loops(instance: object, watcher: str) -> dict[str, Ending]:
    """Block until a loop that ``watcher`` started here ends, then return how each that
    ended since the last call did (and forget them); ``{}`` once none runs. Blocks in
    the kernel: no polling."""
    del instance  # Ray's __ray_call__ passes it
    with _LOCK:
        while not _ENDED.get(watcher) and _RUNNING.get(watcher):
            _CHANGED.wait()
        ended = _ENDED.pop(watcher, {})
        if not _RUNNING.get(watcher):
            _RUNNING.pop(watcher, None)
        return ended


def running(instance: object) -> dict[str, set[str]]:
    """Per watcher, the tags of the loops running in this actor (for tests and status)."""
    del instance
    with _LOCK:
        return {w: set(tags) for w, tags in _RUNNING.items() if tags}

