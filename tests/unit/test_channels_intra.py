"""Intra-process channel: same semantics as the shm channel, by reference, across threads."""

from __future__ import annotations

import pickle
import threading
import time
import uuid

import pytest

from cgraph.channels import IntraChannel, IntraHandle
from cgraph.channels.opener import open_endpoint
from cgraph.errors import ChannelClosedError, ChannelTimeoutError


def test_values_pass_by_reference_in_order():
    ch = IntraChannel()
    writer, reader = ch.writer(), ch.reader(0)
    value = {"big": list(range(10))}
    writer.write(value)
    assert reader.read() is value
    reader.release()


def test_every_reader_sees_every_value():
    ch = IntraChannel(num_readers=3, max_inflight=2)
    writer, readers = ch.writer(), [ch.reader(i) for i in range(3)]
    got = [[] for _ in readers]

    def consume(i):
        for _ in range(50):
            got[i].append(readers[i].read(timeout=5))
            readers[i].release()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for i in range(50):
        writer.write(i, timeout=5)
    for t in threads:
        t.join(5)
    assert got == [list(range(50))] * 3


def test_writer_runs_ahead_max_inflight_then_needs_a_release():
    ch = IntraChannel(num_readers=2, max_inflight=2)
    writer, r0, r1 = ch.writer(), ch.reader(0), ch.reader(1)
    writer.write("a", timeout=0)
    writer.write("b", timeout=0)
    with pytest.raises(ChannelTimeoutError):
        writer.write("c", timeout=0.05)
    assert r0.read() == "a" and r1.read() == "a"
    r0.release()
    with pytest.raises(ChannelTimeoutError):
        writer.write("c", timeout=0.05)  # reader 1 still holds "a"
    r1.release()
    writer.write("c", timeout=0)
    assert [r0.read(), r0.read(), r1.read(), r1.read()] == ["b", "c", "b", "c"]


def test_timeout_then_success():
    ch = IntraChannel()
    reader = ch.reader(0)
    with pytest.raises(ChannelTimeoutError):
        reader.read(timeout=0.05)
    ch.writer().write(1)
    assert reader.read(timeout=0) == 1


@pytest.mark.parametrize("role", ["reader", "writer"])
def test_close_wakes_a_blocked_thread(role):
    ch = IntraChannel(max_inflight=1)
    outcome = []

    def block():
        try:
            if role == "reader":
                ch.reader(0).read()
            else:
                ch.writer().write(1)
                ch.writer().write(2)
        except ChannelClosedError:
            outcome.append(time.monotonic())

    thread = threading.Thread(target=block)
    thread.start()
    time.sleep(0.1)
    closed_at = time.monotonic()
    ch.close()
    thread.join(2)
    assert outcome and outcome[0] - closed_at < 1.0
    with pytest.raises(ChannelClosedError):
        ch.writer().write(3)


def test_handles_pickle_and_meet_in_the_process_registry():
    key = f"g/{uuid.uuid4().hex}"
    w = open_endpoint(pickle.loads(pickle.dumps(IntraHandle(key, max_inflight=2))))
    r = open_endpoint(pickle.loads(pickle.dumps(IntraHandle(key, max_inflight=2, reader=0))))
    w.write([1, 2])
    assert r.read() == [1, 2]
    assert w.channel is r.channel
    with pytest.raises(ValueError, match="different layout"):
        open_endpoint(IntraHandle(key, max_inflight=3))
    w.channel.unlink()
    assert open_endpoint(IntraHandle(key, max_inflight=2)).channel is not w.channel
    IntraChannel.shared(key, 1, 2).unlink()


def test_released_values_are_not_kept_alive():
    ch = IntraChannel()
    writer, reader = ch.writer(), ch.reader(0)
    writer.write(object())
    reader.read()
    reader.release()
    assert ch._ring == [None]


def test_the_opener_refuses_what_is_no_handle_and_names_it():
    with pytest.raises(TypeError, match="not a channel handle: dict"):
        open_endpoint({"name": "x"})
