"""Forwarding: a reader that writes on what it read leaves the buffers in the upstream
slot; the next reader views them there and gives both slots back (no Ray).

    U: writer ─► slot ─► p (pass-through)  ── D: p writes (forward_from=[p]) ─► q
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from cgraph.channels import ShmChannel
from cgraph.channels.opener import open_endpoint
from cgraph.channels.segments import SHM_DIR
from cgraph.channels.shm_channel import FASTPATH, ShmReader, ShmWriter
from cgraph.errors import ChannelTimeoutError
from tests.unit.test_channels_shm import mapping_of

MiB = 1 << 20
KINDS = ["python", pytest.param("fast", marks=pytest.mark.skipif(not FASTPATH, reason="C fast path not built"))]


def endpoints(kind: str, channel: ShmChannel, reader: int | None = None):
    handle = channel.reader_handle(reader) if reader is not None else channel.writer_handle()
    if kind == "fast":
        return open_endpoint(handle)
    return ShmReader(handle) if reader is not None else ShmWriter(handle)


@pytest.fixture
def chain(request):
    """U (1 slot) and D channels, their endpoints of ``request.param`` kind; no leaks after."""
    tag = f"t{uuid.uuid4().hex[:10]}"
    kind, readers = request.param if isinstance(request.param, tuple) else (request.param, 1)
    u = ShmChannel.create(tag, "u", max_inflight=1, buffer_size=4096)
    d = ShmChannel.create(tag, "d", num_readers=readers, max_inflight=1, buffer_size=4096)
    ends = (endpoints(kind, u), endpoints(kind, u, 0), endpoints(kind, d),
            *[endpoints(kind, d, r) for r in range(readers)])
    yield u, d, ends
    for end in ends:
        end.detach()
    for channel in (u, d):
        channel.close()
        channel.unlink()
    left = [e for e in os.listdir(SHM_DIR) if f"_{tag}_" in e]
    assert not left, f"leaked segments: {left}"


@pytest.mark.parametrize("chain", KINDS, indirect=True)
def test_a_pass_through_is_read_in_the_upstream_slot_without_a_copy(chain) -> None:
    u, d, (u_writer, p, d_writer, q) = chain
    sent = np.arange(MiB // 8, dtype=np.float64)
    u_writer.write(sent)
    seen = p.read()
    assert d_writer.write(seen, forward_from=[p]) is p  # handed over
    got = q.read()
    np.testing.assert_array_equal(got, sent)
    assert mapping_of(got.ctypes.data) == mapping_of(seen.ctypes.data) == f"{u.handle.name}_1"
    assert os.path.getsize(os.path.join(SHM_DIR, f"{d.handle.name}_1")) == 4096  # D carried no array
    p.release()  # handed over: gives nothing back
    with pytest.raises(ChannelTimeoutError):
        u_writer.write(sent + 1, timeout=0.2)  # U's one slot is still q's
    q.release()
    u_writer.write(sent + 1, timeout=5)  # q gave U's slot back
    np.testing.assert_array_equal(p.read(), sent + 1)


@pytest.mark.parametrize("chain", KINDS, indirect=True)
def test_a_forwarded_value_read_with_copy_gives_both_slots_back_at_once(chain) -> None:
    _, _, (u_writer, p, d_writer, q) = chain
    u_writer.write({"x": np.ones(1000), "k": 3})
    d_writer.write(p.read(), forward_from=[p])
    got = q.read(copy=True)
    assert got["k"] == 3 and got["x"].sum() == 1000
    u_writer.write(np.zeros(3), timeout=5)  # nothing held any more
    d_writer.write(p.read(), forward_from=[p])
    assert q.read().sum() == 0  # the next read gives the previous hold back first


@pytest.mark.parametrize("chain", KINDS, indirect=True)
def test_a_value_outside_the_held_slot_is_copied_and_the_hold_kept(chain) -> None:
    u, _, (u_writer, p, d_writer, q) = chain
    u_writer.write(np.ones(1000))
    p.read()
    fresh = np.full(1000, 2.0)
    assert d_writer.write(fresh, forward_from=[p]) is None
    got = q.read()
    assert got.sum() == 2000 and mapping_of(got.ctypes.data) != f"{u.handle.name}_1"
    p.release()  # p still held U's slot: this gives it back
    u_writer.write(np.ones(3), timeout=5)


@pytest.mark.parametrize("chain", [("python", 2)], indirect=True)
def test_a_channel_with_two_readers_copies(chain) -> None:
    _, _, (u_writer, p, d_writer, q0, q1) = chain
    u_writer.write(np.ones(1000))
    assert d_writer.write(p.read(), forward_from=[p]) is None
    assert q0.read().sum() == q1.read().sum() == 1000


@pytest.mark.parametrize("kind", KINDS)
def test_a_forwarded_value_forwarded_again_stays_in_the_first_slot(kind: str) -> None:
    tag = f"t{uuid.uuid4().hex[:10]}"
    channels = [ShmChannel.create(tag, name, max_inflight=1, buffer_size=4096) for name in "abc"]
    writers = [endpoints(kind, c) for c in channels]
    readers = [endpoints(kind, c, 0) for c in channels]
    try:
        writers[0].write(np.arange(1000.0))
        writers[1].write(readers[0].read(), forward_from=[readers[0]])  # a -> b: b points into a
        middle = readers[1].read()
        assert writers[2].write(middle, forward_from=[readers[1]]) is readers[1]  # b -> c: still a
        last = readers[2].read()
        assert mapping_of(last.ctypes.data) == f"{channels[0].handle.name}_1" and last.sum() == 499500
        writers[1].write(np.ones(3), timeout=5)  # b's slot (a small record) was given back
        with pytest.raises(ChannelTimeoutError):
            writers[0].write(np.ones(3), timeout=0.2)  # a's slot is the last reader's
        readers[2].release()
        writers[0].write(np.ones(3), timeout=5)
    finally:
        for end in (*writers, *readers):
            end.detach()
        for channel in channels:
            channel.close()
            channel.unlink()
