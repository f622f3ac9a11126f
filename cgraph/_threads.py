"""cgraph's background threads (layer 0: any layer may start one).

Every thread cgraph starts (a graph's monitor, a socket channel's pump, a control
server, a communicator's link) is a daemon started here, so that each one ends the
same way: when its target returns or raises, or when ``SystemExit`` or
``KeyboardInterrupt`` reaches it (Ray raises ``SystemExit`` in a process it is
taking down; a ``KeyboardInterrupt`` may land on any thread). Those two end the
thread quietly, logged at debug level, and never the process: the driver goes on.
An ordinary exception still reaches ``threading.excepthook`` (a bug to see).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

_logger = logging.getLogger("cgraph")  # cgraph._log's logger, by name: both sit on layer 0


def start(target: Callable[..., object], name: str, *args: object) -> threading.Thread:
    """Start ``target(*args)`` on a new daemon thread called ``name``; returns the thread."""
    thread = threading.Thread(target=_quietly_ended, args=(target, name, args), name=name, daemon=True)
    thread.start()
    return thread


def _quietly_ended(target: Callable[..., object], name: str, args: tuple[object, ...]) -> None:
    try:
        target(*args)
    except (SystemExit, KeyboardInterrupt) as exc:
        _logger.debug("thread %s ended on %s", name, type(exc).__name__)
