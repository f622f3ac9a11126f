"""Making a "cpu" group's connections between nodes, each when a call first needs it.

``socket_links.SocketLinks`` asks ``Pairing.get(peer)`` the first time it talks to a
peer on another node. The lower rank of a pair dials (``_dial``: TLS first where
asked, then proves it knows the group's secret); the higher admits, on a listener
whose thread authenticates each connection as it comes (``_admit``: the mutual HMAC
challenge of ``channels.handshake``, one connection per expected rank, strangers
closed and logged) and closes once every lower peer is in. Both ends are tuned as
socket channels are (``handshake.tune``: keepalive, a user timeout)::

    Pairing(rank 2, peers [0, 1])    listens (lower peers 0 and 1 may dial), publishes
      get(0)                         waits until rank 0's connection is admitted
      get(3) (a higher peer)         address_of(3), dials, proves itself
      close()                        stops listening; admitted but unused ones close
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence

from cgraph import _threads
from cgraph.channels import handshake, tls
from cgraph.errors import ChannelClosedError, ChannelTimeoutError


class Pairing:
    """Makes one rank's connections on demand: it dials its higher peers and admits its
    lower ones, whose connections its listener thread authenticates as they come. The
    listener closes once every lower peer is in (or at ``close``)."""

    def __init__(self, rank: int, peers: Sequence[int], secret: bytes, claim_prefix: str, host: str,
                 publish: Callable[[str], None], address_of: Callable[[int], str], timeout: float,
                 use_tls: bool) -> None:
        self._rank, self._peers = rank, set(peers)
        self._secret, self._claim_prefix, self._use_tls = secret, claim_prefix, use_tls
        self._address_of, self._timeout = address_of, timeout
        self._expected = {p for p in peers if p < rank}
        self._admitted: dict[int, socket.socket] = {}
        self._taken: set[int] = set()
        self._closed = False
        self._cv = threading.Condition()
        self._listener: socket.socket | None = None
        if self._expected:
            self._listener = socket.create_server((host, 0), backlog=len(self._expected) + 4)
            _threads.start(self._admit_all, f"cgraph-links-listen{rank}")
            try:
                publish(f"{host}:{self._listener.getsockname()[1]}")
            except BaseException:
                self.close()
                raise

    def get(self, peer: int) -> socket.socket:
        """The connection to ``peer``: dialed (a higher rank) or admitted (a lower one), once.

        Raises:
            ChannelTimeoutError: a lower peer did not connect within the timeout.
            ChannelClosedError: not a peer on another node, or closed.
        """
        if peer not in self._peers or peer in self._taken:
            raise ChannelClosedError(f"rank {peer} is not a peer on another node of rank {self._rank}")
        if peer > self._rank:
            address = self._address_of(peer)
            try:
                sock = _dial(address, self._secret, f"{self._claim_prefix} {self._rank}".encode(),
                             self._timeout, self._use_tls)
            except (handshake.AuthError, OSError) as exc:  # timeouts and TLS errors are OSErrors
                raise ChannelClosedError(f"could not connect to rank {peer} at {address}: {exc}") from exc
        else:
            with self._cv:
                if not self._cv.wait_for(lambda: peer in self._admitted or self._closed, self._timeout):
                    raise ChannelTimeoutError(f"rank {peer} did not connect within {self._timeout:g} s")
                if self._closed:
                    raise ChannelClosedError(f"the links to rank {peer}'s node are closed")
                sock = self._admitted.pop(peer)
        self._taken.add(peer)
        return sock

    def close(self) -> None:
        """Stop listening; connections admitted but never used are closed."""
        with self._cv:
            self._closed = True
            left, self._admitted = list(self._admitted.values()), {}
            self._cv.notify_all()
        self._close_listener()
        for sock in left:
            sock.close()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
            listener.close()

    def _admit_all(self) -> None:
        """Admit each expected rank once; close every connection that fails to prove itself.
        The listener closes once all are in: no listening socket outlives the pairing."""
        listener = self._listener
        while listener is not None and not self._closed:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                peer, sock = _admit(sock, self._secret, self._claim_prefix, self._wanted, self._use_tls)
            except (handshake.AuthError, OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                handshake.logger.warning("cpu group links: refused a connection: %s", exc)
                continue
            with self._cv:
                if self._closed:
                    sock.close()
                    return
                self._admitted[peer] = sock
                self._expected.discard(peer)
                if not self._expected:
                    self._close_listener()
                self._cv.notify_all()

    def _wanted(self, claim: bytes) -> bytes | None:
        prefix, _, who = claim.decode(errors="replace").rpartition(" ")
        ok = prefix == self._claim_prefix and who.isdigit() and int(who) in self._expected
        return self._secret if ok else None


def _dial(address: str, secret: bytes, claim: bytes, timeout: float, use_tls: bool) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        handshake.tune(sock)
        sock.setblocking(False)
        sock = handshake.introduce(sock, secret, claim, time.monotonic() + handshake.HANDSHAKE_S, use_tls)
        sock.setblocking(True)
    except BaseException:
        sock.close()
        raise
    return sock


def _admit(sock: socket.socket, secret: bytes, claim_prefix: str, lookup: Callable[[bytes], bytes | None],
           use_tls: bool) -> tuple[int, socket.socket]:
    """The accepting side's handshake on one connection: (the peer's rank, the socket).

    Raises:
        handshake.AuthError, OSError, TimeoutError: it did not prove itself in time.
    """
    try:
        handshake.tune(sock)
        if use_tls:
            sock.setblocking(False)
            sock = tls.wrap(sock, server_side=True)
            tls.handshake(sock, time.monotonic() + handshake.HANDSHAKE_S)
        sock.settimeout(handshake.HANDSHAKE_S)
        claim = handshake.answer(sock, lookup)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return int(claim.decode().rpartition(" ")[2]), sock
