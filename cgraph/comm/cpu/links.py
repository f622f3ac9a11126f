"""Links to ranks on other nodes for the "cpu" backend: one authenticated TCP socket per pair.

Inside a node the "cpu" backend's ranks talk through shared-memory links; a
pair of ranks on two nodes has no memory in common, so its messages cross one
TCP connection. ``FramedTransport`` routes every peer without a shared-memory
end here and keeps its semantics::

    message = header (16 bytes: fingerprint of the call | payload length) + payload
    post    tries the whole message at once without blocking (MSG_DONTWAIT); what the
            kernel did not take goes to the pair's sender thread as a view of buf
    recv    reads the header in the caller's thread, refuses a message of another
            call or length, then reads the payload straight into buf
    exchange  both peers on other nodes: one poll loop in the caller's thread sends and
              receives whichever the kernel is ready for (no deadlock, no copy, no thread)
    post + recv + wait_sent   the send's peer elsewhere, the receive's on this node: the
              sender thread writes the rest of the send while the caller receives
    send      sendall in the caller's thread: returns once the kernel has the message
              (rendezvous at worst, which every algorithm is tested under)

Why not gloo's pairs: every gloo message wakes a gloo thread on each side, which
costs far more on a busy host than a socket read in the caller's own thread
(docs/design-notes.md, "Numbers behind the code").

**When pairs connect.** A pair connects the first time a call needs it (``listen``;
``connect`` makes every pair at once): two ranks can talk while the group's other
ranks are idle, as after torch's ``init_process_group``. A rank that lower ranks may
dial listens on its node's address from its first call until each of them is in, or
the links close; then the listener closes.

**Who may connect.** A connection proves it knows the
group's secret (32 bytes from ``secrets``, made by the group's store actor and
delivered by Ray) with the mutual HMAC challenge of ``channels.handshake``
before a byte of it is read; the claim names the group and the connecting rank,
each rank may connect once, and strangers are closed and counted. The lower
rank of a pair dials, the higher accepts.

**TLS.** Where the rank's process asks for it (``CGRAPH_TLS=1`` or Ray's
``RAY_USE_TLS=1``, ``channels.tls``), each connection runs mutual TLS 1.2+ first, with
the certificates of the graph's channels, and the HMAC challenge inside it. A TLS
socket takes no flags and no ``sendmsg``: a post hands its whole message to the
pair's thread, and an exchange switches its sockets to non-blocking for its poll
loop (reading what TLS has already decrypted before polling). Every rank of a group
must agree (a cluster's TLS settings do): a plain peer fails the TLS handshake.

Errors are the channel's: no data within the group's timeout gives
``ChannelTimeoutError``; a peer that closed or died gives ``ChannelClosedError``.
``close`` shuts the sockets down, which wakes the peers blocked on them.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from cgraph import _threads
from cgraph.channels import tls
from cgraph.comm.cpu.pairing import Pairing
from cgraph.comm.transport import byte_view
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

HEADER = 16
"""Bytes of a message's header: fingerprint (8) and payload length (8)."""



class SocketLinks:
    """One rank's connections to the ranks on other nodes (see the module docstring)."""

    def __init__(self, pairing: Pairing, timeout: float) -> None:
        self._pairing, self._timeout = pairing, timeout
        self._socks: dict[int, socket.socket] = {}
        self._senders: dict[int, _Sender] = {}
        self._closed = False

    def link(self, peer: int) -> socket.socket:
        """The connection to ``peer``, made on first use (``Pairing.get``: dialed or admitted)."""
        sock = self._socks.get(peer)
        if sock is None:
            if self._closed:
                raise ChannelClosedError(f"the links to rank {peer}'s node are closed")
            sock = self._pairing.get(peer)
            if self._closed:  # closed from another thread (an abort) while this one connected
                sock.close()
                raise ChannelClosedError(f"the links to rank {peer}'s node are closed")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._timeout)
            self._socks[peer], self._senders[peer] = sock, _Sender(sock, peer)
        return sock

    def post(self, fingerprint: bytes, buf: np.ndarray, dst: int) -> None:
        """Start sending ``buf`` to ``dst``; ``buf`` must stay unchanged until ``wait_sent(dst)``.

        The whole message goes at once when the kernel takes it (MSG_DONTWAIT); what
        it did not take goes to the pair's sender thread, as a view of ``buf``.
        """
        raw = byte_view(buf)
        header = fingerprint + raw.size.to_bytes(8, "little")
        sock = self.link(dst)
        sender = self._senders[dst]
        sender.wait(self._timeout)  # the pair's previous message has left
        if isinstance(sock, ssl.SSLSocket):
            sender.start([memoryview(header), raw.data])  # TLS: no flags, no sendmsg
            return
        try:
            sent = sock.sendmsg([header, raw.data], [], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise ChannelClosedError(f"send to rank {dst}: {exc}") from exc
        if sent < HEADER:
            sender.start([memoryview(header)[sent:], raw.data])
        elif sent < HEADER + raw.size:
            sender.start([raw.data[sent - HEADER :]])

    def wait_sent(self, dst: int) -> None:
        """Wait until everything posted to ``dst`` has left (the kernel has it)."""
        if dst in self._senders:
            self._senders[dst].wait(self._timeout)

    def send(self, fingerprint: bytes, buf: np.ndarray, dst: int) -> None:
        """Send ``buf`` to ``dst`` from this thread, returning once the kernel has all of it."""
        raw = byte_view(buf)
        sock = self.link(dst)
        self._senders[dst].wait(self._timeout)
        try:
            _send_parts(sock, [fingerprint + raw.size.to_bytes(8, "little"), raw.data])
        except TimeoutError:
            raise ChannelTimeoutError(f"send to rank {dst}: it read nothing for {self._timeout:g} s") from None
        except OSError as exc:
            raise ChannelClosedError(f"send to rank {dst}: {exc}") from exc

    def exchange(self, fingerprint: bytes, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray,
                 src: int) -> bool:
        """Send to ``dst`` and receive from ``src``, both on other nodes, in this thread: one
        poll loop moves whichever side the kernel is ready for (no thread, no deadlock).

        Returns:
            False when the received message belongs to another call or has another length.
        """
        raw_in = byte_view(recvbuf)
        out = _Progress([fingerprint + byte_view(sendbuf).size.to_bytes(8, "little"), byte_view(sendbuf).data])
        into = _Incoming(fingerprint, raw_in)
        dst_sock, src_sock = self.link(dst), self.link(src)
        self._senders[dst].wait(self._timeout)
        secure = [sock for sock in {dst_sock, src_sock} if isinstance(sock, ssl.SSLSocket)]
        for sock in secure:
            sock.setblocking(False)
        try:
            return self._exchange(out, into, dst, dst_sock, src, src_sock)
        finally:
            for sock in secure:
                sock.settimeout(self._timeout)

    def _exchange(self, out: _Progress, into: _Incoming, dst: int, dst_sock: socket.socket,
                  src: int, src_sock: socket.socket) -> bool:
        poller = select.poll()
        deadline = time.monotonic() + self._timeout
        while not (out.done and into.done):
            if not into.done and tls.pending(src_sock):  # decrypted already: poll would not say
                try:
                    if not into.advance(src_sock):
                        return False
                except OSError as exc:
                    raise ChannelClosedError(f"exchange with ranks {dst} and {src}: {exc}") from exc
                continue
            events: dict[int, int] = {}
            if not out.done:
                events[dst_sock.fileno()] = select.POLLOUT
            if not into.done:
                events[src_sock.fileno()] = events.get(src_sock.fileno(), 0) | select.POLLIN
            for fd, mask in events.items():
                poller.register(fd, mask)
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(left, 0) * 1000)) if left > 0 else {}
            for fd in events:
                poller.unregister(fd)
            if not ready:
                raise ChannelTimeoutError(f"exchange with rank {src}: nothing for {self._timeout:g} s")
            try:
                if not out.done and ready.get(dst_sock.fileno(), 0) & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                    out.advance(dst_sock)
                if not into.done and ready.get(src_sock.fileno(), 0) & (select.POLLIN | select.POLLERR | select.POLLHUP):
                    if not into.advance(src_sock):
                        return False
            except OSError as exc:
                raise ChannelClosedError(f"exchange with ranks {dst} and {src}: {exc}") from exc
        return True

    def recv(self, fingerprint: bytes, buf: np.ndarray, src: int) -> bool:
        """Receive the next message from ``src`` into ``buf``.

        Returns:
            False, having read only the header, when the message belongs to another
            call or has another length (the caller raises the mismatch; the group aborts).
        """
        raw = byte_view(buf)
        header = bytearray(HEADER)
        self._read(memoryview(header), src)
        if bytes(header[:8]) != fingerprint or int.from_bytes(header[8:], "little") != raw.size:
            return False
        self._read(raw.data, src)
        return True

    def close(self) -> None:
        """Shut every connection down: peers blocked on them wake with an error."""
        if self._closed:
            return
        self._closed = True
        self._pairing.close()
        for sock in list(self._socks.values()):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # a sender's sendall fails at once
        for sender in list(self._senders.values()):
            sender.stop()
        for sock in list(self._socks.values()):
            sock.close()

    def _read(self, view: memoryview, src: int) -> None:
        sock, got = self.link(src), 0
        while got < len(view):
            try:
                n = sock.recv_into(view[got:])
            except TimeoutError:
                raise ChannelTimeoutError(f"receive from rank {src}: nothing for {self._timeout:g} s") from None
            except OSError as exc:
                raise ChannelClosedError(f"receive from rank {src}: {exc}") from exc
            if n == 0:
                raise ChannelClosedError(f"receive from rank {src}: it closed the connection")
            got += n


class _Sender:
    """A pair's sender thread: writes the rest of a posted message while the caller receives."""

    def __init__(self, sock: socket.socket, peer: int) -> None:
        self._sock, self._peer = sock, peer
        self._work: list[memoryview] | None = None
        self._busy = False
        self._stopped = False
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._thread = _threads.start(self._run, f"cgraph-link>{peer}")

    def start(self, parts: list[memoryview]) -> None:
        with self._cv:
            self._work, self._busy = parts, True
            self._cv.notify_all()

    def wait(self, timeout: float) -> None:
        """Until the current message has left; its error, if it failed."""
        with self._cv:
            if not self._cv.wait_for(lambda: not self._busy, timeout):
                raise ChannelTimeoutError(f"send to rank {self._peer}: it read nothing for {timeout:g} s")
            if self._error is not None:
                raise ChannelClosedError(f"send to rank {self._peer}: {self._error}")

    def stop(self) -> None:
        """End the thread (after the socket's shutdown, so a message in flight fails fast)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._work is not None or self._stopped)
                if self._stopped:
                    return
                parts, self._work = self._work, None
            try:
                for part in parts or ():
                    self._sock.sendall(part)
            except OSError as exc:
                self._error = exc
            with self._cv:
                self._busy = False
                self._cv.notify_all()


# --------------------------------------------------------------------------- connecting
def listen(rank: int, peers: Sequence[int], secret: bytes, claim_prefix: str, host: str,
           publish: Callable[[str], None], address_of: Callable[[int], str],
           timeout: float, use_tls: bool = False) -> SocketLinks:
    """This rank's links to ``peers`` (ranks on other nodes), each connected when first used.

    Returns at once: where a lower rank may dial this one, it listens on ``host`` and
    publishes the address; a pair connects the first time a call needs it (the lower
    rank dials, the higher admits), so two ranks can talk while the others are idle.

    Args:
        publish: posts this rank's listening address ("host:port") for the others.
        address_of: the address a peer published (waits for it).
        use_tls: run TLS (``channels.tls``) on every connection, the HMAC inside it.
    """
    return SocketLinks(Pairing(rank, peers, secret, claim_prefix, host, publish, address_of,
                                timeout, use_tls), timeout)


def connect(rank: int, peers: Sequence[int], secret: bytes, claim_prefix: str, host: str,
            publish: Callable[[str], None], address_of: Callable[[int], str],
            timeout: float, use_tls: bool = False) -> SocketLinks:
    """``listen``, then connect every pair now (the listener is closed when this returns)."""
    links = listen(rank, peers, secret, claim_prefix, host, publish, address_of, timeout, use_tls)
    try:
        for peer in peers:
            links.link(peer)
    except BaseException:
        links.close()
        raise
    return links


class _Progress:
    """What is left of a message being sent without blocking."""

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self._parts = [memoryview(p).cast("B") for p in parts if len(memoryview(p).cast("B"))]

    @property
    def done(self) -> bool:
        return not self._parts

    def advance(self, sock: socket.socket) -> None:
        try:
            if isinstance(sock, ssl.SSLSocket):  # non-blocking here (``exchange``); one part a call
                sent = sock.send(self._parts[0])
            else:
                sent = sock.sendmsg(self._parts, [], socket.MSG_DONTWAIT)
        except tls.WOULD_BLOCK:
            return
        while sent and self._parts:
            head = self._parts[0]
            if sent >= len(head):
                sent -= len(head)
                self._parts.pop(0)
            else:
                self._parts[0], sent = head[sent:], 0


class _Incoming:
    """A message being received without blocking: its header, then its payload in place."""

    def __init__(self, fingerprint: bytes, raw: np.ndarray) -> None:
        self._fingerprint, self._header, self._got = fingerprint, bytearray(HEADER), 0
        self._payload = raw.data.cast("B")
        self.done = False

    def advance(self, sock: socket.socket) -> bool:
        """Read what is there; False on a message of another call or length."""
        total = HEADER + len(self._payload)
        try:
            if self._got < HEADER:
                view = memoryview(self._header)[self._got:]
            else:
                view = self._payload[self._got - HEADER:]
            n = sock.recv_into(view, 0, 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_DONTWAIT)
        except tls.WOULD_BLOCK:
            return True
        if n == 0:
            raise ConnectionResetError("it closed the connection")
        self._got += n
        if self._got == HEADER:
            if (bytes(self._header[:8]) != self._fingerprint
                    or int.from_bytes(self._header[8:], "little") != len(self._payload)):
                return False
        self.done = self._got == total
        return True


def _send_parts(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """``sendall`` of several buffers (the socket's timeout bounds each wait)."""
    for part in parts:
        if len(memoryview(part).cast("B")):
            sock.sendall(part)
