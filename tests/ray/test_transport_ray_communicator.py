"""Ray's own communicators on a graph's edges and collectives, as Ray Compiled Graphs takes them:
a user's subclass of Ray's ``Communicator`` (here one that really moves tensors, through a
mailbox actor) and Ray's ``CPUCommunicator`` (whose edges Ray sends through host memory)."""

from __future__ import annotations

import itertools
import time

import pytest
import ray
import torch
from ray.experimental.channel.cpu_communicator import CPUCommunicator
from ray.experimental.util.types import ReduceOp as RayReduceOp

import cgraph
from cgraph import InputNode, MultiOutputNode
from cgraph.collective import allreduce
from tests.fake_ray_communicator import RayFake, reduce_all

pytestmark = pytest.mark.usefixtures("no_leaks")


@ray.remote(num_cpus=0)
class Mailbox:
    def __init__(self) -> None:
        self.items: dict[tuple, object] = {}

    def put(self, key, value) -> None:
        self.items[key] = value

    def take(self, key, keep: bool = False):
        return self.items.get(key) if keep else self.items.pop(key, None)


class MailboxCommunicator(RayFake):
    """A user's Ray communicator: tensors go through a mailbox actor, ranked by ``actors``."""

    def __init__(self, actors, mailbox) -> None:
        super().__init__(actors)
        self.mailbox = mailbox
        self.sent: dict[int, int] = {}
        self.got: dict[int, int] = {}
        self.rounds = 0

    def _wait(self, key, keep=False):
        deadline = time.monotonic() + 60
        while (got := ray.get(self.mailbox.take.remote(key, keep))) is None:
            assert time.monotonic() < deadline, f"nothing came for {key}"
            time.sleep(0.002)
        return got

    def send(self, value, peer_rank) -> None:
        n = self.sent[peer_rank] = self.sent.get(peer_rank, 0) + 1
        ray.get(self.mailbox.put.remote(("p2p", self.me, peer_rank, n), value.clone()))

    def recv(self, shape, dtype, peer_rank, allocator=None):
        n = self.got[peer_rank] = self.got.get(peer_rank, 0) + 1
        value = self._wait(("p2p", peer_rank, self.me, n))
        buf = allocator(shape, dtype)
        buf.copy_(value)
        return buf

    def allreduce(self, send_buf, recv_buf, op=RayReduceOp.SUM) -> None:
        self.rounds += 1
        ray.get(self.mailbox.put.remote(("ar", self.rounds, self.me), send_buf.clone()))
        parts = [self._wait(("ar", self.rounds, r), keep=True) for r in range(len(self.actors))]
        recv_buf.copy_(reduce_all(op, parts))


@ray.remote(num_cpus=0)
class Stage:
    def __init__(self, k: int) -> None:
        self.k = k

    def make(self, x):
        return torch.full((4,), float(x * self.k))

    def total(self, t):
        return float(t.sum())


@pytest.fixture
def stages(actors):
    """Three stages (k = 1, 10, 100) and an empty mailbox, as if new (``actors``)."""
    return [actors(Stage, 1, k)[0] for k in (1, 10, 100)], actors(Mailbox, 1)[0]


def test_a_users_ray_communicator_carries_an_edge_in_its_own_rank_order(stages):
    (a, b, _), mailbox = stages
    comm = MailboxCommunicator([b, a], mailbox)  # b is its rank 0: cgraph's ranks map onto these
    with InputNode() as inp:
        dag = b.total.bind(a.make.bind(inp).with_tensor_transport(transport=comm))
    compiled = dag.experimental_compile()
    try:
        assert [compiled.execute(x).get(timeout=60) for x in (1, 2, 3)] == [4.0, 8.0, 12.0]
    finally:
        compiled.teardown()


def test_a_users_ray_communicator_runs_a_collective_given_as_its_transport(stages):
    (a, b, _), mailbox = stages
    comm = MailboxCommunicator([b, a], mailbox)
    with InputNode() as inp:
        summed = allreduce.bind([a.make.bind(inp), b.make.bind(inp)], transport=comm)
        dag = MultiOutputNode([a.total.bind(summed[0]), b.total.bind(summed[1])])
    compiled = dag.experimental_compile()
    try:
        assert compiled.execute(1).get(timeout=60) == [44.0, 44.0]  # (1 + 10) * 4 on both
        assert compiled.execute(2).get(timeout=60) == [88.0, 88.0]
    finally:
        compiled.teardown()


def test_rays_cpu_communicator_edges_go_through_host_memory_and_collectives_run(stages):
    (a, b, c), _ = stages
    cpu_group = CPUCommunicator(3, [a, b, c])
    with InputNode() as inp:
        moved = b.total.bind(a.make.bind(inp).with_tensor_transport(transport=cpu_group))
        summed = allreduce.bind([x.make.bind(inp) for x in (a, b, c)], transport=cpu_group)
        dag = MultiOutputNode([moved, *(x.total.bind(s) for x, s in zip((a, b, c), summed, strict=True))])
    plan = cgraph.plan(dag)
    assert "shm" in str(plan.plan) and "custom:" not in str(plan.plan)
    compiled = dag.experimental_compile()
    try:
        assert compiled.execute(1).get(timeout=60) == [4.0, 444.0, 444.0, 444.0]
    finally:
        compiled.teardown()


def test_a_ray_communicator_over_more_actors_than_use_it_is_refused(stages):
    (a, b, c), mailbox = stages
    comm = MailboxCommunicator([a, b, c], mailbox)
    with InputNode() as inp:
        dag = b.total.bind(a.make.bind(inp).with_tensor_transport(transport=comm))
    with pytest.raises(cgraph.CompileError, match="joins 3 actors.*must be all of its actors"):
        dag.experimental_compile()
    assert ray.get(a.make.remote(1), timeout=30).tolist() == [1.0] * 4, "the actors stay usable"


def test_counters_are_per_graph(stages):
    """Two graphs in a row over one communicator object: each gets its own copy."""
    (a, b, _), mailbox = stages
    comm = MailboxCommunicator([a, b], mailbox)
    for _ in itertools.repeat(None, 2):
        with InputNode() as inp:
            dag = b.total.bind(a.make.bind(inp).with_tensor_transport(transport=comm))
        compiled = dag.experimental_compile()
        try:
            assert compiled.execute(5).get(timeout=60) == 20.0
        finally:
            compiled.teardown()
