"""Watch the actor loops of one compiled graph and turn their end into an error.

A daemon thread waits (``ray.wait``) on the object refs of the actor loops. A
loop ref that resolves while the graph is live means the loop ended: the actor
died (``RayActorError``), or the loop crashed. The monitor records an
``ActorDiedError`` naming the actor and calls ``on_failure``, which closes every
channel so that the driver's ``get()`` and every other actor's loop wake up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import ray

from cgraph.errors import ActorDiedError, RuntimeGraphError


class LoopMonitor:
    def __init__(
        self,
        loops: dict[str, ray.ObjectRef],
        labels: dict[str, str],
        on_failure: Callable[[RuntimeGraphError], None],
        poll_s: float = 0.5,
    ) -> None:
        self._loops = dict(loops)
        self._labels = labels
        self._on_failure = on_failure
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cgraph-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        by_ref = {ref: actor for actor, ref in self._loops.items()}
        pending = list(by_ref)
        while pending and not self._stop.is_set():
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=self._poll_s)
            except Exception:  # noqa: BLE001 - Ray shutting down under us
                return
            if not done or self._stop.is_set():
                continue
            actor = by_ref[done[0]]
            self._on_failure(self._describe(actor, done[0]))
            return

    def _describe(self, actor: str, ref: ray.ObjectRef) -> RuntimeGraphError:
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
        return ActorDiedError(
            f"the execution loop on actor {label} stopped unexpectedly ({reason}); "
            "the graph cannot run any more",
            actor=label,
        )
