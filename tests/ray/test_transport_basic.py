"""Tensors over communicator edges, through cgraph.compile on a local CPU Ray cluster.

"nccl" hints between CPU actors run on a CPU communicator: every test runs on
both, the shared-memory mesh (``default_communicator="cpu"``) and torch's gloo
process group (``"gloo"``: the code the NCCL communicator runs). Four actors are started once for this file
(``pool``) and reused: each test compiles, runs, and tears down.

    chain    a ══► b ══► c ─► driver        ══ communicator edge
    fan-out  a ══► b, a ══► c ─► driver     ── shared memory
    fan-in   a ══► c, b ══► c ─► driver
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import ray
import torch
from ray.dag import InputNode, MultiOutputNode

import cgraph

pytestmark = pytest.mark.usefixtures("no_leaks")


@dataclasses.dataclass
class Box:
    tensor: Any
    label: str


@ray.remote(num_cpus=0)
class TensorWorker:
    def make(self, x: int, n: int = 4) -> torch.Tensor:
        return torch.full((n,), float(x))

    def sized(self, n: int) -> torch.Tensor:
        return torch.ones(n)

    def double(self, t: Any) -> Any:
        return t * 2

    def add(self, *ts: Any) -> Any:
        return sum(ts[1:], ts[0])

    def total(self, t: Any) -> float:
        return float(t.sum())

    def nested(self, x: int) -> dict[str, Any]:
        return {
            "a": torch.full((2, 2), float(x)),
            "list": [torch.arange(3, dtype=torch.int64) + x, "text", (torch.tensor(x, dtype=torch.bfloat16),)],
            "box": Box(torch.ones(1) * x, f"box{x}"),
            "plain": x,
        }

    def describe(self, value: Any) -> Any:
        """Tensors as (values, dtype, device), recursively: what arrived, where."""
        if isinstance(value, torch.Tensor):
            return (value.float().tolist(), str(value.dtype), value.device.type)
        if isinstance(value, dict):
            return {k: self.describe(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.describe(v) for v in value)
        if isinstance(value, Box):
            return ("Box", self.describe(value.tensor), value.label)
        return value

    def fail_if(self, x: int, bad: int = -1) -> torch.Tensor:
        if x == bad:
            raise ValueError(f"bad input {x}")
        return torch.full((2,), float(x))

    def not_a_tensor(self, x: int) -> Any:
        return x if x < 0 else torch.ones(2) * x

    def die_if(self, x: int, bad: int = -1) -> torch.Tensor:
        if x == bad:
            import os

            os._exit(1)
        return torch.full((2,), float(x))

    def module_value(self, module: str, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)


_POOL: list[Any] = []


@pytest.fixture(scope="session")
def pool(ray_session):
    """Four started actors, shared by every test_transport_* module (they die with the session)."""
    if not _POOL:
        _POOL.extend(TensorWorker.remote() for _ in range(4))
        ray.get([a.total.remote(torch.zeros(1)) for a in _POOL])
    return list(_POOL)


@pytest.fixture(params=["cpu", "gloo"], autouse=True)
def communicator(request: Any) -> str:
    """The CPU communicator under test (every test of this module runs on both)."""
    _CHOSEN[:] = [request.param]
    return str(request.param)


_CHOSEN = ["cpu"]


def run(dag: Any, inputs: list[Any], **options: Any) -> list[Any]:
    options.setdefault("default_communicator", _CHOSEN[0])
    compiled = cgraph.compile(dag, **options)
    try:
        return [compiled.execute(x).get(timeout=60) for x in inputs]
    finally:
        compiled.teardown()


def nccl(node: Any, **hint: Any) -> Any:
    return node.with_tensor_transport(transport="nccl", **hint)


def test_chain(pool) -> None:
    a, b, c, _ = pool
    with InputNode() as inp:
        dag = c.total.bind(nccl(b.double.bind(nccl(a.make.bind(inp)))))
    assert run(dag, [1, 2, 3]) == [8.0, 16.0, 24.0]


def test_a_member_whose_first_communicator_op_waits_on_another_members_output_joins(pool) -> None:
    """a ══► b ──► c ══► d: c's first communicator op (its send to d) waits on b's value,
    which waits on b's receive from a. Making a torch group is collective, so when each
    member made it at its first op, b's waited for c's forever (a soak across nodes found
    it); every member now opens its communicators when its loop starts."""
    a, b, c, d = pool
    with InputNode() as inp:
        dag = d.total.bind(nccl(c.double.bind(b.double.bind(nccl(a.make.bind(inp))))))
    assert run(dag, [1, 2]) == [16.0, 32.0]


def test_fan_out_and_fan_in(pool) -> None:
    a, b, c, d = pool
    with InputNode() as inp:
        x = nccl(a.make.bind(inp))
        fan_out = MultiOutputNode([b.total.bind(x), c.total.bind(x)])
    assert run(fan_out, [1, 5]) == [[4.0, 4.0], [20.0, 20.0]]
    with InputNode() as inp:
        y, z = nccl(a.make.bind(inp)), nccl(b.make.bind(inp, 4))
        fan_in = d.total.bind(nccl(c.add.bind(y, z)))
    assert run(fan_in, [1, 2]) == [8.0, 16.0]


def test_nested_tensors(pool) -> None:
    a, b, *_ = pool
    with InputNode() as inp:
        dag = b.describe.bind(nccl(a.nested.bind(inp)))
    (got,) = run(dag, [3])
    assert got == {
        "a": ([[3.0, 3.0], [3.0, 3.0]], "torch.float32", "cpu"),
        "list": [([3.0, 4.0, 5.0], "torch.int64", "cpu"), "text", ((3.0, "torch.bfloat16", "cpu"),)],
        "box": ("Box", ([3.0], "torch.float32", "cpu"), "box3"),
        "plain": 3,
    }


def test_static_shape_and_direct_return(pool) -> None:
    a, b, c, _ = pool
    with InputNode() as inp:
        x = nccl(a.make.bind(inp), _static_shape=True, _direct_return=True)
        y = nccl(c.nested.bind(inp), _static_shape=True)
        dag = MultiOutputNode([b.total.bind(x), b.describe.bind(y)])
    results = run(dag, [1, 2, 3])
    assert [r[0] for r in results] == [4.0, 8.0, 12.0]
    assert [r[1]["box"][2] for r in results] == ["box1", "box2", "box3"]


def test_mixed_edges_shm_and_communicator_in_one_dag(pool) -> None:
    a, b, c, _ = pool
    with InputNode() as inp:
        t = a.make.bind(inp)  # shm to b and to the driver
        u = nccl(b.double.bind(t))  # communicator to c
        v = c.add.bind(u, t).with_tensor_transport(transport="shm")
        dag = MultiOutputNode([t, v, b.total.bind(t)])
    ((t_out, v_out, total),) = run(dag, [2])
    assert t_out.tolist() == [2.0] * 4 and v_out.tolist() == [6.0] * 4 and total == 8.0


def test_user_errors_travel_through_a_communicator_edge(pool) -> None:
    a, b, *_ = pool
    with InputNode() as inp:
        dag = b.total.bind(nccl(a.fail_if.bind(inp), _static_shape=True, _direct_return=True))
    compiled = cgraph.compile(dag, default_communicator=_CHOSEN[0])
    try:
        assert compiled.execute(1).get(timeout=60) == 2.0
        with pytest.raises(ValueError, match="bad input -1") as info:
            compiled.execute(-1).get(timeout=60)
        assert isinstance(info.value, cgraph.TaskError) and "fail_if" in str(info.value)
        assert compiled.execute(2).get(timeout=60) == 4.0
    finally:
        compiled.teardown()


def test_direct_return_and_static_shape_errors_name_the_node_and_shapes(pool) -> None:
    a, b, *_ = pool
    with InputNode() as inp:
        x = nccl(a.not_a_tensor.bind(inp), _direct_return=True)
        y = nccl(a.sized.bind(inp), _static_shape=True)
        dag = MultiOutputNode([b.total.bind(x), b.total.bind(y)])
    compiled = cgraph.compile(dag, default_communicator=_CHOSEN[0])
    try:
        assert compiled.execute(3).get(timeout=60) == [6.0, 3.0]
        with pytest.raises(TypeError, match=r"node n\d was declared _direct_return=True.*returned int"):
            compiled.execute(-2).get(timeout=60)
        with pytest.raises(ValueError, match=r"first execution sent \[\(3,\) float32\], execution 2 sent \[\(5,\) float32\]"):
            compiled.execute(5).get(timeout=60)
        assert compiled.execute(3).get(timeout=60) == [6.0, 3.0]  # still usable
    finally:
        compiled.teardown()
