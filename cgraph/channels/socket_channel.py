"""Socket channel: one writer, one reader, on any two hosts, over TCP.

The process that owns the channels (the driver) runs a ``ControlServer``
(``socket_control``: a daemon thread, one listening socket). Each endpoint opens
a control connection to it at ``attach`` and says hello; the reader also
listens for its writer's data connection and says where. Values never pass
through the server::

            driver: ControlServer (per name: endpoints, reader address, closed)
             ▲  HELLO name r host port         ▲  HELLO name w
             │  CLOSED ◀── CLOSE ──▶ CLOSED    │  ◀── ADDR host port (once the reader said hello)
          reader ◀═══════ data: frame, frame, ... ═══════ writer
                 ════ credits: one byte per value received ════▶

A frame is the value's size (u64), then exactly the slot layout of
``serialization``, sent with ``sendmsg`` from the value's own buffers. A
receiving thread in the reader takes every frame in whole, into a private
``bytearray``, as soon as it comes (arrays writable, so ``release()`` frees
nothing and ``read(copy=...)`` changes nothing): a writer in the middle of a
value larger than the socket buffers never waits for the reader's *user*, so
values move as through shared-memory slots, and a cycle of such edges cannot
deadlock.

Attach never waits for the peer (actors attach in any order): the writer
connects on its first ``write``, once the server sent ``ADDR``; the reader
accepts on its first ``read`` (the connection already waits in its backlog).
The writer starts with ``max_inflight`` credits and spends one per value; the
reader gives one back when a value is read, so the writer runs at most
``max_inflight`` values ahead and the receiving thread holds at most that many.

Every wait is a ``poll`` on the awaited socket and the control socket, at most
``POLL_S`` at a time, re-checking the closed state. ``CLOSED``, or the end of the
control connection (the owner exited), closes the endpoint; so does the end of
the data stream (the peer exited or detached). ``read(timeout)`` times out only
before a value's first byte, ``write(timeout)`` only before sending anything
(while waiting for the reader's address or a credit): the channel stays
consistent. A forked child closes its copies of this process's sockets, so a
peer still sees the stream end when the process that owns them exits.
"""

from __future__ import annotations

import collections
import errno
import math
import os
import select
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

from cgraph.channels.base import ChannelReader, ChannelWriter
from cgraph.channels.segments import segment_name
from cgraph.channels.serialization import dumps, loads, payload_chunks
from cgraph.channels.socket_control import ControlServer
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

__all__ = ["ControlServer", "SocketChannel", "SocketHandle", "SocketReader", "SocketWriter"]

POLL_S = 0.15  # longest sleep before re-checking the closed state
CONNECT_TIMEOUT_S = 30.0  # reaching the control server (never the peer)
DETACH_WAIT_S = 10.0  # a detaching writer waits this long for its reader to take the last values
_FRAME = struct.Struct("<Q")  # value size in bytes, then that many bytes of slot layout
_IOV_MAX = 512  # buffers per sendmsg call (Linux allows 1024)


# --------------------------------------------------------------------------- owner's view
@dataclass(frozen=True, slots=True)
class SocketHandle:
    """Picklable endpoint description, shipped to actors; ``attach`` opens it."""

    name: str
    control: tuple[str, int]
    max_inflight: int
    reader: bool = False

    def attach(self) -> SocketWriter | SocketReader:
        """Open this endpoint in the calling process; never waits for the peer.

        Raises:
            ChannelClosedError: the control server cannot be reached (its owner exited).
        """
        return SocketReader(self) if self.reader else SocketWriter(self)


class SocketChannel:
    """The owner's view (the driver): registers, closes and forgets one channel."""

    def __init__(self, server: ControlServer, handle: SocketHandle) -> None:
        self.handle = handle
        self._server = server

    @classmethod
    def create(
        cls, server: ControlServer, tag: str, channel_id: str, *, max_inflight: int = 1
    ) -> SocketChannel:
        """Register a new channel with ``server``; its endpoints meet through it.

        Raises:
            ValueError: a non-positive ``max_inflight``.
            FileExistsError: ``server`` has a channel of that name (same tag and id).
        """
        if max_inflight < 1:
            raise ValueError(f"channel {channel_id!r}: max_inflight={max_inflight} must be >= 1")
        name = segment_name(tag, channel_id)
        server.register_channel(name)
        return cls(server, SocketHandle(name, server.address, max_inflight))

    def writer_handle(self) -> SocketHandle:
        return self.handle

    def reader_handle(self, index: int = 0) -> SocketHandle:
        if index != 0:
            raise IndexError(f"reader {index} of socket channel {self.handle.name}: it has one (0)")
        return replace(self.handle, reader=True)

    @property
    def closed(self) -> bool:
        return self._server.channel_closed(self.handle.name)

    def close(self) -> None:
        """Close the channel: wakes both endpoints wherever they are, now or when they attach."""
        self._server.close_channel(self.handle.name)

    def unlink(self) -> list[str]:
        """Forget the channel in the server and close its control connections; returns []."""
        self._server.forget_channel(self.handle.name)
        return []

    def __enter__(self) -> SocketChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


# --------------------------------------------------------------------------- endpoints
class _EndOfStream(Exception):
    """The data connection ended (or was reset): the peer exited or detached."""


class _Endpoint:
    """What both ends share: the control connection, waiting, closing, detaching."""

    _what = ""  # "write to" or "read from", for messages

    def __init__(self, handle: SocketHandle) -> None:
        self._handle = handle
        self._data: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._addr: tuple[str, int] | None = None  # where the reader listens (from ADDR)
        self._closed = self._detached = False
        self._midframe = False  # a value was interrupted half-way: the stream is out of step
        self._buf = b""
        self._ctl = _dial(handle)
        _LIVE.add(self)

    def close(self) -> None:
        """Close the channel for both ends, through the control server (idempotent)."""
        if self._detached:
            _close_remotely(self._handle)
        else:
            try:
                self._ctl.sendall(b"CLOSE\n")
            except OSError:
                pass  # no server: the channel is closed for everyone already
        self._closed = True

    def detach(self) -> None:
        """Close this end's sockets; the channel stays open for the other end."""
        self._forget()

    def _forget(self) -> None:
        self._detached = True
        for sock in (self._data, self._listener, self._ctl):
            if sock is not None:
                sock.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (SocketHandle.attach, (self._handle,))

    def _poll_control(self) -> bool:
        """Take in what the server sent, without waiting; True once closed (or detached)."""
        while not (self._closed or self._detached):
            try:
                data = self._ctl.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:  # the control server is gone: its owner exited
                self._closed = True
                break
            *lines, self._buf = (self._buf + data).split(b"\n")
            for words in (line.decode("ascii", "replace").split() for line in lines):
                if words == ["CLOSED"]:
                    self._closed = True
                elif len(words) == 3 and words[0] == "ADDR" and words[2].isdigit():
                    self._addr = (words[1], int(words[2]))
        return self._closed or self._detached

    def _wait(self, sock: socket.socket | None, events: int, deadline: float | None) -> bool:
        """Sleep in ``poll`` until ``sock`` is ready for ``events`` (no ``sock``: until the
        server sent the reader's address); False once ``deadline`` passed.

        Raises:
            ChannelClosedError: the channel is closed, before or while waiting.
        """
        poller = select.poll()
        poller.register(self._ctl, select.POLLIN)
        if sock is not None:
            poller.register(sock, events)
        ctl, ready = self._ctl.fileno(), list[tuple[int, int]]()
        while True:
            if self._poll_control():
                raise self._closed_error()
            if (self._addr is not None) if sock is None else any(fd != ctl for fd, _ in ready):
                return True
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                return False
            ready = poller.poll(math.ceil(wait * 1000))

    def _closed_error(self, ended: object = None) -> ChannelClosedError:
        """The error for a closed channel, or (``ended``: how) for a peer that went away."""
        peer = "writer" if self._handle.reader else "reader"
        why = (
            f"the {peer}'s connection ended ({ended}): it exited or detached" if ended is not None
            else "this end was detached" if self._detached
            else "it is closed (teardown, a failure elsewhere in the graph, or its owner exited)"
            if self._closed
            else "a value was interrupted half-way, so the stream is out of step"
        )
        self._closed = True
        return ChannelClosedError(f"cannot {self._what} socket channel {self._handle.name}: {why}")

    def _timeout(self, timeout: float | None, why: str) -> ChannelTimeoutError:
        return ChannelTimeoutError(
            f"timed out after {timeout}s waiting to {self._what} socket channel "
            f"{self._handle.name} ({why}); the channel is unchanged, retry or raise the timeout"
        )


class SocketWriter(_Endpoint, ChannelWriter):
    """The writing end; one per channel, used by one thread at a time."""

    _what = "write to"

    def __init__(self, handle: SocketHandle) -> None:
        super().__init__(handle)
        self._credits = handle.max_inflight
        try:
            self._ctl.sendall(f"HELLO {handle.name} w\n".encode())
        except BaseException:
            self._forget()
            raise

    def write(self, value: Any, timeout: float | None = None) -> None:
        if self._midframe or self._poll_control():
            raise self._closed_error()
        payload = dumps(value)  # unpicklable: raises here, nothing spent
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._data is None:
            self._connect(deadline, timeout)
        if not self._credits:
            self._take_credits(deadline, timeout)
        chunks = payload_chunks(payload)
        chunks[0] = _FRAME.pack(payload.nbytes) + chunks[0]
        self._credits -= 1
        self._send(chunks)

    def _connect(self, deadline: float | None, timeout: float | None) -> None:
        """Connect to the reader's listener, once the server said where it is."""
        while self._addr is None:
            if not self._wait(None, 0, deadline):
                raise self._timeout(timeout, "its reader has not attached yet")
        sock = socket.socket(self._ctl.family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
        self._data = sock

    def detach(self) -> None:
        if not self._detached and self._data is not None:
            self._await_credits(time.monotonic() + DETACH_WAIT_S)
        super().detach()

    def _await_credits(self, deadline: float) -> None:
        """Before closing: wait until the reader has taken in every value sent (all
        credits back). A credit that reaches a closed socket is answered with a
        reset, and a reset makes the reader's kernel drop the values it still
        holds unread: closing early lost the last values (seen as a flaky
        ECONNRESET in a test). Gives up at ``deadline``, on a closed channel, or
        when the reader is gone."""
        assert self._data is not None
        try:
            while self._credits < self._handle.max_inflight:
                try:
                    got = self._data.recv(4096)
                except BlockingIOError:
                    if not self._wait(self._data, select.POLLIN, deadline):
                        return
                    continue
                if not got:
                    return
                self._credits += len(got)
        except (OSError, ChannelClosedError):
            return

    def _take_credits(self, deadline: float | None, timeout: float | None) -> None:
        """Wait for the reader to give credits back (one byte per value it received)."""
        assert self._data is not None
        while True:
            try:
                got = self._data.recv(4096)
            except BlockingIOError:
                if not self._wait(self._data, select.POLLIN, deadline):
                    raise self._timeout(timeout, "the reader has not received the last "
                                        f"{self._handle.max_inflight} values") from None
                continue
            except OSError as exc:
                raise self._closed_error(exc) from None
            if not got:
                raise self._closed_error("end of stream")
            self._credits += len(got)
            return

    def _send(self, chunks: list[memoryview | bytes]) -> None:
        """Send one frame whole (a closed channel or a gone reader still interrupts it)."""
        sock = self._data
        assert sock is not None
        views, i = [memoryview(c) for c in chunks if len(c)], 0
        try:
            while i < len(views):
                try:
                    sent = sock.sendmsg(views[i : i + _IOV_MAX], (), socket.MSG_NOSIGNAL)
                except BlockingIOError:
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
            sock.shutdown(socket.SHUT_RDWR)
            raise


class SocketReader(_Endpoint, ChannelReader):
    """The reading end; one per channel, used by one thread at a time."""

    _what = "read from"

    def __init__(self, handle: SocketHandle) -> None:
        super().__init__(handle)
        host = self._ctl.getsockname()[0]  # the address this host reaches the owner from
        try:
            self._listener = listener = socket.socket(self._ctl.family, socket.SOCK_STREAM)
            listener.bind((host, 0))
            listener.listen(1)
            listener.setblocking(False)
            self._ctl.sendall(f"HELLO {handle.name} r {host} {listener.getsockname()[1]}\n".encode())
        except BaseException:
            self._forget()
            raise
        self._arrived: collections.deque[bytearray] = collections.deque()
        self._arrival = threading.Condition()
        self._ended: BaseException | None = None  # how the writer's stream ended
        self._pump: threading.Thread | None = None

    def read(self, timeout: float | None = None, copy: bool = False) -> Any:
        """The next value, received whole into private memory (``copy`` changes nothing)."""
        if self._pump is None:
            if self._midframe or self._poll_control():
                raise self._closed_error()
            self._pump = threading.Thread(target=self._receive, daemon=True,
                                          name=f"cgraph-recv-{self._handle.name}")
            self._pump.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._arrival:
            while not self._arrived or self._closed or self._detached:
                if self._closed or self._detached or self._ended is not None:
                    raise self._closed_error(self._ended if not self._closed else None)
                wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
                if wait <= 0:
                    why = "no value has arrived" if self._data else "its writer has not written yet"
                    raise self._timeout(timeout, why)
                self._arrival.wait(wait)
            body = self._arrived.popleft()
        try:
            self._data.send(b"\x01", socket.MSG_NOSIGNAL)  # type: ignore[union-attr]
        except OSError:
            pass  # the writer is gone: the next read finds the end of the stream
        return loads(memoryview(body), writable=True)

    def release(self) -> None:
        """Nothing to give back: the credit went back when the value was read."""

    def _receive(self) -> None:
        """The receiving thread: takes in every value as it comes, so that a writer in the
        middle of a large value never waits on this end's reader (it would, through full
        socket buffers, and two such edges in a cycle would deadlock); the writer's
        credits keep at most ``max_inflight`` values here."""
        try:
            self._accept(None, None)
            while True:
                header = bytearray(_FRAME.size)
                self._recv_into(memoryview(header), None)
                body = bytearray(_FRAME.unpack(header)[0])
                self._recv_into(memoryview(body), None)
                self._midframe = False
                with self._arrival:
                    self._arrived.append(body)
                    self._arrival.notify()
        except ChannelClosedError:
            pass  # CLOSED, or detached: the flags say so
        except _EndOfStream as exc:  # the values before it are still read
            self._ended = exc
        except Exception as exc:  # noqa: BLE001 - reported to the reading thread
            self._ended = exc
        finally:
            with self._arrival:
                self._arrival.notify_all()

    def _accept(self, deadline: float | None, timeout: float | None) -> None:
        """Take the writer's data connection (waiting in the backlog since its first write)."""
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
                break
            except BlockingIOError:
                if not self._wait(self._listener, select.POLLIN, deadline):
                    raise self._timeout(timeout, "its writer has not written yet") from None
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._data = sock
        self._listener.close()  # one writer per channel
        self._listener = None

    def _recv_into(self, view: memoryview, deadline: float | None) -> bool:
        """Fill ``view``; False if ``deadline`` passed before its first byte.

        Raises:
            _EndOfStream: the connection ended first. ChannelClosedError: closed.
        """
        sock, got = self._data, 0
        assert sock is not None
        while got < view.nbytes:
            try:
                n = sock.recv_into(view[got:])
            except BlockingIOError:
                if not self._wait(sock, select.POLLIN, deadline if got == 0 else None):
                    return False
                continue
            except OSError as exc:
                raise _EndOfStream(exc) from None
            if n == 0:
                raise _EndOfStream("end of stream")
            got += n
            self._midframe = True
        return True


# --------------------------------------------------------------------------- helpers
def _dial(handle: SocketHandle) -> socket.socket:
    """A control connection to the owner's server (blocking, no timeout once connected)."""
    try:
        sock = socket.create_connection(handle.control, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ChannelClosedError(
            f"socket channel {handle.name}: cannot reach its control server at "
            f"{handle.control} ({exc}); the owner (driver) exited, or this host cannot reach it"
        ) from None
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a line never waits for an ack
    return sock


def _close_remotely(handle: SocketHandle) -> None:
    """Close a channel through its server over a one-shot connection (no endpoint)."""
    try:
        with _dial(handle) as sock:
            sock.sendall(f"HELLO {handle.name} o\nCLOSE\n".encode())
    except (OSError, ChannelClosedError):
        pass  # no server: the channel is closed for everyone already


_LIVE: weakref.WeakSet[_Endpoint] = weakref.WeakSet()  # this process's endpoints


def _after_fork_in_child() -> None:
    """Close the child's copies of the endpoints' sockets: a peer must see the end of a
    stream when the process that owns it exits, whoever forked it (DataLoader workers)."""
    for endpoint in list(_LIVE):
        endpoint._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
