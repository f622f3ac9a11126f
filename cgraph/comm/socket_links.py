"""Links to ranks on other nodes for the "cpu" backend: one authenticated TCP socket per pair.

Inside a node the "cpu" backend's ranks talk through shared-memory links; a
pair of ranks on two nodes has no memory in common, so its messages cross one
TCP connection. ``FramedTransport`` routes every peer without a shared-memory
end here and keeps its semantics::

    message = header (16 bytes: fingerprint of the call | payload length) + payload
    send    tries the whole message at once without blocking (MSG_DONTWAIT); what the
            kernel did not take goes to the pair's sender thread, from a copy, so the
            caller may reuse buf at once (buffered, like a link)
    recv    reads the header in the caller's thread, refuses a message of another
            call or length, then reads the payload straight into buf

Why not gloo's pairs: every gloo message wakes a gloo thread on each side; on a
busy host that cost ~1.8 ms per message against ~30 us for a socket read in the
caller's own thread (measured on this project's 2-core machine, loopback).

**Who may connect.** Each rank listens on its node's address only while the
pairs are made, then closes the listener. A connection proves it knows the
group's secret (32 bytes from ``secrets``, made by the group's store actor and
delivered by Ray) with the mutual HMAC challenge of ``channels.handshake``
before a byte of it is read; the claim names the group and the connecting rank,
each rank may connect once, and strangers are closed and counted. The lower
rank of a pair dials, the higher accepts.

Errors are the channel's: no data within the group's timeout gives
``ChannelTimeoutError``; a peer that closed or died gives ``ChannelClosedError``.
``close`` shuts the sockets down, which wakes the peers blocked on them.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from cgraph.channels import handshake
from cgraph.errors import ChannelClosedError, ChannelTimeoutError

HEADER = 16
"""Bytes of a message's header: fingerprint (8) and payload length (8)."""
SLOTS = 2
"""Messages per peer handed to its sender thread before ``send`` waits (the links' ``LINK_SLOTS``)."""


class SocketLinks:
    """One rank's connections to the ranks on other nodes (see the module docstring)."""

    def __init__(self, socks: dict[int, socket.socket], timeout: float) -> None:
        self._socks, self._timeout = socks, timeout
        self._senders = {peer: _Sender(sock, peer) for peer, sock in socks.items()}
        self._closed = False
        for sock in socks.values():
            sock.settimeout(timeout)

    def send(self, fingerprint: bytes, buf: np.ndarray, dst: int) -> None:
        raw = _raw(buf)
        header = fingerprint + raw.size.to_bytes(8, "little")
        sender, sock = self._senders[dst], self._socks[dst]
        sender.check()
        sent = 0
        if sender.idle():  # nothing queued before it: try it at once, without blocking
            try:
                sent = sock.sendmsg([header, raw], [], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                raise ChannelClosedError(f"send to rank {dst}: {exc}") from exc
        if sent < HEADER + raw.size:
            rest = (header[sent:] + raw[max(sent - HEADER, 0):].tobytes()) if sent < HEADER \
                else raw[sent - HEADER:].tobytes()
            sender.put(rest, self._timeout)

    def recv(self, fingerprint: bytes, buf: np.ndarray, src: int) -> bool:
        """Receive the next message from ``src`` into ``buf``.

        Returns:
            False, having read only the header, when the message belongs to another
            call or has another length (the caller raises the mismatch; the group aborts).
        """
        raw = _raw(buf)
        header = bytearray(HEADER)
        self._read(memoryview(header), src)
        if bytes(header[:8]) != fingerprint or int.from_bytes(header[8:], "little") != raw.size:
            return False
        self._read(memoryview(raw), src)
        return True

    def flush(self) -> None:
        """Wait until every message sent so far has left (the end of a call)."""
        for sender in self._senders.values():
            sender.drain(self._timeout)

    def close(self) -> None:
        """Shut every connection down: peers blocked on them wake with an error."""
        if self._closed:
            return
        self._closed = True
        for sock in self._socks.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a sender thread's sendall fails at once
        for sender in self._senders.values():
            sender.stop()
        for sock in self._socks.values():
            sock.close()

    def _read(self, view: memoryview, src: int) -> None:
        sock, got = self._socks[src], 0
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
    """A pair's sender thread: writes what ``send`` could not, in order."""

    def __init__(self, sock: socket.socket, peer: int) -> None:
        self._sock, self._peer = sock, peer
        self._queue: queue.Queue[bytes | None] = queue.Queue(SLOTS)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"cgraph-link>{peer}", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def put(self, data: bytes, timeout: float) -> None:
        try:
            self._queue.put(data, timeout=timeout)
        except queue.Full:
            raise ChannelTimeoutError(f"send to rank {self._peer}: it read nothing for {timeout:g} s") from None

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks and self._error is None:
                if not self._queue.all_tasks_done.wait(max(deadline - time.monotonic(), 0)):
                    raise ChannelTimeoutError(f"send to rank {self._peer}: it read nothing for {timeout:g} s")
        self.check()

    def check(self) -> None:
        if self._error is not None:
            raise ChannelClosedError(f"send to rank {self._peer}: {self._error}")

    def stop(self) -> None:
        """End the thread (after the socket's shutdown, so what is queued fails fast)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=1.0)

    def _run(self) -> None:
        while True:
            data = self._queue.get()
            try:
                if data is None:
                    return
                if self._error is None:
                    self._sock.sendall(data)
            except OSError as exc:
                self._error = exc
            finally:
                self._queue.task_done()


# --------------------------------------------------------------------------- connecting
def connect(rank: int, peers: Sequence[int], secret: bytes, claim_prefix: str, host: str,
            publish: Callable[[str], None], address_of: Callable[[int], str],
            timeout: float) -> SocketLinks:
    """Connect this rank to each of ``peers`` (ranks on other nodes), authenticated.

    Args:
        publish: posts this rank's listening address ("host:port") for the others.
        address_of: the address a peer published (waits for it).
    """
    lower = [p for p in peers if p < rank]
    listener = socket.create_server((host, 0), backlog=max(len(lower), 1) + 4)
    socks: dict[int, socket.socket] = {}
    try:
        accepting = threading.Thread(target=_accept, args=(listener, set(lower), secret, claim_prefix,
                                                           socks, timeout), daemon=True)
        accepting.start()
        publish(f"{host}:{listener.getsockname()[1]}")
        for peer in (p for p in peers if p > rank):
            socks[peer] = _dial(address_of(peer), secret, f"{claim_prefix} {rank}".encode(), timeout)
        accepting.join(timeout)
        missing = [p for p in lower if p not in socks]
        if missing:
            raise ChannelTimeoutError(f"ranks {missing} did not connect within {timeout:g} s")
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        listener.close()  # no listening socket outlives the connecting
    for sock in socks.values():
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return SocketLinks(socks, timeout)


def _dial(address: str, secret: bytes, claim: bytes, timeout: float) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.setblocking(False)
        handshake.prove(sock, secret, claim, time.monotonic() + handshake.HANDSHAKE_S)
        sock.setblocking(True)
    except BaseException:
        sock.close()
        raise
    return sock


def _accept(listener: socket.socket, expected: set[int], secret: bytes, claim_prefix: str,
            socks: dict[int, socket.socket], timeout: float) -> None:
    """Admit each expected rank once; close every connection that fails to prove itself."""
    deadline = time.monotonic() + timeout

    def lookup(claim: bytes) -> bytes | None:
        prefix, _, who = claim.decode(errors="replace").rpartition(" ")
        ok = prefix == claim_prefix and who.isdigit() and int(who) in expected and int(who) not in socks
        return secret if ok else None

    while expected - set(socks) and time.monotonic() < deadline:
        listener.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            return
        except OSError:
            return  # the listener was closed
        try:
            sock.settimeout(handshake.HANDSHAKE_S)
            acceptor = handshake.Acceptor(lookup)
            sock.sendall(acceptor.challenge)
            proof = None
            while proof is None:
                data = sock.recv(acceptor.wanted())
                if not data:
                    raise handshake.AuthError("it closed the connection during the handshake")
                proof = acceptor.feed(data)
            sock.sendall(proof)
            sock.settimeout(None)
            socks[int(acceptor.claim.decode().rpartition(" ")[2])] = sock  # type: ignore[union-attr]
        except (handshake.AuthError, OSError) as exc:
            handshake.logger.warning("cpu group links: refused a connection: %s", exc)
            sock.close()


def _raw(buf: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view."""
    return buf.reshape(-1).view(np.uint8)
