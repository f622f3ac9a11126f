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

Segments are named ``<base>_<k>`` after the base that the mesh's maker drew
(``segment_name``: its pid, so the next store or compile on the node frees them
if that process dies); ``unlink`` removes every generation. ``LocalArena`` is the
in-process stand-in for ranks that are threads (``LocalTransport``).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

from cgraph.channels.segments import create_segment, open_segment, unlink_channel, unlink_quietly

MIN_CAPACITY = 1 << 20


def _class_of(nbytes: int) -> int:
    return max(nbytes, MIN_CAPACITY - 1).bit_length()


class ShmArena:
    """One rank's mapping of its node's workspace (see the module docstring).

    Args:
        base: the segments' base name (the same on every rank of the node).
        node_rank: this rank's index on its node (0 makes the segments).
    """

    def __init__(self, base: str, node_rank: int) -> None:
        self.base, self._node_rank = base, node_rank
        self._k, self._turn = 0, 1
        self._mm: mmap.mmap | None = None
        self._view: np.ndarray | None = None

    def view(self, nbytes: int, barrier: Callable[[], None]) -> np.ndarray:
        """A uint8 array of at least ``nbytes`` bytes that every rank of the node maps."""
        k = _class_of(nbytes)
        if self._view is None or k > self._k:
            self._grow(k, barrier)
        assert self._view is not None
        return self._view

    def turn(self) -> int:
        """0, 1, 0, ...: which half of the workspace this call uses (every rank alike)."""
        self._turn ^= 1
        return self._turn

    def _grow(self, k: int, barrier: Callable[[], None]) -> None:
        name = f"{self.base}_{k}"
        if self._node_rank == 0:
            mm = create_segment(name, 1 << k)
            if self._k:
                unlink_quietly(f"{self.base}_{self._k}")  # mapped views keep their pages
            barrier()
        else:
            barrier()
            mm = open_segment(name)
        self._k, self._mm = k, mm
        self._view = np.frombuffer(mm, dtype=np.uint8)  # the old mapping lives while viewed

    def unlink(self) -> list[str]:
        """Remove every generation of the workspace from /dev/shm."""
        return unlink_channel(self.base)


class LocalArena:
    """The workspace of ranks that are threads of one process (tests, ``LocalTransport``)."""

    def __init__(self, shared: dict[str, np.ndarray], node_rank: int) -> None:
        self._shared, self._node_rank, self._k, self._turn = shared, node_rank, 0, 1

    def turn(self) -> int:
        self._turn ^= 1
        return self._turn

    def view(self, nbytes: int, barrier: Callable[[], None]) -> np.ndarray:
        k = _class_of(nbytes)
        if k > self._k:  # every rank of the node decides alike: same sizes, same order
            if self._node_rank == 0:
                self._shared["region"] = np.zeros(1 << k, dtype=np.uint8)
            barrier()
            self._k = k
        return self._shared["region"]
