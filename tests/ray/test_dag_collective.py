"""Collectives in a DAG on live CPU actors (the CPU communicator: no default needed).

    inp ─► m0.tensor ─┐                   ┌─► r0 ─► m0.scale ─► driver
    inp ─► m1.tensor ─┼── allreduce ... ──┼─► r1 ─► m1.scale ─► driver
    inp ─► m2.tensor ─┘   (2-4 members)   └─► r2 ─► m2.scale ─► driver

Each member's tensor differs by rank; results are compared with the same
computation done by hand with torch, with and without overlap. A member whose
producer raises gives every member an error: the driver gets ``TaskError``
and the next execution works. ``no_leaks`` checks /dev/shm after teardown.
"""

from __future__ import annotations

import pytest
import ray
import torch

import cgraph
from cgraph import InputNode, MultiOutputNode
from cgraph.collective import ReduceOp
from cgraph.collective.dag_ops import allgather, allreduce, reducescatter
from cgraph.errors import CollectiveMismatchError

pytestmark = pytest.mark.usefixtures("no_leaks")

N = 12  # elements per member: divisible by 2, 3 and 4 members (reducescatter)


@ray.remote(num_cpus=0)
class Member:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def tensor(self, x: int) -> torch.Tensor:
        if x == -1 and self.rank == 1:
            raise ValueError(f"bad input on rank {self.rank}")
        if x == -2 and self.rank == 2:
            return member_tensor(self.rank, x)[:8]  # a shape the other members do not have
        return member_tensor(self.rank, x)

    def scale(self, t: torch.Tensor) -> torch.Tensor:
        return t * 2

    def ints(self, x: int) -> torch.Tensor:
        return torch.arange(4) + self.rank + x

    def pair(self, x: int) -> tuple[torch.Tensor, int]:
        return member_tensor(self.rank, x), self.rank


def member_tensor(rank: int, x: int) -> torch.Tensor:
    return (torch.arange(N, dtype=torch.float32) * (rank + 1) + x) % 7 - rank


@pytest.fixture(scope="module")
def members(ray_session):
    actors = [Member.remote(r) for r in range(4)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    yield actors
    for a in actors:
        ray.kill(a)


def expected(method: str, op: str, size: int, x: int) -> list[torch.Tensor]:
    inputs = torch.stack([member_tensor(r, x) for r in range(size)])
    reduced = inputs.amax(0) if op == "max" else inputs.sum(0) / size if op == "avg" else inputs.sum(0)
    if method == "allreduce":
        return [reduced * 2] * size
    if method == "allgather":
        return [inputs.reshape(-1) * 2] * size
    return [chunk * 2 for chunk in reduced.chunk(size)]


def build(actors, method: str, op: str, **options):
    with InputNode() as inp:
        inputs = [a.tensor.bind(inp) for a in actors]
        if method == "allgather":
            results = allgather.bind(inputs)
        else:
            collective = allreduce if method == "allreduce" else reducescatter
            results = collective.bind(inputs, op=op, **options)
        return MultiOutputNode([a.scale.bind(r) for a, r in zip(actors, results, strict=True)])


def run(dag, xs, **options):
    compiled = cgraph.compile(dag, **options)
    try:
        return [compiled.execute(x).get(timeout=60) for x in xs]
    finally:
        compiled.teardown()


@pytest.mark.parametrize(
    "method, op, size",
    [
        ("allreduce", "sum", 1),
        ("allreduce", "sum", 2),
        ("allreduce", "max", 3),
        ("allreduce", "sum", 4),
        ("allgather", "sum", 3),
        ("reducescatter", "max", 2),
        ("reducescatter", "sum", 4),
        ("allreduce", "avg", 3),
        ("reducescatter", "avg", 2),
    ],
)
def test_results_equal_torch_with_and_without_overlap(members, method, op, size):
    dag = build(members[:size], method, op)
    for overlap in (False, True):
        results = run(dag, [3, 5], overlap_gpu_communication=overlap)
        for x, got in zip([3, 5], results, strict=True):
            want = expected(method, op, size, x)
            assert len(got) == size
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w)


@pytest.mark.parametrize(("algorithm", "communicator"), [
    ("tree", None), ("butterfly", None), ("reduction_server", "gloo"), ("ring", "gloo"), ("auto", "gloo"),
])
def test_a_named_allreduce_algorithm_gives_the_same_result(members, algorithm, communicator):
    options = {} if communicator is None else {"default_communicator": communicator}
    got = run(build(members[:3], "allreduce", "sum", algorithm=algorithm), [2], **options)[0]
    for g, w in zip(got, expected("allreduce", "sum", 3, 2), strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failing_producer_reaches_the_driver_and_the_graph_goes_on(members, overlap):
    compiled = cgraph.compile(build(members[:3], "allreduce", "sum"), overlap_gpu_communication=overlap)
    try:
        with pytest.raises(cgraph.TaskError, match="bad input on rank 1") as info:
            compiled.execute(-1).get(timeout=60)
        assert isinstance(info.value, ValueError)
        got = compiled.execute(4).get(timeout=60)
        torch.testing.assert_close(got[0], expected("allreduce", "sum", 3, 4)[0])
    finally:
        compiled.teardown()


@pytest.mark.parametrize("communicator", [None, "gloo"])
def test_members_with_different_shapes_get_a_mismatch_and_the_graph_goes_on(members, communicator):
    """Every output of that execution raises the same CollectiveMismatchError (gloo would
    abort the actor's process on such a call); nothing was sent, so the next one runs."""
    options = {} if communicator is None else {"default_communicator": communicator}
    compiled = cgraph.compile(build(members[:3], "allreduce", "sum"), **options)
    try:
        refs = compiled.execute(-2)
        with pytest.raises(cgraph.TaskError) as info:
            refs.get(timeout=60)
        assert isinstance(info.value, CollectiveMismatchError), info.value
        assert "rank 0: allreduce float32(12,) sum" in str(info.value), info.value
        assert "rank 2: allreduce float32(8,) sum" in str(info.value), info.value
        got = compiled.execute(4).get(timeout=60)
        torch.testing.assert_close(got[2], expected("allreduce", "sum", 3, 4)[2])
    finally:
        compiled.teardown()


def test_ray_s_avg_op_and_transport_argument_port_as_they_are(members):
    """``op=ReduceOp.AVG`` and ``transport="nccl"`` as Ray's own collective binds take them (on
    CPU actors NCCL's place goes to the graph's communicator); an integer AVG is an error."""
    from ray.experimental.util.types import ReduceOp as RayReduceOp

    with InputNode() as inp:
        inputs = [a.tensor.bind(inp) for a in members[:3]]
        results = allreduce.bind(inputs, op=RayReduceOp.AVG, transport="nccl")
        dag = MultiOutputNode([a.scale.bind(r) for a, r in zip(members[:3], results, strict=True)])
    got = run(dag, [6])[0]
    for g, w in zip(got, expected("allreduce", "avg", 3, 6), strict=True):
        torch.testing.assert_close(g, w)
    with pytest.raises(cgraph.DAGValidationError, match="default_communicator='gloo'"):
        allgather.bind(inputs, transport="gloo")
    with InputNode() as inp:
        dag = MultiOutputNode(allreduce.bind([a.ints.bind(inp) for a in members[:2]], op="avg"))
    with pytest.raises(cgraph.TaskError, match="needs a floating dtype, not torch.int64"):
        run(dag, [1])


def test_chained_collectives_and_members_from_multi_return_calls(members):
    a, b = members[:2]
    with InputNode() as inp:
        ta, rank_a = a.pair.options(num_returns=2).bind(inp)  # every return value read, as Ray asks
        tb, rank_b = b.pair.options(num_returns=2).bind(inp)
        summed = allreduce.bind([ta, tb], op=ReduceOp.SUM)
        gathered = allgather.bind(summed)
        dag = MultiOutputNode([*gathered, rank_a, rank_b])
    ga, gb, rank0, rank = run(dag, [1])[0]
    total = member_tensor(0, 1) + member_tensor(1, 1)
    torch.testing.assert_close(ga, torch.cat([total, total]))
    torch.testing.assert_close(gb, ga)
    assert (rank0, rank) == (0, 1)


def test_a_call_bound_after_the_collective_runs_after_it_on_that_handle(members):
    a, b = members[:2]
    with InputNode() as inp:
        ra, rb = allreduce.bind([a.tensor.bind(inp), b.tensor.bind(inp)])
        later = a.scale.bind(a.tensor.bind(inp))  # bound after: bind indices put it after
        dag = MultiOutputNode([a.scale.bind(ra), rb, later])
    lane = [str(op) for op in cgraph.plan(dag).schedule["a"] if op.kind.name in ("COMPUTE", "COLLECTIVE")]
    assert lane == ["a.C1", "a.COLL3[a,b]", "a.C4", "a.C5", "a.C8"]  # bind order: C8 = scale(ra)
    assert "n8 = a.scale(n6)" in str(cgraph.plan(dag).graph)
