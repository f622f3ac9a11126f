"""Optional TLS on cgraph's sockets: the standard ``ssl`` module, certificates the user gives.

Off by default. ``compile(..., tls=True)`` turns it on for one graph, and so does
``CGRAPH_TLS=1`` or Ray's own ``RAY_USE_TLS=1`` in the driver's environment
(``compile(..., tls=False)`` overrides both). Then every socket of the graph,
control and data, runs TLS 1.2+ first and the graph's HMAC handshake inside it::

    TCP connect ─▶ TLS handshake (both sides present a certificate the CA signed)
                ─▶ cgraph handshake (the graph's secret, bound to channel and role)
                ─▶ frames, credits, control lines: encrypted and integrity-checked

Each process reads the certificates from its own environment: ``CGRAPH_TLS_CERT``,
``CGRAPH_TLS_KEY`` and ``CGRAPH_TLS_CA``, else Ray's ``RAY_TLS_SERVER_CERT``,
``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT`` (which a cluster started with
Ray's TLS has on every node). Host names are not checked: peers are addressed
by IP, and the HMAC handshake inside TLS already binds the peer to the graph.

Sockets stay non-blocking, so every loop that waits on them waits the same way;
``WOULD_BLOCK`` is what a plain or a TLS socket raises when it must wait, and
``pending`` says how many decrypted bytes are ready without ``poll`` seeing them.
"""

from __future__ import annotations

import functools
import os
import select
import socket
import ssl
import time

WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

_OURS = ("CGRAPH_TLS_CERT", "CGRAPH_TLS_KEY", "CGRAPH_TLS_CA")
_RAYS = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


def wanted(tls: bool | None) -> bool:
    """Whether a graph compiled with ``tls`` (None: ask the environment) uses TLS."""
    if tls is not None:
        return tls
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes")
               for name in ("CGRAPH_TLS", "RAY_USE_TLS"))


@functools.cache
def context(server_side: bool) -> ssl.SSLContext:
    """This process's TLS context, from its environment (see the module docstring).

    Raises:
        ValueError: TLS is on but this process has no certificate, key or CA.
    """
    paths = [os.environ.get(name, "") for name in _OURS]
    if not all(paths):
        paths = [os.environ.get(name, "") for name in _RAYS]
    if not all(paths):
        raise ValueError(
            f"this compiled graph uses TLS, but process {os.getpid()} has no certificate: set "
            f"{', '.join(_OURS)} (or Ray's {', '.join(_RAYS)}) on every node, e.g. in the "
            "actors' runtime_env env_vars, or compile with tls=False")
    cert, key, ca = paths
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.check_hostname = False  # peers are IPs; the HMAC handshake binds them to the graph
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: a client without a CA-signed cert is refused
    return ctx


def wrap(sock: socket.socket, server_side: bool) -> ssl.SSLSocket:
    """``sock`` (connected, non-blocking) wrapped; ``step`` runs its handshake."""
    return context(server_side).wrap_socket(sock, server_side=server_side,
                                            do_handshake_on_connect=False)


def step(sock: ssl.SSLSocket) -> int:
    """Advance the TLS handshake: 0 once done, else the ``poll`` event it waits for.

    Raises:
        ssl.SSLError, OSError: the peer failed the handshake (no or a bad certificate).
    """
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return select.POLLIN
    except ssl.SSLWantWriteError:
        return select.POLLOUT
    return 0


def handshake(sock: ssl.SSLSocket, deadline: float) -> None:
    """Run the TLS handshake to its end, waiting in ``poll`` until ``deadline``.

    Raises:
        TimeoutError: not done by ``deadline``. ssl.SSLError, OSError: it failed.
    """
    while True:
        event = step(sock)
        if not event:
            return
        poller = select.poll()
        poller.register(sock, event)
        wait = deadline - time.monotonic()
        if wait <= 0 or not poller.poll(max(1, int(wait * 1000))):
            raise TimeoutError("the TLS handshake did not finish in time")


def pending(sock: socket.socket) -> int:
    """Decrypted bytes ready to read without waiting (0 for a plain socket)."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


def send_flags(sock: socket.socket) -> int:
    """``MSG_NOSIGNAL`` for a plain socket; a TLS socket takes no flags."""
    return 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_NOSIGNAL


def half_close(sock: socket.socket) -> None:
    """End this side's stream (FIN), keeping the TLS state for reading what still comes
    (``SSLSocket.shutdown`` would drop it)."""
    socket.socket.shutdown(sock, socket.SHUT_WR)
