"""Line coverage inside an actor's loop, when (and only when) coverage runs in the process.

Ray starts the loop's thread from its C++ core, which ``threading.settrace`` never
reaches, and may end the worker with ``os._exit``, which skips ``atexit``: so a loop on
such a thread (``threading`` knows it only as a dummy) installs coverage's tracer itself
and saves the data when it returns (``scripts/coverage.sh``). Loops on threads Python
started (the unit tests' harness) are traced already and saved at exit. Without
coverage in the process this is one dict lookup.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol

_SAVING = threading.Lock()  # coverage's data file is not safe for two savers at once


class Measuring(Protocol):
    """What ``coverage.Coverage.current()`` returns (coverage is imported only where it runs)."""

    def save(self) -> None: ...


def trace_this_thread() -> Measuring | None:
    """Trace the calling thread if coverage measures this process and nothing traces it
    yet; returns what to ``save`` when the loop ends (None: nothing)."""
    coverage = sys.modules.get("coverage")
    current: Measuring | None = coverage.Coverage.current() if coverage is not None else None
    if current is None or not isinstance(threading.current_thread(), threading._DummyThread):
        return None
    sys.settrace(threading._trace_hook)  # type: ignore[attr-defined] # coverage's, set at start
    return current


def save(current: Measuring | None) -> None:
    if current is not None:
        with _SAVING:
            try:
                current.save()
            except Exception:  # noqa: BLE001 - measuring must never break the loop's exit
                pass
