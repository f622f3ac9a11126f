"""A stranger on the network: a plain Python process with no Ray, no cgraph and no secret.

    python stranger.py ATTACK HOST PORT [ARG]

It attacks one of a compiled graph's listening sockets on this machine (only the
address it is given) and prints one JSON line saying what it saw. Attacks:

    garbage         random bytes after the challenge
    huge            a frame header announcing 1 GiB, then more bytes
    pickle PATH     a well-formed frame whose pickle would create PATH
    forged NAME=PATH  a handshake response with a guessed MAC for channel NAME, then
                    the pickle frame that would create PATH
    hold SECONDS    connect first and stay silent
    flood COUNT     COUNT connections at once, silent
    hello NAME      (control server) the old reader hello for NAME, pointing at a
                    listener of its own: does anyone connect to it?
    close NAME      (control server) the old one-shot close of NAME, then a forged claim
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import sys
import time

CHALLENGE = 13 + 32  # "cgraph-auth-1" + nonce


class Creates:
    """Unpickling this creates a file: what a successful attack would leave behind."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def frame(path: str) -> bytes:
    body = pickle.dumps(Creates(path), protocol=5)
    slot = struct.pack("<QQ", len(body), 0) + body
    return struct.pack("<Q", len(slot)) + slot


def closed_by_peer(sock: socket.socket, timeout: float = 15.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except OSError:
        return False


def connect(host: str, port: int) -> tuple[socket.socket, bytes]:
    """Connect and read the listener's first bytes; b"" where it shut the door first (the
    writer got in before this stranger was accepted: a reset, or an end of stream)."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.settimeout(15)  # a busy actor may take a while to accept under load
    try:
        challenge = sock.recv(CHALLENGE)
    except OSError:
        challenge = b""
    return sock, challenge


def send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def arrived() -> None:
    """Say on stdout that this stranger is in at the door (or found it shut): the attack
    script waits for it before it lets the writers connect."""
    print(json.dumps({"in": True}), flush=True)


def attack(kind: str, host: str, port: int, arg: str) -> dict:
    if kind == "flood":
        socks, refused = [], 0
        for _ in range(int(arg)):
            try:
                socks.append(socket.create_connection((host, port), timeout=10))
            except ConnectionRefusedError:  # the door shut behind the writer (a slow machine)
                refused += 1
        arrived()
        closed = sum(closed_by_peer(s, 15.0) for s in socks)
        return {"closed": closed + refused, "of": int(arg)}
    try:
        sock, challenge = connect(host, port)
    except ConnectionRefusedError:  # the door shut behind the writer before this one came
        arrived()
        return {"challenged": False, "door_shut": True, "closed": True, "held_s": 0.0}
    arrived()
    seen = {"challenged": challenge.startswith(b"cgraph-auth"), "door_shut": challenge == b""}
    if kind == "garbage":
        seen["sent"] = send(sock, os.urandom(4096))
    elif kind == "huge":
        seen["sent"] = send(sock, struct.pack("<Q", 1 << 30) + os.urandom(1 << 16))
    elif kind == "pickle":
        seen["sent"] = send(sock, frame(arg))
    elif kind == "forged":
        name, path = arg.split("=", 1)
        claim = f"data {name} w".encode()
        response = len(claim).to_bytes(2, "little") + claim + os.urandom(64)
        seen["sent"] = send(sock, response + frame(path))
    elif kind == "hold":
        start = time.monotonic()
        seen["closed"] = closed_by_peer(sock, float(arg) + 10)
        seen["held_s"] = round(time.monotonic() - start, 2)
        return seen
    elif kind == "hello":
        return {**seen, **forged_hello(sock, arg)}
    elif kind == "close":
        seen["sent"] = send(sock, f"HELLO {arg} o\nCLOSE\n".encode())
        seen["closed"] = closed_by_peer(sock)
        again, _ = connect(host, port)
        claim = f"control {arg} o".encode()
        send(again, len(claim).to_bytes(2, "little") + claim + os.urandom(64) + b"CLOSE\n")
        seen["forged_closed"] = closed_by_peer(again)
        return seen
    seen["closed"] = closed_by_peer(sock)
    return seen


def forged_hello(sock: socket.socket, name: str) -> dict:
    """Claim to be NAME's reader, listening here; see whether the writer comes."""
    trap = socket.create_server((sock.getsockname()[0], 0))
    trap.settimeout(8)
    port = trap.getsockname()[1]
    sent = send(sock, f"HELLO {name} r {sock.getsockname()[0]} {port}\n".encode())
    closed = closed_by_peer(sock)
    try:
        victim, _ = trap.accept()
        victim.settimeout(3)
        got = victim.recv(1 << 16)
    except OSError:
        got = None
    return {"sent": sent, "closed": closed, "writer_came": got is not None,
            "bytes_from_writer": 0 if got is None else len(got)}


def main() -> None:
    kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    arg = sys.argv[4] if len(sys.argv) > 4 else ""
    print(json.dumps({"attack": kind, **attack(kind, host, port, arg)}), flush=True)


if __name__ == "__main__":
    main()
