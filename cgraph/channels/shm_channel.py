"""Shared-memory channel: one writer, N readers, ``max_inflight`` slots, no atomics.

Segments (files in /dev/shm, opened without Python's resource_tracker)::

    cgraph_<creator pid>_<graph tag>_<channel id>          control: header + semaphores
    cgraph_<creator pid>_<graph tag>_<channel id>_<gen>    data of one slot, one per growth

    control segment
    ┌──────────────────────────────────────────────────────────────────────┐
    │ magic version R M closed next_gen writer_seq                         │
    │ slot 0: gen cap nbytes seq │ slot 1: ... │ ... slot M-1              │
    │ reader seq 0 .. R-1                                                  │
    │ reader 0: ready sem, free sem │ reader 1: ... │ ... reader R-1       │
    └──────────────────────────────────────────────────────────────────────┘
        slot k's data: segment ..._<gen k>, cap bytes (serialization layout)

Protocol (value number ``s`` goes to slot ``s % M``)::

    writer, write(v)                           reader r, read() / release()
    payload = dumps(v)                         wait ready[r]
    for r: wait free[r]   (starts at M)        (gen, nbytes) = slot[s % M]
    grow slot if too small (new gen)           v = loads(view of that slot)
    pack payload into slot s % M               ... caller uses v ...
    slot[s % M] = (gen, cap, nbytes, s)        release(): post free[r]
    for r: post ready[r]

Every shared word has exactly one writer process (slot table and next_gen: the
writer; reader seq r: reader r), and ``sem_post`` / ``sem_wait`` order the
memory, so plain stores suffice: no atomics. ``free[r]`` counts the slots reader
r has not yet claimed; the writer takes one token per reader per value, so it
runs at most M values ahead of the slowest reader, and it only touches slot
``s % M`` after every reader has released value ``s - M`` from it.

A slot grows when a larger value comes: the writer creates a new generation
(1.5x), unlinks the old name; readers map the new one when they see it. Mappings
are never closed, only dropped: old pages live while some array views them.

``close()`` (any endpoint or the owner, any process) sets ``closed`` and posts
every semaphore, so every waiter wakes and raises ``ChannelClosedError``;
waiters also wake every ``POLL_S`` to re-check the flag, so a lost post delays
them at most that long. A timeout gives back the tokens it took and raises
``ChannelTimeoutError``; the channel stays consistent. The owner's ``unlink()``
removes every segment of the channel; ``cleanup_stale_segments()`` removes those
whose creator process is dead.

C fast path. When the extension is built (``FASTPATH``), ``attach()`` opens the
subclasses in shm_fast.py: small plain values take one C call per write / read
/ release, everything else runs the code below. Both speak this protocol and
keep the endpoint's sequence numbers in the shared words, so they interoperate.
``CGRAPH_PURE_PYTHON=1`` turns the C path off.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cgraph.channels.base import ChannelReader, ChannelWriter
from cgraph.channels.segments import (
    SHM_DIR,
    create_segment,
    open_segment,
    segment_name,
    unlink_channel,
    unlink_quietly,
)
from cgraph.channels.semaphore import Semaphore, fastpath
from cgraph.channels.serialization import dumps, has_buffers, loads, pack_into
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

FASTPATH = fastpath is not None  # endpoints run their hot path in C (_fastpath.c)
POLL_S = 0.15
DEFAULT_BUFFER_SIZE = 1 << 20
_POLL_NS = int(POLL_S * 1e9)
_PAGE = mmap.PAGESIZE
_MAGIC = 0x4C4E484348504743  # "CGPHCHNL"
_VERSION = 1
# Header words (u64): fixed fields, then the slot table, then reader sequence numbers.
_W_MAGIC, _W_VERSION, _W_READERS, _W_INFLIGHT, _W_CLOSED, _W_NEXT_GEN, _W_WSEQ = range(7)
_W_SLOTS = 8
_SLOT_WORDS = 4  # gen, capacity, nbytes, seq
_SEM_STRIDE = 64  # one cache line per 32-byte sem_t


@dataclass(frozen=True, slots=True)
class ShmHandle:
    """Picklable endpoint description; ``reader`` is -1 for the writer."""

    name: str
    num_readers: int
    max_inflight: int
    buffer_size: int = DEFAULT_BUFFER_SIZE
    reader: int = -1

    def attach(self) -> ShmWriter | ShmReader:
        """Open this endpoint in the calling process (with the C fast path if ``FASTPATH``)."""
        if FASTPATH:
            from cgraph.channels.shm_fast import FastShmReader, FastShmWriter  # builds on this

            return FastShmWriter(self) if self.reader < 0 else FastShmReader(self)
        return ShmWriter(self) if self.reader < 0 else ShmReader(self)


class ShmChannel:
    """The owner's view (the driver): creates, closes and unlinks the segments."""

    def __init__(self, handle: ShmHandle, control: _Control) -> None:
        self.handle = handle
        self._control = control

    @classmethod
    def create(
        cls,
        tag: str,
        channel_id: str,
        *,
        num_readers: int = 1,
        max_inflight: int = 1,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
    ) -> ShmChannel:
        """Create the control segment of a new channel (data segments come on first write).

        Args:
            tag: the compiled graph's tag; channel_id: the edge, any text.
            buffer_size: smallest slot data segment; larger values grow the slot.

        Raises:
            ValueError: a non-positive ``num_readers`` or ``max_inflight``.
            FileExistsError: a channel of that name exists (same tag and id).
        """
        if num_readers < 1 or max_inflight < 1:
            raise ValueError(
                f"channel {channel_id!r}: num_readers={num_readers} and "
                f"max_inflight={max_inflight} must both be at least 1"
            )
        handle = ShmHandle(segment_name(tag, channel_id), num_readers, max_inflight, buffer_size)
        mm = create_segment(handle.name, _control_size(num_readers, max_inflight))
        control = _Control(mm, num_readers, max_inflight)
        control.initialise()
        return cls(handle, control)

    def writer_handle(self) -> ShmHandle:
        return self.handle

    def reader_handle(self, index: int) -> ShmHandle:
        if not 0 <= index < self.handle.num_readers:
            raise IndexError(f"reader {index} of a {self.handle.num_readers}-reader channel")
        return replace(self.handle, reader=index)

    @property
    def closed(self) -> bool:
        return self._control.is_closed()

    def close(self) -> None:
        """Close the channel and wake every waiter, in every process."""
        self._control.close()

    def unlink(self) -> list[str]:
        """Remove every segment of the channel; returns the names removed."""
        return unlink_channel(self.handle.name)

    def __enter__(self) -> ShmChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


class ShmWriter(ChannelWriter):
    """The writing end; one per channel, used by one thread at a time."""

    def __init__(self, handle: ShmHandle) -> None:
        self._handle = handle
        self._control = control = _Control.open(handle)
        self._words = control.words
        self._slots = _SlotMaps(handle, control)
        self._detached = False

    def write(self, value: Any, timeout: float | None = None) -> None:
        if self._words[_W_CLOSED] or self._detached:
            raise _closed(self._handle, "write to")
        payload = dumps(value)
        self.reserve(timeout)
        self.fill(payload.nbytes, lambda slot: pack_into(payload, slot))

    def reserve(self, timeout: float | None = None) -> None:
        """Wait until every reader released the next slot, and take it (``fill`` writes it).

        Raises:
            ChannelClosedError, ChannelTimeoutError: as ``write``; nothing is taken.
        """
        if self._words[_W_CLOSED] or self._detached:
            raise _closed(self._handle, "write to")
        for i, sem in enumerate(self._control.free):  # one token per reader: its slot is free
            if sem.try_acquire_fast() != 0:
                self._wait_free(i, timeout)
                break

    def fill(self, nbytes: int, write_into: Callable[[memoryview], None]) -> None:
        """Write the reserved slot: ``write_into`` gets a view of ``nbytes`` bytes (the slot
        grown if needed); then every reader may read it. If it raises, the slot stays
        untouched and is given back."""
        words, control = self._words, self._control
        seq = words[_W_WSEQ]  # in the shared words: the C path counts there too
        slot = seq % self._handle.max_inflight
        try:
            write_into(self._slots.writable(slot, nbytes))
        except BaseException:
            self._give_back(len(control.free))  # nothing written: slot untouched
            raise
        at = _W_SLOTS + _SLOT_WORDS * slot
        words[at + 2], words[at + 3] = nbytes, seq
        words[_W_WSEQ] = seq + 1
        for sem in control.ready:
            sem.post_fast()

    def _wait_free(self, first: int, timeout: float | None) -> None:
        """Blocking part of taking the free tokens; on failure gives back those taken."""
        control, taken = self._control, first
        deadline = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
        try:
            for i in range(first, len(control.free)):
                if not control.free[i].acquire(deadline, _POLL_NS, control.is_closed):
                    raise _wait_failed(self._handle, control, "write to", timeout)
                taken = i + 1
        except BaseException:  # also KeyboardInterrupt while asleep
            self._give_back(taken)
            raise

    def _give_back(self, count: int) -> None:
        for sem in self._control.free[:count]:
            sem.post()

    def close(self) -> None:
        self._control.close()

    def detach(self) -> None:
        self._detached = True
        self._slots.drop()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShmHandle.attach, (self._handle,))


class ShmReader(ChannelReader):
    """Reader ``handle.reader`` of a channel, used by one thread at a time."""

    def __init__(self, handle: ShmHandle) -> None:
        self._handle = handle
        self._control = control = _Control.open(handle)
        self._words = control.words
        self._slots = _SlotMaps(handle, control)
        self._word = _reader_word(handle.max_inflight, handle.reader)
        self._ready = control.ready[handle.reader]
        self._free = control.free[handle.reader]
        self._holding = False
        self._detached = False

    def read(self, timeout: float | None = None, copy: bool = False) -> Any:
        """The next value; a zero-copy view valid until ``release()``, or with
        ``copy=True`` one copy of the slot's bytes that outlives it (the slot is
        released at once)."""
        if self._holding:
            self._holding = False
            self._free.post_fast()
        words = self._words
        if words[_W_CLOSED] or self._detached:
            raise _closed(self._handle, "read from")
        if self._ready.try_acquire_fast() != 0:
            control = self._control
            deadline = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
            if not self._ready.acquire(deadline, _POLL_NS, control.is_closed):
                raise _wait_failed(self._handle, control, "read from", timeout)
        if words[_W_CLOSED]:
            raise _closed(self._handle, "read from")
        seq = words[self._word]  # in the shared words: the C path counts there too
        words[self._word] = seq + 1
        self._holding = True
        return self._decode(seq % self._handle.max_inflight, copy)

    def _decode(self, slot: int, copy: bool) -> Any:
        """The value in ``slot``, which this reader holds; released on error, or when copied."""
        words = self._words
        try:
            view = self._slots.readable(slot)
            if copy:
                if not has_buffers(view):  # unpickling copies already: no private copy
                    value = loads(view)
                    self.release()
                    return value
                nbytes = words[_W_SLOTS + _SLOT_WORDS * slot + 2]
                private = memoryview(bytearray(view[:nbytes]))
                self.release()
                return loads(private, writable=True)
            return loads(view)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._holding:
            self._holding = False
            self._free.post_fast()

    def close(self) -> None:
        self._control.close()

    def detach(self) -> None:
        self.release()
        self._detached = True
        self._slots.drop()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShmHandle.attach, (self._handle,))


# --------------------------------------------------------------------------- control segment
class _Control:
    """The mapped control segment: header words and the semaphores."""

    def __init__(self, mm: mmap.mmap, num_readers: int, max_inflight: int) -> None:
        self.mm = mm
        self.words = memoryview(mm).cast("Q")
        anchor = ctypes.c_char.from_buffer(mm)  # pins the mapping for the semaphores
        base = ctypes.addressof(anchor) + _sem_offset(num_readers, max_inflight)
        ready_at = [base + 2 * r * _SEM_STRIDE for r in range(num_readers)]
        self.ready = [Semaphore(at, anchor) for at in ready_at]
        self.free = [Semaphore(at + _SEM_STRIDE, anchor) for at in ready_at]
        self.max_inflight = max_inflight

    @classmethod
    def open(cls, handle: ShmHandle) -> _Control:
        try:
            mm = open_segment(handle.name)
        except FileNotFoundError:
            raise ChannelClosedError(
                f"shm channel {handle.name}: no such segment in {SHM_DIR} (torn down, or "
                "never created: create it with ShmChannel.create before attaching)"
            ) from None
        control = cls(mm, handle.num_readers, handle.max_inflight)
        layout = (_MAGIC, handle.num_readers, handle.max_inflight)
        if tuple(control.words[i] for i in (_W_MAGIC, _W_READERS, _W_INFLIGHT)) != layout:
            raise ValueError(
                f"shm channel {handle.name}: segment layout does not match the handle "
                f"({handle.num_readers} readers, {handle.max_inflight} slots)"
            )
        return control

    def initialise(self) -> None:
        w = self.words
        w[_W_MAGIC], w[_W_VERSION] = _MAGIC, _VERSION
        w[_W_READERS], w[_W_INFLIGHT] = len(self.ready), self.max_inflight
        for ready, free in zip(self.ready, self.free, strict=True):
            ready.init(0)
            free.init(self.max_inflight)

    def is_closed(self) -> bool:
        return self.words[_W_CLOSED] != 0

    def close(self) -> None:
        self.words[_W_CLOSED] = 1
        for sem in (*self.ready, *self.free):
            sem.post()  # each semaphore has at most one waiter: one post wakes it


class _SlotMaps:
    """This process's mappings of the slots' data segments, by generation."""

    def __init__(self, handle: ShmHandle, control: _Control) -> None:
        self._handle = handle
        self._words = control.words
        n = handle.max_inflight
        # Read by the C fast path too (it holds these very lists): mutate, never rebind.
        self.gens = [0] * n
        self.views: list[memoryview | None] = [None] * n

    def readable(self, slot: int) -> memoryview:
        at = _W_SLOTS + _SLOT_WORDS * slot
        gen, view = self._words[at], self.views[slot]
        if view is None or self.gens[slot] != gen:
            mm = open_segment(f"{self._handle.name}_{gen}", self._words[at + 1])
            view = self._map(slot, gen, mm)
        return view

    def writable(self, slot: int, nbytes: int) -> memoryview:
        words, at = self._words, _W_SLOTS + _SLOT_WORDS * slot
        gen, capacity = words[at], words[at + 1]
        if nbytes <= capacity:
            return self.readable(slot)
        new_capacity = _round_up(max(nbytes, self._handle.buffer_size, capacity * 3 // 2), _PAGE)
        new_gen = words[_W_NEXT_GEN] = words[_W_NEXT_GEN] + 1  # recorded before it exists
        mm = create_segment(f"{self._handle.name}_{new_gen}", new_capacity)
        if gen:
            unlink_quietly(f"{self._handle.name}_{gen}")  # live views keep their pages
        words[at], words[at + 1] = new_gen, new_capacity
        return self._map(slot, new_gen, mm)

    def _map(self, slot: int, gen: int, mm: mmap.mmap) -> memoryview:
        # The old view is dropped, never closed: arrays may still point into it.
        view = memoryview(mm)
        self.gens[slot], self.views[slot] = gen, view
        return view

    def drop(self) -> None:
        self.views[:] = [None] * len(self.views)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _reader_word(max_inflight: int, reader: int) -> int:
    return _W_SLOTS + _SLOT_WORDS * max_inflight + reader


def _sem_offset(num_readers: int, max_inflight: int) -> int:
    return _round_up(8 * _reader_word(max_inflight, num_readers), _SEM_STRIDE)


def _control_size(num_readers: int, max_inflight: int) -> int:
    size = _sem_offset(num_readers, max_inflight) + 2 * num_readers * _SEM_STRIDE
    return _round_up(size, _PAGE)


def _closed(handle: ShmHandle, what: str) -> ChannelClosedError:
    return ChannelClosedError(f"cannot {what} shm channel {handle.name}: it is closed")


def _wait_failed(
    handle: ShmHandle, control: _Control, what: str, timeout: float | None
) -> Exception:
    if control.is_closed():
        return ChannelClosedError(
            f"shm channel {handle.name} was closed while waiting to {what} it "
            "(teardown, or a failure elsewhere in the graph)"
        )
    return ChannelTimeoutError(
        f"timed out after {timeout}s waiting to {what} shm channel {handle.name} "
        f"(slowest peer still busy); the channel is unchanged, retry or raise the timeout"
    )
