"""Shared-memory channel across plain processes (no Ray).

Every test runs under its own graph tag; the ``tag`` fixture fails the test if
any ``cgraph_*_<tag>_*`` segment is left in /dev/shm afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
import time
import uuid

import numpy as np
import pytest

from cgraph.channels import ShmChannel, ShmHandle, cleanup_stale_segments, segment_name
from cgraph.channels.opener import open_endpoint
from cgraph.channels.segments import SHM_DIR
from cgraph.channels.shm_channel import POLL_S
from cgraph.errors import ChannelClosedError, ChannelTimeoutError
from tests.unit.child_process import FORK, finish, run

SPAWN = mp.get_context("spawn")


def segments(tag):
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith("cgraph_") and f"_{tag}_" in e)


@pytest.fixture
def tag():
    tag = f"t{uuid.uuid4().hex[:10]}"
    yield tag
    left = segments(tag)
    for entry in left:
        os.unlink(os.path.join(SHM_DIR, entry))
    assert not left, f"leaked segments: {left}"


def mapping_of(address):
    """The /dev/shm file whose mapping in this process contains ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi and len(parts) > 5:
                return os.path.basename(parts[5])
    return None








# --------------------------------------------------------------------------- children
def _read_all(handle, count):
    reader = open_endpoint(handle)
    sums = []
    for _ in range(count):
        value = reader.read()
        sums.append(float(np.sum(value)) if isinstance(value, np.ndarray) else value)
        reader.release()
    return sums


def _write_counting(handle, count, progress):
    writer = open_endpoint(handle)
    for i in range(count):
        writer.write(i)
        progress.value = i + 1
    return count


def _block_then_report(handle):
    endpoint = open_endpoint(handle)
    start = time.monotonic()
    try:
        for i in range(3):  # the writer blocks on its second write (max_inflight=1)
            endpoint.read() if handle.reader >= 0 else endpoint.write(i)
    except ChannelClosedError:
        return ("closed", time.monotonic() - start)
    return ("returned", time.monotonic() - start)


def _create_and_die(tag):
    """A creator that dies with its reaper (a node's whole process tree lost): what is left
    for ``cleanup_stale_segments``; with its reaper alive, the orphans would race it."""
    from cgraph.channels import reaper

    ch = ShmChannel.create(tag, "orphan")
    w = open_endpoint(ch.writer_handle())
    w.write(np.ones(1 << 16))  # also leaves a data generation behind
    own = reaper._STARTED.get(os.getpid())
    if own is not None:
        own.kill()
        own.wait()
    os._exit(0)


def _grow_in_child(handle):
    writer = open_endpoint(handle)
    for n in (10, 100_000, 1_000_000, 10):
        writer.write(np.ones(n))
    return True


# --------------------------------------------------------------------------- tests
VALUES = [
    0, "text", None, {"a": [1, 2, (3, "x")]}, [np.arange(6).reshape(2, 3), [np.ones(0)]],
    np.array(7.0), np.zeros((3, 0)), np.arange(20.0)[::3], np.arange(12, dtype="u2").reshape(3, 4).T,
    KeyError("missing"),
]  # fmt: skip


def test_round_trip_many_types_in_one_process(tag):
    with ShmChannel.create(tag, "rt", buffer_size=4096) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        for value in VALUES:
            writer.write(value)
            got = reader.read()
            assert type(got) is type(value)
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got, value)
            elif isinstance(value, BaseException):
                assert got.args == value.args
            elif not isinstance(value, list):
                assert got == value
            reader.release()


def test_torch_tensors_through_the_channel(tag):
    torch = pytest.importorskip("torch")
    values = [torch.arange(10, dtype=torch.bfloat16), torch.randn(3, 4).T, torch.tensor(2)]
    with ShmChannel.create(tag, "torch") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        for t in values:
            writer.write(t)
            got = reader.read()
            assert got.dtype == t.dtype and torch.equal(got, t)
            assert mapping_of(got.data_ptr()).startswith(ch.handle.name)
            reader.release()


def test_reader_gets_a_zero_copy_view_into_the_slot(tag):
    with ShmChannel.create(tag, "view") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        a = np.arange(1000.0)
        writer.write(a)
        got = reader.read()
        address = got.__array_interface__["data"][0]
        assert mapping_of(address) == f"{ch.handle.name}_1"  # slot 0, generation 1
        assert not got.flags.writeable and not np.shares_memory(got, a)
        reader.release()


def test_grow_once_then_reuse_and_old_views_stay_valid(tag):
    name = segment_name(tag, "grow")
    with ShmChannel.create(tag, "grow", buffer_size=4096) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        writer.write(np.full(10, 1.0))
        small = reader.read()
        reader.release()
        writer.write(np.full(100_000, 2.0))  # grows slot 0: generation 2, gen 1 unlinked
        big = reader.read()
        assert segments(tag) == sorted([name, f"{name}_2"])
        assert small.sum() == 10.0  # the old generation's pages are still mapped
        reader.release()
        for n in (5, 100_000, 50_000):  # smaller again: reuses generation 2
            writer.write(np.full(n, 3.0))
            assert reader.read().sum() == 3.0 * n
            reader.release()
        assert segments(tag) == sorted([name, f"{name}_2"])
        assert big.shape == (100_000,)


def test_one_writer_three_readers_across_processes(tag):
    count = 60
    with ShmChannel.create(tag, "fan", num_readers=3, max_inflight=2, buffer_size=4096) as ch:
        children = [run(_read_all, ch.reader_handle(i), count) for i in range(3)]
        writer = open_endpoint(ch.writer_handle())
        expected = []
        for i in range(count):
            value = np.full(i * 500, i, dtype=np.int64) if i % 2 else i  # grows as it goes
            writer.write(value, timeout=20)
            expected.append(float(np.sum(value)) if i % 2 else i)
        for proc, out in children:
            assert finish(proc, out) == expected


def test_writer_runs_ahead_max_inflight_then_blocks_until_release(tag):
    with ShmChannel.create(tag, "pipe", max_inflight=3) as ch:
        progress = FORK.Value("i", 0)
        proc, out = run(_write_counting, ch.writer_handle(), 6, progress)
        reader = open_endpoint(ch.reader_handle(0))
        deadline = time.monotonic() + 10
        while progress.value < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert progress.value == 3  # three values in flight, the fourth write blocks
        assert reader.read() == 0
        time.sleep(0.3)
        assert progress.value == 3  # read but not released: the slot is still in use
        reader.release()
        assert [reader.read(timeout=10) for _ in range(5)] == [1, 2, 3, 4, 5]
        reader.release()
        assert finish(proc, out) == 6


@pytest.mark.parametrize("role", ["reader", "writer"])
def test_close_wakes_a_blocked_peer_in_another_process(tag, role):
    with ShmChannel.create(tag, f"close-{role}", max_inflight=1) as ch:
        handle = ch.reader_handle(0) if role == "reader" else ch.writer_handle()
        proc, out = run(_block_then_report, handle)
        time.sleep(0.5)  # let it block
        closed_at = time.monotonic()
        ch.close()
        outcome, _ = finish(proc, out)
        assert outcome == "closed"
        assert time.monotonic() - closed_at < 1.0


def test_a_lost_wakeup_is_caught_by_the_periodic_recheck(tag):
    with ShmChannel.create(tag, "poll") as ch:
        proc, out = run(_block_then_report, ch.reader_handle(0))
        time.sleep(0.3)
        ch._control.words[4] = 1  # set `closed` without posting (simulates a lost post)
        outcome, _ = finish(proc, out)
        assert outcome == "closed"
        proc.join()


def test_timeouts_leave_the_channel_consistent(tag):
    with ShmChannel.create(tag, "timeout", num_readers=2, max_inflight=1) as ch:
        writer = open_endpoint(ch.writer_handle())
        r0, r1 = open_endpoint(ch.reader_handle(0)), open_endpoint(ch.reader_handle(1))
        with pytest.raises(ChannelTimeoutError):
            r0.read(timeout=0.05)
        writer.write("a")
        assert r0.read() == "a" and r1.read() == "a"
        r0.release()
        with pytest.raises(ChannelTimeoutError):  # took reader 0's token, waited on reader 1
            writer.write("b", timeout=0.05)
        r1.release()
        writer.write("b", timeout=1)  # the token taken above was given back
        with pytest.raises(ChannelTimeoutError):
            writer.write("c", timeout=0.05)  # still exactly max_inflight ahead
        assert r0.read(timeout=1) == "b" and r1.read(timeout=1) == "b"


def _fails_to_rebuild():
    raise RuntimeError("cannot rebuild on this side")


class _BadOnRead:
    def __reduce__(self):
        return (_fails_to_rebuild, ())


def test_errors_in_values_do_not_wedge_the_channel(tag):
    with ShmChannel.create(tag, "bad") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        with pytest.raises(TypeError):
            writer.write(threading.Lock())  # unpicklable: nothing written, no slot taken
        writer.write(_BadOnRead())
        with pytest.raises(RuntimeError, match="cannot rebuild"):
            reader.read()  # the slot is released anyway
        writer.write(ValueError("an error value"), timeout=1)
        assert isinstance(reader.read(timeout=1), ValueError)


def test_closed_channel_refuses_everything(tag):
    with ShmChannel.create(tag, "closed") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        writer.write(1)
        reader.close()
        assert ch.closed
        with pytest.raises(ChannelClosedError):
            writer.write(2)
        with pytest.raises(ChannelClosedError):
            reader.read()
    with pytest.raises(ChannelClosedError, match="no such segment"):
        open_endpoint(ch.reader_handle(0))  # unlinked


def test_handles_and_endpoints_pickle_into_a_fresh_interpreter(tag):
    with ShmChannel.create(tag, "spawn", max_inflight=2) as ch:
        handle = pickle.loads(pickle.dumps(ch.reader_handle(0)))
        assert isinstance(handle, ShmHandle) and handle.reader == 0
        proc, out = run(_read_all, handle, 3, ctx=SPAWN)
        writer = pickle.loads(pickle.dumps(open_endpoint(ch.writer_handle())))
        for value in (np.arange(4.0), 5, np.ones((100, 100))):
            writer.write(value, timeout=20)
        assert finish(proc, out, timeout=60) == [6.0, 5, 10000.0]


def test_unlink_removes_generations_grown_by_another_process(tag):
    ch = ShmChannel.create(tag, "gens", max_inflight=2, buffer_size=4096)
    proc, out = run(_grow_in_child, ch.writer_handle())
    assert _read_all(ch.reader_handle(0), 4) == [10.0, 100_000.0, 1_000_000.0, 10.0]
    finish(proc, out)
    assert len(segments(tag)) == 3  # control + the current generation of each slot
    ch.close()
    assert len(ch.unlink()) == 3
    assert segments(tag) == []


def test_cleanup_stale_segments_removes_only_dead_creators(tag):
    proc = FORK.Process(target=_create_and_die, args=(tag,))
    proc.start()
    proc.join(20)
    with ShmChannel.create(tag, "alive") as ch:
        assert len(segments(tag)) == 3  # the orphan's control + data, and ours
        removed = cleanup_stale_segments()
        assert sorted(r for r in removed if f"_{tag}_" in r) == sorted(
            [segment_name(tag, "orphan", proc.pid), segment_name(tag, "orphan", proc.pid) + "_1"]
        )
        assert segments(tag) == [ch.handle.name]


def test_names_are_safe_and_one_to_one():
    a, b = segment_name("g", "n3>b.comm", pid=7), segment_name("g", "n3<b.comm", pid=7)
    assert a != b and a.startswith("cgraph_7_g_n3-") and "/" not in a
    assert segment_name("g", "a_b", pid=1) != segment_name("g_a", "b", pid=1)
    assert len(segment_name("g", "x" * 1000)) <= 200
    assert POLL_S <= 0.2


def test_read_copy_outlives_the_slot_and_is_writable():
    import numpy as np

    from cgraph.channels.shm_channel import ShmChannel

    with ShmChannel.create("copytest", "c", num_readers=1, max_inflight=1) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        writer.write({"a": np.arange(6.0)})
        got = reader.read(copy=True)  # released at once: the writer may reuse the slot
        writer.write({"a": np.zeros(6)}, timeout=5)
        assert got["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        got["a"][0] = 9.0  # a private copy
        assert reader.read(timeout=5)["a"].tolist() == [0.0] * 6
        reader.release()
        writer.detach()
        reader.detach()
