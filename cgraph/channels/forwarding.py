"""Forwarding: a pass-through leaves what it read in the upstream slot (zero-copy).

A reader that holds value ``s`` of channel U and writes part of it on to channel
D (one reader) may leave those buffers in U's slot instead of copying them: D's
slot then carries the pickle bytes, EXTERNAL entries (offsets into U's slot
data, ``serialization.forwarded``) and the origin (U's data segment and its
size, U's control segment, the forwarding reader's index). The forwarding
reader hands its hold over (it will not post ``free``); D's reader maps U's
slot, reads the value as views into it, and on release posts its own ``free``
and U's ``free[r]`` for the reader it took over from, so U's writer reuses the
slot only after the last reader of the value is done::

    U: writer ─► slot s ─► reader r (actor P)        P: write(v, forward_from=[reader r])
    D: writer (P) ─► slot: pickle + origin ─► reader (actor Q): views into U's slot s
                                                     release: post D.free, U.free[r]

Only the writer decides (``forward``): a buffer forwards when its memory lies in
a slot one of ``forward_from`` holds; D must have one reader (one release gives
U's slot back). The caller makes sure nothing reads the handed-over slot after
the write (cgraph's executor forwards only the lane's last op).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cgraph.channels.segments import open_segment
from cgraph.channels.serialization import Payload, forwarded
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelReader
    from cgraph.channels.semaphore import Semaphore

OpenFree = Callable[[str, int, int, int], "Semaphore"]
"""(control segment, readers, slots, reader) -> that reader's ``free`` semaphore."""


class Origins:
    """A reader's mappings of the channels whose slots forwarded values live in."""

    _KEEP = 8  # data segments kept mapped (one per upstream slot and generation)

    def __init__(self) -> None:
        self.data: dict[str, memoryview] = {}
        self.free: dict[tuple[str, int], Semaphore] = {}

    def resolve(self, origin: bytes, open_free: OpenFree) -> tuple[memoryview, Semaphore]:
        """The origin slot's data and the semaphore that gives it back to its writer."""
        segment, capacity, control, reader, num_readers, max_inflight = pickle.loads(origin)
        try:
            data = self.data.get(segment)
            if data is None:
                if len(self.data) >= self._KEEP:  # dropped, never closed: views keep their pages
                    self.data.pop(next(iter(self.data)))
                data = self.data[segment] = memoryview(open_segment(segment, capacity))
            free = self.free.get((control, reader))
            if free is None:
                free = self.free[(control, reader)] = open_free(control, num_readers, max_inflight, reader)
        except FileNotFoundError:
            raise ChannelClosedError(f"shm channel {control}: a forwarded value's origin is gone "
                                     "(torn down)") from None
        return data, free


def forward(payload: Payload, holders: Sequence[ChannelReader]) -> tuple[Payload, ChannelReader | None]:
    """``payload`` with the buffers that lie in one holder's slot forwarded, and that
    holder (the payload as is and None when no buffer does)."""
    import numpy as np

    addresses = [np.frombuffer(buf, np.uint8).ctypes.data if buf.nbytes else -1 for buf in payload.buffers]
    for holder in holders:
        held = getattr(holder, "held", lambda: None)()
        if held is None:
            continue
        view, origin = held
        base = np.frombuffer(view, np.uint8).ctypes.data
        inside = {i: address - base for i, (address, buf) in enumerate(zip(addresses, payload.buffers, strict=True))
                  if base <= address and address + buf.nbytes <= base + view.nbytes}
        if inside:
            return forwarded(payload, inside, origin), holder
    return payload, None
