"""Where library code adds events to a running graph's timeline (layer 0: any layer may).

A recorded graph's loop binds a sink to its thread for as long as it runs; code
that runs inside a method of that graph on that thread (the collective library's
``allreduce`` and friends) asks for it and adds one event per call:

    runtime (recording loop)    bind(add) ... unbind()
    cgraph.collective           add = sink()
                                if add is not None: add("allreduce(algorithm='ring')", start_ns, end_ns, nbytes)

Without a recorded graph on the thread ``sink()`` is None: one thread-local read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Sink = Callable[[str, int, int, "int | None"], None]
"""add(text, start_ns, end_ns, nbytes): one event of the thread's running graph."""

_local = threading.local()


def bind(add: Sink | None) -> None:
    """This thread's sink from now on (None: no more)."""
    _local.add = add


def sink() -> Sink | None:
    """The sink of the graph this thread runs, if it records a timeline."""
    return getattr(_local, "add", None)
