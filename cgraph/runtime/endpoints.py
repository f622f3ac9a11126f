"""Where the runtime meets the channel package: one resource per ``ChannelSpec``.

The driver creates every shared-memory channel (``create_channel``) and ships
picklable endpoint handles to the actors, which ``open_reader``/``open_writer``
them inside their loops. In-process channels have no driver-side resource: the
actor creates them on first use, keyed by graph tag and channel id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cgraph.channels.intra_channel import IntraChannel, IntraHandle
from cgraph.channels.shm_channel import ShmChannel, ShmReader
from cgraph.errors import CompileError
from cgraph.runtime.options import CompileOptions


class _ChannelResource:
    """A channel the driver made (``self.channel``), read by ``self.readers`` in order."""

    readers: tuple[str, ...]
    channel: Any

    def writer_handle(self) -> Any:
        return self.channel.writer_handle()

    def reader_handle(self, reader: str) -> Any:
        return self.channel.reader_handle(self.readers.index(reader))

    def close(self) -> None:
        self.channel.close()

    def unlink(self) -> None:
        self.channel.unlink()


class _ShmResource(_ChannelResource):
    def __init__(self, spec: Any, tag: str, options: CompileOptions, secret: bytes | None,
                 ends: tuple[str, str]) -> None:
        self.readers = tuple(spec.readers)
        self.channel = ShmChannel.create(
            tag,
            spec.id,
            num_readers=len(self.readers),
            max_inflight=options.max_inflight_executions,
            buffer_size=options.buffer_size_bytes,
        )


class _IntraResource:
    def __init__(self, spec: Any, tag: str, options: CompileOptions, secret: bytes | None,
                 ends: tuple[str, str]) -> None:
        self.key = f"{tag}:{spec.id}"
        self.readers = tuple(spec.readers)
        self.max_inflight = options.max_inflight_executions

    def writer_handle(self) -> IntraHandle:
        return IntraHandle(self.key, len(self.readers), self.max_inflight)

    def reader_handle(self, reader: str) -> IntraHandle:
        return IntraHandle(self.key, len(self.readers), self.max_inflight, self.readers.index(reader))

    def close(self) -> None:
        pass  # lives in the actor; its loop ends when the actor's other channels close

    def unlink(self) -> None:
        pass


class _CommResource:
    """A COMM channel: its side channel and communicator group are made by ``communicators``."""

    def __init__(self, spec: Any, tag: str, options: CompileOptions, secret: bytes | None,
                 ends: tuple[str, str]) -> None:
        self.id = spec.id

    def writer_handle(self) -> Any:
        raise CompileError(f"channel {self.id} goes through a communicator: SEND/RECV ops move it")

    def reader_handle(self, reader: str) -> Any:
        return self.writer_handle()

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


class _SocketResource(_ChannelResource):
    """A CROSS_NODE channel: a TCP connection, set up through the driver's control server."""

    def __init__(self, spec: Any, tag: str, options: CompileOptions, secret: bytes | None,
                 ends: tuple[str, str]) -> None:
        self.readers = tuple(spec.readers)  # one: the planner makes one per reader
        self.channel = socket_channel(tag, spec.id, options.max_inflight_executions, secret=secret,
                                      max_value_bytes=options.max_value_bytes, ends=ends)


def socket_channel(tag: str, channel_id: str, max_inflight: int, *, secret: bytes | None = None,
                   max_value_bytes: int | None = None, ends: tuple[str, str] = ("", "")) -> Any:
    """A one-reader TCP channel whose endpoints find each other through this driver and
    prove they know ``secret`` (the graph's; None: one of its own)."""
    import ray

    from cgraph.channels.socket_channel import ControlServer, SocketChannel

    server = ControlServer.shared(ray.util.get_node_ip_address())
    limit = {} if max_value_bytes is None else {"max_value_bytes": max_value_bytes}
    return SocketChannel.create(server, tag, channel_id, max_inflight=max_inflight, secret=secret,
                                ends=ends, **limit)


def node_channel(tag: str, channel_id: str, hosts: tuple[str, str], *, max_inflight: int,
                 buffer_size: int, secret: bytes | None = None) -> Any:
    """A one-reader channel from ``hosts[0]`` to ``hosts[1]`` ("" = the driver's node):
    shared memory when both are the driver's node, else a socket."""
    if any(hosts):
        return socket_channel(tag, channel_id, max_inflight, secret=secret)
    return ShmChannel.create(tag, channel_id, num_readers=1, max_inflight=max_inflight,
                             buffer_size=buffer_size)


_RESOURCES = {"SHM": _ShmResource, "INTRA": _IntraResource, "COMM": _CommResource,
              "CROSS_NODE": _SocketResource}


def create_channel(spec: Any, *, tag: str, options: CompileOptions, secret: bytes | None = None,
                   ends: tuple[str, str] = ("", "")) -> Any:
    """Allocate what one channel needs on the driver.

    Args:
        secret: the graph's secret, which a socket channel's endpoints prove they know.
        ends: its writer and reader in words, for errors about a lost peer.

    Raises:
        CompileError: a transport this build cannot run yet.
    """
    factory = _RESOURCES.get(spec.kind.name)
    if factory is None:
        raise CompileError(
            f"channel {spec.id} needs the {spec.kind.name.lower()} transport "
            f"({spec.transport}), which this build of cgraph cannot run yet; "
            "use transport='shm' (or 'auto') on that edge"
        )
    return factory(spec, tag, options, secret, ends)


def open_reader(handle: Any) -> Any:
    return handle.attach()


def open_writer(handle: Any) -> Any:
    return handle.attach()


def forget_local(handles: list[Any]) -> None:
    """Forget the in-process channels behind ``handles`` (at the end of an actor loop)."""
    for h in handles:
        if isinstance(h, IntraHandle):
            IntraChannel.shared(h.key, h.num_readers, h.max_inflight).unlink()


class CopyingReader:
    """A driver-side reader whose values outlive ``release()``: one copy of the slot."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        # the reader's own methods, bound once: one Python frame less per read and release
        if isinstance(reader, ShmReader):
            self.read: Callable[..., Any] = functools.partial(reader.read, copy=True)
        else:
            self.read = reader.read  # in-process values are never views of a slot
        self.release: Callable[[], None] = reader.release

    def close(self) -> None:
        self._reader.close()

    def detach(self) -> None:
        self._reader.detach()
