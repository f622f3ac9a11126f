"""The control server of socket channels: where endpoints meet, and who closes them.

It lives in the process that owns the channels (the driver): one listening
socket on the node's own address and a daemon thread sleeping in
``selectors``. Each endpoint of a socket channel opens one control connection
at ``attach``. Before the server reads a line from it, the connection runs the
mutual handshake (``handshake.Acceptor``) with the claim
``control <name> <role>``: the server checks it with the secret of channel
``name`` (given at ``register_channel``) and proves the same back. A connection
that claims an unknown channel, proves nothing, sends a byte too many or takes
longer than ``HANDSHAKE_S`` is closed and counted (``refusals``); the server
keeps serving. Then the protocol is ASCII lines::

    endpoint -> server                     server -> endpoint
    (role r) LISTEN <host> <port>          ADDR <host> <port>  to the writer, once the
                                                               reader said where
    CLOSE    close the channel             CLOSED  to every endpoint of a closed
             (and those linked to it)              channel (also at once, if it is)

Roles: ``w`` writer, ``r`` reader, ``o`` any other party: a one-shot closer
(a detached endpoint's close) or a watcher waiting for ``CLOSED``. The end of a control connection drops it (an endpoint
detached or exited; the channel stays open); a line the server does not
understand drops that connection only. ``SocketChannel.close``/``unlink`` call
in from any thread; one lock guards the table, and every send is a
non-blocking one-liner.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field

from cgraph import _threads
from cgraph._log import logger
from cgraph.channels.handshake import HANDSHAKE_S, Admission, AuthError, RefusalLog, tune
from cgraph.channels.tls import WOULD_BLOCK, pending
from cgraph.errors import ChannelClosedError

_MAX_LINE = 1024
_BACKOFF_S = 0.15  # after a failed accept (out of fds): the listener stays readable
_LISTEN, _WAKE = object(), object()


@dataclass(eq=False, slots=True)
class _Conn:
    """One control connection, as the server sees it."""

    sock: socket.socket  # plain, or TLS-wrapped (``Admission.sock``)
    auth: Admission | None  # the handshake in progress; None once the peer proved itself
    buf: bytes = b""
    name: str = ""
    role: str = ""  # once proven: "w" writer, "r" reader, "o" a one-shot closer
    dead: bool = False


@dataclass(slots=True)
class _Entry:
    """What the server knows of one channel."""

    secret: bytes = b""
    closed: bool = False
    conns: list[_Conn] = field(default_factory=list)
    reader: _Conn | None = None
    addr: str = ""  # "host port" of the reader's listener, once it said hello
    linked: tuple[str, ...] = ()  # channels that close with this one (``link_closing``)


class ControlServer:
    """A broker and closer living in the process that owns channels (the driver).

    A daemon thread tells each writer where its reader listens and relays
    ``close`` to every endpoint. ``host`` must be an address every endpoint can
    reach (on a cluster: this node's IP). One lock guards the channel table.
    """

    def __init__(self, host: str = "127.0.0.1", tls: bool = False) -> None:
        self.tls = tls  # every connection runs TLS first; its channels' endpoints too
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTEN)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._lock = threading.Lock()
        self._channels: dict[str, _Entry] = {}
        self._conns: set[_Conn] = set()
        self.refusals = RefusalLog(f"socket channel control server {self.address}")
        self._stopped = False
        self._pid = os.getpid()
        name = f"cgraph-control-{self.address[1]}"
        self._thread = _threads.start(self._serve, name)
        _LIVE.add(self)

    @classmethod
    def shared(cls, host: str = "127.0.0.1", tls: bool = False) -> ControlServer:
        """This process's server on ``host`` (with or without TLS), started on first use
        (again after a fork, and after the last channel of the previous one was forgotten:
        a ``register_channel`` that meets it closed raises ``ChannelClosedError``, and
        the caller asks again)."""
        with _shared_lock:
            server = _shared.get((host, tls))
            if server is None or server._stopped or server._pid != os.getpid():
                server = _shared[(host, tls)] = cls(host, tls)
            return server

    def close(self) -> None:
        """Stop the thread and close every socket: every endpoint sees its channel closed."""
        if self._pid != os.getpid():
            self._forget()
            return
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._wake_w.send(b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        """Close every socket, waking no one (also a forked child's copies)."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()  # the parent's thread may have held it at the fork
        self._stopped = True
        for sock in (*(c.sock for c in self._conns), self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._conns.clear()
        self._channels.clear()
        self._selector.close()

    # ----------------------------------------------------------------- for SocketChannel
    def register_channel(self, name: str, secret: bytes) -> None:
        """Start tracking channel ``name`` (open, no endpoint yet); its endpoints prove
        they know ``secret``.

        Raises:
            FileExistsError: it is tracked already. ChannelClosedError: the server is closed.
        """
        with self._lock:
            if self._stopped:
                raise ChannelClosedError(
                    f"cannot create socket channel {name}: its control server {self.address} "
                    "is closed; create channels on a live one (ControlServer.shared())"
                )
            if name in self._channels:
                raise FileExistsError(f"socket channel {name} exists (same tag and channel id)")
            self._channels[name] = _Entry(secret)

    def close_channel(self, name: str) -> None:
        """Mark ``name`` closed and tell its endpoints (any thread; unknown names: no-op)."""
        with self._lock:
            self._close_locked(name)

    def link_closing(self, names: tuple[str, ...]) -> None:
        """Close these channels together from now on: a close of any one (an endpoint's
        ``CLOSE``, ``close_channel``) closes every one, so that one member of a group
        wakes every other, wherever it is. Only the owner links; a stranger proves no
        secret and closes nothing.

        Raises:
            KeyError: a name that is not tracked.
        """
        with self._lock:
            entries = [self._channels[name] for name in names]
            for entry in entries:
                entry.linked = names
            if any(entry.closed for entry in entries):
                for name in names:
                    self._close_locked(name)

    def channel_closed(self, name: str) -> bool:
        """Whether ``name`` is closed (an unknown or forgotten name counts as closed)."""
        with self._lock:
            entry = self._channels.get(name)
            return entry is None or entry.closed

    def forget_channel(self, name: str) -> None:
        """Stop tracking ``name`` and close its endpoints' control connections. A shared
        server (``shared``) that tracks no channel any more closes: its thread and listener
        go with the last graph that used them, and the next channel starts a new one."""
        with _shared_lock:
            with self._lock:
                entry = self._channels.pop(name, None)
                for conn in entry.conns if entry is not None else ():
                    self._drop(conn)
                key = (self.address[0], self.tls)
                idle = not self._channels and _shared.get(key) is self
            if idle:
                del _shared[key]
        if idle:
            self.close()

    # ----------------------------------------------------------------- the thread
    def _serve(self) -> None:
        while True:
            try:  # sleeps in the kernel until a socket speaks or a handshake's time is up
                events = self._selector.select(self._next_deadline())
            except (OSError, ValueError):  # closed under us
                return
            with self._lock:
                if self._stopped:
                    return
                for key, _ in events:
                    if key.data is _LISTEN:
                        self._accept()
                    elif key.data is _WAKE:
                        self._wake_r.recv(64)
                    elif not key.data.dead:
                        self._serve_one(key.data)
                self._expire()

    def _next_deadline(self) -> float | None:
        with self._lock:
            soonest = min((c.auth.deadline for c in self._conns if c.auth is not None), default=None)
        return None if soonest is None else max(0.0, soonest - time.monotonic()) + 0.01

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns if c.auth is not None and c.auth.deadline <= now]:
            self._refuse(conn, f"no proof within {HANDSHAKE_S:g} s")

    def _serve_one(self, conn: _Conn) -> None:
        try:
            if conn.auth is not None:
                self._authenticate(conn)
            else:
                self._on_readable(conn)
        except Exception:  # a bug must not stop the server: drop that connection only
            logger.exception("socket channel control server: dropping a control connection")
            self._drop(conn)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except WOULD_BLOCK:
            return
        except OSError as exc:  # out of fds, ...: the listener stays readable, so back off
            logger.warning("socket channel control server cannot accept: %s", exc)
            time.sleep(_BACKOFF_S)
            return
        try:
            sock.setblocking(False)
            tune(sock)
            admission = Admission(sock, self._secret_for, self.tls)
            conn = _Conn(admission.sock, admission)
        except (OSError, ValueError) as exc:  # ValueError: TLS on, no certificate here
            self.refusals.refuse("?", exc)
            sock.close()
            return
        self._conns.add(conn)
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        self._authenticate(conn)  # plain: the challenge goes out now

    def _secret_for(self, claim: bytes) -> bytes | None:
        """The secret that proves ``control <name> <role>``: channel ``name``'s."""
        words = claim.split(b" ")
        if len(words) != 3 or words[0] != b"control" or words[2] not in (b"w", b"r", b"o"):
            return None
        entry = self._channels.get(words[1].decode("ascii", "replace"))
        return None if entry is None else entry.secret

    def _authenticate(self, conn: _Conn) -> None:
        """One step of a connection's handshake: nothing else is read before it succeeds."""
        admission = conn.auth
        assert admission is not None
        try:
            if not admission.advance():
                events = selectors.EVENT_WRITE if admission.want == select.POLLOUT else selectors.EVENT_READ
                self._selector.modify(conn.sock, events, conn)
                return
        except (AuthError, OSError) as exc:
            return self._refuse(conn, exc)
        _, name, role = (admission.acceptor.claim or b"").decode("ascii").split(" ")
        conn.auth = None
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._hello(conn, name, role)
        if not conn.dead and pending(conn.sock):  # decrypted already: no readiness will say so
            self._on_readable(conn)
        return None

    def _on_readable(self, conn: _Conn) -> None:
        while not conn.dead:
            try:
                data = conn.sock.recv(4096)
            except WOULD_BLOCK:
                return
            except OSError:
                data = b""
            if not data:  # the endpoint detached, or its process exited
                return self._drop(conn)
            self._on_lines(conn, data)
            if not pending(conn.sock):
                return

    def _on_lines(self, conn: _Conn, data: bytes) -> None:
        *lines, conn.buf = (conn.buf + data).split(b"\n")
        for line in lines:
            if conn.dead:
                break
            words = line.decode("ascii", "replace").split()
            if words == ["CLOSE"]:
                self._close_locked(conn.name)
            elif conn.role == "r" and len(words) == 3 and words[0] == "LISTEN" and words[2].isdigit():
                self._listening(conn, f"{words[1]} {words[2]}")
            else:
                self._refuse(conn, repr(line[:80]))
        if len(conn.buf) > _MAX_LINE and not conn.dead:
            self._refuse(conn, f"a line longer than {_MAX_LINE} bytes")
        return None

    def _refuse(self, conn: _Conn, what: object) -> None:
        try:
            peer: object = conn.sock.getpeername()
        except OSError:
            peer = "?"
        self.refusals.refuse(peer, what)
        self._drop(conn)

    def _hello(self, conn: _Conn, name: str, role: str) -> None:
        conn.name, conn.role = name, role
        entry = self._channels.get(name)
        if entry is None:  # forgotten while it proved itself
            _say(conn, b"CLOSED\n")
            return self._drop(conn)
        entry.conns.append(conn)
        if entry.closed:
            _say(conn, b"CLOSED\n")
        elif role == "w" and entry.addr:
            _say(conn, f"ADDR {entry.addr}\n".encode())
        return None

    def _listening(self, conn: _Conn, addr: str) -> None:
        """The reader said where it listens: tell the writers."""
        entry = self._channels.get(conn.name)
        if entry is None or entry.closed:
            return
        entry.reader, entry.addr = conn, addr
        for peer in entry.conns:
            if peer.role == "w":
                _say(peer, f"ADDR {addr}\n".encode())

    def _close_locked(self, name: str) -> None:
        entry = self._channels.get(name)
        if entry is not None and not entry.closed:
            entry.closed = True
            for conn in entry.conns:
                _say(conn, b"CLOSED\n")
            for other in entry.linked:
                self._close_locked(other)

    def _drop(self, conn: _Conn) -> None:
        if conn.dead:
            return
        conn.dead = True
        self._conns.discard(conn)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        entry = self._channels.get(conn.name)
        if entry is not None and conn in entry.conns:
            entry.conns.remove(conn)
            if entry.reader is conn:  # its listener is gone with it
                entry.reader, entry.addr = None, ""


def _say(conn: _Conn, line: bytes) -> None:
    try:
        conn.sock.send(line)
    except OSError:
        pass  # gone: the end of its stream drops it


_LIVE: weakref.WeakSet[ControlServer] = weakref.WeakSet()
_shared: dict[tuple[str, bool], ControlServer] = {}
_shared_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Close the child's copies of the servers' sockets; ``shared`` starts new ones."""
    global _shared_lock
    _shared_lock = threading.Lock()
    _shared.clear()
    for server in list(_LIVE):
        server._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
