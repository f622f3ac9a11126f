"""The shm channel's C fast path (``_fastpath.c`` + the Fast endpoints of shm_channel.py) against the Python path.

"Fast" endpoints are what ``attach()`` opens when the extension is built;
"pure" endpoints are the Python classes (``ShmWriter`` / ``ShmReader``) opened
directly, or, in the ``spawn`` tests, endpoints in a child that runs with
``CGRAPH_PURE_PYTHON=1`` (ctypes semaphores too). Both sides of one channel must
see the same bytes, values, blocking and errors. The C-specific tests skip
when the extension is not built.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from cgraph.channels import serialization
from cgraph.channels import shm_layout as shm
from cgraph.channels.opener import open_endpoint
from cgraph.channels.segments import SHM_DIR
from cgraph.channels.semaphore import Semaphore, fastpath
from cgraph.channels.shm_channel import FASTPATH, ShmChannel, ShmReader, ShmWriter
from cgraph.errors import ChannelClosedError, ChannelTimeoutError
from tests.unit.child_process import finish, run

pytestmark = pytest.mark.slow  # left out of `make test-fast`

if FASTPATH:  # a CGRAPH_PURE_PYTHON=1 child imports this module too
    from cgraph.channels.shm_channel import FastShmReader, FastShmWriter

needs_c = pytest.mark.skipif(not FASTPATH, reason="C extension not built, or CGRAPH_PURE_PYTHON")
SPAWN = mp.get_context("spawn")
DONE = 0  # the core's status after a call it finished itself

SMALL = [
    0, -1, 2**70, 1.5, float("inf"), 1 + 2j, True, None, "", "text", "ü€" * 30, b"", b"abc",
    b"\x00" * 5000, (), ("x",) * 8, [1, 2.0, "3"], ((1, "x"), {"k": 2.0}),
    {"a": (1, 2), "b": [None, b"x"]}, ((), {}),
]  # fmt: skip
NOT_SMALL = [
    list(range(9)), {"a": {"b": {"c": 1}}}, {1: "int key"}, {3, 4}, bytearray(b"ab"),
    KeyError("k"), np.arange(5.0), [np.ones(3)],
]  # fmt: skip


@pytest.fixture
def tag():
    tag = f"f{uuid.uuid4().hex[:10]}"
    yield tag
    left = sorted(e for e in os.listdir(SHM_DIR) if e.startswith("cgraph_") and f"_{tag}_" in e)
    for entry in left:
        os.unlink(os.path.join(SHM_DIR, entry))
    assert not left, f"leaked segments: {left}"


def same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, list) and a and isinstance(a[0], np.ndarray):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    elif isinstance(a, BaseException):
        assert a.args == b.args
    else:
        assert a == b


def slot_bytes(ch, reader):
    """The bytes of the slot holding ``reader``'s last value (it must hold it)."""
    words, slots = ch._control.words, ch.handle.max_inflight
    slot = (words[shm._reader_word(slots, reader._handle.reader)] - 1) % slots
    nbytes = words[shm._W_SLOTS + shm._SLOT_WORDS * slot + 2]
    return bytes(reader._slots.readable(slot)[:nbytes])


# --------------------------------------------------------------------------- children
def _read_n(handle, count, pure):
    reader = ShmReader(handle) if pure else open_endpoint(handle)
    got = []
    for _ in range(count):
        value = reader.read(timeout=20)
        got.append(float(value.sum()) if isinstance(value, np.ndarray) else value)
        reader.release()
    return type(reader).__name__, got


def _write_values(handle, values, pure):
    writer = ShmWriter(handle) if pure else open_endpoint(handle)
    for value in values:
        writer.write(value, timeout=20)
    return type(writer).__name__


def _write_until_closed(writer, out):
    try:
        for i in range(100):
            writer.write(i, timeout=20)
    except ChannelClosedError:
        out.append(("closed", time.monotonic()))


# --------------------------------------------------------------------------- selection
@needs_c
def test_layout_constants_match_the_python_code():
    layout = fastpath.LAYOUT
    assert layout["magic"] == shm._MAGIC and layout["version"] == shm._VERSION
    assert (layout["closed"], layout["writer_seq"]) == (shm._W_CLOSED, shm._W_WSEQ)
    assert (layout["slots"], layout["slot_words"]) == (shm._W_SLOTS, shm._SLOT_WORDS)
    assert layout["sem_stride"] == shm._SEM_STRIDE
    assert layout["head_bytes"] == serialization._HEAD.size
    big = tuple(range(layout["small_len"] + 1))
    assert not serialization._is_small_plain(big) and serialization._is_small_plain(big[:-1])


@needs_c
def test_attach_opens_the_c_endpoints(tag):
    with ShmChannel.create(tag, "kind") as ch:
        assert type(open_endpoint(ch.writer_handle())) is FastShmWriter
        reader = open_endpoint(ch.reader_handle(0))
        assert type(reader) is FastShmReader and isinstance(reader, ShmReader)


def test_pure_python_env_turns_the_c_path_off():
    code = "from cgraph.channels import shm_channel as s, semaphore as m; print(s.FASTPATH, m.fastpath)"
    env = {**os.environ, "CGRAPH_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None"]


@needs_c
def test_the_channel_suite_passes_on_the_pure_python_path_too():
    # Where the extension cannot be built, users run the Python path: keep it tested.
    suite = os.path.join(os.path.dirname(__file__), "test_channels_shm.py")
    env = {**os.environ, "CGRAPH_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite],
        env=env, capture_output=True, text=True, timeout=240, cwd=os.path.dirname(suite),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout


# --------------------------------------------------------------------------- same results
def _round_trip(tag, name, value, writer_kind):
    """Write ``value`` with a fast or pure writer; read it with a fast and a pure reader."""
    with ShmChannel.create(tag, name, num_readers=2, buffer_size=1 << 16) as ch:
        writer = (FastShmWriter if writer_kind == "fast" else ShmWriter)(ch.writer_handle())
        fast, pure = FastShmReader(ch.reader_handle(0)), ShmReader(ch.reader_handle(1))
        writer.write("warm-up", timeout=5)  # maps the slot (Python's job) everywhere
        assert fast.read(timeout=5) == pure.read(timeout=5) == "warm-up"
        fast.release()
        pure.release()
        writer.write(value, timeout=5)
        got_fast, got_pure = fast.read(timeout=5), pure.read(timeout=5)
        raw = slot_bytes(ch, fast), slot_bytes(ch, pure)
        status = writer._core.status if writer_kind == "fast" else None, fast._core.status
        result = got_fast, got_pure, raw, status
        fast.release()
        pure.release()
        return result


@needs_c
@pytest.mark.parametrize("value", SMALL, ids=lambda v: type(v).__name__)
def test_small_values_take_the_c_path_and_match_python_byte_for_byte(tag, value):
    got_fast, got_pure, raw_c, status = _round_trip(tag, "c", value, "fast")
    assert status == (DONE, DONE)  # written and read in C
    _, _, raw_py, _ = _round_trip(tag, "py", value, "pure")
    assert raw_c[0] == raw_c[1] == raw_py[0]  # same slot bytes as serialization.pack_into
    same(value, got_fast)
    same(value, got_pure)


@needs_c
@pytest.mark.parametrize("value", NOT_SMALL, ids=lambda v: type(v).__name__)
def test_other_values_fall_back_to_python_with_c_endpoints(tag, value):
    got_fast, got_pure, _, (write_status, read_status) = _round_trip(tag, "c", value, "fast")
    assert write_status == fastpath.FALLBACK
    parts = value if isinstance(value, list) else [value]
    has_buffers = any(isinstance(x, np.ndarray) for x in parts)  # a small bytearray is in band
    assert read_status == (fastpath.DECODE if has_buffers else DONE)
    same(value, got_fast)
    same(value, got_pure)


@needs_c
def test_large_bytes_grow_the_slot_then_the_c_path_reuses_it(tag):
    with ShmChannel.create(tag, "grow", num_readers=2, max_inflight=1, buffer_size=4096) as ch:
        writer = open_endpoint(ch.writer_handle())
        fast, pure = open_endpoint(ch.reader_handle(0)), ShmReader(ch.reader_handle(1))
        for size, status in [(10, None), (100_000, fastpath.FALLBACK), (90_000, DONE), (10, DONE)]:
            value = os.urandom(size)
            writer.write(value, timeout=5)
            if status is not None:
                assert writer._core.status == status  # growing is Python's job
            assert fast.read(timeout=5) == value and pure.read(timeout=5) == value
            fast.release()
            pure.release()
        assert ch._control.words[shm._W_SLOTS] == 2  # slot 0 grew once: generation 2


@needs_c
def test_numpy_arrays_stay_zero_copy_views_with_c_endpoints(tag):
    with ShmChannel.create(tag, "view", max_inflight=2) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        for i in range(4):
            a = np.arange(1000.0) + i
            writer.write(a)
            got = reader.read()
            assert reader._core.status == fastpath.DECODE and reader._core.holding
            start = got.__array_interface__["data"][0]
            slot_view = reader._slots.views[0]  # arrays: even values, slot 0
            base = np.frombuffer(slot_view, np.uint8).__array_interface__["data"][0]
            assert base <= start < base + len(slot_view)  # points into the slot
            assert not got.flags.writeable
            np.testing.assert_array_equal(got, a)
            writer.write(i)  # a small value between arrays, in C
            assert reader.read() == i
            reader.release()
        writer.write({"a": np.arange(4.0)})
        copied = reader.read(copy=True)
        assert not reader._core.holding and copied["a"].flags.writeable


# --------------------------------------------------------------------------- interop
@needs_c
def test_c_and_python_endpoints_take_turns_on_one_channel(tag):
    values = [*SMALL, *NOT_SMALL, b"y" * 200_000, *SMALL]
    with ShmChannel.create(tag, "mix", num_readers=2, max_inflight=3, buffer_size=4096) as ch:
        writers = [FastShmWriter(ch.writer_handle()), ShmWriter(ch.writer_handle())]
        readers0 = [FastShmReader(ch.reader_handle(0)), ShmReader(ch.reader_handle(0))]
        reader1 = ShmReader(ch.reader_handle(1))
        for i, value in enumerate(values):
            writers[i % 2].write(value, timeout=5)
            reader0 = readers0[(i // 2) % 2]  # swapped after a release: seq is shared
            same(value, reader0.read(timeout=5))
            same(value, reader1.read(timeout=5))
            reader0.release()
            reader1.release()
        assert all(f.value() == 3 for f in ch._control.free)  # every slot free again


@needs_c
@pytest.mark.parametrize("c_side", ["writer", "reader"])
def test_c_and_python_endpoints_interoperate_across_fork(tag, c_side):
    values = [*SMALL, np.arange(10.0), b"z" * 50_000, 7]
    expected = [float(v.sum()) if isinstance(v, np.ndarray) else v for v in values]
    with ShmChannel.create(tag, "fork", max_inflight=2, buffer_size=4096) as ch:
        child_pure = c_side == "writer"  # the child is the other side
        proc, out = run(_read_n, ch.reader_handle(0), len(values), child_pure)
        _write_values(ch.writer_handle(), values, pure=not child_pure)
        kind, got = finish(proc, out)
        assert kind == ("ShmReader" if child_pure else "FastShmReader")
        assert got == expected


@needs_c
@pytest.mark.parametrize("c_side", ["writer", "reader"])
def test_c_endpoint_talks_to_a_pure_python_process(tag, c_side, monkeypatch):
    values = [1, ("a", {"b": 2}), b"q" * 10_000, np.ones(100), None]
    expected = [float(v.sum()) if isinstance(v, np.ndarray) else v for v in values]
    monkeypatch.setenv("CGRAPH_PURE_PYTHON", "1")  # the spawned child imports cgraph anew
    with ShmChannel.create(tag, "spawn", max_inflight=2, buffer_size=4096) as ch:
        if c_side == "writer":
            proc, out = run(_read_n, ch.reader_handle(0), len(values), False, ctx=SPAWN)
            assert _write_values(ch.writer_handle(), values, False) == "FastShmWriter"
            kind, got = finish(proc, out, timeout=60)
            assert (kind, got) == ("ShmReader", expected)  # attach() in a pure child
        else:
            proc, out = run(_write_values, ch.writer_handle(), values, False, ctx=SPAWN)
            kind, got = _read_n(ch.reader_handle(0), len(values), False)
            assert finish(proc, out, timeout=60) == "ShmWriter"
            assert (kind, got) == ("FastShmReader", expected)


# --------------------------------------------------------------------------- blocking
@needs_c
def test_close_wakes_a_reader_blocked_in_c(tag):
    with ShmChannel.create(tag, "close-r") as ch:
        reader, errors = open_endpoint(ch.reader_handle(0)), []
        thread = threading.Thread(target=lambda: errors.append(_catch(reader.read)))
        thread.start()
        time.sleep(0.3)  # blocked in sem_clockwait, GIL released: this thread runs
        closed_at = time.monotonic()
        ch.close()
        thread.join(5)
        assert time.monotonic() - closed_at < 0.5
        assert isinstance(errors[0], ChannelClosedError)


@needs_c
def test_close_wakes_a_writer_blocked_in_c(tag):
    with ShmChannel.create(tag, "close-w", max_inflight=1) as ch:
        writer, out = open_endpoint(ch.writer_handle()), []
        thread = threading.Thread(target=_write_until_closed, args=(writer, out))
        thread.start()
        time.sleep(0.3)  # one value written, the second write waits for a free slot
        closed_at = time.monotonic()
        ch.close()
        thread.join(5)
        assert out and out[0][0] == "closed" and out[0][1] - closed_at < 0.5


@needs_c
def test_a_closed_flag_without_a_post_is_seen_within_a_poll(tag):
    with ShmChannel.create(tag, "lost") as ch:
        reader, errors = open_endpoint(ch.reader_handle(0)), []
        thread = threading.Thread(target=lambda: errors.append(_catch(reader.read)))
        thread.start()
        time.sleep(0.2)
        ch._control.words[shm._W_CLOSED] = 1  # a lost post: only the poll sees it
        thread.join(5)
        assert isinstance(errors[0], ChannelClosedError)


@needs_c
def test_timeouts_in_c_raise_and_leave_the_channel_usable(tag):
    with ShmChannel.create(tag, "timeout", num_readers=2, max_inflight=1) as ch:
        writer = open_endpoint(ch.writer_handle())
        r0, r1 = open_endpoint(ch.reader_handle(0)), open_endpoint(ch.reader_handle(1))
        start = time.monotonic()
        with pytest.raises(ChannelTimeoutError):
            r0.read(timeout=0.1)
        assert 0.09 < time.monotonic() - start < 0.5
        writer.write("a")
        assert r0.read() == "a" and r1.read() == "a"
        r0.release()
        with pytest.raises(ChannelTimeoutError):  # took reader 0's token, waited on reader 1
            writer.write("b", timeout=0.05)
        assert writer._core.status == fastpath.WAIT_FAILED
        assert [f.value() for f in ch._control.free] == [1, 0]  # reader 0's token given back
        r1.release()
        writer.write("b", timeout=1)
        with pytest.raises(ChannelTimeoutError):
            writer.write("c", timeout=0)  # still exactly max_inflight ahead
        assert r0.read(timeout=1) == "b" and r1.read(timeout=1) == "b"


@needs_c
def test_writer_in_c_runs_max_inflight_ahead_then_blocks(tag):
    with ShmChannel.create(tag, "pipe", max_inflight=2) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        progress = []

        def write_five():
            for i in range(5):
                writer.write(i)
                progress.append(i)

        thread = threading.Thread(target=write_five)
        thread.start()
        time.sleep(0.3)
        assert len(progress) == 2  # two values in flight, the third write sleeps in C
        assert reader.read() == 0
        time.sleep(0.2)
        assert len(progress) == 2  # read but not released: the slot is still in use
        assert reader.read() == 1  # releases value 0: the third write goes through
        assert [reader.read(timeout=5) for _ in range(3)] == [2, 3, 4]
        reader.release()
        thread.join(5)
        assert len(progress) == 5


@needs_c
def test_one_c_writer_three_c_readers_across_processes(tag):
    values = [i if i % 3 else ("v", {"i": i}) for i in range(300)]
    with ShmChannel.create(tag, "fan", num_readers=3, max_inflight=2) as ch:
        children = [run(_read_n, ch.reader_handle(i), len(values), False) for i in range(3)]
        _write_values(ch.writer_handle(), values, False)
        for proc, out in children:
            assert finish(proc, out) == ("FastShmReader", values)


class _Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    raise _Interrupted


@needs_c
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_a_signal_handler_interrupts_a_c_wait_and_the_channel_survives(tag):
    previous = signal.signal(signal.SIGUSR1, _raise_interrupted)
    main = threading.main_thread().ident
    try:
        with ShmChannel.create(tag, "signal", max_inflight=1) as ch:
            writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
            for role in ("reader", "writer"):
                timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGUSR1))
                timer.start()
                with pytest.raises(_Interrupted):
                    if role == "reader":
                        reader.read()  # nothing written yet
                    else:
                        writer.write(2, timeout=10)  # value 1 unread: no free slot
                timer.join()
                if role == "reader":
                    writer.write(1)
            assert ch._control.free[0].value() == 0  # the interrupted write gave its token back
            assert reader.read(timeout=1) == 1
            reader.release()
            writer.write(2, timeout=1)
            assert reader.read(timeout=1) == 2
    finally:
        signal.signal(signal.SIGUSR1, previous)


# --------------------------------------------------------------------------- errors, refs
def _fails_to_rebuild():
    raise RuntimeError("cannot rebuild on this side")


class _BadOnRead:
    def __reduce__(self):
        return (_fails_to_rebuild, ())


@needs_c
def test_an_unpickling_error_in_c_releases_the_slot(tag):
    with ShmChannel.create(tag, "bad") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        writer.write(_BadOnRead())  # pickled in Python (not small), unpickled in C
        with pytest.raises(RuntimeError, match="cannot rebuild"):
            reader.read()
        assert not reader._core.holding
        writer.write("next", timeout=1)
        assert reader.read(timeout=1) == "next"


@needs_c
def test_detached_c_endpoints_refuse_to_work(tag):
    with ShmChannel.create(tag, "detach") as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        writer.write(1)
        assert reader.read() == 1
        reader.detach()  # releases the slot too
        writer.write(2, timeout=1)
        writer.detach()
        with pytest.raises(ChannelClosedError):
            writer.write(3)
        with pytest.raises(ChannelClosedError):
            reader.read()


@needs_c
def test_the_c_path_leaks_no_references(tag):
    value, sentinel = ("abc", {"k": 12345678901}), fastpath.MISS
    with ShmChannel.create(tag, "refs", max_inflight=2, buffer_size=4096) as ch:
        writer, reader = open_endpoint(ch.writer_handle()), open_endpoint(ch.reader_handle(0))
        views = reader._slots.views
        for _ in range(3):
            writer.write(value)
            reader.read(copy=True)
        before = [sys.getrefcount(x) for x in (value, sentinel, views[0], views[1])]
        for _ in range(2000):
            writer.write(value)
            assert reader.read() == value
            writer.write(np.ones(2))
            reader.read()
            reader.release()
        after = [sys.getrefcount(x) for x in (value, sentinel, views[0], views[1])]
        assert after == before


# --------------------------------------------------------------------------- primitives
@needs_c
def test_c_semaphore_primitives():
    mm = mmap.mmap(-1, 4096)
    address = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    sem = Semaphore(address, mm)
    sem.init(0)
    assert fastpath.sem_trywait(address) != 0
    start = time.monotonic_ns()
    assert fastpath.sem_wait(address, start + 50_000_000, 10_000_000, None) == 1  # deadline
    assert time.monotonic_ns() - start >= 50_000_000
    assert fastpath.sem_wait(address, None, 10_000_000, lambda: True) == 2  # stopped
    assert fastpath.sem_post(address) == 0 and sem.value() == 1
    assert fastpath.sem_wait(address, None, 10_000_000, None) == 0 and sem.value() == 0
    with pytest.raises(ZeroDivisionError):
        fastpath.sem_wait(address, None, 10_000_000, lambda: 1 / 0)
    with pytest.raises(ValueError):
        fastpath.sem_wait(address, None, 0, None)
    assert not sem.acquire(time.monotonic_ns() + 20_000_000, 5_000_000, lambda: False)
    sem.post()
    assert sem.try_acquire() and not sem.try_acquire()


def _catch(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    return None
