"""What both ends of a socket channel share: the handle, the control connection, waiting.

An endpoint opens one control connection to the owner's ``ControlServer`` at
attach and proves it belongs to the graph (``handshake``, claim
``control <name> <role>``); the server proves the same back. Every socket
cgraph opens gets ``handshake.tune``: TCP keepalive with a user timeout, so a
peer whose host vanished without a FIN or RST is noticed within ``LOST_PEER_S``.
"""

from __future__ import annotations

import math
import os
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from cgraph import _threads
from cgraph.channels.handshake import (
    HANDSHAKE_S,
    AuthError,
    RefusedError,
    introduce,
    tune,
)
from cgraph.channels.tls import WOULD_BLOCK, pending
from cgraph.errors import ChannelClosedError, ChannelLostError, ChannelTimeoutError

POLL_S = 0.15  # longest sleep before re-checking the closed state
CONNECT_TIMEOUT_S = 30.0  # reaching the control server (never the peer)
DEFAULT_MAX_VALUE_BYTES = 16 << 30
"""Largest value a socket channel carries unless told otherwise (``max_value_bytes``):
a frame announcing more is refused before anything is allocated."""


@dataclass(frozen=True, slots=True)
class SocketHandle:
    """Picklable endpoint description, shipped to actors inside Ray's own calls; ``attach``
    opens it. ``secret`` (the graph's) never appears in a repr, log or error."""

    name: str
    control: tuple[str, int]
    max_inflight: int
    reader: bool = False
    secret: bytes = field(default=b"", repr=False)
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    peer: str = ""  # the other end, for messages: "writer a (Worker) on node 3f2a..."
    tls: bool = False  # every connection runs TLS first (``tls``)

    @property
    def role(self) -> str:
        return "r" if self.reader else "w"


class Endpoint:
    """What both ends share: the control connection, waiting, closing, detaching."""

    _what = ""  # "write to" or "read from", for messages

    def __init__(self, handle: SocketHandle) -> None:
        self._handle = handle
        self._data: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._addr: tuple[str, int] | None = None  # where the reader listens (from ADDR)
        self._closed = self._detached = False
        self._refused: str | None = None  # why the control server turned this end away
        self._midframe = False  # a value was interrupted half-way: the stream is out of step
        # A TLS connection is not safe for two threads at once (OpenSSL), and a reader's
        # receiving thread reads the data socket while its user sends credits on it:
        # every call on the data socket's TLS state holds this lock.
        self._io = threading.Lock()
        self._ctl_lock = threading.Lock()  # a reader's two threads both watch the control socket
        self._buf = b""
        self._ctl = _dial(handle, handle.role)
        _LIVE.add(self)

    def close(self) -> None:
        """Close the channel for both ends, through the control server (idempotent)."""
        if self._detached:
            close_remotely(self._handle)
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

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self._handle,))  # opens it again where unpickled

    def _poll_control(self) -> bool:
        """Take in what the server sent, without waiting; True once closed (or detached)."""
        with self._ctl_lock:
            return self._take_control()

    def _take_control(self) -> bool:
        while not (self._closed or self._detached):
            try:
                data = self._ctl.recv(4096)
            except WOULD_BLOCK:
                break
            except OSError:
                data = b""
            if not data:  # the control server is gone (its owner exited), or refused us
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
            if sock is None and self._addr is not None:
                return True
            if sock is not None and any(fd != ctl for fd, _ in ready):
                return True
            if sock is not None:
                with self._io:
                    if pending(sock):
                        return True
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                return False
            ready = poller.poll(math.ceil(wait * 1000))

    def _closed_error(self, ended: object = None) -> ChannelClosedError:
        """The error for a closed channel, or (``ended``: how) for a peer that went away:
        a ``ChannelLostError`` naming the peer, never an actor's death."""
        self._closed = True
        role = "writer" if self._handle.reader else "reader"
        what = f"cannot {self._what} socket channel {self._handle.name}"
        if ended is not None:
            return ChannelLostError(f"{what}: the {role}'s connection ended ({ended}): "
                                    f"{self._handle.peer or 'it'} exited, detached, or its node "
                                    "is unreachable")
        why = (
            "this end was detached" if self._detached
            else f"its control server refused this end ({self._refused})" if self._refused
            else "it is closed (teardown, a failure elsewhere in the graph, or its owner exited)"
            if not self._midframe
            else "a value was interrupted half-way, so the stream is out of step"
        )
        return ChannelClosedError(f"{what}: {why}")

    def _timeout(self, timeout: float | None, why: str) -> ChannelTimeoutError:
        return ChannelTimeoutError(
            f"timed out after {timeout}s waiting to {self._what} socket channel "
            f"{self._handle.name} ({why}); the channel is unchanged, retry or raise the timeout"
        )


def _dial(handle: SocketHandle, role: str) -> socket.socket:
    """An authenticated control connection to the owner's server (blocking, no timeout
    once connected). A server that refuses the claim (it no longer knows the channel)
    leaves a socket at its end: the first use finds the channel closed.

    Raises:
        ChannelClosedError: the server cannot be reached, or could not prove it knows
            the graph's secret.
    """
    try:
        sock = socket.create_connection(handle.control, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ChannelClosedError(
            f"socket channel {handle.name}: cannot reach its control server at "
            f"{handle.control} ({exc}); the owner (driver) exited, or this host cannot reach it"
        ) from None
    tune(sock)
    sock.setblocking(False)
    deadline = time.monotonic() + HANDSHAKE_S
    try:
        sock = introduce(sock, handle.secret, f"control {handle.name} {role}".encode(), deadline, handle.tls)
    except (ssl.SSLError, TimeoutError) as exc:
        sock.close()
        raise ChannelClosedError(f"socket channel {handle.name}: TLS with the control server at "
                                 f"{handle.control} failed ({exc})") from None
    except RefusedError:
        pass  # the server does not know the channel (unlinked, or never made there)
    except AuthError as exc:
        sock.close()
        raise ChannelClosedError(
            f"socket channel {handle.name}: the control server at {handle.control} failed "
            f"the handshake ({exc}); it is not this graph's owner"
        ) from None
    return sock


def watch_closed(handle: SocketHandle, on_close: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_close`` (on a daemon thread) once channel ``handle`` is closed or its owner
    is gone; returns a function that stops watching without calling it. The thread
    sleeps in ``recv`` on an authenticated control connection: no periodic wake-ups.

    Raises:
        ChannelClosedError: the control server cannot be reached.
    """
    sock, stopped = _dial(handle, "o"), threading.Event()
    sock.setblocking(True)  # this thread sleeps in recv until a line or the end comes

    def run() -> None:
        seen = b""
        try:
            while b"CLOSED" not in seen:
                data = sock.recv(64)
                if not data:  # the owner exited (or refused us: the channel is gone)
                    break
                seen = (seen + data)[-64:]
        except OSError:
            pass
        if not stopped.is_set():
            on_close()

    thread = _threads.start(run, f"cgraph-watch-{handle.name}")

    def stop() -> None:
        stopped.set()
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes its recv (TLS or not)
        except OSError:
            pass
        thread.join(timeout=1.0)
        sock.close()

    return stop


def close_remotely(handle: SocketHandle) -> None:
    """Close a channel through its server over a one-shot connection (no endpoint), from
    any process that holds its handle; no server: it is closed for everyone already."""
    try:
        with _dial(handle, "o") as sock:
            sock.sendall(b"CLOSE\n")
    except (OSError, ChannelClosedError):
        pass  # no server: the channel is closed for everyone already


_LIVE: weakref.WeakSet[Endpoint] = weakref.WeakSet()  # this process's endpoints


def _after_fork_in_child() -> None:
    """Close the child's copies of the endpoints' sockets: a peer must see the end of a
    stream when the process that owns it exits, whoever forked it (DataLoader workers)."""
    for endpoint in list(_LIVE):
        endpoint._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
