"""The "cpu" backend's links across nodes: shared memory inside a "node", TCP between.

Four ranks live in threads of this process, laid out as two nodes of two: each
node's pair shares a shared-memory mesh made here, and every pair on two nodes
gets an authenticated loopback connection (``socket_links.connect``, addresses
passed through a dict). ``FramedTransport`` routes each peer; the algorithms run
over it unchanged. Attacks aim only at the listeners these tests open.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from cgraph.channels import handshake
from cgraph.channels.segments import unlink_channel
from cgraph.comm import algorithms
from cgraph.comm.algorithms import shared
from cgraph.comm.cpu import links as socket_links
from cgraph.comm.cpu import pairing as socket_pairing
from cgraph.comm.cpu.arena import ShmArena
from cgraph.comm.cpu.framed import FramedTransport
from cgraph.comm.cpu.layout import _global_ends
from cgraph.comm.cpu.mesh import create_links
from cgraph.comm.cpu.pairing import Pairing
from cgraph.comm.types import ReduceOp
from cgraph.errors import (
    ChannelClosedError,
    ChannelTimeoutError,
    CollectiveGroupError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)

pytestmark = pytest.mark.slow  # left out of `make test-fast`

NODES = ("A", "A", "B", "B")


def hybrid(work: Callable[[FramedTransport], Any], nodes: tuple[str, ...] = NODES,
           timeout: float = 20.0, use_tls: bool = False) -> list[Any]:
    """Run ``work(transport)`` on every rank of ``nodes`` at once; results (or errors) by rank.

    Each node's ranks share a workspace (``ShmArena``), as a settled cpu group's do."""
    n = len(nodes)
    made, local, bases = [], {}, []
    for node in sorted(set(nodes)):
        mine = [r for r in range(n) if nodes[r] == node]
        channels, ends = create_links(f"t{uuid.uuid4().hex[:6]}", node, len(mine))
        made += channels
        bases.append(f"cgraph_{os.getpid()}_t{uuid.uuid4().hex[:6]}")
        local.update({r: (ends[i], mine, bases[-1]) for i, r in enumerate(mine)})

    def one(rank: int) -> Any:
        ends, mine, base = local[rank]
        remote = connect(rank, [r for r in range(n) if nodes[r] != nodes[rank]], timeout,
                         use_tls=use_tls) if len(set(nodes)) > 1 else None
        arena = ShmArena(base, mine.index(rank), len(mine))
        t = FramedTransport(_global_ends(ends, mine, rank, n), "g", nodes, timeout, remote, arena)
        try:
            with t.calling(("g", "test")):
                return work(t)
        except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
            t.close()
            return exc
        finally:
            t.detach()

    _BOOK.clear()
    try:
        with ThreadPoolExecutor(n) as pool:
            return [f.result(timeout=120) for f in [pool.submit(one, r) for r in range(n)]]
    finally:
        for channel in made:
            channel.unlink()
        for base in bases:
            unlink_channel(base)


SECRET = b"s" * 32


def connect(rank: int, peers: list[int], timeout: float, secret: bytes = SECRET,
            addresses: dict[int, str] | None = None, use_tls: bool = False) -> socket_links.SocketLinks:
    book = _BOOK if addresses is None else addresses

    def publish(address: str) -> None:
        with _POSTED:
            book[rank] = address
            _POSTED.notify_all()

    def address_of(peer: int) -> str:
        with _POSTED:
            _POSTED.wait_for(lambda: peer in book, timeout)
            return book[peer]

    return socket_links.connect(rank, peers, secret, "cpu-links g.x", "127.0.0.1", publish,
                                address_of, timeout, use_tls)


_BOOK: dict[int, str] = {}
_POSTED = threading.Condition()


def data(rank: int, count: int, dtype: Any = np.float64) -> np.ndarray:
    return (np.random.default_rng(rank + 31 * count).standard_normal(count) * 100).astype(dtype)


def test_every_algorithm_over_shared_memory_and_sockets_equals_numpy() -> None:
    counts = (0, 1, 7, 5000, 300_000)  # 300k float64: 2.3 MiB, several slices of the sliced ones

    def work(t: FramedTransport) -> dict[tuple[str, int], np.ndarray]:
        got = {}
        for algorithm in sorted(algorithms.ALGORITHMS):
            for count in counts:
                buf = data(t.rank, count)
                algorithms.allreduce(t, buf, ReduceOp.SUM, algorithm)
                got[(algorithm, count)] = buf
        return got

    results = hybrid(work)
    for count in counts:
        want = np.stack([data(r, count) for r in range(4)]).sum(0)
        for algorithm in algorithms.ALGORITHMS:
            for rank, got in enumerate(results):
                assert not isinstance(got, Exception), got
                np.testing.assert_allclose(got[(algorithm, count)], want, rtol=1e-12, atol=1e-9,
                                           err_msg=f"{algorithm} {count} rank {rank}")


def _shared_calls(t: FramedTransport, counts: tuple[int, ...]) -> list[np.ndarray]:
    outs = []
    for count in counts:
        buf = data(t.rank, count)
        shared.allreduce_shared(t, buf, ReduceOp.SUM)
        outs.append(buf)
    return outs


def _assert_sums_alike(got: list[Any], counts: tuple[int, ...]) -> None:
    """Every rank got numpy's sum of the 4 ranks' data, bit for bit alike."""
    assert not any(isinstance(g, Exception) for g in got), got
    for i, count in enumerate(counts):
        want = np.stack([data(r, count) for r in range(4)]).sum(0)
        np.testing.assert_allclose(got[0][i], want, rtol=1e-12, atol=1e-9)
        assert all(np.array_equal(g[i], got[0][i]) for g in got), count


@pytest.mark.parametrize("nodes", [NODES, ("A",) * 4])
def test_shared_runs_as_itself_meeting_on_the_workspace_semaphores(nodes: tuple[str, ...]) -> None:
    """Calls of changing sizes (the workspace grows, halves alternate) on two nodes of two
    and one node of four: every rank gets numpy's sum, bit for bit alike, and the
    barriers were the semaphores' (no barrier message crossed a link)."""
    counts = (1000, 7, 3, 300_000, 1, 0, 50, 129, 2000) * 2
    meetings: list[int] = []

    def work(t: FramedTransport) -> list[np.ndarray]:
        assert shared.shares(t)
        real = t.node_barrier

        def counted() -> None:
            meetings.append(t.rank)
            real()

        t.node_barrier = counted  # type: ignore[method-assign]
        return _shared_calls(t, counts)

    _assert_sums_alike(hybrid(work, nodes), counts)
    assert len(meetings) >= 4 * 2 * sum(1 for c in counts if c)  # two a call on every rank


@pytest.mark.parametrize("nodes", [NODES, ("A",) * 4])
@pytest.mark.parametrize("readable", [True, False])
def test_large_calls_read_the_peers_tensors_where_the_kernel_lets_them(
        monkeypatch: pytest.MonkeyPatch, nodes: tuple[str, ...], readable: bool) -> None:
    """Above ``CMA_MIN_BYTES`` (lowered here) the ranks read each other's tensors
    (``peer_memory``); where one rank of a node may not, the whole node keeps the
    workspace. Either way every rank gets numpy's sum, bit for bit alike."""
    from cgraph.comm.cpu import peer_memory

    monkeypatch.setattr(shared, "CMA_MIN_BYTES", 4096)
    monkeypatch.setattr(shared, "CMA_BLOCK_BYTES", 1000)  # several blocks, a ragged last one
    real_probe = peer_memory.probe
    monkeypatch.setattr(peer_memory, "probe", lambda pid, address, expected:
                        readable and real_probe(pid, address, expected))
    counts = (100, 9000, 3, 40_000, 0, 9000) * 2
    reads: list[int] = []

    def work(t: FramedTransport) -> list[np.ndarray]:
        real = t.peer_read

        def counted(peer: int, pid: int, address: int, out: np.ndarray) -> None:
            reads.append(t.rank)
            real(peer, pid, address, out)

        t.peer_read = counted  # type: ignore[method-assign]
        return _shared_calls(t, counts)

    _assert_sums_alike(hybrid(work, nodes), counts)
    assert bool(reads) == readable and (not readable or set(reads) == {0, 1, 2, 3})


def test_a_peer_read_that_fails_mid_call_is_the_groups_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from cgraph.comm.cpu import peer_memory

    monkeypatch.setattr(shared, "CMA_MIN_BYTES", 4096)
    real_read = peer_memory.read

    def work(t: FramedTransport) -> Any:
        shared.allreduce_shared(t, data(t.rank, 1000), ReduceOp.SUM)  # agrees peers are readable
        if t.rank == 1:
            monkeypatch.setattr(peer_memory, "read", _gone)
        try:
            shared.allreduce_shared(t, data(t.rank, 1000), ReduceOp.SUM)
        finally:
            monkeypatch.setattr(peer_memory, "read", real_read)
        return "done"

    got = hybrid(work, ("A",) * 4, timeout=3.0)  # the ranks are threads: every read fails
    assert all(isinstance(g, CollectiveGroupError) for g in got), got
    reads = [str(g) for g in got if "could not read the buffer of rank" in str(g)]
    assert reads and all("No such process" in r and "link" not in r for r in reads), got


def _gone(*args: Any) -> None:
    raise ProcessLookupError(3, "No such process")


def test_a_rank_that_never_meets_times_out_naming_its_node() -> None:
    def work(t: FramedTransport) -> Any:
        shared.allreduce_shared(t, data(t.rank, 10), ReduceOp.SUM)  # maps the workspace
        if t.rank == 0:
            t.node_barrier()
        elif t.rank == 1:
            time.sleep(3.0)  # alive but absent past the timeout
        return "done"

    got = hybrid(work, timeout=1.5)
    assert isinstance(got[0], CollectiveTimeoutError), got
    assert "to meet the other ranks of this node" in str(got[0]) and "A 0,1; B 2,3" in str(got[0])


def test_closing_wakes_a_rank_waiting_at_the_node_barrier() -> None:
    def work(t: FramedTransport) -> Any:
        shared.allreduce_shared(t, data(t.rank, 10), ReduceOp.SUM)
        if t.rank == 0:
            time.sleep(0.3)
            t.close()
        elif t.rank == 1:
            start = time.monotonic()
            try:
                t.node_barrier()
            except CollectiveGroupError as exc:
                return exc, time.monotonic() - start
        return "done"

    got = hybrid(work, timeout=60.0)
    exc, waited = got[1]
    assert "could not meet the other ranks of this node" in str(exc) and waited < 10, got[1]


def test_max_and_integers_cross_nodes_exactly() -> None:
    every = np.stack([data(r, 999, np.int64) for r in range(4)])

    def work(t: FramedTransport) -> np.ndarray:
        buf = data(t.rank, 999, np.int64)
        algorithms.allreduce(t, buf, ReduceOp.MAX, "reduction_server")
        return buf

    assert all(np.array_equal(got, every.max(0)) for got in hybrid(work))


@pytest.mark.parametrize("nbytes", [1, 64 << 10, 8 << 20])
def test_a_message_inside_its_header_and_one_after_it(nbytes: int) -> None:
    """Rank 0 (node A) and rank 2 (node B) swap messages of either kind, both ways."""

    def work(t: FramedTransport) -> np.ndarray | None:
        if t.rank not in (0, 2):
            return None
        mine = np.full(nbytes, t.rank + 1, dtype=np.uint8)
        got = np.zeros(nbytes, dtype=np.uint8)
        t.sendrecv(mine, 2 - t.rank, got, 2 - t.rank)
        return got

    got = hybrid(work)
    assert got[0].tolist() == [3] * nbytes and got[2].tolist() == [1] * nbytes


def test_a_message_of_another_size_is_a_mismatch_not_a_crash() -> None:
    """The header names the length: the receiver refuses before reading a payload byte."""

    def work(t: FramedTransport) -> Any:
        if t.rank == 0:
            t.send(np.zeros(100, dtype=np.uint8), 2)
        elif t.rank == 2:
            t.recv(np.zeros(50, dtype=np.uint8), 0)
        return "done"

    got = hybrid(work)
    assert isinstance(got[2], CollectiveMismatchError), got
    assert "rank 0 sent a message of another call, or of another size" in str(got[2])


def test_a_message_of_another_call_is_a_mismatch() -> None:
    def work(t: FramedTransport) -> Any:
        buf = np.zeros(4)
        if t.rank == 0:
            with t.calling(("g", "allreduce sum ring")):
                t.send(buf, 2)
        elif t.rank == 2:
            with t.calling(("g", "allreduce max ring")):
                t.recv(buf, 0)
        return "done"

    got = hybrid(work)
    assert isinstance(got[2], CollectiveMismatchError) and "allreduce max ring" in str(got[2])


def test_a_peer_on_another_node_that_never_sends_times_out_naming_the_layout() -> None:
    def work(t: FramedTransport) -> Any:
        if t.rank == 1:
            t.recv(np.zeros(8), 3)
        elif t.rank == 3:
            time.sleep(4.0)  # alive (its connections open) but silent past the timeout
        return "done"

    got = hybrid(work, timeout=2.0)
    assert isinstance(got[1], CollectiveTimeoutError), got
    text = str(got[1])
    assert "receive from rank 3" in text and "ranks by node: A 0,1; B 2,3" in text


def test_closing_wakes_a_peer_on_another_node() -> None:
    """A rank that gives up shuts its sockets down; a peer blocked on it wakes at once."""

    def work(t: FramedTransport) -> Any:
        if t.rank == 0:
            t.close()
        elif t.rank == 2:
            t.recv(np.zeros(8), 0)
        return "done"

    got = hybrid(work, timeout=60.0)
    assert isinstance(got[2], CollectiveGroupError) and "could not receive from rank 0" in str(got[2])


def _pair_with_a_stranger(stranger: Callable[[str], None], use_tls: bool = False) -> tuple[Any, Any]:
    """Rank 0 dials rank 1; a stranger reaches rank 1's listener first."""
    book: dict[int, str] = {}
    seen = threading.Event()

    def publish_then_attack(address: str) -> None:
        book[1] = address
        stranger(address)
        seen.set()

    results: dict[int, Any] = {}

    def rank1() -> None:
        try:
            results[1] = socket_links.connect(1, [0], SECRET, "cpu-links g.x", "127.0.0.1",
                                              publish_then_attack, lambda _r: "", 10.0, use_tls)
        except Exception as exc:  # noqa: BLE001 - inspected below
            results[1] = exc

    thread = threading.Thread(target=rank1)
    thread.start()
    assert seen.wait(10)
    results[0] = socket_links.connect(0, [1], SECRET, "cpu-links g.x", "127.0.0.1",
                                      lambda _a: None, lambda _r: book[1], 10.0, use_tls)
    thread.join(20)
    return results[0], results[1]


def _garbage(address: str) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"\x05\x00hello" + b"\x00" * 80)
        time.sleep(0.2)


def _wrong_secret(address: str) -> None:
    with pytest.raises(Exception):  # noqa: B017,PT011 - refused either way
        socket_pairing._dial(address, b"w" * 32, b"cpu-links g.x 0", 3.0, False)


def _the_real_pair_talks(first: Any, second: Any) -> None:
    """The stranger was refused: both real ranks got their links, and a message crosses."""
    assert isinstance(second, socket_links.SocketLinks), second
    try:
        buf = np.arange(5.0)
        first.send(b"f" * 8, buf, 1)
        got = np.zeros(5)
        assert second.recv(b"f" * 8, got, 0) and got.tolist() == buf.tolist()
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("stranger", [_garbage, _wrong_secret], ids=["garbage", "wrong-secret"])
def test_a_stranger_is_refused_and_the_real_peer_still_connects(stranger: Callable[[str], None]) -> None:
    _the_real_pair_talks(*_pair_with_a_stranger(stranger))


# --------------------------------------------------------------------------- TLS
@pytest.fixture
def certs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process has a certificate of a test CA (``channels.tls`` reads the environment)."""
    trustme = pytest.importorskip("trustme")
    from cgraph.channels import tls

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    for name, blob in (("CGRAPH_TLS_CERT", cert.cert_chain_pems[0]),
                       ("CGRAPH_TLS_KEY", cert.private_key_pem), ("CGRAPH_TLS_CA", ca.cert_pem)):
        blob.write_to_path(str(tmp_path / name))
        monkeypatch.setenv(name, str(tmp_path / name))
    tls.context.cache_clear()
    yield ca
    tls.context.cache_clear()


def test_every_algorithm_over_tls_equals_numpy(certs: Any) -> None:
    """The links between nodes run TLS: whole messages through the pair's thread, exchanges
    in a non-blocking poll loop (both directions on one socket where the rail has 2 ranks)."""
    counts = (0, 7, 300_000)

    def work(t: FramedTransport) -> dict[tuple[str, int], Any]:
        kinds = {type(s).__name__ for s in t._remote._socks.values()}  # type: ignore[union-attr]
        got: dict[tuple[str, int], Any] = {("kinds", 0): kinds}
        for algorithm in ("ring", "reduction_server", "shared", "butterfly"):
            for count in counts:
                buf = data(t.rank, count)
                algorithms.allreduce(t, buf, ReduceOp.SUM, algorithm)
                got[(algorithm, count)] = buf
        return got

    results = hybrid(work, use_tls=True)
    assert all(not isinstance(r, Exception) for r in results), results
    assert all(r[("kinds", 0)] == {"SSLSocket"} for r in results)
    for count in counts:
        want = np.stack([data(r, count) for r in range(4)]).sum(0)
        for key in (k for k in results[0] if k[1] == count and k[0] != "kinds"):
            for got in results:
                np.testing.assert_allclose(got[key], want, rtol=1e-12, atol=1e-9, err_msg=str(key))


def _plain_with_the_secret(address: str) -> None:
    with pytest.raises(Exception):  # noqa: B017,PT011 - the TLS listener refuses plain TCP
        socket_pairing._dial(address, SECRET, b"cpu-links g.x 0", 3.0, False)


def _tls_of_another_ca(address: str) -> None:
    import trustme

    from cgraph.channels import tls

    other = trustme.CA()
    cert = other.issue_cert("127.0.0.1")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cert.configure_cert(ctx)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=3)
    # the listener wants a certificate of its CA: the TLS handshake fails, or (TLS 1.3, where
    # the client finishes first) the listener closes before sending its challenge
    with pytest.raises((ssl.SSLError, OSError, handshake.AuthError)):
        with ctx.wrap_socket(raw) as sock:
            sock.settimeout(3)
            handshake.prove(sock, SECRET, b"cpu-links g.x 0", time.monotonic() + 3)
    assert tls.context(True) is not None  # the listener's own context is still this CA's


@pytest.mark.parametrize("stranger", [_plain_with_the_secret, _tls_of_another_ca],
                         ids=["plain-tcp-with-the-secret", "tls-of-another-ca"])
def test_a_tls_listener_refuses_plain_peers_and_foreign_certificates(
        certs: Any, stranger: Callable[[str], None]) -> None:
    _the_real_pair_talks(*_pair_with_a_stranger(stranger, use_tls=True))


def test_the_listener_is_closed_once_the_pairs_are_made() -> None:
    book: dict[int, str] = {}
    out: dict[int, Any] = {}

    def one(rank: int) -> None:
        out[rank] = socket_links.connect(rank, [1 - rank], SECRET, "cpu-links g.x", "127.0.0.1",
                                         lambda a: book.__setitem__(rank, a),
                                         lambda r: _wait_for(book, r), 10.0)

    threads = [threading.Thread(target=one, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    try:
        host, port = book[1].rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2).close()
    finally:
        for links in out.values():
            links.close()


def test_listen_connects_a_pair_when_a_call_first_needs_it() -> None:
    """Rank 0 (node A) and rank 2 (node B) talk while rank 1 (node B) never calls: ``listen``
    dials no one up front; rank 2 listens until its one lower peer is in, then closes."""
    book: dict[int, str] = {}

    def make(rank: int, peers: list[int]) -> socket_links.SocketLinks:
        return socket_links.listen(rank, peers, SECRET, "cpu-links g.x", "127.0.0.1",
                                   lambda a: book.__setitem__(rank, a), lambda r: _wait_for(book, r), 10.0)

    first, third = make(0, [1, 2]), make(2, [0])
    try:
        assert sorted(book) == [2], "only a rank with lower peers elsewhere listens"
        sending = threading.Thread(target=first.send, args=(b"f" * 8, np.arange(5.0), 2))
        sending.start()
        got = np.zeros(5)
        assert third.recv(b"f" * 8, got, 0) and got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        sending.join(10)
        host, port = book[2].rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2).close()
    finally:
        first.close()
        third.close()


def test_a_lower_peer_that_never_connects_times_out_and_close_wakes_a_waiter() -> None:
    links = socket_links.listen(1, [0], SECRET, "cpu-links g.x", "127.0.0.1", lambda a: None,
                                lambda r: "", 0.3)
    with pytest.raises(ChannelTimeoutError, match="rank 0 did not connect within 0.3 s"):
        links.recv(b"f" * 8, np.zeros(1), 0)
    closer = threading.Timer(0.2, links.close)
    closer.start()
    with pytest.raises(ChannelClosedError):
        links.recv(b"f" * 8, np.zeros(1), 0)
    closer.join()


def _wait_for(book: dict[int, str], rank: int) -> str:
    deadline = time.monotonic() + 10
    while rank not in book and time.monotonic() < deadline:
        time.sleep(0.01)
    return book[rank]


def test_both_ends_of_a_pair_keep_alive_as_socket_channels_do() -> None:
    """A peer whose host vanishes without a FIN is noticed by keepalive and the user timeout,
    on the dialed end and on the admitted end alike (``handshake.tune``)."""
    from cgraph.channels.handshake import LOST_PEER_S

    book: dict[int, str] = {}
    pairings: dict[int, Pairing] = {}
    got: dict[int, socket.socket] = {}

    def one(rank: int) -> None:
        pairings[rank] = Pairing(rank, [1 - rank], SECRET, "cpu-links g.x", "127.0.0.1",
                                 lambda a: book.__setitem__(rank, a), lambda r: _wait_for(book, r), 10.0, False)
        got[rank] = pairings[rank].get(1 - rank)

    threads = [threading.Thread(target=one, args=(r,)) for r in (1, 0)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    try:
        assert sorted(got) == [0, 1]
        for sock in got.values():
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == LOST_PEER_S * 1000
    finally:
        for sock in got.values():
            sock.close()
        for pairing in pairings.values():
            pairing.close()
