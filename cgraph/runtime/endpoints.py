"""Where the runtime meets the channel package: one resource per ``ChannelSpec``.

The driver creates every channel (``create_channel``): shared memory of its own
node itself, another node's through an actor there (``node_channels``), sockets
through its control server; it ships picklable endpoint handles to the actors,
which open them inside their loops (``channels.opener.open_endpoint``). In-process
channels have no driver-side resource: the actor creates them on first use,
keyed by graph tag and channel id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from cgraph._boundary import UserValue
from cgraph.channels.intra_channel import IntraChannel, IntraHandle
from cgraph.channels.relay import RelayHandle
from cgraph.channels.shm_channel import ShmChannel, ShmHandle
from cgraph.errors import ChannelClosedError, CompileError
from cgraph.ir import DRIVER
from cgraph.runtime.node_channels import RemoteShm
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler.channels import ChannelKind, ChannelSpec

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelHandle, ChannelReader, ChannelWriter
    from cgraph.channels.socket_channel import SocketChannel
    from cgraph.scheduler import Planned


class Resource(Protocol):
    """What ``create_channel`` makes: a channel's endpoint handles, closed and unlinked at teardown."""

    def writer_handle(self) -> ChannelHandle: ...

    def reader_handle(self, reader: str) -> ChannelHandle: ...

    def close(self) -> None: ...

    def unlink(self) -> None: ...


class _ChannelResource:
    """A channel the driver made (``self.channel``), read by ``self.readers`` in order."""

    readers: tuple[str, ...]
    channel: ShmChannel | RemoteShm | SocketChannel

    def writer_handle(self) -> ChannelHandle:
        return self.channel.writer_handle()

    def reader_handle(self, reader: str) -> ChannelHandle:
        assert not isinstance(self.channel, RemoteShm)  # _ShmResource's own reader_handle takes it
        return self.channel.reader_handle(self.readers.index(reader))

    def close(self) -> None:
        self.channel.close()

    def unlink(self) -> None:
        self.channel.unlink()


@dataclass(frozen=True)
class Allocation:
    """What every channel of one compiled graph is made with (on the driver)."""

    tag: str
    options: CompileOptions
    secret: bytes | None = None  # the graph's: socket endpoints prove they know it
    tls: bool = False  # its sockets run TLS first
    remote: Mapping[str, ShmHandle] = field(default_factory=dict)  # made on other nodes, by id


class _ShmResource(_ChannelResource):
    """An SHM channel: made here when its node is the driver's, else by that node's agent."""

    channel: ShmChannel | RemoteShm

    def __init__(self, spec: ChannelSpec, alloc: Allocation, ends: tuple[str, str]) -> None:
        self.readers = tuple(spec.readers)
        made = alloc.remote.get(spec.id)
        self.channel = RemoteShm(made, self.readers) if made is not None else ShmChannel.create(
            alloc.tag, spec.id, num_readers=len(self.readers),
            max_inflight=alloc.options.max_inflight_executions,
            buffer_size=alloc.options.buffer_size_bytes)

    def reader_handle(self, reader: str) -> ChannelHandle:
        if isinstance(self.channel, RemoteShm):
            return self.channel.reader_handle(reader)
        return super().reader_handle(reader)


class _IntraResource:
    def __init__(self, spec: ChannelSpec, alloc: Allocation, ends: tuple[str, str]) -> None:
        self.key = f"{alloc.tag}:{spec.id}"
        self.readers = tuple(spec.readers)
        self.max_inflight = alloc.options.max_inflight_executions

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

    def __init__(self, spec: ChannelSpec, alloc: Allocation, ends: tuple[str, str]) -> None:
        self.id = spec.id

    def writer_handle(self) -> ChannelHandle:
        raise CompileError(f"channel {self.id} goes through a communicator: SEND/RECV ops move it")

    def reader_handle(self, reader: str) -> ChannelHandle:
        return self.writer_handle()

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


class _SocketResource(_ChannelResource):
    """A CROSS_NODE channel: one TCP connection into the readers' node, set up through the
    driver's control server. With several readers there, the first one's process relays
    each value into a shared-memory channel of that node that they all read (``relay``)."""

    channel: SocketChannel

    def __init__(self, spec: ChannelSpec, alloc: Allocation, ends: tuple[str, str]) -> None:
        self.readers = tuple(spec.readers)
        options = alloc.options
        self.channel = socket_channel(alloc.tag, spec.id, options.max_inflight_executions,
                                      secret=alloc.secret, max_value_bytes=options.max_value_bytes,
                                      ends=ends, tls=alloc.tls)
        self.landing: ShmChannel | RemoteShm | None = None
        if len(self.readers) > 1:
            landing = replace(spec, id=f"{spec.id}.relay")
            self.landing = _ShmResource(landing, alloc, ends).channel

    def reader_handle(self, reader: str) -> ChannelHandle:
        if self.landing is None:
            return self.channel.reader_handle(0)
        index = self.readers.index(reader)
        shm = self.landing.handle
        if index:
            return replace(shm, reader=index)
        return RelayHandle(self.channel.reader_handle(0), shm, replace(shm, reader=0))

    def close(self) -> None:
        self.channel.close()
        if self.landing is not None:
            self.landing.close()

    def unlink(self) -> None:
        self.channel.unlink()
        if self.landing is not None:
            self.landing.unlink()


def remote_segments(planned: Planned) -> dict[str, list[tuple[str, int]]]:
    """The shared-memory channels another node must make, by node: ``[(id, readers)]``."""
    graph, wanted = planned.graph, dict[str, list[tuple[str, int]]]()

    def host(actor: str) -> str:
        return "" if actor == DRIVER else graph.actor(actor).host

    for spec in planned.plan.channels:
        if spec.kind is ChannelKind.SHM and host(spec.writer):
            wanted.setdefault(host(spec.writer), []).append((spec.id, len(spec.readers)))
        elif spec.kind is ChannelKind.CROSS_NODE and len(spec.readers) > 1 and host(spec.readers[0]):
            wanted.setdefault(host(spec.readers[0]), []).append((f"{spec.id}.relay",
                                                                  len(spec.readers)))
    return wanted


def socket_channel(tag: str, channel_id: str, max_inflight: int, *, secret: bytes | None = None,
                   max_value_bytes: int | None = None, ends: tuple[str, str] = ("", ""),
                   tls: bool = False) -> SocketChannel:
    """A one-reader TCP channel whose endpoints find each other through this driver and
    prove they know ``secret`` (the graph's; None: one of its own), over TLS if ``tls``."""
    import ray

    from cgraph.channels.socket_channel import ControlServer, SocketChannel

    limit = {} if max_value_bytes is None else {"max_value_bytes": max_value_bytes}

    def create() -> SocketChannel:
        server = ControlServer.shared(ray.util.get_node_ip_address(), tls=tls)  # type: ignore[no-untyped-call]  # unannotated in Ray
        return SocketChannel.create(server, tag, channel_id, max_inflight=max_inflight,
                                    secret=secret, ends=ends, **limit)

    try:
        return create()
    except ChannelClosedError:  # another graph's teardown closed the shared server as we took it
        return create()


def node_channel(tag: str, channel_id: str, hosts: tuple[str, str], *, max_inflight: int,
                 buffer_size: int, secret: bytes | None = None, tls: bool = False) -> ShmChannel | SocketChannel:
    """A one-reader channel from ``hosts[0]`` to ``hosts[1]`` ("" = the driver's node):
    shared memory when both are the driver's node, else a socket."""
    if any(hosts):
        return socket_channel(tag, channel_id, max_inflight, secret=secret, tls=tls)
    return ShmChannel.create(tag, channel_id, num_readers=1, max_inflight=max_inflight,
                             buffer_size=buffer_size)


_RESOURCES: dict[str, Callable[[ChannelSpec, Allocation, tuple[str, str]], Resource]] = {
    "SHM": _ShmResource, "INTRA": _IntraResource, "COMM": _CommResource,
    "CROSS_NODE": _SocketResource,
}


def create_channel(spec: ChannelSpec, *, tag: str, options: CompileOptions, secret: bytes | None = None,
                   ends: tuple[str, str] = ("", ""),
                   remote: Mapping[str, ShmHandle] | None = None, tls: bool = False) -> Resource:
    """Allocate what one channel needs on the driver.

    Args:
        secret: the graph's secret, which a socket channel's endpoints prove they know.
        ends: its writer and reader in words, for errors about a lost peer.
        remote: handles of the channels other nodes made (``remote_segments``), by id.
        tls: its sockets run TLS first.

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
    return factory(spec, Allocation(tag, options, secret, tls, remote or {}), ends)


class FanOutWriter:
    """The driver's input writer when the input goes out on several channels (readers on
    several nodes: shared memory on this node, a socket to each other node).

    Only the first write may time out: once one channel holds an execution's input,
    the others are written without a deadline, so no execution is ever half-submitted
    (their readers take inputs at the same pace; a stuck one is closed by teardown or
    the monitor, which wakes this write).
    """

    def __init__(self, writers: list[ChannelWriter]) -> None:
        self._writers = writers

    def write(self, value: UserValue, timeout: float | None = None) -> None:
        first, *rest = self._writers
        first.write(value, timeout=timeout)
        for writer in rest:
            writer.write(value, timeout=None)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()

    def detach(self) -> None:
        for writer in self._writers:
            writer.detach()


def forget_local(handles: list[ChannelHandle]) -> None:
    """Forget the in-process channels behind ``handles`` (at the end of an actor loop)."""
    for h in handles:
        if isinstance(h, IntraHandle):
            IntraChannel.shared(h.key, h.num_readers, h.max_inflight).unlink()


class CopyingReader:
    """A driver-side reader whose values outlive ``release()``: one copy of the slot."""

    def __init__(self, reader: ChannelReader) -> None:
        self._reader = reader
        # the reader's own methods, bound once: one Python frame less per read and release
        self.read: Callable[..., UserValue] = functools.partial(reader.read, copy=True)
        self.release: Callable[[], None] = reader.release

    def close(self) -> None:
        self._reader.close()

    def detach(self) -> None:
        self._reader.detach()
