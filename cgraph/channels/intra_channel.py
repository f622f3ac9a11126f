"""Intra-process channel: the channel interface for edges inside one actor.

Values are handed over by reference: no copy, no serialization. A ring of
``max_inflight`` slots and one condition variable give the same semantics as
the shared-memory channel (one writer, N readers, each reader sees every value
in order, the writer runs at most ``max_inflight`` values ahead), so the
executor treats both alike; blocking works across threads of the process.

Handles are picklable (a key and the layout): the driver ships them to the
actor, and ``attach`` finds or creates the channel of that key in the actor's
process-local registry, so the writer and readers of an edge meet there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cgraph.channels.base import ChannelReader, ChannelWriter
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

if TYPE_CHECKING:
    from cgraph._boundary import UserValue

_registry: dict[str, IntraChannel] = {}
_registry_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class IntraHandle:
    """Picklable endpoint description; ``reader`` is -1 for the writer."""

    key: str
    num_readers: int = 1
    max_inflight: int = 1
    reader: int = -1


class IntraChannel:
    """A ring of ``max_inflight`` values shared by one writer and N readers."""

    def __init__(self, num_readers: int = 1, max_inflight: int = 1, key: str = "") -> None:
        if num_readers < 1 or max_inflight < 1:
            raise ValueError(
                f"intra channel {key!r}: num_readers={num_readers} and "
                f"max_inflight={max_inflight} must both be at least 1"
            )
        self.key = key
        self.num_readers = num_readers
        self.max_inflight = max_inflight
        self._ring: list[UserValue] = [None] * max_inflight
        self._written = 0
        self._claimed = [0] * num_readers  # next value number each reader reads
        self._released = [0] * num_readers
        self._closed = False
        self._cond = threading.Condition()

    @classmethod
    def shared(cls, key: str, num_readers: int, max_inflight: int) -> IntraChannel:
        """The process-local channel registered under ``key``, created on first use."""
        with _registry_lock:
            channel = _registry.get(key)
            if channel is None:
                channel = _registry[key] = cls(num_readers, max_inflight, key)
        if (channel.num_readers, channel.max_inflight) != (num_readers, max_inflight):
            raise ValueError(f"intra channel {key!r} exists with a different layout")
        return channel

    def writer(self) -> IntraWriter:
        return IntraWriter(self)

    def reader(self, index: int) -> IntraReader:
        if not 0 <= index < self.num_readers:
            raise IndexError(f"reader {index} of a {self.num_readers}-reader channel")
        return IntraReader(self, index)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the channel and wake every waiting thread."""
        with self._cond:
            self._closed = True
            self._ring = [None] * self.max_inflight
            self._cond.notify_all()

    def unlink(self) -> None:
        """Forget the channel in the registry (the counterpart of the shm unlink)."""
        with _registry_lock:
            if _registry.get(self.key) is self:
                del _registry[self.key]

    def put(self, value: UserValue, timeout: float | None) -> None:
        with self._cond:
            if not self._cond.wait_for(self._has_room, timeout):
                raise self._timed_out("write to", timeout)
            if self._closed:
                raise self._closed_error("write to")
            self._ring[self._written % self.max_inflight] = value
            self._written += 1
            self._cond.notify_all()

    def get(self, reader: int, timeout: float | None) -> UserValue:
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._closed or self._claimed[reader] < self._written, timeout
            )
            if not ready:
                raise self._timed_out("read from", timeout)
            if self._closed:
                raise self._closed_error("read from")
            value = self._ring[self._claimed[reader] % self.max_inflight]
            self._claimed[reader] += 1
            return value

    def release(self, reader: int) -> None:
        with self._cond:
            before = min(self._released)
            self._released[reader] += 1
            if min(self._released) > before:  # every reader is done with value `before`
                self._ring[before % self.max_inflight] = None
                self._cond.notify_all()

    def _has_room(self) -> bool:
        return self._closed or self._written - min(self._released) < self.max_inflight

    def _closed_error(self, what: str) -> ChannelClosedError:
        return ChannelClosedError(f"cannot {what} intra channel {self.key!r}: it is closed")

    def _timed_out(self, what: str, timeout: float | None) -> ChannelTimeoutError:
        return ChannelTimeoutError(
            f"timed out after {timeout}s waiting to {what} intra channel {self.key!r}; "
            "the channel is unchanged"
        )


class IntraWriter(ChannelWriter):
    def __init__(self, channel: IntraChannel) -> None:
        self.channel = channel

    def write(self, value: UserValue, timeout: float | None = None) -> None:
        self.channel.put(value, timeout)

    def close(self) -> None:
        self.channel.close()

    def detach(self) -> None:
        pass  # nothing process-local beyond the shared object


class IntraReader(ChannelReader):
    def __init__(self, channel: IntraChannel, index: int) -> None:
        self.channel = channel
        self.index = index
        self._holding = False

    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        """The next value (``copy`` changes nothing: values are never views of a slot)."""
        self.release()
        value = self.channel.get(self.index, timeout)
        self._holding = True
        return value

    def release(self) -> None:
        if self._holding:
            self._holding = False
            self.channel.release(self.index)

    def close(self) -> None:
        self.channel.close()

    def detach(self) -> None:
        self.release()
