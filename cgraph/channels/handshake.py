"""Mutual challenge-response on every connection cgraph accepts (HMAC-SHA256).

Each compiled graph has a random secret (32 bytes from ``secrets``) that reaches
its actors inside the setup calls Ray delivers, never over a cgraph socket. A
connection proves, before the listening side reads one byte of a frame or
unpickles anything, that both ends know it::

    acceptor (listens)                              connector (dials)
    ── CHALLENGE: MAGIC, nonce_a (32) ─────────────▶
                                                    claim = what it wants, e.g.
                                                    b"data cgraph_12_ab_n1>b.xnode w"
    ◀── RESPONSE: len(claim) u16, claim, nonce_c (32), mac_c ──
    secret = lookup(claim), or refuse
    mac_c == HMAC(secret, "connector" | claim | nonce_a | nonce_c)?
    ── PROOF: mac_a = HMAC(secret, "acceptor" | claim | nonce_a | nonce_c) ─▶
                                                    mac_a right? else refuse

Fresh nonces on both sides make every exchange single-use (no replay); the
labels keep one side's MAC from being reflected as the other's; the claim
binds the proof to the graph (its channel names carry the graph's tag), the
channel and the role. The connector sends nothing after its response until the
proof arrives, so the acceptor refuses any byte beyond it. Lengths are fixed
except the claim's, which is bounded (``MAX_CLAIM``) before anything is
buffered: a stranger can make the acceptor hold at most ``RESPONSE_MAX``
bytes, for at most ``HANDSHAKE_S``.

``Acceptor`` is sans-IO (the control server's selector loop and a reader's
listener feed it what they receive); ``prove`` runs the connector's side on a
socket, blocking until a deadline, and ``introduce`` runs TLS first where asked.
Every TCP connection cgraph makes or admits (socket channels, the "cpu"
backend's links between nodes) goes through ``tune``: no Nagle delay, and
keepalive with a user timeout, so a peer whose host vanished without a FIN or
RST is noticed within ``LOST_PEER_S``. The standard library's
``multiprocessing.connection`` does the same with a one-sided challenge; here
both sides prove themselves.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import select
import socket
import time
from collections.abc import Callable

from cgraph.channels import tls
from cgraph.channels.tls import WOULD_BLOCK, pending, send_flags

LOST_PEER_S = 30  # keepalive: idle 10 s, then 4 probes 5 s apart; unacked data: 30 s
MAGIC = b"cgraph-auth-1"
NONCE = 32
MAC = 32  # SHA-256
SECRET_BYTES = 32
MAX_CLAIM = 1024
CHALLENGE_BYTES = len(MAGIC) + NONCE
RESPONSE_MAX = 2 + MAX_CLAIM + NONCE + MAC
HANDSHAKE_S = 5.0
"""How long a connection may take to prove itself before it is closed."""

logger = logging.getLogger("cgraph")


class AuthError(Exception):
    """A peer failed the handshake (or broke off, or ran out of time)."""


class RefusedError(AuthError):
    """The listener closed the connection before its proof: it refused the claim."""


def new_secret() -> bytes:
    """A fresh graph secret."""
    return secrets.token_bytes(SECRET_BYTES)


def _mac(secret: bytes, label: bytes, claim: bytes, nonce_a: bytes, nonce_c: bytes | bytearray) -> bytes:
    message = b"%s\0%s%s%s%s" % (label, len(claim).to_bytes(2, "little"), claim, nonce_a, nonce_c)
    return hmac.digest(secret, message, "sha256")


class Acceptor:
    """The listening side of one connection's handshake, without I/O.

    Send ``challenge`` first; then ``feed`` what the peer sent, asking ``wanted()``
    bytes at a time (never more, so no frame byte is ever read before the peer
    proved itself). ``feed`` returns the proof to send back once the peer proved
    itself (``claim`` is then set), None while it needs more.

    Raises (from ``feed``):
        AuthError: a malformed response, an unknown claim or a wrong MAC.
    """

    def __init__(self, lookup: Callable[[bytes], bytes | None]) -> None:
        self._lookup = lookup
        self._nonce = secrets.token_bytes(NONCE)
        self.challenge = MAGIC + self._nonce
        self._buf = bytearray()
        self.claim: bytes | None = None

    def wanted(self) -> int:
        """How many more bytes the response needs (0 once decided)."""
        if self.claim is not None:
            return 0
        if len(self._buf) < 2:
            return 2 - len(self._buf)
        return 2 + int.from_bytes(self._buf[:2], "little") + NONCE + MAC - len(self._buf)

    def feed(self, data: bytes) -> bytes | None:
        if self.claim is not None or len(data) > self.wanted():
            raise AuthError("sent more than its handshake response")
        self._buf += data
        if len(self._buf) >= 2 and not 0 < int.from_bytes(self._buf[:2], "little") <= MAX_CLAIM:
            raise AuthError("a claim of impossible length")
        if len(self._buf) < 2 or self.wanted():
            return None
        size = int.from_bytes(self._buf[:2], "little")
        claim = bytes(self._buf[2 : 2 + size])
        nonce_c, mac_c = self._buf[2 + size : 2 + size + NONCE], self._buf[2 + size + NONCE :]
        secret = self._lookup(claim)
        if secret is None:
            raise AuthError(f"a claim it cannot check ({claim[:80]!r})")
        if not hmac.compare_digest(mac_c, _mac(secret, b"connector", claim, self._nonce, nonce_c)):
            raise AuthError("a wrong proof (it does not know the graph's secret)")
        self.claim = claim
        return _mac(secret, b"acceptor", claim, self._nonce, bytes(nonce_c))


class Admission:
    """One accepted connection on its way in: TLS first (when on), then the challenge and
    the peer's proof, without ever blocking. Call ``advance()`` when its socket is ready
    for ``want`` (a ``poll`` event); refuse it at ``deadline``.
    """

    def __init__(self, sock: socket.socket, lookup: Callable[[bytes], bytes | None],
                 use_tls: bool) -> None:
        self.sock = tls.wrap(sock, server_side=True) if use_tls else sock
        self.acceptor = Acceptor(lookup)
        self.deadline = time.monotonic() + HANDSHAKE_S
        self.want = select.POLLIN if use_tls else select.POLLOUT  # TLS: the client speaks first
        self._tls, self._challenged = use_tls, False

    def advance(self) -> bool:
        """Take what the peer sent; True once it proved itself (the proof went back).

        Raises:
            AuthError: it failed the handshake. OSError (ssl.SSLError): its connection
                or its TLS handshake failed.
        """
        if self.acceptor.claim is not None:
            return True
        if self._tls:
            self.want = tls.step(self.sock)  # type: ignore[arg-type]
            if self.want:
                return False
            self._tls, self.want = False, select.POLLIN
        if not self._challenged:
            _send_all(self.sock, self.acceptor.challenge, time.monotonic() + 1.0)
            self._challenged, self.want = True, select.POLLIN
        while True:
            try:
                data = self.sock.recv(self.acceptor.wanted())
            except WOULD_BLOCK:
                return False
            if not data:
                raise AuthError("it closed the connection during the handshake")
            proof = self.acceptor.feed(data)
            if proof is not None:
                _send_all(self.sock, proof, time.monotonic() + 1.0)
                return True


def tune(sock: socket.socket) -> None:
    """No Nagle delay (a credit or a line never waits for an ack); keepalive and a user
    timeout, so a silently lost peer ends the connection instead of hanging it."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4),
                          ("TCP_USER_TIMEOUT", LOST_PEER_S * 1000)):
        if hasattr(socket, option):  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def introduce(sock: socket.socket, secret: bytes, claim: bytes, deadline: float,
              use_tls: bool) -> socket.socket:
    """The dialing side on a connected non-blocking socket: TLS first where asked, then
    ``prove``. Returns the socket to use (the TLS wrapper, or ``sock``); the caller
    closes ``sock`` on an error.

    Raises:
        ssl.SSLError, TimeoutError: TLS failed, or the deadline passed.
        AuthError: the acceptor refused the claim (``RefusedError``) or failed its proof.
    """
    if use_tls:
        sock = tls.wrap(sock, server_side=False)
        tls.handshake(sock, deadline)
    prove(sock, secret, claim, deadline)
    return sock


def prove(sock: socket.socket, secret: bytes, claim: bytes, deadline: float) -> None:
    """Run the connector's side on a connected, non-blocking ``sock`` (plain or TLS), until
    ``deadline`` (``time.monotonic()``).

    Raises:
        AuthError: the listener is no cgraph endpoint, could not prove it knows
            ``secret``, closed the connection, or ran out of time.
    """
    if not 0 < len(claim) <= MAX_CLAIM:
        raise ValueError(f"a handshake claim is 1..{MAX_CLAIM} bytes, got {len(claim)}")
    challenge = _recv_exact(sock, CHALLENGE_BYTES, deadline)
    if not hmac.compare_digest(challenge[: len(MAGIC)], MAGIC):
        raise AuthError("the listener is not a cgraph endpoint (no challenge)")
    nonce_a, nonce_c = challenge[len(MAGIC) :], secrets.token_bytes(NONCE)
    mac_c = _mac(secret, b"connector", claim, nonce_a, nonce_c)
    _send_all(sock, len(claim).to_bytes(2, "little") + claim + nonce_c + mac_c, deadline)
    proof = _recv_exact(sock, MAC, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"acceptor", claim, nonce_a, nonce_c)):
        raise AuthError("the listener could not prove it knows the graph's secret")


def answer(sock: socket.socket, lookup: Callable[[bytes], bytes | None]) -> bytes:
    """Run the listener's side on a connected, blocking ``sock`` (its timeout bounds each
    read); the claim of a peer that proved itself.

    Raises:
        AuthError: it sent a bad response, an unknown claim or a wrong MAC, or closed.
    """
    acceptor = Acceptor(lookup)
    sock.sendall(acceptor.challenge)
    proof = None
    while proof is None:
        data = sock.recv(acceptor.wanted())
        if not data:
            raise AuthError("it closed the connection during the handshake")
        proof = acceptor.feed(data)
    sock.sendall(proof)
    assert acceptor.claim is not None
    return acceptor.claim


def _poll(sock: socket.socket, event: int, wait: float) -> bool:
    if wait <= 0:
        return False
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(max(1, int(wait * 1000))))


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        if not pending(sock) and not _poll(sock, select.POLLIN, deadline - time.monotonic()):
            raise AuthError(f"no answer within {HANDSHAKE_S:g} s")
        try:
            got = sock.recv(size - len(buf))
        except WOULD_BLOCK:
            continue
        except OSError as exc:
            raise AuthError(f"the connection failed ({exc})") from None
        if not got:
            raise RefusedError("the listener closed the connection (it refused the claim)")
        buf += got
    return bytes(buf)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view, send_flags(sock)) :]
            continue
        except WOULD_BLOCK:
            pass
        except OSError as exc:
            raise AuthError(f"the connection failed ({exc})") from None
        if not _poll(sock, select.POLLOUT, deadline - time.monotonic()):
            raise AuthError(f"could not send within {HANDSHAKE_S:g} s")


class RefusalLog:
    """Counts the connections one listener refused; logs the first few at WARNING and
    the rest at DEBUG, so that a flood of strangers cannot flood the log."""

    LOUD = 5

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0

    def refuse(self, peer: object, why: object) -> None:
        global _refused
        self.count += 1
        _refused += 1
        level = logging.WARNING if self.count <= self.LOUD else logging.DEBUG
        logger.log(level, "%s: refused a connection from %s: %s%s", self.where, peer, why,
                   " (further refusals are logged at DEBUG)" if self.count == self.LOUD else "")


_refused = 0


def refused_connections() -> int:
    """How many connections this process's listeners refused so far (all of them)."""
    return _refused
