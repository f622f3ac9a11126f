"""Noticing at once that a rank on this node died, instead of at the group's timeout.

A rank blocked on a shared-memory link or the node's barrier waits for a peer
that writes to memory; if that peer dies, nothing ever writes, and the wait
ends only at the group's timeout. (A peer on another node is noticed at once:
its TCP connections close.) ``PeerWatch`` holds a pidfd of every peer on this
node (Linux 5.3+, ``os.pidfd_open``) and one thread that sleeps in ``poll`` on
them; when one becomes readable (the process exited, however it died) it calls
``on_death(rank, pid)`` once, which aborts the group: its links close and every
rank blocked on them wakes with an error naming the dead rank::

    PeerWatch({2: 4711, 3: 4712}, on_death)     pidfds + a stop pipe, one thread in poll()
      peer 3 exits  -> on_death(3, 4712)         the thread ends
      stop()        -> the thread ends; fds closed

Where pidfds are missing (older kernels, non-Linux) nothing is watched and a
dead peer is found at the timeout, as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Mapping

from cgraph import _threads


class PeerWatch:
    """Calls ``on_death(rank, pid)`` from its own thread when the first of ``peers``
    (rank -> pid, processes of this node) exits; ``stop`` ends the watch."""

    def __init__(self, peers: Mapping[int, int], on_death: Callable[[int, int], None]) -> None:
        self._on_death = on_death
        self._fds: dict[int, tuple[int, int]] = {}
        self._gone: tuple[int, int] | None = None  # a peer already dead at the start
        opener = getattr(os, "pidfd_open", None)
        for rank, pid in peers.items():
            if opener is None:
                break
            try:
                self._fds[opener(pid)] = (rank, pid)
            except ProcessLookupError:
                self._gone = self._gone or (rank, pid)
            except OSError:
                continue  # not allowed or not supported here: this one is not watched
        self._stop_r, self._stop_w = os.pipe()
        self._thread = _threads.start(self._run, "cgraph-peer-watch")

    @property
    def watching(self) -> int:
        """How many peers have a pidfd (0 where the kernel has none)."""
        return len(self._fds)

    def stop(self) -> None:
        """End the watch (idempotent); ``on_death`` is not called after this returns."""
        if self._stop_w < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join()
        for fd in (*self._fds, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds, self._stop_w = {}, -1

    def _run(self) -> None:
        if self._gone is not None:
            self._on_death(*self._gone)
            return
        poller = select.poll()
        for fd in (*self._fds, self._stop_r):
            poller.register(fd, select.POLLIN)
        while True:
            ready = [fd for fd, _ in poller.poll()]
            if self._stop_r in ready:
                return
            dead = [self._fds[fd] for fd in ready if fd in self._fds]
            if dead:
                self._on_death(*dead[0])
                return
