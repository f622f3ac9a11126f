"""Optional CPU placement of a compiled graph's loops (``cpu_affinity=``).

On virtual machines a wake-up that crosses to an idle (halted) vCPU costs tens
of microseconds, several times the channel's own software cost; a wake-up on
the same CPU is a plain context switch. ``cpu_affinity="colocate"`` pins the
driver's calling thread and every actor loop on the driver's node to ONE CPU
while the graph is live, so each hop is a context switch: lower latency for
small, latency-bound graphs, at the price of running their methods one at a
time. A set of CPU ids pins them to those CPUs instead. Teardown restores the
previous affinity everywhere.

    default                    colocate
    cpu0: driver  a            cpu0: driver a b c
    cpu1: b  c    (IPIs)       cpu1: (free for other work)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable


def choose_cpus(spec: str | Iterable[int] | None) -> set[int] | None:
    """The CPU set for ``spec`` (None, "colocate" or an iterable of CPU ids).

    Raises:
        ValueError: an unknown spec, or CPUs this process may not use.
    """
    if spec is None:
        return None
    allowed = os.sched_getaffinity(0)
    if spec == "colocate":
        return {max(allowed)}
    if isinstance(spec, str):
        raise ValueError(f"cpu_affinity={spec!r}: use None, 'colocate' or a set of CPU ids")
    cpus = {int(c) for c in spec}
    if not cpus or not cpus <= allowed:
        raise ValueError(f"cpu_affinity={sorted(cpus)}: CPUs allowed here are {sorted(allowed)}")
    return cpus


def pin_thread(cpus: set[int] | None) -> Callable[[], None]:
    """Pin the calling thread to ``cpus``; returns the undo (safe from any thread)."""
    if not cpus:
        return lambda: None
    tid = threading.get_native_id()
    before = os.sched_getaffinity(tid)
    os.sched_setaffinity(tid, cpus)

    def undo() -> None:
        try:
            os.sched_setaffinity(tid, before)
        except OSError:
            pass  # the thread is gone

    return undo
