"""Faults on communicator edges: a peer that dies, and teardown's clean-up.

    a.die_if(v) ══comm══► b.total ─► driver      a exits (os._exit) when v == -1

b waits for a's tensor on its communication thread (overlap on);
the driver's monitor sees a die and closes every channel and link, which wakes
b: ``get()`` raises ``cgraph.ActorDiedError`` naming a, well before any
timeout, and b's loop ends so b answers ordinary calls again.
"""

from __future__ import annotations

import time

import pytest
import ray
import torch
from ray.dag import InputNode

import cgraph
from tests.ray.conftest import cgraph_segments
from tests.ray.test_transport_basic import TensorWorker, pool  # noqa: F401 - the shared actors

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.parametrize("communicator", ["cpu", "gloo"])
def test_a_peer_dying_mid_execution_raises_actor_died_without_a_hang(ray_session, communicator: str) -> None:
    a, b = TensorWorker.remote(), TensorWorker.remote()
    try:
        with InputNode() as inp:
            x = a.die_if.bind(inp).with_tensor_transport(transport="nccl", _static_shape=True, _direct_return=True)
            dag = b.total.bind(x)
        compiled = cgraph.compile(dag, default_communicator=communicator, overlap_gpu_communication=True)
        assert compiled.execute(1).get(timeout=60) == 2.0
        start = time.monotonic()
        ref = compiled.execute(-1)
        with pytest.raises(cgraph.ActorDiedError) as info:
            ref.get(timeout=60)
        assert time.monotonic() - start < 20
        assert "TensorWorker" in str(info.value) and info.value.actor.startswith("a ")
        compiled.teardown()
        assert ray.get(b.total.remote(torch.ones(3)), timeout=30) == 3.0  # b's loop ended
    finally:
        ray.kill(a)
        ray.kill(b)


def test_teardown_removes_links_and_side_channels(pool) -> None:  # noqa: F811
    a, b, c, _ = pool
    before = set(cgraph_segments())
    with InputNode() as inp:
        x = a.make.bind(inp).with_tensor_transport(transport="nccl")
        dag = c.total.bind(b.double.bind(x).with_tensor_transport(transport="nccl"))
    compiled = cgraph.compile(dag, default_communicator="cpu", overlap_gpu_communication=True)
    refs = [compiled.execute(i) for i in range(3)]
    assert refs[0].get(timeout=60) == 0.0
    during = set(cgraph_segments()) - before
    assert any("side" in name for name in during), during  # side channels
    assert any("-3e" in name for name in during), during  # links "cpu.0>1" (">" escaped)
    compiled.teardown()  # two executions still in flight
    assert set(cgraph_segments()) - before == set()
