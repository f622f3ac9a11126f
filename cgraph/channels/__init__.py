"""Channels: how values move between the operations of a compiled graph.

``ShmChannel`` (shared memory, between processes of one node),
``SocketChannel`` (TCP, between nodes, brokered by the driver's
``ControlServer``) and ``IntraChannel`` (inside one process) implement the
``ChannelWriter`` / ``ChannelReader`` interface of ``base``; the driver creates
a channel and ships picklable handles (``ShmHandle``, ``SocketHandle``,
``IntraHandle``) whose ``attach()`` opens an endpoint in the actor.
"""

from __future__ import annotations

from cgraph.channels.base import ChannelHandle, ChannelReader, ChannelWriter
from cgraph.channels.intra_channel import IntraChannel, IntraHandle, IntraReader, IntraWriter
from cgraph.channels.segments import cleanup_stale_segments, segment_name, unlink_channel
from cgraph.channels.shm_channel import ShmChannel, ShmHandle, ShmReader, ShmWriter
from cgraph.channels.socket_channel import (
    ControlServer,
    SocketChannel,
    SocketHandle,
    SocketReader,
    SocketWriter,
)

__all__ = [
    "ChannelHandle",
    "ChannelReader",
    "ChannelWriter",
    "ControlServer",
    "IntraChannel",
    "IntraHandle",
    "IntraReader",
    "IntraWriter",
    "ShmChannel",
    "ShmHandle",
    "ShmReader",
    "ShmWriter",
    "SocketChannel",
    "SocketHandle",
    "SocketReader",
    "SocketWriter",
    "cleanup_stale_segments",
    "segment_name",
    "unlink_channel",
]
