"""A user's subclass of Ray's ``Communicator`` run through cgraph's interface (``RayCommunicator``).

The fake below is a Ray Communicator of threads in one process (queues per rank pair, a
barrier for collectives), ranked its own way; cgraph's ranks map onto them out of order,
so every translation (peer ranks, allocator receives, rank order of gathered and
scattered chunks) is checked against plain torch arithmetic.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import pytest
import torch
from ray.experimental.util.types import ReduceOp as RayReduceOp

from cgraph.comm.ray_communicator import RayCommunicator, ranks_of
from tests.fake_ray_communicator import RayFake, reduce_all

RAY_RANKS = (2, 0, 1)  # cgraph rank r is Ray rank RAY_RANKS[r]


class Shared:
    """What the fake's ranks share: a queue per (src, dst) pair and a collective board."""

    def __init__(self, n: int) -> None:
        self.pipes = {(s, d): queue.SimpleQueue() for s in range(n) for d in range(n)}
        self.board: dict[int, torch.Tensor] = {}
        self.barrier = threading.Barrier(n)
        self.lock = threading.Lock()


class ThreadComm(RayFake):
    """A Ray Communicator over threads; ``actors`` are names standing in for handles."""

    def __init__(self, actors: list[str], shared: Shared) -> None:
        super().__init__(actors)
        self.shared = shared
        self.destroyed = False

    def send(self, value, peer_rank):
        self.shared.pipes[(self.me, peer_rank)].put(value.clone())

    def recv(self, shape, dtype, peer_rank, allocator=None):
        got = self.shared.pipes[(peer_rank, self.me)].get(timeout=10)
        buf = allocator(shape, dtype)
        buf.copy_(got)
        return buf

    def _gather(self, send_buf) -> list[torch.Tensor]:
        with self.shared.lock:
            self.shared.board[self.me] = send_buf.clone()
        self.shared.barrier.wait()
        parts = [self.shared.board[r] for r in range(len(self.actors))]
        self.shared.barrier.wait()
        return parts

    def allgather(self, send_buf, recv_buf):
        recv_buf.copy_(torch.cat(self._gather(send_buf)))

    def allreduce(self, send_buf, recv_buf, op=RayReduceOp.SUM):
        recv_buf.copy_(reduce_all(op, self._gather(send_buf)))

    def reducescatter(self, send_buf, recv_buf, op=RayReduceOp.SUM):
        recv_buf.copy_(reduce_all(op, self._gather(send_buf)).chunk(len(self.actors))[self.me])

    def destroy(self):
        self.destroyed = True


def run_ranks(body: Callable[[RayCommunicator], object]) -> list[object]:
    """``body(comm)`` on each of cgraph's 3 ranks, each in a thread with its own copy."""
    actors = ["x", "y", "z"]  # Ray's order; cgraph's members are ["z", "x", "y"]
    shared = Shared(3)
    members = [actors[r] for r in RAY_RANKS]
    ranks = ranks_of(ThreadComm(actors, shared), members, members)
    assert ranks == RAY_RANKS
    results: list[object] = [None] * 3
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        comm = RayCommunicator(ThreadComm(actors, shared), ranks)
        comm.initialize(rank, 3, "g")
        try:
            results[rank] = body(comm)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return results


def value(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float32) + 10 * rank


def test_send_and_recv_name_cgraph_ranks():
    def body(comm: RayCommunicator) -> object:
        assert comm.world_size == 3 and comm.ray_comm.get_self_rank() == RAY_RANKS[comm.rank]
        if comm.rank == 0:
            comm.send(value(0), 2)
            return None
        if comm.rank == 2:
            buf = torch.empty(6)
            comm.recv(buf, 0)
            return buf
        return None

    assert torch.equal(run_ranks(body)[2], value(0))


def test_collectives_come_out_in_cgraph_rank_order():
    def body(comm: RayCommunicator) -> object:
        mine = value(comm.rank)
        total = mine.clone()
        comm.allreduce(total, "sum")
        peak = mine.clone()
        comm.allreduce(peak, "max")
        parts = [torch.empty(6) for _ in range(3)]
        comm.allgather(parts, mine)
        out = torch.empty(2)
        comm.reducescatter(out, mine, "sum")
        return total, peak, parts, out

    everyone = sum(value(r) for r in range(3))
    for rank, (total, peak, parts, out) in enumerate(run_ranks(body)):
        assert torch.equal(total, everyone)
        assert torch.equal(peak, value(2))
        assert all(torch.equal(p, value(r)) for r, p in enumerate(parts)), "gathered by cgraph rank"
        assert torch.equal(out, everyone.chunk(3)[rank]), "each cgraph rank gets its own chunk"


def test_a_communicator_that_does_not_join_exactly_the_members_is_refused():
    comm = ThreadComm(["x", "y", "z"], Shared(3))
    with pytest.raises(ValueError, match="joins 3 actors.*must be all of its actors"):
        ranks_of(comm, ["x", "y"], ["a", "b"])
    with pytest.raises(ValueError, match="does not rank all of them"):
        ranks_of(comm, ["x", "w"], ["a", "b"])


def test_destroy_reaches_the_users_object():
    comm = RayCommunicator(ThreadComm(["x"], Shared(1)), (0,))
    comm.destroy()
    assert comm.ray_comm.destroyed
