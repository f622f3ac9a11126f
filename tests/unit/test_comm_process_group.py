"""The torch process-group communicator, run with gloo: the code NCCL runs, minus ``_Cuda``.

Two or three ranks live in threads of this process and meet through one
``HashStore`` (a stand-in for the store actor a compiled graph starts); every
call is the communicator's own, checked against values computed here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cgraph.comm.torch import process_group
from cgraph.comm.torch.process_group import NcclCommunicator, ProcessGroupCommunicator
from cgraph.errors import ChannelClosedError, ChannelLostError


@dataclass(frozen=True)
class _Meet:
    """A rendezvous whose ``connect`` hands every rank the same in-process store."""

    store: Any

    def connect(self) -> Any:
        return self.store


def ranks(n: int, work: Callable[[ProcessGroupCommunicator], Any], nodes: tuple[str, ...] = ()) -> list[Any]:
    """Run ``work(comm)`` on ``n`` gloo ranks at once; their results by rank."""
    meet = _Meet(dist.HashStore())

    def one(rank: int) -> Any:
        comm = ProcessGroupCommunicator(meet, rank, n, "gloo", nodes=nodes)  # type: ignore[arg-type]
        try:
            return work(comm)
        finally:
            comm.destroy()

    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=60) for f in [pool.submit(one, r) for r in range(n)]]


def test_identity_and_no_stream_under_gloo() -> None:
    got = ranks(2, lambda c: (c.rank, c.world_size, c.device.type, c.stream, c.backend))
    assert got == [(0, 2, "cpu", None, "gloo"), (1, 2, "cpu", None, "gloo")]


def test_send_and_recv_fill_the_callers_buffer() -> None:
    def work(c: ProcessGroupCommunicator) -> Any:
        if c.rank == 0:
            c.send(torch.arange(6, dtype=torch.float32).reshape(2, 3), 1)
            return None
        buf = torch.zeros(2, 3)
        c.recv(buf, 0)
        return buf

    assert torch.equal(ranks(2, work)[1], torch.arange(6, dtype=torch.float32).reshape(2, 3))


@pytest.mark.parametrize(("op", "expect"), [("sum", 6.0), ("max", 3.0), ("min", 1.0), ("product", 6.0)])
def test_allreduce_every_op(op: str, expect: float) -> None:
    def work(c: ProcessGroupCommunicator) -> Any:
        t = torch.full((5,), float(c.rank + 1))
        c.allreduce(t, op)
        return t

    for t in ranks(3, work):
        assert torch.equal(t, torch.full((5,), expect))


def test_allgather_reducescatter_broadcast_barrier() -> None:
    def work(c: ProcessGroupCommunicator) -> Any:
        out = [torch.zeros(2) for _ in range(3)]
        c.allgather(out, torch.full((2,), float(c.rank)))
        mine = torch.zeros(2)
        c.reducescatter(mine, torch.arange(6, dtype=torch.float32) * (c.rank + 1))
        b = torch.full((3,), float(c.rank))
        c.broadcast(b, 2)
        c.barrier()
        return [o.tolist() for o in out], mine.tolist(), b.tolist()

    for rank, (gathered, mine, b) in enumerate(ranks(3, work)):
        assert gathered == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert mine == [6.0 * (2 * rank), 6.0 * (2 * rank + 1)]  # (1+2+3) x chunk `rank`
        assert b == [2.0, 2.0, 2.0]


def test_a_call_after_abort_raises_channel_closed_and_abort_is_idempotent() -> None:
    def work(c: ProcessGroupCommunicator) -> Any:
        c.barrier()
        c.abort()
        c.abort()
        c.destroy()
        with pytest.raises(ChannelClosedError, match="gloo communicator was aborted"):
            c.send(torch.ones(1), 1 - c.rank)
        return True

    assert ranks(2, work) == [True, True]


def test_aborting_a_peer_wakes_a_rank_blocked_in_recv() -> None:
    """gloo's abort leaves a blocked recv waiting; dropping the group closes its pairs."""
    meet = _Meet(dist.HashStore())
    blocked, errors = threading.Event(), []

    def receiver() -> None:
        comm = ProcessGroupCommunicator(meet, 0, 2, "gloo")  # type: ignore[arg-type]
        comm.barrier()
        blocked.set()
        try:
            comm.recv(torch.zeros(3), 1)
        except RuntimeError as exc:
            errors.append(exc)
        comm.destroy()

    thread = threading.Thread(target=receiver)
    thread.start()
    peer = ProcessGroupCommunicator(meet, 1, 2, "gloo")  # type: ignore[arg-type]
    peer.barrier()
    assert blocked.wait(30)
    peer.abort()  # what the peer's watcher does at teardown
    thread.join(30)
    assert not thread.is_alive() and errors, "the blocked recv was not woken"
    assert isinstance(errors[0], ChannelLostError), errors  # a peer gone, not this op's fault


def test_unknown_backend_and_nccl_without_cuda_are_refused() -> None:
    meet = _Meet(dist.HashStore())
    with pytest.raises(ValueError, match="unknown process-group backend 'mpi'"):
        ProcessGroupCommunicator(meet, 0, 1, "mpi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown process-group backend"):
        process_group.process_group("mpi", meet.store, 0, 1, process_group.WATCHDOG)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match='default_communicator="gloo"'):
            NcclCommunicator(meet, 0, 1)  # type: ignore[arg-type]
        assert process_group.backend_available("gloo") and not process_group.backend_available("nccl")


def test_node_address_is_loopback_outside_ray() -> None:
    assert process_group._node_address() == "127.0.0.1"


def test_a_group_already_broken_is_still_released() -> None:
    """``destroy`` of a group torch already broke (a dead peer) frees it without raising."""

    class Broken:
        def rank(self) -> int:
            return 0

        def size(self) -> int:
            return 2

        def shutdown(self) -> None:
            raise RuntimeError("connection closed by peer")

    comm = ProcessGroupCommunicator.over(Broken(), None, "gloo")
    comm.destroy()
    with pytest.raises(ChannelClosedError):
        comm.send(torch.ones(1), 0)


def test_node_address_falls_back_to_loopback_when_ray_cannot_say(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def unknown() -> str:
        raise RuntimeError("no node here")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_node_ip_address", unknown)
    assert process_group._node_address() == "127.0.0.1"


@pytest.mark.parametrize("algorithm", ["star", "chain", "tree", "butterfly", "ring", "reduction_server"])
def test_cgraphs_algorithms_run_on_the_gloo_communicator(algorithm: str) -> None:
    """As on the CPU mesh, the ``algorithm`` argument picks one of cgraph's (a DAG node's option)."""

    def work(c: ProcessGroupCommunicator) -> Any:
        t = torch.arange(10, dtype=torch.float32) * (c.rank + 1)
        c.allreduce(t, "sum", algorithm)
        b = torch.full((3,), float(c.rank + 1), dtype=torch.bfloat16)  # no numpy dtype: via float32
        c.allreduce(b, "max", algorithm)
        return t.tolist(), b.float().tolist()

    for got, b in ranks(3, work):
        assert got == (torch.arange(10, dtype=torch.float32) * 6).tolist() and b == [3.0] * 3


def test_the_reduction_server_follows_the_members_nodes() -> None:
    def work(c: ProcessGroupCommunicator) -> Any:
        t = torch.full((12,), float(c.rank))
        c.allreduce(t, "sum", "reduction_server")
        transport = c._transport
        assert transport is not None
        return t.tolist(), [transport.node_of(r) for r in range(c.world_size)]

    for got, layout in ranks(4, work, nodes=("x", "x", "y", "y")):
        assert got == [6.0] * 12 and layout == ["x", "x", "y", "y"]
    for _, layout in ranks(2, work):
        assert layout == [0, 0]  # no layout given: one node

