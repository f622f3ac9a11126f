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

Forwarding (zero-copy pass-through): a reader that writes on what it read may
leave the buffers in its slot and hand the hold over to the next reader
(``write(forward_from=...)``, ``held``, ``hand_over``; protocol in forwarding.py).

C fast path. When the extension is built (``FASTPATH``), ``open_shm`` opens
``FastShmWriter`` / ``FastShmReader`` (the end of this file): small plain values
take one C call per write / read / release, everything else runs the Python
code they inherit. ``CGRAPH_PURE_PYTHON=1`` before cgraph is imported turns the
C path off.

Why. A pure-Python hop through the Python endpoints spends nearly all of its
time on interpreter and ctypes overhead around two semaphore operations, a
``pickle.dumps`` and a ``pickle.loads`` (docs/design-notes.md, "The channel's
hot path in C"). Here each endpoint gets
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
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cgraph.channels.base import ChannelReader, ChannelWriter
from cgraph.channels.forwarding import Origins, forward
from cgraph.channels.segments import (
    create_segment,
    segment_name,
    unlink_channel,
)
from cgraph.channels.semaphore import Semaphore, fastpath
from cgraph.channels.serialization import (
    dumps,
    has_buffers,
    loads,
    origin_of,
    pack_into,
)
from cgraph.channels.shm_layout import (
    _SLOT_WORDS,
    _W_CLOSED,
    _W_SLOTS,
    _W_WSEQ,
    _Control,
    _control_size,
    _reader_word,
    _sem_offset,
    _SlotMaps,
)
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

if TYPE_CHECKING:
    from cgraph._boundary import UserValue
    from cgraph.channels._fastpath import Endpoint

FASTPATH = fastpath is not None  # endpoints run their hot path in C (_fastpath.c)
_MISS = fastpath.MISS if fastpath is not None else object()  # the core's "Python, finish this"
POLL_S = 0.15
DEFAULT_BUFFER_SIZE = 1 << 20
_POLL_NS = int(POLL_S * 1e9)


@dataclass(frozen=True, slots=True)
class ShmHandle:
    """Picklable endpoint description; ``reader`` is -1 for the writer."""

    name: str
    num_readers: int
    max_inflight: int
    buffer_size: int = DEFAULT_BUFFER_SIZE
    reader: int = -1



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

    def write(self, value: UserValue, timeout: float | None = None,
              forward_from: Sequence[ChannelReader] = ()) -> ChannelReader | None:
        """Write ``value`` (one copy of its buffers into the slot).

        ``forward_from``: readers (of other shm channels, in this process) holding
        slots; where this channel has one reader and buffers of ``value`` lie in
        one of those slots, they are forwarded instead of copied (module docstring)
        and that reader's hold is handed over. Returns the reader handed over, or None.
        """
        if self._words[_W_CLOSED] or self._detached:
            raise _closed(self._handle, "write to")
        payload = dumps(value)
        taken = None
        if forward_from and payload.buffers and self._handle.num_readers == 1:
            payload, taken = forward(payload, forward_from)
        self.reserve(timeout)
        self.fill(payload.nbytes, lambda slot: pack_into(payload, slot))
        if taken is not None:
            assert isinstance(taken, ShmReader)  # only shm readers hold slots (``forward``)
            taken.hand_over()  # from now on our reader gives the slot back
        return taken

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

    def __reduce__(self) -> tuple[object, ...]:
        return (open_shm, (self._handle,))


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
        self._upstream: Semaphore | None = None  # a forwarded value's origin slot, to give back
        self._forwarded: tuple[memoryview, bytes] | None = None  # its origin's data and name
        self._foreign = Origins()

    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        """The next value; a zero-copy view valid until ``release()``, or with
        ``copy=True`` one copy of the slot's bytes that outlives it (the slot is
        released at once)."""
        if self._upstream is not None:
            self._give_upstream()
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

    def _decode(self, slot: int, copy: bool) -> UserValue:
        """The value in ``slot``, which this reader holds; released on error, or when copied."""
        words = self._words
        try:
            view = self._slots.readable(slot)
            origin = origin_of(view)
            if origin is not None:
                external, self._upstream = self._foreign.resolve(origin, self._open_control)
                self._forwarded = (external, origin)
                value = loads(view, external=external, copy=copy)
                if copy:
                    self.release()
                    self._give_upstream()
                return value
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
        if self._upstream is not None:
            self._give_upstream()
        if self._holding:
            self._holding = False
            self._free.post_fast()

    def _give_upstream(self) -> None:
        upstream, self._upstream, self._forwarded = self._upstream, None, None
        if upstream is not None:
            upstream.post()

    def held(self) -> tuple[memoryview, bytes] | None:
        """The slot holding the buffers of the value this reader holds (its data view)
        and the pickled origin a forwarded value names it by: this reader's own slot,
        or for a value forwarded to it the slot it came from (forwarded on again, the
        value's buffers stay there). None when it holds nothing."""
        if self._upstream is not None:
            return self._forwarded
        if not self._holding:
            return None
        return self._held_slot((self._words[self._word] - 1) % self._handle.max_inflight)

    def _held_slot(self, slot: int) -> tuple[memoryview, bytes]:
        at, handle = _W_SLOTS + _SLOT_WORDS * slot, self._handle
        gen, capacity = self._words[at], self._words[at + 1]
        origin = (f"{handle.name}_{gen}", capacity, handle.name, handle.reader, handle.num_readers,
                  handle.max_inflight)
        return self._slots.readable(slot), pickle.dumps(origin)

    def hand_over(self) -> None:
        """Stop holding the slot ``held`` named without giving it back: the reader of the
        value this one forwarded gives it back (``write(forward_from=...)``). A value that
        was forwarded to this reader passes its origin on; its own slot (a small record)
        is given back now."""
        if self._upstream is not None:
            self._upstream = self._forwarded = None
            self.release()
        else:
            self._holding = False

    @staticmethod
    def _open_control(name: str, num_readers: int, max_inflight: int, reader: int) -> Semaphore:
        return _Control.open(ShmHandle(name, num_readers, max_inflight)).free[reader]

    def close(self) -> None:
        self._control.close()

    def detach(self) -> None:
        self.release()
        self._detached = True
        self._slots.drop()

    def __reduce__(self) -> tuple[object, ...]:
        return (open_shm, (self._handle,))


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


def open_shm(handle: ShmHandle) -> ShmWriter | ShmReader:
    """Open this endpoint in the calling process (with the C fast path if ``FASTPATH``)."""
    if FASTPATH:
        return FastShmWriter(handle) if handle.reader < 0 else FastShmReader(handle)
    return ShmWriter(handle) if handle.reader < 0 else ShmReader(handle)


# --------------------------------------------------------------------------- C fast path
class FastShmWriter(ShmWriter):
    """A writer whose small plain values go through the C core in one call."""

    def __init__(self, handle: ShmHandle) -> None:
        super().__init__(handle)
        self._core = _core(handle, self._control, self._slots)

    def write(self, value: UserValue, timeout: float | None = None,
              forward_from: Sequence[ChannelReader] = ()) -> ChannelReader | None:
        if self._core.write(value, timeout) is not None:  # MISS: Python finishes (and forwards)
            return self._write_missed(value, timeout, forward_from)
        return None

    def _write_missed(self, value: UserValue, timeout: float | None,
                      forward_from: Sequence[ChannelReader]) -> ChannelReader | None:
        assert fastpath is not None  # a Fast endpoint has a C core
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

    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        if self._upstream is not None:  # the last value was forwarded: give its origin back too
            self._give_upstream()
        value = self._core.read(timeout, copy)
        if value is _MISS:
            return self._read_missed(timeout, copy)
        return value

    def _decode(self, slot: int, copy: bool) -> UserValue:
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

    def _read_missed(self, timeout: float | None, copy: bool) -> UserValue:
        status = self._core.status
        assert fastpath is not None  # a Fast endpoint has a C core
        if status == fastpath.DECODE:  # the core took the value and holds its slot
            slot = (self._words[self._word] - 1) % self._handle.max_inflight
            return self._decode(slot, copy)
        if status == fastpath.WAIT_FAILED:
            raise _wait_failed(self._handle, self._control, "read from", timeout)
        raise _closed(self._handle, "read from")

    def detach(self) -> None:
        self._core.detach()
        super().detach()


def _core(handle: ShmHandle, control: _Control, slots: _SlotMaps) -> Endpoint:
    assert fastpath is not None  # only FASTPATH endpoints have a C core
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
