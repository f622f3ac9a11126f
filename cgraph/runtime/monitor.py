"""Watch the actor loops of one compiled graph and turn their end into an error.

A daemon thread waits (``ray.wait``) on the object refs of the actor loops. A
loop ref that resolves while the graph is live means the loop ended: the actor
died (``RayActorError``: an ``ActorDiedError`` naming it), its loop crashed, or
one of its channels ended under it (the loop returns why: a ``ChannelLostError``
naming the channel and the peer, since that actor is alive). A lost channel is
often a dead peer's doing, so the monitor waits a moment for a death to show
and reports that instead. Then it calls ``on_failure``, which closes every
channel so that the driver's ``get()`` and every other actor's loop wake up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ray

from cgraph import _threads
from cgraph.errors import ActorDiedError, ChannelLostError, RuntimeGraphError

DEATH_GRACE_S = 3.0


class LoopMonitor:
    def __init__(
        self,
        loops: dict[str, ray.ObjectRef[str]],
        labels: dict[str, str],
        on_failure: Callable[[RuntimeGraphError], None],
        poll_s: float = 0.5,
    ) -> None:
        self._loops = dict(loops)
        self._labels = labels
        self._on_failure = on_failure
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = _threads.start(self._run, "cgraph-monitor")

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        """Wait until the thread is out of Ray (``stop`` first): it wakes as soon as a loop
        ends, or at its next poll. ``ray.shutdown()`` tears graphs down before it
        disconnects, so no Ray call of a monitor overlaps the disconnect."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._poll_s + 1.0)

    def _run(self) -> None:
        by_ref = {ref: actor for actor, ref in self._loops.items()}
        pending = list(by_ref)
        while pending and not self._stop.is_set():
            if not ray.is_initialized():
                return  # ray.shutdown(): a Ray call now would start a new Ray (auto-init)
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=self._poll_s)
            except Exception:  # noqa: BLE001 - Ray shutting down under us
                return
            if not done or self._stop.is_set():
                continue
            error = self._describe(by_ref[done[0]], done[0])
            if not isinstance(error, ActorDiedError) and pending:
                error = self._death_behind(by_ref, pending) or error
            if not self._stop.is_set():
                self._on_failure(error)
            return

    def _death_behind(self, by_ref: dict[ray.ObjectRef[str], str],
                      pending: list[ray.ObjectRef[str]]) -> ActorDiedError | None:
        """A loop that stopped on a lost channel often lost it because its peer died: an
        actor's death shows in its own loop's ref a moment later, and is the cause to
        report. Waits ``DEATH_GRACE_S`` for one."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while pending and time.monotonic() < deadline and not self._stop.is_set():
            try:
                done, pending = ray.wait(pending, num_returns=1,
                                         timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - Ray shutting down under us
                return None
            for ref in done:
                error = self._describe(by_ref[ref], ref)
                if isinstance(error, ActorDiedError):
                    return error
        return None

    def _describe(self, actor: str, ref: ray.ObjectRef[str]) -> RuntimeGraphError:
        label = self._labels.get(actor, actor)
        try:
            reason = ray.get(ref, timeout=1.0)
        except ray.exceptions.RayActorError as exc:
            return ActorDiedError(
                f"actor {label} died while the compiled graph was running: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}. "
                "Tear the graph down and compile a new one with live actors.",
                actor=label,
            )
        except Exception as exc:  # noqa: BLE001
            return ActorDiedError(
                f"the execution loop on actor {label} failed: {type(exc).__name__}: {exc}",
                actor=label,
            )
        # the loop returned: the actor is alive, one of its channels ended under it
        return ChannelLostError(
            f"the execution loop on actor {label} stopped, the actor is alive: {reason}; "
            "the graph cannot run any more"
        )
