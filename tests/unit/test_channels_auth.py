"""The handshake every cgraph listener runs, and socket channels under attack (no Ray).

A stranger here is a plain socket in this process: it never has the channel's
secret. The fuzz tests feed thousands of random and truncated byte streams to
the handshake and to a reader's frame parser; none may crash, hang or allocate
past the bound.
"""

from __future__ import annotations

import resource
import socket
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.channels import ControlServer, SocketChannel
from cgraph.channels.handshake import (
    CHALLENGE_BYTES,
    MAC,
    MAGIC,
    MAX_CLAIM,
    NONCE,
    RESPONSE_MAX,
    Acceptor,
    AuthError,
    RefusedError,
    new_secret,
    prove,
    refused_connections,
)
from cgraph.channels.opener import open_endpoint
from cgraph.channels.socket_reader import FRAME
from cgraph.errors import ChannelClosedError, ChannelLostError

pytestmark = pytest.mark.slow  # left out of `make test-fast`

SECRET = new_secret()
CLAIM = b"data cgraph_1_t_n1 w"


def lookup(claim):
    return SECRET if claim == CLAIM else None


def run_pair(connector_secret=SECRET, claim=CLAIM, acceptor_lookup=lookup):
    """Both sides over a socketpair: (connector's error or None, acceptor's claim or error)."""
    left, right = socket.socketpair()
    acceptor, outcome = Acceptor(acceptor_lookup), {}

    def accept():
        right.sendall(acceptor.challenge)
        try:
            while True:
                data = right.recv(acceptor.wanted())
                if not data:
                    raise AuthError("closed")
                proof = acceptor.feed(data)
                if proof is not None:
                    right.sendall(proof)
                    outcome["acceptor"] = acceptor.claim
                    return
        except AuthError as exc:
            outcome["acceptor"] = exc
            right.close()

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        prove(left, connector_secret, claim, time.monotonic() + 5)
        outcome["connector"] = None
    except AuthError as exc:
        outcome["connector"] = exc
    thread.join(5)
    left.close()
    right.close()
    return outcome["connector"], outcome["acceptor"]


def test_both_sides_prove_themselves_with_the_secret():
    assert run_pair() == (None, CLAIM)


def test_a_wrong_secret_fails_on_both_sides():
    connector, acceptor = run_pair(connector_secret=new_secret())
    assert isinstance(acceptor, AuthError) and "wrong proof" in str(acceptor)
    assert isinstance(connector, RefusedError)  # it never got a proof


def test_an_acceptor_with_another_secret_cannot_prove_itself():
    connector, acceptor = run_pair(acceptor_lookup=lambda claim: new_secret())
    assert isinstance(acceptor, AuthError)  # it also cannot check the connector


def test_a_claim_the_acceptor_does_not_know_is_refused():
    connector, acceptor = run_pair(claim=b"data cgraph_1_t_other w")
    assert isinstance(acceptor, AuthError) and "cannot check" in str(acceptor)
    assert isinstance(connector, RefusedError)


def recorded_response():
    """A real connector's response to one challenge, as a stranger on the wire saw it."""
    first = Acceptor(lookup)
    left, right = socket.socketpair()
    right.sendall(first.challenge)
    thread = threading.Thread(target=lambda: _swallow_proof(left))
    thread.start()
    response = b""
    while first.wanted():
        chunk = right.recv(first.wanted())
        response += chunk
        first.feed(chunk)
    right.sendall(b"\0" * MAC)  # a wrong proof: the connector gives up
    thread.join(5)
    left.close()
    right.close()
    return first, response


def _swallow_proof(sock):
    try:
        prove(sock, SECRET, CLAIM, time.monotonic() + 5)
    except AuthError:
        pass


def test_a_recorded_response_does_not_open_another_connection():
    first, response = recorded_response()
    assert first.claim == CLAIM  # it was a good response to its own challenge
    replayed = Acceptor(lookup)  # a new connection: a new nonce
    with pytest.raises(AuthError, match="wrong proof"):
        replayed.feed(response[:2])
        replayed.feed(response[2:])


def test_the_acceptors_proof_cannot_be_reflected_as_the_connectors():
    """The two MACs carry different labels: a stranger who relays one side's proof to
    the other side's challenge gets nowhere."""
    acceptor = Acceptor(lookup)
    nonce_a = acceptor.challenge[len(MAGIC):]
    from cgraph.channels.handshake import _mac

    nonce_c = bytes(NONCE)
    reflected = _mac(SECRET, b"acceptor", CLAIM, nonce_a, nonce_c)
    assert acceptor.feed(len(CLAIM).to_bytes(2, "little")) is None
    with pytest.raises(AuthError, match="wrong proof"):
        acceptor.feed(CLAIM + nonce_c + reflected)


@pytest.mark.parametrize("length", [0, MAX_CLAIM + 1, 0xFFFF])
def test_a_claim_of_impossible_length_is_refused_before_it_is_read(length):
    acceptor = Acceptor(lookup)
    with pytest.raises(AuthError, match="impossible length"):
        acceptor.feed(length.to_bytes(2, "little"))


def test_bytes_past_the_response_are_refused():
    acceptor = Acceptor(lookup)
    with pytest.raises(AuthError, match="more than"):
        acceptor.feed(bytes(3))  # it asked for 2


def test_a_listener_that_is_no_cgraph_endpoint_is_refused():
    left, right = socket.socketpair()
    right.sendall(b"SSH-2.0-OpenSSH_9.2" + bytes(40))
    with pytest.raises(AuthError, match="not a cgraph endpoint"):
        prove(left, SECRET, CLAIM, time.monotonic() + 5)
    left.close()
    right.close()


def test_a_silent_listener_times_out():
    left, right = socket.socketpair()
    start = time.monotonic()
    with pytest.raises(AuthError, match="no answer"):
        prove(left, SECRET, CLAIM, time.monotonic() + 0.2)
    assert time.monotonic() - start < 2
    left.close()
    right.close()


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=80), max_size=12), st.booleans())
def test_fuzzed_responses_never_pass_crash_or_grow_past_the_bound(chunks, well_formed_length):
    acceptor = Acceptor(lookup)
    if well_formed_length and chunks:  # a plausible length prefix, so the body is parsed
        chunks[0] = len(CLAIM).to_bytes(2, "little") + chunks[0]
    fed = 0
    for chunk in chunks:
        while chunk:
            want = acceptor.wanted()
            piece, chunk = chunk[: max(want, 1)], chunk[max(want, 1):]
            try:
                assert acceptor.feed(piece) is None  # random bytes never prove anything
            except AuthError:
                return
            fed += len(piece)
            assert fed <= RESPONSE_MAX and acceptor.claim is None
    assert acceptor.claim is None


# --------------------------------------------------------------------------- socket channels
@pytest.fixture
def server():
    server = ControlServer()
    yield server
    server.close()


@pytest.fixture
def channel(server):
    ch = SocketChannel.create(server, f"a{uuid.uuid4().hex[:8]}", "x", max_inflight=2,
                              max_value_bytes=1 << 20)
    yield ch
    ch.close()
    ch.unlink()


def listener_of(server, ch, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = server._channels.get(ch.handle.name)
        if entry is not None and entry.addr:
            host, port = entry.addr.split()
            return host, int(port)
        time.sleep(0.01)
    raise AssertionError("the reader never said where it listens")


def closed_by_peer(sock, timeout=10.0):
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def authenticated_writer(addr, ch):
    """A raw data connection that proves itself: what only the real writer can do."""
    sock = socket.create_connection(addr, timeout=5)
    prove(sock, ch.handle.secret, f"data {ch.handle.name} w".encode(), time.monotonic() + 5)
    return sock


def test_strangers_at_the_readers_door_steal_nothing(server, channel):
    reader = open_endpoint(channel.reader_handle())
    addr = listener_of(server, channel)
    before = refused_connections()
    silent = socket.create_connection(addr)  # first in, never speaks
    garbage = socket.create_connection(addr)
    garbage.sendall(b"\x00" * 64 + FRAME.pack(1 << 30))
    wrong = socket.create_connection(addr)
    with pytest.raises(RefusedError):
        prove(wrong, new_secret(), f"data {channel.handle.name} w".encode(), time.monotonic() + 5)
    writer = open_endpoint(channel.writer_handle())
    writer.write("from the writer", timeout=10)
    assert reader.read(timeout=10) == "from the writer"
    assert closed_by_peer(garbage) and closed_by_peer(silent) and closed_by_peer(wrong)
    assert refused_connections() - before >= 3
    with pytest.raises(OSError):  # the door is shut once the writer is in
        socket.create_connection(addr, timeout=2)
    writer.detach()
    reader.detach()


@pytest.mark.parametrize("who", ["writer", "reader"])
def test_a_forged_control_line_closes_nothing(server, channel, who):
    reader = open_endpoint(channel.reader_handle())
    addr = listener_of(server, channel)
    for attack in (f"HELLO {channel.handle.name} o\nCLOSE\n",
                   f"HELLO {channel.handle.name} r 127.0.0.1 1\n"):
        stranger = socket.create_connection(server.address, timeout=5)
        assert stranger.recv(CHALLENGE_BYTES).startswith(MAGIC)
        stranger.sendall(attack.encode())
        assert closed_by_peer(stranger)
        stranger.close()
    assert not channel.closed and listener_of(server, channel) == addr
    writer = open_endpoint(channel.writer_handle())
    writer.write(7, timeout=10)
    assert reader.read(timeout=10) == 7
    writer.detach()
    reader.detach()


def _maxrss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_an_authenticated_frame_over_the_bound_is_refused_before_allocation(server, channel):
    reader = open_endpoint(channel.reader_handle())
    sock = authenticated_writer(listener_of(server, channel), channel)
    peak = _maxrss_bytes()
    sock.sendall(FRAME.pack(1 << 30))  # 1 GiB, over max_value_bytes=1 MiB
    with pytest.raises(ChannelLostError, match="max_value_bytes"):
        reader.read(timeout=10)
    assert _maxrss_bytes() - peak < 256 << 20
    sock.close()
    reader.detach()


def test_a_value_stalled_half_way_is_reported_as_a_lost_writer(server, channel, monkeypatch):
    import cgraph.channels.socket_reader as socket_reader

    monkeypatch.setattr(socket_reader, "LOST_PEER_S", 0.5)
    reader = open_endpoint(channel.reader_handle())
    sock = authenticated_writer(listener_of(server, channel), channel)
    sock.sendall(FRAME.pack(1000) + bytes(10))
    with pytest.raises(ChannelLostError, match="no byte of a value"):
        reader.read(timeout=10)
    sock.close()
    reader.detach()


def test_a_reader_returning_more_credits_than_values_breaks_the_stream(server, channel):
    writer = open_endpoint(channel.writer_handle())
    listener = socket.create_server(("127.0.0.1", 0))
    with server._lock:  # the server says the fake reader listens there
        for conn in server._channels[channel.handle.name].conns:
            conn.sock.send(b"ADDR 127.0.0.1 %d\n" % listener.getsockname()[1])

    def fake_reader():  # proves itself (it has the secret), then floods credits
        sock, _ = listener.accept()
        acceptor = Acceptor(lambda claim: channel.handle.secret)
        sock.sendall(acceptor.challenge)
        while acceptor.claim is None:
            proof = acceptor.feed(sock.recv(acceptor.wanted()))
        sock.sendall(proof + b"\x01" * 50)
        time.sleep(2)
        sock.close()

    thread = threading.Thread(target=fake_reader)
    thread.start()
    writer.write(1, timeout=10)
    writer.write(2, timeout=10)
    with pytest.raises(ChannelClosedError, match="credits"):
        writer.write(3, timeout=10)
    thread.join(5)
    listener.close()
    writer.detach()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=64), max_size=6), st.integers(0, 2 << 20))
def test_fuzzed_frames_from_an_authenticated_peer_end_cleanly(server, chunks, size):
    """Truncated and random frames, some with plausible sizes: each ends in values or a
    clean error, in bounded time and memory; never a crash or a hang."""
    ch = SocketChannel.create(server, f"f{uuid.uuid4().hex[:8]}", "x", max_value_bytes=1 << 20)
    reader = open_endpoint(ch.reader_handle())
    sock = authenticated_writer(listener_of(server, ch), ch)
    peak = _maxrss_bytes()
    sock.sendall(FRAME.pack(size) + b"".join(chunks))
    sock.close()
    try:
        for _ in range(3):
            reader.read(timeout=10)
    except ChannelClosedError:
        pass  # the stream ended: truncated, over the bound, or simply over
    except Exception as exc:  # noqa: BLE001 - a whole frame of garbage: unpickling fails
        assert not isinstance(exc, (MemoryError, SystemError)), exc
    assert _maxrss_bytes() - peak < 64 << 20
    reader.detach()
    ch.close()
    ch.unlink()
