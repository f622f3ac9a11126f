"""Socket channels over TLS (no Ray): certificates made by ``trustme`` for one test CA.

The handshake of the graph's secret runs inside TLS; a peer without a certificate
of the CA, or with TLS but without the secret, is refused.
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid

import numpy as np
import pytest

from cgraph.channels import ControlServer, SocketChannel, tls
from cgraph.channels.handshake import refused_connections
from cgraph.channels.opener import open_endpoint
from tests.unit.child_process import finish, run

trustme = pytest.importorskip("trustme")


def write_pem(blob, path):
    blob.write_to_path(str(path))
    return str(path)


@pytest.fixture
def certs(tmp_path, monkeypatch):
    """This process (and its forks) have a certificate of a test CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"CGRAPH_TLS_CERT": write_pem(cert.cert_chain_pems[0], tmp_path / "cert.pem"),
             "CGRAPH_TLS_KEY": write_pem(cert.private_key_pem, tmp_path / "key.pem"),
             "CGRAPH_TLS_CA": write_pem(ca.cert_pem, tmp_path / "ca.pem")}
    for name, path in paths.items():
        monkeypatch.setenv(name, path)
    tls.context.cache_clear()
    yield ca, tmp_path
    tls.context.cache_clear()


@pytest.fixture
def server(certs):
    server = ControlServer(tls=True)
    yield server
    server.close()


def _echo(in_handle, out_handle, count):
    reader, writer = open_endpoint(in_handle), open_endpoint(out_handle)
    for _ in range(count):
        writer.write(reader.read(timeout=20), timeout=20)
    reader.detach()
    writer.detach()
    return count


def test_values_round_trip_over_tls_across_a_fork(server):
    tag = f"t{uuid.uuid4().hex[:8]}"
    there = SocketChannel.create(server, tag, "there", max_inflight=2)
    back = SocketChannel.create(server, tag, "back", max_inflight=2)
    assert there.handle.tls and back.reader_handle().tls
    values = [1, "text", np.arange(3 << 20, dtype=np.float32), {"k": np.ones(5)}, None]
    proc, out = run(_echo, there.reader_handle(), back.writer_handle(), len(values))
    writer, reader = open_endpoint(there.writer_handle()), open_endpoint(back.reader_handle())
    assert isinstance(writer._ctl, ssl.SSLSocket)
    for value in values:
        writer.write(value, timeout=20)
        got = reader.read(timeout=20)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got, value)
        elif isinstance(value, dict):
            np.testing.assert_array_equal(got["k"], value["k"])
        else:
            assert got == value
    assert isinstance(writer._data, ssl.SSLSocket)
    assert finish(proc, out) == len(values)
    writer.detach()
    reader.detach()
    for ch in (there, back):
        ch.close()
        ch.unlink()


def test_thousands_of_round_trips_over_tls(server):
    """A reader's receiving thread reads the TLS connection while its user sends credits
    on it; OpenSSL does not allow both at once (unlocked, the stream broke within a few
    hundred to a few thousand round trips)."""
    tag = f"t{uuid.uuid4().hex[:8]}"
    there = SocketChannel.create(server, tag, "there", max_inflight=10)
    back = SocketChannel.create(server, tag, "back", max_inflight=10)
    count = 5000
    proc, out = run(_echo, there.reader_handle(), back.writer_handle(), count)
    writer, reader = open_endpoint(there.writer_handle()), open_endpoint(back.reader_handle())
    got = []
    for i in range(count):
        writer.write(i, timeout=20)
        got.append(reader.read(timeout=20))
    assert got == list(range(count))
    assert finish(proc, out) == count
    writer.detach()
    reader.detach()
    for ch in (there, back):
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


def tls_client(addr, ca_pem, cert=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(ca_pem)
    if cert is not None:
        cert.configure_cert(ctx)
    sock = ctx.wrap_socket(socket.create_connection(addr, timeout=5))
    return sock


def test_peers_without_a_certificate_of_the_ca_are_refused(server, certs):
    ca, tmp = certs
    ch = SocketChannel.create(server, f"t{uuid.uuid4().hex[:8]}", "x")
    reader = open_endpoint(ch.reader_handle())
    addr = listener_of(server, ch)
    before = refused_connections()
    plain = socket.create_connection(addr, timeout=5)  # no TLS at all
    plain.sendall(b"\x00" * 64)
    other = trustme.CA()  # TLS, with a certificate of another CA
    with pytest.raises((ssl.SSLError, OSError)):
        sock = tls_client(addr, str(tmp / "ca.pem"), other.issue_cert("127.0.0.1"))
        sock.recv(64)  # TLS 1.3: the server's refusal arrives after the client's finish
    plain.settimeout(10)
    try:
        assert plain.recv(64) == b""
    except ConnectionResetError:
        pass
    deadline = time.monotonic() + 10
    while refused_connections() - before < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert refused_connections() - before >= 2
    writer = open_endpoint(ch.writer_handle())
    writer.write("still mine", timeout=10)
    assert reader.read(timeout=10) == "still mine"
    writer.detach()
    reader.detach()
    ch.close()
    ch.unlink()


def test_a_certificate_without_the_graphs_secret_is_not_enough(server, certs):
    ca, tmp = certs
    ch = SocketChannel.create(server, f"t{uuid.uuid4().hex[:8]}", "x")
    reader = open_endpoint(ch.reader_handle())
    sock = tls_client(listener_of(server, ch), str(tmp / "ca.pem"), ca.issue_cert("127.0.0.1"))
    challenge = b""
    while len(challenge) < 45:
        challenge += sock.recv(45 - len(challenge))
    assert challenge.startswith(b"cgraph-auth-1")  # inside TLS, the graph's challenge
    before = refused_connections()
    claim = f"data {ch.handle.name} w".encode()
    sock.sendall(len(claim).to_bytes(2, "little") + claim + bytes(64))
    sock.settimeout(10)
    try:
        assert sock.recv(64) == b""  # no proof: the end
    except (ConnectionResetError, ssl.SSLError):
        pass
    assert refused_connections() == before + 1
    writer = open_endpoint(ch.writer_handle())
    writer.write(1, timeout=10)
    assert reader.read(timeout=10) == 1
    writer.detach()
    reader.detach()
    ch.close()
    ch.unlink()


def test_a_process_without_certificates_is_told_what_to_set(monkeypatch):
    for name in ("CGRAPH_TLS_CERT", "CGRAPH_TLS_KEY", "CGRAPH_TLS_CA", "RAY_TLS_SERVER_CERT",
                 "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    tls.context.cache_clear()
    with pytest.raises(ValueError, match="CGRAPH_TLS_CERT"):
        tls.context(server_side=True)
    tls.context.cache_clear()


@pytest.mark.parametrize(("option", "env", "want"), [
    (None, {}, False), (None, {"CGRAPH_TLS": "1"}, True), (None, {"RAY_USE_TLS": "1"}, True),
    (False, {"RAY_USE_TLS": "1"}, False), (True, {}, True)])
def test_tls_is_off_unless_asked_for(monkeypatch, option, env, want):
    for name in ("CGRAPH_TLS", "RAY_USE_TLS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tls.wanted(option) is want
