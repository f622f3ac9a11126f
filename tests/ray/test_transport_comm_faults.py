"""A user communicator that raises: that execution's error, never the actor's loop.

    a.make ══Flaky══► b.total ─► driver       Flaky: GlooCommunicator whose send, recv
    a.make ══cpu════► c.note  ─► driver              or allreduce raises on one execution

The execution whose communicator call raises fails with the original exception
(a ``TaskError`` that is also a ``ValueError``), each later one at once with
``cgraph.CommunicatorError`` (the group carries nothing more in this graph),
while the part of the graph off that group (c, on the CPU communicator) keeps
computing right values; teardown leaves nothing in /dev/shm and the actors
answer calls again. An ``initialize`` that raises is a ``CompileError``. A
value typed for a GPU transport and read by the driver reaches it as a host copy.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
import torch
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.collective.dag_ops import allreduce
from tests.ray.test_transport_custom import GlooCommunicator, gloo  # noqa: F401 - the store fixture

pytestmark = pytest.mark.usefixtures("no_leaks")

BAD = 2.0 * 4  # the sum of a.make(2): the execution whose communicator call raises


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self) -> None:
        self.seen: list[float] = []

    def make(self, x: int) -> torch.Tensor:
        return torch.full((4,), float(x))

    def total(self, t: torch.Tensor) -> float:
        return float(t.sum())

    def note(self, t: torch.Tensor) -> float:
        self.seen.append(float(t.sum()))
        return self.seen[-1]

    def noted(self) -> list[float]:
        return self.seen


class FlakySend(GlooCommunicator):
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        if float(tensor.sum()) == BAD:
            raise ValueError("flaky send")
        super().send(tensor, dst)


class FlakyRecv(GlooCommunicator):
    def recv(self, tensor: torch.Tensor, src: int) -> None:
        super().recv(tensor, src)
        if float(tensor.sum()) == BAD:
            raise ValueError("flaky recv")


class FlakyAllreduce(GlooCommunicator):
    def allreduce(self, tensor: torch.Tensor, op: Any = "sum") -> None:
        if self.rank == 0 and tensor.is_floating_point() and float(tensor.sum()) == BAD:
            raise ValueError("flaky allreduce")
        super().allreduce(tensor, op)


class BadInit(GlooCommunicator):
    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        if rank == 1:
            raise ConnectionError("no route to the store")
        self._rank, self._size = rank, world_size  # rank 0 waits for nobody


@pytest.fixture(scope="module")
def workers(ray_session):
    actors = [Worker.remote() for _ in range(3)]
    ray.get([w.noted.remote() for w in actors])
    yield actors
    for w in actors:
        ray.kill(w)


def flaky_edge_dag(workers: list[Any], comm: Any) -> Any:
    a, b, c = workers
    with InputNode() as inp:
        x = cgraph.with_type_hint(a.make.bind(inp), cgraph.TorchTensorType(transport=comm, device="cpu"))
        y = a.make.bind(inp).with_tensor_transport(transport="nccl")  # another group: the CPU communicator
        return MultiOutputNode([b.total.bind(x), c.note.bind(y)])


def check_one_fault(compiled: Any, workers: list[Any], match: str, ok: list[list[float]]) -> None:
    """Executions 0..4 one at a time: 0 and 1 give ``ok``, 2 raises the ValueError, 3 and 4
    the group's failure, at once; c noted every input."""
    c = workers[2]
    before = len(ray.get(c.noted.remote()))
    try:
        assert [compiled.execute(x).get(timeout=30) for x in (0, 1)] == ok
        with pytest.raises(ValueError, match=match) as info:
            compiled.execute(2).get(timeout=30)
        assert isinstance(info.value, cgraph.TaskError)
        for x in (3, 4):
            start = time.monotonic()
            with pytest.raises(cgraph.CommunicatorError, match=r"communicator group custom:\w+ failed in "
                               rf"execution 2 on actor \w \(Worker\): ValueError: {match}; recompile"):
                compiled.execute(x).get(timeout=30)
            assert time.monotonic() - start < 5  # no communicator call, no timeout waited for
        assert noted(c, before, 5) == [0.0, 4.0, 8.0, 12.0, 16.0]  # the rest kept working
    finally:
        compiled.teardown()
    assert ray.get([w.total.remote(torch.ones(3)) for w in workers], timeout=30) == [3.0] * 3  # loops ended


def noted(c: Any, before: int, count: int) -> list[float]:
    """c's notes since ``before``, once ``count`` came (an error's get does not wait for c)."""
    deadline = time.monotonic() + 30
    while len(seen := ray.get(c.noted.remote())[before:]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen  # type: ignore[no-any-return]


def test_a_send_that_raises_fails_its_execution_then_its_group(workers, gloo) -> None:  # noqa: F811
    compiled = cgraph.compile(flaky_edge_dag(workers, FlakySend(gloo.host, gloo.port)), default_communicator="cpu")
    check_one_fault(compiled, workers, "flaky send", [[0.0, 0.0], [4.0, 4.0]])


def test_a_recv_that_raises_fails_its_execution_then_its_group(workers, gloo) -> None:  # noqa: F811
    compiled = cgraph.compile(flaky_edge_dag(workers, FlakyRecv(gloo.host, gloo.port)), default_communicator="cpu")
    check_one_fault(compiled, workers, "flaky recv", [[0.0, 0.0], [4.0, 4.0]])


def test_a_collective_that_raises_fails_every_member_then_its_group(workers, gloo) -> None:  # noqa: F811
    a, b, c = workers
    with InputNode() as inp:
        summed = allreduce.bind([a.make.bind(inp), b.make.bind(inp)])
        dag = MultiOutputNode([a.total.bind(summed[0]), b.total.bind(summed[1]), c.note.bind(a.make.bind(inp))])
    compiled = cgraph.compile(dag, default_communicator=FlakyAllreduce(gloo.host, gloo.port))
    check_one_fault(compiled, workers, "flaky allreduce", [[0.0, 0.0, 0.0], [8.0, 8.0, 4.0]])


def test_an_initialize_that_raises_is_a_compile_error(workers, gloo) -> None:  # noqa: F811
    with pytest.raises(cgraph.CompileError, match=r"communicator custom:BadInit \(BadInit\) raised in "
                       r"initialize\(rank=1, world_size=2\) on actor \w \(Worker\): ConnectionError: no route"):
        cgraph.compile(flaky_edge_dag(workers, BadInit(gloo.host, gloo.port)), default_communicator="cpu")
    assert ray.get([w.total.remote(torch.ones(3)) for w in workers], timeout=30) == [3.0] * 3
    healthy = GlooCommunicator(gloo.host, gloo.port)
    compiled = cgraph.compile(flaky_edge_dag(workers, healthy), default_communicator="cpu")  # the actors are free
    try:
        assert compiled.execute(1).get(timeout=30) == [4.0, 4.0]
    finally:
        compiled.teardown()


def test_a_gpu_typed_value_read_by_the_driver_arrives_as_a_host_copy(workers) -> None:
    """Ray refuses this at compile ("Driver cannot participate in the NCCL group"); cgraph
    sends the driver a host copy through shared memory (docs/design-notes.md)."""
    a, b, _ = workers
    with InputNode() as inp:
        x = a.make.bind(inp).with_tensor_transport(transport="nccl")
        dag = MultiOutputNode([x, b.total.bind(x)])
    compiled = cgraph.compile(dag, default_communicator="cpu")
    try:
        value, total = compiled.execute(3).get(timeout=30)
    finally:
        compiled.teardown()
    assert isinstance(value, torch.Tensor) and value.device.type == "cpu"
    assert value.tolist() == [3.0] * 4 and total == 12.0
