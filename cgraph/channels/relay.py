"""A value read on several nodes crosses each node boundary once: a socket into one
process of the readers' node, then that node's shared memory for every reader there.

    node H: writer ══ socket (one) ══▶ node N: gateway process (the first reader)
                                         its receiving thread lands each value
                                         straight in a slot of an shm channel on N
                                         ┌───────────┬───────────┐
                                         reader 0    reader 1 ... (every reader on N,
                                         (the gateway  the gateway too), zero-copy views
                                          itself)

The relay's receiving thread reserves a slot before it gives the writer the
credit for the value that will fill it (``SocketReader`` with a sink), so the
writer never starts a value that could not land: it waits before it, exactly as
a shared-memory writer waits for its slowest reader. The readers are plain
``ShmReader``s; the gateway's own is wrapped in a ``RelayReader`` that also owns
the relay (detach ends both; a lost writer is reported as the socket saw it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cgraph.channels.base import ChannelReader
from cgraph.channels.shm_channel import ShmHandle, ShmReader, ShmWriter
from cgraph.channels.socket_endpoint import SocketHandle
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:
    from cgraph._boundary import UserValue
    from cgraph.channels.socket_reader import SocketReader


@dataclass(frozen=True, slots=True)
class RelayHandle:
    """The gateway's end: the socket's reader, and the node channel it writes and reads."""

    socket: SocketHandle
    shm_writer: ShmHandle
    shm_reader: ShmHandle


class RelayReader(ChannelReader):
    """Reader 0 of the node channel, which also runs the relay that fills it."""

    def __init__(self, reader: ShmReader, relay: SocketReader, sink: ShmWriter) -> None:
        self._reader, self._relay, self._sink = reader, relay, sink

    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        try:
            return self._reader.read(timeout, copy=copy)
        except ChannelClosedError:
            ended = self._relay._ended
            if ended is not None:  # the writer went away: say so, and which one
                raise self._relay._closed_error(ended) from None
            raise

    def release(self) -> None:
        self._reader.release()

    def close(self) -> None:
        self._relay.close()
        self._reader.close()

    def detach(self) -> None:
        self._relay.detach()
        self._reader.detach()
        self._sink.detach()

    def shm_endpoints(self) -> tuple[ShmReader, ShmWriter]:
        """The node channel's endpoints this process holds (a node watch closes them)."""
        return (self._reader, self._sink)
