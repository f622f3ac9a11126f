"""Socket channel across plain processes (no Ray): fork children and threads on loopback.

Each test has its own ``ControlServer`` unless it is about the shared one. Every
wait has a timeout, so a bug fails a test instead of hanging it.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import threading
import time
import uuid

import numpy as np
import pytest

from cgraph.channels import ControlServer, SocketChannel, SocketHandle, SocketReader, SocketWriter
from cgraph.channels.opener import open_endpoint
from cgraph.channels.serialization import dumps, pack_into, payload_chunks
from cgraph.channels.socket_reader import FRAME
from cgraph.errors import ChannelClosedError, ChannelTimeoutError
from tests.unit.child_process import FORK, finish, run

torch = pytest.importorskip("torch")

BIG = 8 << 20  # float64 elements: 64 MiB


@pytest.fixture
def server():
    server = ControlServer()
    yield server
    server.close()


@pytest.fixture
def tag():
    return f"t{uuid.uuid4().hex[:10]}"








def assert_same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, BaseException):
        assert got.args == want.args
    else:
        assert got == want


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def dropped(sock):
    """Whether the other end closed ``sock`` (an end of stream, or a reset when it left
    bytes unread)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def detach_all(*endpoints):
    for endpoint in endpoints:
        endpoint.detach()


# --------------------------------------------------------------------------- children
def _echo(in_handle, out_handle, count):
    reader, writer = open_endpoint(in_handle), open_endpoint(out_handle)
    for _ in range(count):
        writer.write(reader.read(timeout=20), timeout=20)
    detach_all(reader, writer)
    return count


def _read_n(handle, count, delay=0.0):
    time.sleep(delay)
    reader = open_endpoint(handle)
    values = [reader.read(timeout=20, copy=True) for _ in range(count)]  # kept past the next read
    reader.detach()
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in values]


def _write_n(handle, values, delay=0.0):
    time.sleep(delay)
    writer = open_endpoint(handle)
    for value in values:
        writer.write(value, timeout=20)
    writer.detach()
    return len(values)


def _write_counting(handle, count, progress):
    writer = open_endpoint(handle)
    for i in range(count):
        writer.write(i, timeout=20)
        progress.value = i + 1
    writer.detach()
    return count


def _block_then_report(handle, mode):
    start = time.monotonic()
    endpoint = None
    try:
        endpoint = open_endpoint(handle)  # a slow start may find the channel closed already
        if mode == "reader":
            endpoint.read()
        elif mode == "writer":
            for i in range(3):  # max_inflight=1 and nobody reads: the second write blocks
                endpoint.write(i)
        else:  # mid-value: the reader stops after the first value, the kernel buffers fill
            endpoint.write(0)
            endpoint.write(np.ones(BIG))
        outcome = "returned"
    except ChannelClosedError:
        outcome = "closed"
    if endpoint is not None:
        endpoint.detach()
    return outcome, time.monotonic() - start


def _read_one_then_stop(handle):
    open_endpoint(handle).read(timeout=20)
    os.kill(os.getpid(), signal.SIGSTOP)


def stopping_reader(handle):
    """A reader in a child process that reads one value, then stops (SIGSTOP): it takes
    in nothing more, so its writer blocks half-way through the next large value. Kill
    it when done."""
    proc = FORK.Process(target=_read_one_then_stop, args=(handle,), daemon=True)
    proc.start()
    return proc


def _read_one_and_die(handle):
    reader = open_endpoint(handle)
    reader.read(timeout=20)
    os._exit(0)


def _write_and_die(handle, values, mid_value):
    writer = open_endpoint(handle)
    for value in values:
        writer.write(value, timeout=20)
    if mid_value:  # die with part of a value sent: its size, then a tenth of it
        writer._data.sendall(FRAME.pack(1000) + bytes(100))
    os._exit(0)


def _attach_and_die(handle):
    open_endpoint(handle)
    os._exit(0)


def _shared_server_in_child(tag):
    server = ControlServer.shared()
    with SocketChannel.create(server, tag, "child") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write("in the child")
        got = reader.read(timeout=10)
        detach_all(writer, reader)
    return server.address, got


# --------------------------------------------------------------------------- tests
CHUNK_VALUES = [
    0, "text", b"", {"k": [1, 2]}, np.zeros(0), np.arange(3, dtype="u1"),
    [np.arange(5.0), np.ones((3, 3), dtype="f4"), np.arange(7, dtype="i2")],
    {"t": torch.arange(10, dtype=torch.bfloat16), "u": torch.randn(3, 4).T},
]  # fmt: skip


@pytest.mark.parametrize("value", CHUNK_VALUES, ids=range(len(CHUNK_VALUES)))
def test_payload_chunks_are_what_pack_into_writes(value):
    payload = dumps(value)
    slot = bytearray(payload.nbytes)
    pack_into(payload, memoryview(slot))
    chunks = payload_chunks(payload)
    assert b"".join(bytes(c) for c in chunks) == slot
    assert sum(memoryview(c).nbytes for c in chunks) == payload.nbytes
    assert all(any(c is buf for c in chunks) for buf in payload.buffers)  # views, not copies


def round_trip_values():
    return [
        b"", 0, 7, "text", None, {"a": [1, (2, "x")]}, KeyError("missing"),
        np.zeros(0), np.array(7.0), np.arange(20.0)[::3], np.arange(12, dtype="u2").reshape(3, 4).T,
        torch.empty(0), torch.tensor(2), torch.randn(3, 4).T, torch.arange(10, dtype=torch.bfloat16),
        {"x": np.ones((3, 3)), "t": torch.arange(6.0).reshape(2, 3)[:, ::2], "n": [np.arange(4)]},
        np.arange(BIG, dtype=np.float64),
    ]  # fmt: skip


@pytest.mark.timeout(60)
def test_values_round_trip_exactly_across_a_fork(server, tag):
    values = round_trip_values()
    there = SocketChannel.create(server, tag, "there", max_inflight=2)
    back = SocketChannel.create(server, tag, "back", max_inflight=2)
    proc, out = run(_echo, there.reader_handle(), back.writer_handle(), len(values))
    writer, reader = open_endpoint(there.writer_handle()), open_endpoint(back.reader_handle())
    for value in values:
        writer.write(value, timeout=20)
        assert_same(reader.read(timeout=20), value)
    assert finish(proc, out) == len(values)
    detach_all(writer, reader)


def test_values_read_with_copy_are_private_and_writable(server, tag):
    with SocketChannel.create(server, tag, "private") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        a, t = np.arange(4.0), torch.arange(4.0)
        writer.write({"a": a, "t": t})
        got = reader.read(timeout=5, copy=True)
        reader.release()
        writer.write(np.zeros(4))
        assert reader.read(timeout=5).tolist() == [0.0] * 4  # the next value: got's memory is its own
        got["a"][0] = 9.0
        got["t"].add_(1)
        assert a[0] == 0.0 and t[0] == 0.0
        assert got["a"].flags.writeable and got["t"].tolist() == [1.0, 2.0, 3.0, 4.0]
        assert got["a"].tolist() == [9.0, 1.0, 2.0, 3.0]
        big = np.full(1 << 20, 1, np.uint8)  # large: its receive buffer is handed over
        writer.write(big)
        kept = reader.read(timeout=5, copy=True)
        for fill in (2, 3):  # the buffers after it never touch it
            writer.write(np.full(1 << 20, fill, np.uint8))
            assert int(reader.read(timeout=5).max()) == fill
        assert kept.flags.writeable and int(kept.min()) == int(kept.max()) == 1
        detach_all(writer, reader)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_values_land_in_receive_buffers_reused_from_value_to_value(server, tag):
    """A read value is a read-only view of the reader's receive buffer, valid until
    release(); the next value lands in the same memory (no fresh mapping per value)."""
    mib = 1 << 20
    with SocketChannel.create(server, tag, "reuse", max_inflight=2) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write(np.full(2 * mib, 1, np.uint8))
        first = reader.read(timeout=5)
        assert not first.flags.writeable and int(first.sum()) == 2 * mib
        where = _address(first)
        for fill in (2, 3, 4):
            reader.release()  # the buffer is free before the next value arrives
            writer.write(np.full(2 * mib, fill, np.uint8))
            got = reader.read(timeout=5)
            assert int(got.min()) == int(got.max()) == fill
            assert _address(got) == where
        reader.release()
        writer.write(np.full(5 * mib, 5, np.uint8))  # larger than the buffer: a larger one
        big = reader.read(timeout=5)
        assert big.nbytes == 5 * mib and int(big.min()) == int(big.max()) == 5
        reader.release()
        writer.write(np.full(5 * mib, 6, np.uint8))
        assert _address(reader.read(timeout=5)) == _address(big)
        detach_all(writer, reader)


def test_values_waiting_unread_each_keep_their_own_buffer(server, tag):
    mib = 1 << 20
    with SocketChannel.create(server, tag, "unread", max_inflight=3) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        for round_ in range(3):
            for i in range(3):  # three values wait unread while the last is still held
                writer.write(np.full(mib, 10 * round_ + i, np.uint8))
            for i in range(3):  # none was overwritten while it waited, or while one was held
                got = reader.read(timeout=5)
                assert int(got.min()) == int(got.max()) == 10 * round_ + i
        reader.release()
        detach_all(writer, reader)


def test_a_thousand_values_arrive_in_order(server, tag):
    values = [np.full(3, i) if i % 10 == 0 else i for i in range(1000)]
    with SocketChannel.create(server, tag, "order", max_inflight=4) as ch:
        proc, out = run(_write_n, ch.writer_handle(), values)
        got = _read_n(ch.reader_handle(), len(values))
        assert got == [v.tolist() if isinstance(v, np.ndarray) else v for v in values]
        assert finish(proc, out) == 1000


def test_writer_runs_max_inflight_ahead_then_blocks_until_a_read(server, tag):
    with SocketChannel.create(server, tag, "pipe", max_inflight=3) as ch:
        progress = FORK.Value("i", 0)
        proc, out = run(_write_counting, ch.writer_handle(), 6, progress)
        reader = open_endpoint(ch.reader_handle())
        assert wait_for(lambda: progress.value >= 3)
        time.sleep(0.3)
        assert progress.value == 3  # three values unread: the fourth write waits for a credit
        assert reader.read(timeout=5) == 0
        assert wait_for(lambda: progress.value >= 4)
        time.sleep(0.3)
        assert progress.value == 4
        assert [reader.read(timeout=10) for _ in range(5)] == [1, 2, 3, 4, 5]
        assert finish(proc, out) == 6
        reader.detach()


def test_read_timeout_then_the_value_still_arrives(server, tag):
    with SocketChannel.create(server, tag, "rt") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        start = time.monotonic()
        with pytest.raises(ChannelTimeoutError, match="not written yet"):
            reader.read(timeout=0.05)  # no connection yet
        assert time.monotonic() - start < 1.0
        writer.write("a")
        assert reader.read(timeout=5) == "a"
        for timeout in (0.05, 0):  # connected, nothing sent
            with pytest.raises(ChannelTimeoutError, match="no value has arrived"):
                reader.read(timeout=timeout)
        writer.write("b")
        assert reader.read(timeout=5) == "b"
        detach_all(writer, reader)


def test_write_timeout_when_out_of_credits_leaves_the_channel_consistent(server, tag):
    with SocketChannel.create(server, tag, "wt", max_inflight=2) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write("a")
        writer.write("b")
        start = time.monotonic()
        with pytest.raises(ChannelTimeoutError, match="last 2 values"):
            writer.write("c", timeout=0.05)
        assert time.monotonic() - start < 1.0
        assert reader.read(timeout=5) == "a"
        writer.write("c", timeout=5)
        with pytest.raises(ChannelTimeoutError):
            writer.write("d", timeout=0)
        assert [reader.read(timeout=5) for _ in range(2)] == ["b", "c"]
        writer.write("d", timeout=5)
        assert reader.read(timeout=5) == "d"
        detach_all(writer, reader)


def test_write_times_out_while_the_reader_has_not_attached(server, tag):
    with SocketChannel.create(server, tag, "late") as ch:
        writer = open_endpoint(ch.writer_handle())
        with pytest.raises(ChannelTimeoutError, match="reader has not attached"):
            writer.write("a", timeout=0.1)
        reader = open_endpoint(ch.reader_handle())
        writer.write("a", timeout=5)
        assert reader.read(timeout=5) == "a"
        detach_all(writer, reader)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["reader", "writer", "writer-mid-value"])
def test_owner_close_wakes_a_blocked_endpoint_in_another_process(server, tag, mode):
    with SocketChannel.create(server, tag, mode, max_inflight=1) as ch:
        handle = ch.reader_handle() if mode == "reader" else ch.writer_handle()
        idle_reader = None if mode != "writer" else open_endpoint(ch.reader_handle())  # never reads
        stopped = stopping_reader(ch.reader_handle()) if mode == "writer-mid-value" else None
        proc, out = run(_block_then_report, handle, mode)
        time.sleep(1.0)  # let it block
        closed_at = time.monotonic()
        ch.close()
        outcome, _ = finish(proc, out)
        assert outcome == "closed"
        # the close wakes it, not the keepalive's LOST_PEER_S (30 s); generous for a loaded host
        assert time.monotonic() - closed_at < 10.0
        if idle_reader is not None:
            # the writer's one value may be read before the close's notice reaches this
            # reader's thread (a fresh-clone run saw it under load); the next read raises
            with pytest.raises(ChannelClosedError):
                for _ in range(2):
                    idle_reader.read(timeout=10)
            idle_reader.detach()
        if stopped is not None:
            stopped.kill()
            stopped.join(5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("closer", ["reader", "writer"])
def test_closing_one_endpoint_wakes_the_other(server, tag, closer):
    with SocketChannel.create(server, tag, closer, max_inflight=1) as ch:
        mine = open_endpoint(ch.reader_handle() if closer == "reader" else ch.writer_handle())
        theirs = ch.writer_handle() if closer == "reader" else ch.reader_handle()
        proc, out = run(_block_then_report, theirs, "writer" if closer == "reader" else "reader")
        time.sleep(0.5)
        closed_at = time.monotonic()
        mine.close()
        outcome, _ = finish(proc, out)
        assert outcome == "closed" and time.monotonic() - closed_at < 10.0  # the close, not LOST_PEER_S
        assert ch.closed
        with pytest.raises(ChannelClosedError):
            mine.read() if closer == "reader" else mine.write(1)
        mine.detach()


@pytest.mark.timeout(30)
def test_a_one_shot_close_of_one_linked_channel_wakes_the_readers_of_every_other(server, tag):
    """A communicator group's controls across nodes: a member closes its own, and a member
    blocked on another (another process: another node) wakes."""
    from cgraph.channels.socket_endpoint import close_remotely

    channels = [SocketChannel.create(server, tag, f"abort{rank}", max_inflight=1) for rank in range(3)]
    alone = SocketChannel.create(server, tag, "unlinked", max_inflight=1)
    SocketChannel.link_closing(channels)
    proc, out = run(_block_then_report, channels[2].reader_handle(), "reader")
    time.sleep(0.5)
    close_remotely(channels[0].reader_handle())  # as spread() does, from a member's process
    outcome, _ = finish(proc, out)
    assert outcome == "closed"
    assert all(ch.closed for ch in channels) and not alone.closed
    for ch in (*channels, alone):
        ch.unlink()


def test_linking_a_closed_channel_closes_the_rest_and_only_one_server_links(server, tag):
    first, second = (SocketChannel.create(server, tag, f"abort{rank}", max_inflight=1) for rank in range(2))
    first.close()
    SocketChannel.link_closing([first, second])
    assert second.closed
    other = ControlServer()
    try:
        theirs = SocketChannel.create(other, tag, "abort9", max_inflight=1)
        with pytest.raises(ValueError, match="share their control server"):
            SocketChannel.link_closing([first, theirs])
    finally:
        other.close()
    with pytest.raises(KeyError):
        server.link_closing(("never-registered",))


def test_attaching_after_close_or_unlink_fails_on_first_use(server, tag):
    ch = SocketChannel.create(server, tag, "closed")
    ch.close()
    gone = SocketChannel.create(server, tag, "gone")
    gone.close()
    gone.unlink()
    never = SocketHandle("cgraph_1_never_made", server.address, 1)
    for handle in (ch.writer_handle(), gone.writer_handle(), never):
        writer = open_endpoint(handle)
        with pytest.raises(ChannelClosedError, match="closed"):
            writer.write(1, timeout=5)
        writer.detach()
    for handle in (ch.reader_handle(), gone.reader_handle()):
        reader = open_endpoint(handle)
        with pytest.raises(ChannelClosedError, match="closed"):
            reader.read(timeout=5)
        reader.detach()
    ch.unlink()
    server.close()
    with pytest.raises(ChannelClosedError, match="cannot reach its control server"):
        open_endpoint(ch.writer_handle())


@pytest.mark.timeout(30)
def test_reader_dying_wakes_a_writer_waiting_for_credit(server, tag):
    with SocketChannel.create(server, tag, "rdie", max_inflight=1) as ch:
        proc = FORK.Process(target=_read_one_and_die, args=(ch.reader_handle(),), daemon=True)
        proc.start()
        writer = open_endpoint(ch.writer_handle())
        with pytest.raises(ChannelClosedError, match="reader's connection ended"):
            for i in range(10):
                writer.write(i, timeout=10)  # a timeout here would mean a hang
        proc.join(10)
        writer.detach()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mid_value", [False, True], ids=["between-values", "mid-value"])
def test_writer_dying_ends_the_stream_for_the_reader(server, tag, mid_value):
    values = [1, 2]
    with SocketChannel.create(server, tag, "wdie", max_inflight=4) as ch:
        args = (ch.writer_handle(), values, mid_value)
        proc = FORK.Process(target=_write_and_die, args=args, daemon=True)
        reader = open_endpoint(ch.reader_handle())
        proc.start()
        proc.join(10)  # dead, after two values (and part of a third, mid_value)
        assert [reader.read(timeout=10) for _ in values] == values
        with pytest.raises(ChannelClosedError, match="writer's connection ended"):
            reader.read(timeout=10)
        proc.join(10)
        reader.detach()


@pytest.mark.parametrize("first", ["reader", "writer"])
def test_either_endpoint_may_attach_first_without_waiting(server, tag, first):
    with SocketChannel.create(server, tag, first, max_inflight=2) as ch:
        start = time.monotonic()
        if first == "reader":
            mine = open_endpoint(ch.reader_handle())
            assert time.monotonic() - start < 1.0
            proc, out = run(_write_n, ch.writer_handle(), ["a", "b", "c"], 0.3)
            assert [mine.read(timeout=10) for _ in range(3)] == ["a", "b", "c"]
        else:
            mine = open_endpoint(ch.writer_handle())
            assert time.monotonic() - start < 1.0
            proc, out = run(_read_n, ch.reader_handle(), 3, 0.3)
            for value in ("a", "b", "c"):
                mine.write(value, timeout=10)
        finish(proc, out)
        mine.detach()


def test_attach_and_detach_leak_no_file_descriptor():
    server = ControlServer()
    before = fd_count()
    for i in range(20):
        ch = SocketChannel.create(server, "leak", str(i))
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write(i)
        assert reader.read(timeout=5) == i
        detach_all(writer, reader)
        unused = open_endpoint(ch.reader_handle())  # attached, never used
        unused.detach()
        ch.close()
        ch.unlink()
    late = open_endpoint(ch.writer_handle())  # attaches to an unlinked channel
    late.detach()
    assert wait_for(lambda: fd_count() <= before, timeout=3), (before, fd_count())
    server.close()


@pytest.mark.timeout(30)
def test_shared_server_survives_idle_channels_dead_endpoints_and_garbage(tag):
    server = ControlServer.shared()
    assert ControlServer.shared() is server
    keeper = SocketChannel.create(server, tag, "keeper")  # a graph's channel, live throughout
    idle = SocketChannel.create(server, tag, "idle")  # no endpoint ever attaches
    assert not idle.closed
    idle.close()
    assert idle.closed
    assert idle.unlink() == []
    with socket.create_connection(server.address, timeout=5) as stranger:
        assert stranger.recv(100).startswith(b"cgraph-auth")  # its challenge
        stranger.sendall(b"GET / HTTP/1.0\n")
        assert dropped(stranger)
    with SocketChannel.create(server, tag, "dead") as dead:
        proc = FORK.Process(target=_attach_and_die, args=(dead.writer_handle(),), daemon=True)
        proc.start()
        proc.join(10)
    with SocketChannel.create(server, tag, "alive") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write("still serving")
        assert reader.read(timeout=5) == "still serving"
        detach_all(writer, reader)
    assert server._thread.is_alive()
    keeper.unlink()


def test_a_shared_server_goes_with_its_last_channel_and_the_next_starts_anew(tag):
    server = ControlServer.shared()
    first, second = SocketChannel.create(server, tag, "one"), SocketChannel.create(server, tag, "two")
    first.unlink()
    assert server._thread.is_alive(), "a channel is still tracked"
    second.unlink()
    server._thread.join(timeout=5)
    assert not server._thread.is_alive() and server._listener.fileno() == -1, "thread and listener gone"
    with pytest.raises(ChannelClosedError):
        SocketChannel.create(server, tag, "late")  # a caller holding the old one asks again
    fresh = ControlServer.shared()
    assert fresh is not server
    with SocketChannel.create(fresh, tag, "three") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write("served")
        assert reader.read(timeout=5) == "served"
        detach_all(writer, reader)
        ch.unlink()


def test_shared_server_is_recreated_in_a_forked_child(tag):
    server = ControlServer.shared()
    proc, out = run(_shared_server_in_child, tag)
    address, got = finish(proc, out)
    assert got == "in the child"
    assert tuple(address) != server.address
    assert ControlServer.shared() is server


def test_a_forked_child_does_not_keep_this_process_sockets(server, tag):
    with SocketChannel.create(server, tag, "fork") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write(1)
        assert reader.read(timeout=5) == 1
        child = FORK.Process(target=time.sleep, args=(5,), daemon=True)
        child.start()  # inherits copies of both data sockets, closes them at once
        try:
            writer.detach()  # the stream ends though the child is still alive
            with pytest.raises(ChannelClosedError, match="writer's connection ended"):
                reader.read(timeout=2)
        finally:
            child.kill()
            child.join(5)
        reader.detach()


def test_handles_and_endpoints_pickle(server, tag):
    with SocketChannel.create(server, tag, "pickle", max_inflight=3) as ch:
        assert ch.handle.name.startswith(f"cgraph_{os.getpid()}_{tag}_pickle")
        handle = pickle.loads(pickle.dumps(ch.reader_handle()))
        assert handle == ch.reader_handle() and handle.reader and handle.max_inflight == 3
        reader = open_endpoint(handle)
        first = open_endpoint(ch.writer_handle())
        writer = pickle.loads(pickle.dumps(first))  # an endpoint pickles as its handle
        first.detach()  # never wrote: the copy is the channel's one writer
        assert isinstance(writer, SocketWriter) and isinstance(reader, SocketReader)
        writer.write("pickled")
        assert reader.read(timeout=5) == "pickled"
        detach_all(writer, reader)


def test_bad_arguments_are_refused(server, tag):
    ch = SocketChannel.create(server, tag, "args")
    with pytest.raises(IndexError):
        ch.reader_handle(1)
    with pytest.raises(FileExistsError):
        SocketChannel.create(server, tag, "args")
    with pytest.raises(ValueError, match="max_inflight"):
        SocketChannel.create(server, tag, "zero", max_inflight=0)
    ch.unlink()


def _fails_to_rebuild():
    raise RuntimeError("cannot rebuild on this side")


class _BadOnRead:
    def __reduce__(self):
        return (_fails_to_rebuild, ())


def test_errors_in_values_do_not_wedge_the_channel(server, tag):
    with SocketChannel.create(server, tag, "bad", max_inflight=1) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        with pytest.raises(TypeError):
            writer.write(threading.Lock())  # unpicklable: nothing sent, no credit spent
        writer.write(_BadOnRead(), timeout=1)
        with pytest.raises(RuntimeError, match="cannot rebuild"):
            reader.read(timeout=5)  # the credit went back anyway
        writer.write(ValueError("an error value"), timeout=1)
        assert isinstance(reader.read(timeout=5), ValueError)
        detach_all(writer, reader)


@pytest.mark.timeout(30)
def test_values_written_before_the_writer_detaches_still_arrive(server, tag):
    with SocketChannel.create(server, tag, "drain", max_inflight=4) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle())
        writer.write("a")
        writer.write("b")
        assert reader.read(timeout=5) == "a"  # its credit waits, unread, at the writer

        def finish_and_detach():  # the last value is still in flight when it detaches
            writer.write("c", timeout=5)
            writer.write(np.ones(BIG // 8), timeout=5)
            writer.detach()

        thread = threading.Thread(target=finish_and_detach, daemon=True)
        thread.start()
        time.sleep(0.3)
        assert reader.read(timeout=5) == "b" and reader.read(timeout=5) == "c"
        assert reader.read(timeout=5).sum() == BIG // 8
        thread.join(10)
        with pytest.raises(ChannelClosedError, match="writer's connection ended"):
            reader.read(timeout=5)
        reader.detach()


def test_a_write_interrupted_half_way_ends_the_stream(server, tag):
    with SocketChannel.create(server, tag, "sigint") as ch:
        reader = stopping_reader(ch.reader_handle())
        writer = open_endpoint(ch.writer_handle())
        writer.write(0, timeout=10)
        wait = writer._wait

        def interrupted(sock, event, deadline):  # ^C the moment the write blocks half-way
            if sock is writer._data and event == select.POLLOUT:
                raise KeyboardInterrupt
            return wait(sock, event, deadline)

        writer._wait = interrupted
        try:
            with pytest.raises(KeyboardInterrupt):
                writer.write(np.ones(BIG))  # its reader is stopped: the kernel's buffers fill
        finally:
            reader.kill()
            reader.join(5)
        with pytest.raises(ChannelClosedError, match="half-way"):
            writer.write(1)
        writer.detach()


def test_detached_endpoint_refuses_use_and_can_still_close(server, tag):
    with SocketChannel.create(server, tag, "detached") as ch:
        reader = open_endpoint(ch.reader_handle())
        reader.detach()
        with pytest.raises(ChannelClosedError, match="detached"):
            reader.read()
        assert not ch.closed
        reader.close()  # through a one-shot control connection
        assert wait_for(lambda: ch.closed, timeout=5)


def _double_each(inp: SocketHandle, out: SocketHandle, count: int) -> int:
    reader, writer = open_endpoint(inp), open_endpoint(out)
    for _ in range(count):
        writer.write(reader.read() * 2)  # before reading the next value
    writer.detach()
    reader.detach()
    return count


@pytest.mark.timeout(60)
def test_large_values_around_a_cycle_do_not_deadlock(server, tag):
    """Each end writes values far larger than socket buffers before it reads: the writes
    complete as the other end's receiving thread takes values in (as into shm slots)."""
    big = np.arange(2 << 20, dtype=np.float32)  # 8 MiB
    with SocketChannel.create(server, tag, "there", max_inflight=4) as there, \
            SocketChannel.create(server, tag, "back", max_inflight=4) as back:
        proc, out = run(_double_each, there.reader_handle(), back.writer_handle(), 4)
        writer, reader = open_endpoint(there.writer_handle()), open_endpoint(back.reader_handle())
        for i in range(4):
            writer.write(big + i, timeout=30)
        got = [reader.read(timeout=30, copy=True) for _ in range(4)]
        assert finish(proc, out) == 4
        for i, value in enumerate(got):
            assert np.array_equal(value, (big + i) * 2)
        writer.detach()
        reader.detach()
