"""A node's shared workspace: memory every rank of one node maps, for the "shared" allreduce.

Links move a message with two copies (into a slot, out of it) and a wake-up per
message; a reduction over links pays that at every step. With one region all
ranks of a node map, an allreduce is one copy in, a reduction that reads every
rank's input where it lies, and one copy out (``algorithms.shared``).

The region grows in powers of two; every rank of the node asks for the same size
in the same call (it is part of a collective), so they agree on when it grows
without a message about it::

    view(nbytes, barrier)   capacity >= nbytes: the mapped region, at once
                            else node rank 0 makes <base>_<k> (2^k >= nbytes bytes) and
                            unlinks the smaller one, barrier(), the others map it

``meet`` is the node's barrier, on semaphores in ``<base>_0`` (made with the
first generation): each rank posts one token to every other rank's semaphore,
then takes L-1 from its own. Over links a barrier is ceil(log2 L) rounds of
messages; here it is L-1 posts and one sleep in the kernel (what it gained:
docs/design-notes.md, "Numbers behind the code"). Tokens cannot cross barriers: a rank leaves barrier k only
after every rank has posted its k-th tokens, so its L-1 tokens of barrier k all
exist by then, and no rank posts for k+1 before leaving k. ``close`` marks the
segment closed and wakes every sleeper, which then raises. After the semaphores,
``<base>_0`` holds a board of one row per rank (pid, a buffer's address, a verdict)
for ``algorithms.shared``'s reads of its peers' tensors (``peer_memory``).

Segments are named ``<base>_<k>`` after the base that the mesh's maker drew
(``segment_name``: its pid, so the next store or compile on the node frees them
if that process dies); ``unlink`` removes every generation. The tests' stand-in
for ranks that are threads is ``LocalArena`` in tests/fabric.py.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from collections.abc import Callable

import numpy as np

from cgraph.channels.segments import create_segment, open_segment, unlink_channel, unlink_quietly
from cgraph.channels.semaphore import Semaphore
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

MIN_CAPACITY = 1 << 20
STRIDE = 64
"""Bytes per semaphore in ``<base>_0`` (one cache line each); the closed flag is word 0."""
BOARD = 32
"""Bytes per rank of the board after the semaphores: pid, a buffer's address, a verdict, spare
(``algorithms.shared``'s reads of its peers' buffers, ``peer_memory``)."""
POLL_NS = 150_000_000
"""A sleeper in ``meet`` re-checks the closed flag this often (a lost wake-up costs this)."""


def size_class(nbytes: int) -> int:
    return max(nbytes, MIN_CAPACITY - 1).bit_length()


class ShmArena:
    """One rank's mapping of its node's workspace (see the module docstring).

    Args:
        base: the segments' base name (the same on every rank of the node).
        node_rank: this rank's index on its node (0 makes the segments).
        node_size: how many ranks the node has (one semaphore each).
    """

    def __init__(self, base: str, node_rank: int, node_size: int) -> None:
        self.base, self._node_rank, self._size = base, node_rank, node_size
        self._k, self._turn = 0, 1
        self._mm: mmap.mmap | None = None
        self._view: np.ndarray | None = None
        self._sync: mmap.mmap | None = None
        self.board: np.ndarray | None = None  # (node_size, 4) int64 in <base>_0, one row per rank
        self.peer_reads: bool | None = None  # may the node's ranks read each other (``peer_memory``)?
        self._flag: np.ndarray | None = None  # word 0 of <base>_0: 1 once closed
        self._sems: list[Semaphore] = []

    def view(self, nbytes: int, barrier: Callable[[], None]) -> np.ndarray:
        """A uint8 array of at least ``nbytes`` bytes that every rank of the node maps."""
        k = size_class(nbytes)
        if self._view is None or k > self._k:
            self._grow(k, barrier)
        assert self._view is not None
        return self._view

    def turn(self) -> int:
        """0, 1, 0, ...: which half of the workspace this call uses (every rank alike)."""
        self._turn ^= 1
        return self._turn

    def meet(self, timeout: float) -> None:
        """Return once every rank of the node has called ``meet`` (module docstring).

        Raises:
            ChannelTimeoutError: a rank did not come within ``timeout`` seconds.
            ChannelClosedError: a rank of the node closed the workspace (abort, destroy).
        """
        if not self._sems:
            raise RuntimeError("meet before the first view: the semaphores are not mapped")
        for j, sem in enumerate(self._sems):
            if j != self._node_rank:
                sem.post()
        mine, closed = self._sems[self._node_rank], self._closed
        deadline = time.monotonic_ns() + int(timeout * 1e9)
        for _ in range(self._size - 1):
            if not mine.acquire(deadline, POLL_NS, closed) and not closed():
                raise ChannelTimeoutError(f"a rank of this node did not reach the barrier within {timeout:g} s")
            if closed():
                raise ChannelClosedError("the node's workspace was closed (abort or destroy)")

    def close(self) -> None:
        """Mark the workspace closed and wake every rank asleep in ``meet`` (it raises)."""
        if self._flag is None:
            return
        self._flag[0] = 1
        for sem in self._sems:
            for _ in range(self._size):
                sem.post()

    def _closed(self) -> bool:
        return self._flag is not None and bool(self._flag[0])

    def _grow(self, k: int, barrier: Callable[[], None]) -> None:
        name = f"{self.base}_{k}"
        first = self._sync is None
        if self._node_rank == 0:
            if first:
                self._map_sync(create_segment(f"{self.base}_0", STRIDE * (self._size + 1) + BOARD * self._size),
                               init=True)
            mm = create_segment(name, 1 << k)
            if self._k:
                unlink_quietly(f"{self.base}_{self._k}")  # mapped views keep their pages
            barrier()
        else:
            barrier()
            if first:
                self._map_sync(open_segment(f"{self.base}_0"), init=False)
            mm = open_segment(name)
        self._k, self._mm = k, mm
        self._view = np.frombuffer(mm, dtype=np.uint8)  # the old mapping lives while viewed

    def _map_sync(self, mm: mmap.mmap, init: bool) -> None:
        anchor = (ctypes.c_char * len(mm)).from_buffer(mm)  # keeps the mapping while sems live
        base = ctypes.addressof(anchor)
        self._sync, self._flag = mm, np.frombuffer(mm, dtype=np.uint64, count=1)
        self._sems = [Semaphore(base + STRIDE * (j + 1), anchor) for j in range(self._size)]
        self.board = np.frombuffer(mm, dtype=np.int64, count=4 * self._size,
                                   offset=STRIDE * (self._size + 1)).reshape(self._size, 4)
        if init:
            for sem in self._sems:
                sem.init(0)

    def unlink(self) -> list[str]:
        """Remove every generation of the workspace from /dev/shm."""
        return unlink_channel(self.base)
