"""Shared-memory channel endpoints whose hot path runs in C (``_fastpath.c``).

Why. A pure-Python hop through shm_channel.py costs ~5 us for a small value,
nearly all of it interpreter and ctypes overhead around two semaphore
operations, a ``pickle.dumps`` and a ``pickle.loads``. Here each endpoint gets
a C core (``_fastpath.Endpoint``) that does a whole small-value write, or a
whole read, in one call::

    FastShmWriter.write(v)                  FastShmReader.read()
      core.write(v) ── None: done             core.read() ── a value: done
         │ MISS                                  │ MISS
         ├ FALLBACK: ShmWriter.write(v)          ├ DECODE: ShmReader._decode (held slot)
         └ WAIT_FAILED: raise timeout/closed     ├ WAIT_FAILED: raise timeout/closed
                                                 └ CLOSED: raise closed
    FastShmReader.release = core.release  (a C method, no Python frame)

What stays in Python: values that need the out-of-band pickler (numpy
arrays, torch tensors, anything but a small tuple / list / dict of scalars),
creating and mapping slot generations, slots holding out-of-band buffers, and
every error message. The semaphore operations on those paths are C functions
too (semaphore.py). The Python side keeps owning every mmap: the core reads the
endpoint's ``_SlotMaps.gens`` / ``.views`` lists in place, so a slot mapped by
Python is seen by C on the next call, and mappings are still only dropped.

Interop guarantee. The C core writes the same slot bytes (header, then the
``pickle.dumps(v, 5)`` bytes that serialization.dumps makes for such values)
and counts sequence numbers in the same shared words, so a fast endpoint and a
pure-Python one (another process, or ``CGRAPH_PURE_PYTHON=1``) of one channel
work together. A fast endpoint's own state (the reader's held slot) lives in
its core; ``ShmReader._holding`` is unused here.

Disable with ``CGRAPH_PURE_PYTHON=1`` before cgraph is imported;
``shm_channel.FASTPATH`` says which path ``attach()`` takes.
"""

from __future__ import annotations

from typing import Any

from cgraph.channels.semaphore import fastpath
from cgraph.channels.shm_channel import (
    _POLL_NS,
    ShmHandle,
    ShmReader,
    ShmWriter,
    _closed,
    _Control,
    _sem_offset,
    _SlotMaps,
    _wait_failed,
)

if fastpath is None:  # shm_channel only imports this module when FASTPATH
    raise ImportError("cgraph.channels._fastpath is not available (or CGRAPH_PURE_PYTHON=1)")
_MISS = fastpath.MISS


class FastShmWriter(ShmWriter):
    """A writer whose small plain values go through the C core in one call."""

    def __init__(self, handle: ShmHandle) -> None:
        super().__init__(handle)
        self._core = _core(handle, self._control, self._slots)

    def write(self, value: Any, timeout: float | None = None, forward_from: Any = ()) -> Any:
        if self._core.write(value, timeout) is not None:  # MISS: Python finishes (and forwards)
            return self._write_missed(value, timeout, forward_from)
        return None

    def _write_missed(self, value: Any, timeout: float | None, forward_from: Any) -> Any:
        if self._core.status == fastpath.WAIT_FAILED:
            raise _wait_failed(self._handle, self._control, "write to", timeout)
        return super().write(value, timeout, forward_from)  # FALLBACK: nothing done yet

    def detach(self) -> None:
        self._core.detach()
        super().detach()


class FastShmReader(ShmReader):
    """A reader that reads, unpickles and releases small values in C."""

    def __init__(self, handle: ShmHandle) -> None:
        super().__init__(handle)
        self._core = _core(handle, self._control, self._slots)
        self.release = self._core.release  # type: ignore[method-assign]  # C, no frame

    def read(self, timeout: float | None = None, copy: bool = False) -> Any:
        if self._upstream is not None:  # the last value was forwarded: give its origin back too
            self._give_upstream()
        value = self._core.read(timeout, copy)
        if value is _MISS:
            return self._read_missed(timeout, copy)
        return value

    def _decode(self, slot: int, copy: bool) -> Any:
        value = super()._decode(slot, copy)
        if self._upstream is not None:  # a forwarded value: release gives both slots back
            self.release = self._release_both  # type: ignore[method-assign]
        return value

    def _release_both(self) -> None:
        self.release = self._core.release  # type: ignore[method-assign]
        self._core.release()
        self._give_upstream()

    def held(self) -> tuple[memoryview, bytes] | None:
        if self._upstream is not None:
            return self._forwarded
        if not self._core.holding:
            return None
        return self._held_slot((self._words[self._word] - 1) % self._handle.max_inflight)

    def hand_over(self) -> None:
        if self._upstream is not None:  # passes the origin on; our slot holds a small record
            self._upstream = self._forwarded = None
            self.release = self._core.release  # type: ignore[method-assign]
            self._core.release()
        else:
            self._core.forget()

    def _read_missed(self, timeout: float | None, copy: bool) -> Any:
        status = self._core.status
        if status == fastpath.DECODE:  # the core took the value and holds its slot
            slot = (self._words[self._word] - 1) % self._handle.max_inflight
            return self._decode(slot, copy)
        if status == fastpath.WAIT_FAILED:
            raise _wait_failed(self._handle, self._control, "read from", timeout)
        raise _closed(self._handle, "read from")

    def detach(self) -> None:
        self._core.detach()
        super().detach()


def _core(handle: ShmHandle, control: _Control, slots: _SlotMaps) -> Any:
    return fastpath.Endpoint(
        control.words,
        slots.gens,
        slots.views,
        handle.reader,
        handle.num_readers,
        handle.max_inflight,
        _sem_offset(handle.num_readers, handle.max_inflight),
        _POLL_NS,
    )
