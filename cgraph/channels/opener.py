"""Opening a channel endpoint from its handle, in the process that uses it.

    endpoint = open_endpoint(handle)     # a ChannelWriter or ChannelReader
    reader = open_reader(handle)         # the same, typed (TypeError for the other role)

The driver makes a channel and ships each end's handle (a small frozen
dataclass) to its actor inside Ray's own call; the actor opens it here. This
module is the one place that knows every kind of handle and the endpoint
classes behind it, so no handle class imports the endpoints built on it:

    ShmHandle     shared memory on one node: ``ShmWriter`` / ``ShmReader``, or
                  their C fast-path subclasses when the extension is built
    SocketHandle  TCP between nodes: ``SocketWriter`` / ``SocketReader``
    IntraHandle   inside one process: ``IntraWriter`` / ``IntraReader``
    RelayHandle   a node's gateway: a socket reader that fills a node channel,
                  and reader 0 of that node channel
"""

from __future__ import annotations

from cgraph.channels.base import ChannelReader, ChannelWriter
from cgraph.channels.intra_channel import IntraChannel, IntraHandle
from cgraph.channels.relay import RelayHandle, RelayReader
from cgraph.channels.shm_channel import ShmHandle, ShmReader, ShmWriter, open_shm
from cgraph.channels.socket_channel import SocketWriter
from cgraph.channels.socket_endpoint import SocketHandle
from cgraph.channels.socket_reader import SocketReader


def open_endpoint(handle: object) -> ChannelWriter | ChannelReader:
    """Open the endpoint ``handle`` describes; a socket end never waits for its peer.

    Raises:
        ChannelClosedError: the channel is closed, or (sockets) its control server
            cannot be reached because its owner exited.
        TypeError: ``handle`` is no channel handle.
    """
    if isinstance(handle, ShmHandle):
        return open_shm(handle)
    if isinstance(handle, SocketHandle):
        return SocketReader(handle) if handle.reader else SocketWriter(handle)
    if isinstance(handle, IntraHandle):
        channel = IntraChannel.shared(handle.key, handle.num_readers, handle.max_inflight)
        return channel.writer() if handle.reader < 0 else channel.reader(handle.reader)
    if isinstance(handle, RelayHandle):
        return _open_relay(handle)
    raise TypeError(f"not a channel handle: {type(handle).__name__}")


def open_reader(handle: object) -> ChannelReader:
    """``open_endpoint`` of a reader's handle.

    Raises:
        TypeError: ``handle`` opens a writer.
    """
    endpoint = open_endpoint(handle)
    if not isinstance(endpoint, ChannelReader):
        raise TypeError(f"{handle!r} is a writer's handle, not a reader's")
    return endpoint


def open_writer(handle: object) -> ChannelWriter:
    """``open_endpoint`` of a writer's handle.

    Raises:
        TypeError: ``handle`` opens a reader.
    """
    endpoint = open_endpoint(handle)
    if not isinstance(endpoint, ChannelWriter):
        raise TypeError(f"{handle!r} is a reader's handle, not a writer's")
    return endpoint


def _open_relay(handle: RelayHandle) -> RelayReader:
    sink = open_shm(handle.shm_writer)
    try:
        reader = open_shm(handle.shm_reader)
        relay = SocketReader(handle.socket, sink=sink)  # type: ignore[arg-type]
    except BaseException:
        sink.detach()
        raise
    assert isinstance(reader, ShmReader) and isinstance(sink, ShmWriter)  # opened from their handles
    return RelayReader(reader, relay, sink)
