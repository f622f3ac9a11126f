"""How a flat buffer is cut: balanced chunks (one per rank) and bounded slices.

    chunk_bounds(10, 4) -> ((0, 3), (3, 6), (6, 8), (8, 10))   first 10 % 4 get one more
    slice_bounds(10, 4) -> ((0, 4), (4, 8), (8, 10))          at most 4 elements each

Every rank computes the same bounds from the same count, so no sizes travel.
"""

from __future__ import annotations

import numpy as np

Bounds = tuple[tuple[int, int], ...]


def flat_view(buf: np.ndarray) -> np.ndarray:
    """A 1-D view of ``buf`` that shares its memory (so writes land in ``buf``).

    Raises:
        ValueError: ``buf`` is not a writeable C-contiguous numpy array.
    """
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"collectives run on numpy arrays, got {type(buf).__name__}")
    if not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError(
            "collectives run in place on a writeable C-contiguous array; "
            "pass np.ascontiguousarray(buf) and copy the result back"
        )
    return buf.reshape(-1)


def chunk_bounds(count: int, parts: int, offset: int = 0) -> Bounds:
    """``parts`` contiguous ranges covering ``offset .. offset+count``, sizes differing by <= 1."""
    base, extra = divmod(count, parts)
    bounds = []
    start = offset
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def slice_bounds(count: int, max_elems: int) -> Bounds:
    """Consecutive ranges of at most ``max_elems`` (>= 1) elements covering ``0 .. count``."""
    step = max(1, max_elems)
    return tuple((a, min(a + step, count)) for a in range(0, count, step))


def elems_per(nbytes: int, itemsize: int) -> int:
    """How many elements of ``itemsize`` bytes fit in ``nbytes`` (at least one)."""
    return max(1, nbytes // max(1, itemsize))
