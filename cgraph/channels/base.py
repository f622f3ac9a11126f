"""The channel interface every transport implements: one writer, N readers.

A writer ``write``s values in order; each reader ``read``s every value in the
same order and ``release``s it when done, which frees the slot for the writer.
A channel holds ``max_inflight`` values, so the writer can run that many values
ahead of its slowest reader before ``write`` blocks.

Endpoints are opened from a handle: a small frozen, picklable record (name and
layout) that the driver creates and ships to Ray actors, which ``attach`` it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cgraph._boundary import UserValue


class ChannelWriter(ABC):
    """The writing end of a channel."""

    @abstractmethod
    def write(self, value: UserValue, timeout: float | None = None) -> object:
        """Write ``value`` into the next slot, waiting for a free one.

        Raises:
            ChannelClosedError: the channel was closed (before or while waiting).
            ChannelTimeoutError: no slot freed within ``timeout`` seconds; nothing
                was written and the channel stays usable.
        """

    @abstractmethod
    def close(self) -> None:
        """Close the channel for everyone and wake every waiter (idempotent)."""

    @abstractmethod
    def detach(self) -> None:
        """Drop this endpoint's local resources; the channel stays open for others."""


class ChannelReader(ABC):
    """A reading end of a channel."""

    @abstractmethod
    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        """Return the next value, waiting for it; releases the previous one first.

        A zero-copy value (array views into shared memory or a receive buffer) is valid
        until ``release()``; ``copy=True`` returns one that outlives it (a reader whose
        values are never views of its memory ignores it).

        Raises:
            ChannelClosedError: the channel was closed (before or while waiting).
            ChannelTimeoutError: nothing arrived within ``timeout`` seconds; the
                next ``read`` still returns the next value.
        """

    @abstractmethod
    def release(self) -> None:
        """Give the last value's slot back to the writer (idempotent)."""

    @abstractmethod
    def close(self) -> None:
        """Close the channel for everyone and wake every waiter (idempotent)."""

    @abstractmethod
    def detach(self) -> None:
        """Drop this endpoint's local resources; the channel stays open for others."""


class ChannelHandle(Protocol):
    """A picklable description of one endpoint (a frozen dataclass); ``opener.open_endpoint``
    opens it in the process that uses it."""
