"""The shared-memory channel's segments: the control segment's words and semaphores, and
each process's mappings of the slots' data segments (protocol: shm_channel.py)."""

from __future__ import annotations

import ctypes
import mmap
from typing import TYPE_CHECKING, Protocol

from cgraph.channels.segments import SHM_DIR, create_segment, open_segment, unlink_quietly
from cgraph.channels.semaphore import Semaphore
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:

    class Layout(Protocol):
        """What the segments are laid out by: a channel's ``ShmHandle`` (shm_channel.py)."""

        @property
        def name(self) -> str: ...
        @property
        def num_readers(self) -> int: ...
        @property
        def max_inflight(self) -> int: ...
        @property
        def buffer_size(self) -> int: ...

_PAGE = mmap.PAGESIZE
_MAGIC = 0x4C4E484348504743  # "CGPHCHNL"
_VERSION = 1
# Header words (u64): fixed fields, then the slot table, then reader sequence numbers.
_W_MAGIC, _W_VERSION, _W_READERS, _W_INFLIGHT, _W_CLOSED, _W_NEXT_GEN, _W_WSEQ = range(7)
_W_SLOTS = 8
_SLOT_WORDS = 4  # gen, capacity, nbytes, seq
_SEM_STRIDE = 64  # one cache line per 32-byte sem_t


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
    def open(cls, handle: Layout) -> _Control:
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

    def __init__(self, handle: Layout, control: _Control) -> None:
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
