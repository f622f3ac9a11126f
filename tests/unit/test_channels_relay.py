"""A relay: one socket into a node, that node's shared memory for every reader there (no Ray).

The writer runs in a forked child (another "node"); the gateway reader and a
second reader run here, reading the landing channel's slots.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest

from cgraph.channels import ControlServer, ShmChannel, SocketChannel
from cgraph.channels.opener import open_endpoint
from cgraph.channels.relay import RelayHandle
from cgraph.errors import ChannelClosedError, ChannelLostError, ChannelTimeoutError
from tests.unit.child_process import FORK, finish, run


@pytest.fixture
def relay():
    """(socket channel, landing shm channel of 2 readers), max_inflight 2."""
    server = ControlServer()
    tag = f"r{uuid.uuid4().hex[:8]}"
    sock = SocketChannel.create(server, tag, "x", max_inflight=2)
    land = ShmChannel.create(tag, "x.relay", num_readers=2, max_inflight=2, buffer_size=4096)
    yield sock, land
    for ch in (sock, land):
        ch.close()
        ch.unlink()
    server.close()


def gateway(sock, land):
    handle = RelayHandle(sock.reader_handle(), land.writer_handle(), land.reader_handle(0))
    return open_endpoint(handle)


def _write_all(handle, values, exit_after=False):
    writer = open_endpoint(handle)
    for value in values:
        writer.write(value, timeout=20)
    if exit_after:
        os._exit(0)
    writer.detach()
    return len(values)


def in_shm(arr, name):
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            if f"/dev/shm/{name}" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= addr < hi:
                    return True
    return False


def test_every_reader_gets_every_value_as_a_view_of_the_nodes_memory(relay):
    sock, land = relay
    first, second = gateway(sock, land), open_endpoint(land.reader_handle(1))
    values = [np.arange(n, dtype=np.float32) for n in (10, 1 << 20, 3)]  # 4 MiB grows the slot
    proc, out = run(_write_all, sock.writer_handle(), values)
    for want in values:
        for reader in (first, second):
            got = reader.read(timeout=20)
            np.testing.assert_array_equal(got, want)
            assert in_shm(got, land.handle.name) and not got.flags.writeable
            reader.release()
    assert finish(proc, out) == 3
    first.detach()
    second.detach()


def test_the_writer_waits_before_a_value_until_the_slowest_reader_releases(relay):
    sock, land = relay
    first, second = gateway(sock, land), open_endpoint(land.reader_handle(1))
    writer = open_endpoint(sock.writer_handle())
    writer.write(0, timeout=10)
    writer.write(1, timeout=10)
    assert first.read(timeout=10) == 0 and second.read(timeout=10) == 0
    first.release()  # the second reader still holds value 0's slot
    with pytest.raises(ChannelTimeoutError):
        writer.write(2, timeout=0.5)  # no credit: nothing of it was sent
    second.release()
    writer.write(2, timeout=10)
    assert [first.read(timeout=10) for _ in range(2)] == [1, 2]
    assert [second.read(timeout=10) for _ in range(2)] == [1, 2]
    writer.detach()
    first.detach()
    second.detach()


def test_a_lost_writer_is_named_by_the_gateway_and_closes_the_landing(relay):
    sock, land = relay
    first, second = gateway(sock, land), open_endpoint(land.reader_handle(1))
    proc = FORK.Process(target=_write_all, args=(sock.writer_handle(), [5], True), daemon=True)
    proc.start()
    proc.join(10)
    assert first.read(timeout=10) == 5 and second.read(timeout=10) == 5
    second.release()  # the relay closes the landing once every value it landed is released
    with pytest.raises(ChannelLostError, match="writer's connection ended"):
        first.read(timeout=10)
    with pytest.raises(ChannelClosedError):
        second.read(timeout=10)
    first.detach()
    second.detach()


def test_closing_the_landing_ends_a_relay_waiting_for_a_slot(relay):
    sock, land = relay
    first = gateway(sock, land)
    second = open_endpoint(land.reader_handle(1))
    writer = open_endpoint(sock.writer_handle())
    for i in range(2):
        writer.write(i, timeout=10)
    time.sleep(0.2)  # the relay now waits for a free slot (nobody read)
    start = time.monotonic()
    land.close()
    with pytest.raises(ChannelClosedError):
        first.read(timeout=10)
    assert time.monotonic() - start < 2
    first.detach()
    second.detach()
    writer.detach()


def test_a_relay_handle_pickles():
    import pickle

    server = ControlServer()
    sock = SocketChannel.create(server, "p", "x")
    land = ShmChannel.create("p", "x.relay", num_readers=2)
    handle = RelayHandle(sock.reader_handle(), land.writer_handle(), replace(land.handle, reader=0))
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert repr(sock.handle.secret) not in repr(handle)  # a handle's repr never shows the secret
    land.unlink()
    sock.unlink()
    server.close()
