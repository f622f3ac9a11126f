"""Line coverage inside an actor's loop, when (and only when) coverage runs in the process.

Ray starts the loop's thread from its C++ core, which ``threading.settrace`` never
reaches, and may end the worker with ``os._exit``, which skips ``atexit``: so the loop
installs coverage's tracer itself and saves the data when it returns
(``scripts/coverage.sh``). Without coverage in the process this is one dict lookup.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


def trace_this_thread() -> Any:
    """Trace the calling thread if coverage measures this process; returns what to save."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        sys.settrace(threading._trace_hook)  # type: ignore[attr-defined] # coverage's, set at start
    return current


def save(current: Any) -> None:
    if current is not None:
        try:
            current.save()
        except Exception:  # noqa: BLE001 - measuring must never break the loop's exit
            pass
