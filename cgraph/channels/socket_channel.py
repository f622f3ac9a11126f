"""Socket channel: one writer, one reader, on any two hosts, over TCP, authenticated.

The process that owns the channels (the driver) runs a ``ControlServer``
(``socket_control``: a daemon thread, one listening socket). Each endpoint opens
a control connection to it at ``attach``; both prove they know the graph's
secret (``handshake``) before a line is taken. The reader also listens for its
writer's data connection (``socket_reader``) and says where. Values never pass
through the server::

            driver: ControlServer (per name: secret, endpoints, reader address, closed)
             ▲  auth "control name r"           ▲  auth "control name w"
             │  LISTEN host port                │  ◀── ADDR host port (once the reader said)
             │  CLOSED ◀── CLOSE ──▶ CLOSED     │
          reader ◀═══ auth "data name w", then frame, frame, ... ═══ writer
                 ════ credits: one byte per value received ════▶

A frame is the value's size (u64), then exactly the slot layout of
``serialization``, sent with ``sendmsg`` from the value's own buffers; a value
larger than the handle's ``max_value_bytes`` is refused by the writer before
anything is sent (and by the reader before anything is allocated).

Attach never waits for the peer (actors attach in any order): the writer
connects on its first ``write``, once the server sent ``ADDR``; the reader's
receiving thread admits it as soon as it proves itself. The writer starts with
``max_inflight`` credits and spends one per value; the reader gives one back
when a value is read, so the writer runs at most ``max_inflight`` values ahead;
more credits than that is a broken stream.

Every wait is a ``poll`` on the awaited socket and the control socket, at most
``POLL_S`` at a time, re-checking the closed state. ``CLOSED``, or the end of the
control connection (the owner exited), closes the endpoint; the end of the data
stream (the peer exited, detached or was lost) raises ``ChannelLostError``
naming the peer. ``read(timeout)`` times out only before a value's first byte,
``write(timeout)`` only before sending anything (while waiting for the reader's
address, the handshake or a credit): the channel stays consistent. A forked
child closes its copies of this process's sockets, so a peer still sees the
stream end when the process that owns them exits.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
import time
from dataclasses import replace

from cgraph.channels import tls
from cgraph.channels.base import ChannelWriter
from cgraph.channels.handshake import (
    HANDSHAKE_S,
    AuthError,
    RefusedError,
    introduce,
    new_secret,
    tune,
)
from cgraph.channels.segments import segment_name
from cgraph.channels.serialization import dumps, payload_chunks
from cgraph.channels.socket_control import ControlServer
from cgraph.channels.socket_endpoint import DEFAULT_MAX_VALUE_BYTES, Endpoint, SocketHandle
from cgraph.channels.socket_reader import FRAME, SocketReader
from cgraph.channels.tls import WOULD_BLOCK
from cgraph.errors import ChannelClosedError

__all__ = ["ControlServer", "SocketChannel", "SocketHandle", "SocketReader", "SocketWriter"]

DETACH_WAIT_S = 10.0  # a detaching writer waits this long for its reader to take the last values
CONNECT_TRIES = 3  # data connections refused during the handshake (evicted by a flood): retried
_IOV_MAX = 512  # buffers per sendmsg call (Linux allows 1024)


# --------------------------------------------------------------------------- owner's view
class SocketChannel:
    """The owner's view (the driver): registers, closes and forgets one channel."""

    def __init__(self, server: ControlServer, handle: SocketHandle, reader_peer: str = "") -> None:
        self.handle = handle
        self._server = server
        self._reader_peer = reader_peer

    @classmethod
    def create(
        cls, server: ControlServer, tag: str, channel_id: str, *, max_inflight: int = 1,
        secret: bytes | None = None, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        ends: tuple[str, str] = ("", ""),
    ) -> SocketChannel:
        """Register a new channel with ``server``; its endpoints meet through it.

        Args:
            secret: the graph's secret (``handshake.new_secret()``); None: a fresh one.
            max_value_bytes: the largest value it carries.
            ends: the writer and the reader in words ("writer a (W) on node 3f2a..."),
                for errors about a lost peer.

        Raises:
            ValueError: a non-positive ``max_inflight`` or ``max_value_bytes``.
            FileExistsError: ``server`` has a channel of that name (same tag and id).
        """
        if max_inflight < 1 or max_value_bytes < 1:
            raise ValueError(f"channel {channel_id!r}: max_inflight={max_inflight} and "
                             f"max_value_bytes={max_value_bytes} must be >= 1")
        secret = new_secret() if secret is None else secret
        name = segment_name(tag, channel_id)
        server.register_channel(name, secret)
        handle = SocketHandle(name, server.address, max_inflight, secret=secret,
                              max_value_bytes=max_value_bytes, peer=ends[1], tls=server.tls)
        return cls(server, handle, reader_peer=ends[0])

    def writer_handle(self) -> SocketHandle:
        return self.handle

    def reader_handle(self, index: int = 0) -> SocketHandle:
        if index != 0:
            raise IndexError(f"reader {index} of socket channel {self.handle.name}: it has one (0)")
        return replace(self.handle, reader=True, peer=self._reader_peer)

    @property
    def closed(self) -> bool:
        return self._server.channel_closed(self.handle.name)

    def close(self) -> None:
        """Close the channel: wakes both endpoints wherever they are, now or when they attach."""
        self._server.close_channel(self.handle.name)

    @staticmethod
    def link_closing(channels: list[SocketChannel]) -> None:
        """Close these channels (of one server) together: a close of any closes all
        (``ControlServer.link_closing``)."""
        servers = {id(c._server) for c in channels}
        if len(servers) > 1:
            raise ValueError("channels linked to close together must share their control server")
        if channels:
            channels[0]._server.link_closing(tuple(c.handle.name for c in channels))

    def unlink(self) -> list[str]:
        """Forget the channel in the server and close its control connections; returns []."""
        self._server.forget_channel(self.handle.name)
        return []

    def __enter__(self) -> SocketChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


# --------------------------------------------------------------------------- the writer
class SocketWriter(Endpoint, ChannelWriter):
    """The writing end; one per channel, used by one thread at a time."""

    _what = "write to"

    def __init__(self, handle: SocketHandle) -> None:
        super().__init__(handle)
        self._credits = handle.max_inflight

    def write(self, value: object, timeout: float | None = None) -> None:
        if self._midframe or self._poll_control():
            raise self._closed_error()
        payload = dumps(value)  # unpicklable: raises here, nothing spent
        if payload.nbytes > self._handle.max_value_bytes:
            raise ValueError(
                f"a value of {payload.nbytes} bytes cannot cross socket channel "
                f"{self._handle.name}: its max_value_bytes is {self._handle.max_value_bytes}; "
                "compile with a larger max_value_bytes")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._data is None:
            self._connect(deadline, timeout)
        if not self._credits:
            self._take_credits(deadline, timeout)
        chunks = payload_chunks(payload)
        chunks[0] = FRAME.pack(payload.nbytes) + chunks[0]
        self._credits -= 1
        self._send(chunks)

    def _connect(self, deadline: float | None, timeout: float | None) -> None:
        """Connect to the reader's listener, once the server said where it is, and prove
        to each other that both belong to the graph."""
        while self._addr is None:
            if not self._wait(None, 0, deadline):
                raise self._timeout(timeout, "its reader has not attached yet")
        for attempt in range(CONNECT_TRIES):
            sock = self._dial_reader(deadline, timeout)
            limit = time.monotonic() + HANDSHAKE_S
            limit = limit if deadline is None else min(limit, deadline)
            try:
                sock = introduce(sock, self._handle.secret, f"data {self._handle.name} w".encode(), limit,
                                 self._handle.tls)
            except (ssl.SSLError, TimeoutError) as exc:
                sock.close()
                raise ChannelClosedError(f"socket channel {self._handle.name}: TLS with its "
                                         f"reader at {self._addr} failed ({exc})") from None
            except RefusedError as exc:  # evicted by a crowd of strangers: try again
                sock.close()
                if attempt + 1 == CONNECT_TRIES:
                    raise self._closed_error(f"its listener refused {CONNECT_TRIES} handshakes: "
                                             f"{exc}") from None
                continue
            except AuthError as exc:
                sock.close()
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timeout(timeout, "proving itself to its reader") from None
                raise ChannelClosedError(
                    f"socket channel {self._handle.name}: the listener at {self._addr} is not its "
                    f"reader ({exc}); nothing was sent") from None
            self._data = sock
            return

    def _dial_reader(self, deadline: float | None, timeout: float | None) -> socket.socket:
        assert self._addr is not None
        sock = socket.socket(self._ctl.family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            tune(sock)
            err = sock.connect_ex(self._addr)
            if err in (errno.EINPROGRESS, errno.EAGAIN):
                if not self._wait(sock, select.POLLOUT, deadline):
                    raise self._timeout(timeout, "connecting to its reader")
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise self._closed_error(f"connecting to {self._addr}: {os.strerror(err)}")
        except BaseException:
            sock.close()
            raise
        return sock

    def detach(self) -> None:
        if not self._detached and self._data is not None:
            self._drain(time.monotonic() + DETACH_WAIT_S)
        super().detach()

    def _drain(self, deadline: float) -> None:
        """Before closing: end the stream (FIN) and wait until the reader took in every
        value and ended its side too, taking in the credits it still sends. A credit
        that reaches a closed socket is answered with a reset, and a reset makes the
        reader's kernel drop the values it still holds unread: closing at once lost
        the last values (seen as a flaky ECONNRESET in a test). Gives up at
        ``deadline``, on a closed channel, or when the reader is gone."""
        sock = self._data
        assert sock is not None
        try:
            tls.half_close(sock)
            while True:
                try:
                    if not sock.recv(4096):
                        return
                except WOULD_BLOCK:
                    if not self._wait(sock, select.POLLIN, deadline):
                        return
        except (OSError, ChannelClosedError):
            return

    def _take_credits(self, deadline: float | None, timeout: float | None) -> None:
        """Wait for the reader to give credits back (one byte per value it received)."""
        try:
            came = self._recv_credits(deadline)
        except OSError as exc:
            raise self._closed_error(exc) from None
        if not came:
            raise self._timeout(timeout, "the reader has not received the last "
                                f"{self._handle.max_inflight} values")

    def _recv_credits(self, deadline: float | None) -> bool:
        """Take in the credits that came back, waiting for at least one; False at ``deadline``.

        Raises:
            ChannelLostError: the reader is gone, or gave back more than was spent.
        """
        assert self._data is not None
        while True:
            try:
                got = self._data.recv(4096)
            except WOULD_BLOCK:
                if not self._wait(self._data, select.POLLIN, deadline):
                    return False
                continue
            if not got:
                raise self._closed_error("end of stream")
            if self._credits + len(got) > self._handle.max_inflight or got.strip(b"\x01"):
                self._midframe = True  # no more writes: the stream cannot be trusted
                raise self._closed_error(f"it gave back {len(got)} credits with "
                                         f"{self._handle.max_inflight - self._credits} values "
                                         "unacknowledged, a broken stream")
            self._credits += len(got)
            return True

    def _send(self, chunks: list[memoryview | bytes]) -> None:
        """Send one frame whole (a closed channel or a gone reader still interrupts it)."""
        sock = self._data
        assert sock is not None
        views, i = [memoryview(c) for c in chunks if len(c)], 0
        gather = not isinstance(sock, ssl.SSLSocket)  # TLS encrypts one buffer at a time
        try:
            while i < len(views):
                try:
                    if gather:
                        sent = sock.sendmsg(views[i : i + _IOV_MAX], (), socket.MSG_NOSIGNAL)
                    else:
                        sent = sock.send(views[i])
                except WOULD_BLOCK:
                    self._wait(sock, select.POLLOUT, None)
                    continue
                while sent:  # skip what went out; the first partly sent view is sliced
                    if sent < views[i].nbytes:
                        views[i], sent = views[i][sent:], 0
                    else:
                        sent, i = sent - views[i].nbytes, i + 1
        except ChannelClosedError:
            raise
        except OSError as exc:
            raise self._closed_error(exc) from None
        except BaseException:  # interrupted half-way (^C): end the stream, nothing can resync
            self._midframe = True
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
            raise
