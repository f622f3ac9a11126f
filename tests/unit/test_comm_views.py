"""Zero-copy receives: ``recv_view`` of the CPU communicator and where the runtime uses it.

    rank 0: send(t0) send(t1) send(t2)          link 0>1, LINK_SLOTS = 2
    rank 1: v0 = recv_view(...)  ── v0 holds slot 0: t1 fits in slot 1, t2 waits ──
            lease.release()      ── t2 goes into slot 0, under v0's old address ──

A view is valid until its lease is released, so the runtime views only the
last message an actor receives on a link in an execution (``last_link_reads``)
and releases it at the execution's end; earlier messages on the link are
copies. No Ray: links and communicators in threads of this process.
"""

from __future__ import annotations

import glob
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cgraph.channels.opener import open_endpoint
from cgraph.channels.shm_channel import ShmChannel
from cgraph.comm.communicator import view_receiver
from cgraph.comm.cpu.mesh import CpuCommunicator, create_links
from cgraph.ir import TensorHint
from cgraph.runtime.comm_channel import EdgeReader, EdgeWriter, encode
from cgraph.runtime.comm_ops import last_link_reads
from cgraph.runtime.error_value import ErrorValue
from cgraph.scheduler import parse_schedule
from tests.unit.test_comm_cpu import StarOnly  # send and recv only: no recv_view
from tests.unit.test_comm_ops import Harness, normalise


@pytest.fixture(autouse=True)
def no_segments_left():  # type: ignore[no-untyped-def]
    """Every test here removes the shared-memory segments it made."""
    before = set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*"))
    yield
    assert set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*")) - before == set()


@contextmanager
def pair() -> Iterator[tuple[CpuCommunicator, CpuCommunicator, list[ShmChannel]]]:
    """Two ranks of a fresh link mesh; the links are removed on exit."""
    channels, ends = create_links(uuid.uuid4().hex[:8], "v", 2)
    comms = [CpuCommunicator(e) for e in ends]
    try:
        yield comms[0], comms[1], channels
    finally:
        for comm in comms:
            comm.destroy()
        for ch in channels:
            ch.close()
            ch.unlink()


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


SAMPLES = [
    torch.arange(12, dtype=torch.float32).reshape(3, 4),
    torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # not contiguous: sent contiguous
    torch.tensor(2.5),  # 0-d
    torch.empty(0, 3),
    torch.ones(5, dtype=torch.bfloat16) * 3,
    torch.tensor([True, False, True]),
    torch.arange(4, dtype=torch.int64) - 2,
    torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64),
]


def test_recv_view_returns_every_dtype_and_shape_in_place() -> None:
    with pair() as (a, b, _):
        sender = in_thread(lambda: [a.send(t, 1) for t in SAMPLES])
        for want in SAMPLES:
            got, lease = b.recv_view(tuple(want.shape), want.dtype, 0)
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
            lease.release()
        sender.join(10)
        assert view_receiver(b) == b.recv_view


def test_a_view_holds_its_slot_until_its_lease_is_released() -> None:
    with pair() as (a, b, _):
        sent: list[int] = []

        def send_three() -> None:
            for k in range(3):
                a.send(torch.full((4,), float(k)), 1)
                sent.append(k)

        sender = in_thread(send_three)
        first, lease = b.recv_view((4,), torch.float32, 0)
        sender.join(0.3)
        assert sent == [0, 1] and sender.is_alive()  # slot 0 is viewed: the third send waits
        assert first.tolist() == [0.0] * 4
        with pytest.raises(RuntimeError, match="still viewed; release its lease first"):
            b.recv(torch.empty(4), 0)
        lease.release()
        lease.release()  # idempotent
        second = torch.empty(4)
        b.recv(second, 0)
        third, lease = b.recv_view((4,), torch.float32, 0)
        sender.join(10)
        assert second.tolist() == [1.0] * 4 and third.tolist() == [2.0] * 4
        # the third message went into the first one's slot: a released view is not a value
        assert third.data_ptr() == first.data_ptr() and first.tolist() == [2.0] * 4
        lease.release()


def test_a_view_of_the_wrong_size_is_refused_and_frees_the_slot() -> None:
    with pair() as (a, b, _):
        a.send(torch.zeros(4), 1)
        a.send(torch.ones(2), 1)
        with pytest.raises(ValueError, match="message of 16 x uint8 does not fit a buffer of 20 x uint8"):
            b.recv_view((5,), torch.float32, 0)
        got, lease = b.recv_view((2,), torch.float32, 0)  # not left "viewed" by the failure
        assert got.tolist() == [1.0, 1.0]
        lease.release()




VALUES = [
    [torch.full((3,), float(i)), {"b": torch.arange(4) * i, "k": i}, torch.tensor(float(i))] for i in range(4)
]


@pytest.mark.parametrize("how", ["view", "copy", "no capability"])
def test_edge_reader_views_only_the_last_tensor_and_releases_it(how: str) -> None:
    with pair() as (a, b, channels):
        side = ShmChannel.create(uuid.uuid4().hex[:8], "side", num_readers=1, max_inflight=8, buffer_size=256)
        channels.append(side)
        hint = TensorHint("nccl")
        writer = EdgeWriter(a, 1, open_endpoint(side.writer_handle()), hint, "n1")
        recv_comm = b if how != "no capability" else StarOnly(b)
        reader = EdgeReader(recv_comm, 0, open_endpoint(side.reader_handle(0)), hint, "n1", view_last=how != "copy")
        assert (reader.viewer is not None) == (how == "view")

        def origin(exc: Exception) -> ErrorValue:
            return ErrorValue.capture(exc, actor="a", method="f", execution_index=0)

        sender = in_thread(lambda: [writer.send(encode(v, node="n1", direct_return=False, origin=origin), origin)
                                    for v in VALUES])
        for i, want in enumerate(VALUES):
            got, tensors = reader.recv()
            assert [got[0].tolist(), got[1]["b"].tolist(), got[1]["k"], got[2].item()] == \
                [want[0].tolist(), want[1]["b"].tolist(), i, float(i)]
            assert len(reader.leases) == (1 if how == "view" else 0) and len(tensors) == 3
            reader.release()  # the execution's end
            assert reader.leases == []
        sender.join(10)
        reader.detach()
        writer.detach()


def endpoints(recvs: dict[tuple[str, str], tuple[str, int]], collectives: dict[str, str]) -> Any:
    return SimpleNamespace(
        recvs={k: SimpleNamespace(group=g, peer_rank=r) for k, (g, r) in recvs.items()},
        collectives={n: SimpleNamespace(group=g) for n, g in collectives.items()},
    )


SEED_RECVS = {("n1", "a"): ("cpu", 0), ("n2", "b"): ("cpu", 1), ("n3", "c"): ("cpu", 2)}
SAME_PEER = {("n1", "a"): ("cpu", 0), ("n2", "a"): ("cpu", 0)}


@pytest.mark.parametrize(
    ("lane", "recvs", "collectives", "viewed"),
    [
        ("r.RECV1<a r.RECV2<b r.RECV3<c r.C4 r.C5 r.C6", SEED_RECVS, {}, {"n1", "n2", "n3"}),
        ("r.RECV1<a@comm r.RECV2<b@comm r.RECV3<c@comm r.C4", SEED_RECVS, {}, {"n1", "n2", "n3"}),
        ("r.RECV1<a r.RECV2<a r.C3", SAME_PEER, {}, {"n2"}),
        ("r.RECV1<a r.C3 r.RECV2<a@comm r.C4", SAME_PEER, {}, {"n2"}),
        # a later collective of the group reads every link of it again
        ("r.RECV1<a r.COLL4[r,a] r.RECV2<b", {("n1", "a"): ("cpu", 0), ("n2", "b"): ("cpu", 1)},
         {"n4": "cpu"}, {"n2"}),
        ("r.RECV1<a r.COLL4[r,a]", {("n1", "a"): ("cpu", 0)}, {"n4": "cpu[r,a]"}, {"n1"}),  # another group
        ("r.RECV1<a r.RECV2<a", {("n1", "a"): ("cpu", 0), ("n2", "a"): ("custom:X", 0)}, {}, {"n1", "n2"}),
    ],
)
def test_last_link_reads_views_only_a_links_last_message(
    lane: str, recvs: dict[tuple[str, str], tuple[str, int]], collectives: dict[str, str], viewed: set[str]
) -> None:
    (ops,) = parse_schedule(lane).values()
    assert {node for node, _ in last_link_reads(ops, endpoints(recvs, collectives))} == viewed


class V:
    def many(self, x: int) -> list[Any]:
        return [torch.full((2,), float(x)), {"b": torch.arange(3) * x}, torch.tensor(float(x))]

    def make(self, x: int) -> torch.Tensor:
        return torch.full((5000,), float(x))  # larger than one slot's first size

    def ident(self, t: Any) -> Any:
        return t

    def total(self, *values: Any) -> float:
        flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
        return float(sum(float(t.sum()) for v in flat for t in (v.values() if isinstance(v, dict) else [v])))


SAME_LINK = """
actor s = V(gpus=0)
actor r = V(gpus=0)
actor t = V(gpus=0)
n0 = input
n1 = s.many(n0) :nccl
n2 = s.make(n0) :nccl[static_shape,direct_return]
n3 = r.ident(n2) :nccl
n4 = t.total(n3)
n5 = r.total(n1)
return [n4, n5, n3]
"""


class VHarness(Harness):
    def _loop(self, actor: str, program: Any) -> None:
        from cgraph.runtime.executor import run_actor_loop

        try:
            self.results[actor] = run_actor_loop(V(), program)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.results[actor] = exc


@pytest.mark.parametrize("overlap", [False, True])
def test_graph_with_views_copies_and_a_forwarded_view(overlap: bool) -> None:
    """r gets two values from s on one link (n1 copied, n2 viewed), forwards the view to t and to the driver."""
    inputs = [1, 2, 3, 4, 5, 6]
    with VHarness(SAME_LINK, overlap=overlap) as h:
        r_ops = h.planned.schedule["r"]
        assert {n for n, _ in last_link_reads(r_ops, h.comm.programs["r"])} == {"n2"}
        got = [normalise(row) for row in h.run(*inputs)]
    for x, row in zip(inputs, got, strict=True):
        assert row == [5000.0 * x, 2.0 * x + 3.0 * x + x, [float(x)] * 5000]
