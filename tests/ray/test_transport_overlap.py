"""Overlap at run time: identical results with and without it, and a collective node.

    inp ─► a.make(v, n) ══╦══► d.total ─────┐        ══ communicator edges (CPU communicator)
                          ╚══► b.total ─────┤        ── shared memory
    inp ─► b.nested(v) ══════► d.describe ──┼─► driver
    inp ─► c.fail_if(v) ═════► d.double ────┘   (static shape, direct return; v == -1 raises)

200 random executions (shapes change, some raise), submitted several at a
time, give the same results compiled with and without
``overlap_gpu_communication`` (and, over gloo, with ``run_ahead``: d receives execution
i+1's values while it computes execution i), and the results a plain computation predicts.
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.ir import parse_graph
from cgraph.runtime.launch import launch
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler import format_schedule, plan_schedule
from tests.ray.test_transport_basic import pool  # noqa: F401 - the shared actors

pytestmark = pytest.mark.usefixtures("no_leaks")

EXECUTIONS = 200


def build(actors: list[Any]) -> Any:
    a, b, c, d = actors
    with InputNode() as inp:
        x = a.make.bind(inp[0], inp[1]).with_tensor_transport(transport="nccl")
        y = b.nested.bind(inp[0]).with_tensor_transport(transport="nccl")
        z = c.fail_if.bind(inp[0]).with_tensor_transport(transport="nccl", _static_shape=True, _direct_return=True)
        return MultiOutputNode([d.total.bind(x), d.describe.bind(y), d.double.bind(z), b.total.bind(x)])


def expected(v: int, n: int) -> Any:
    if v == -1:
        return ("error", "bad input -1")
    return [float(v * n), {"a": [[float(v)] * 2] * 2, "plain": v}, [2.0 * v] * 2, float(v * n)]


def observe(ref: Any) -> Any:
    try:
        total, described, doubled, other = ref.get(timeout=60)
    except ValueError as exc:
        return ("error", "bad input -1" if "bad input -1" in str(exc) else str(exc))
    return [total, {"a": described["a"][0], "plain": described["plain"]}, doubled.tolist(), other]


def run_all(actors: list[Any], inputs: list[tuple[int, int]], overlap: bool, communicator: str = "cpu",
            ahead: bool = False) -> list[Any]:
    compiled = cgraph.compile(build(actors), default_communicator=communicator, overlap_gpu_communication=overlap,
                              max_inflight_executions=4, run_ahead=ahead)
    out: list[Any] = []
    try:
        if overlap:
            assert "@comm" in format_schedule(compiled.schedule)
        if ahead:  # d's three receives begin while d computes the execution before
            assert "d.RECV3<a@comm+1 d.RECV4<b@comm+1 d.RECV5<c@comm+1 d.C6" in format_schedule(compiled.schedule)
        for start in range(0, len(inputs), 4):  # up to 4 executions in flight
            refs = [compiled.execute(*args) for args in inputs[start : start + 4]]
            out += [observe(ref) for ref in refs]
    finally:
        compiled.teardown()
    return out


@pytest.mark.parametrize("communicator", ["cpu", "gloo"])
def test_identical_results_with_and_without_overlap(pool, communicator: str) -> None:  # noqa: F811
    rng = random.Random(20240601)
    inputs = [(rng.choice([-1, 0, 1, 2, 3, 7]), rng.randint(1, 6)) for _ in range(EXECUTIONS)]
    plain = run_all(pool, inputs, overlap=False, communicator=communicator)
    overlapped = run_all(pool, inputs, overlap=True, communicator=communicator)
    assert overlapped == plain
    if communicator == "gloo":  # the CPU communicator's receives never run ahead (tests/unit/test_ahead.py)
        ahead = run_all(pool, inputs, overlap=True, communicator=communicator, ahead=True)
        assert ahead == plain, "a value received ahead landed in another execution"
    assert plain == [expected(v, n) for v, n in inputs]
    assert sum(1 for r in plain if r[0] == "error") > 10  # errors were exercised too


COLLECTIVE = """
actor a = TensorWorker(gpus=0)
actor b = TensorWorker(gpus=0)
actor c = TensorWorker(gpus=0)
n0 = input
n1 = a.fail_if(n0)
n2 = b.fail_if(n0)
n3 = allreduce(n1, n2)
n4 = n3[0]
n5 = n3[1]
n6 = c.total(n4)
return [n6, n5]
"""


@pytest.mark.parametrize("communicator", ["cpu", "gloo"])
@pytest.mark.parametrize("overlap", [False, True])
def test_collective_node_on_actors(pool, overlap: bool, communicator: str) -> None:  # noqa: F811
    """A COLLECTIVE node through launch, on the shared-memory mesh and on gloo."""
    graph = parse_graph(COLLECTIVE)
    planned = plan_schedule(graph, overlap=overlap, default_communicator=communicator)
    front = type("Front", (), {})()
    front.graph, front.handles = graph, MappingProxyType(dict(zip("abc", pool, strict=False)))
    front.communicators = MappingProxyType({})
    compiled = launch(front, planned, CompileOptions(overlap_gpu_communication=overlap,
                                                     default_communicator=communicator))
    try:
        total, reduced = compiled.execute(3).get(timeout=60)
        assert total == 12.0 and reduced.tolist() == [6.0, 6.0]
        with pytest.raises(ValueError, match="bad input -1"):
            compiled.execute(-1).get(timeout=60)
        assert compiled.execute(1).get(timeout=60)[0] == 4.0
    finally:
        compiled.teardown()
