"""A user-supplied communicator: torch.distributed's gloo, written against cgraph's interface.

    driver: TCPStore (master)          GlooCommunicator(host, port) ──pickled──► each member actor:
                                        initialize(rank, n, group) → ProcessGroupGloo(PrefixStore(group, client))

It is passed per edge (``TorchTensorType(transport=obj, device="cpu")``) and as
``default_communicator``; every tensor of those edges goes through its
``send``/``recv`` (counted in the actors), collectives would use the
interface's star defaults.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import ray
import torch
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.comm.communicator import Communicator
from tests.ray.test_transport_basic import pool  # noqa: F401 - the shared actors

pytestmark = pytest.mark.usefixtures("no_leaks")

SENT = [0]  # per process: tensors this process sent through a GlooCommunicator


class GlooCommunicator(Communicator):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.pg: Any = None

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        client = TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=30))
        self.pg = ProcessGroupGloo(PrefixStore(group_name + "/", client), rank, world_size, timedelta(seconds=30))
        self._rank, self._size = rank, world_size

    rank = property(lambda self: self._rank)  # type: ignore[assignment]
    world_size = property(lambda self: self._size)  # type: ignore[assignment]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        SENT[0] += 1
        self._wait(self.pg.send([tensor.contiguous()], dst, 0))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._wait(self.pg.recv([tensor], src, 0))

    def abort(self) -> None:
        self.aborted = True  # gloo's abort does not wake a pending recv: waits watch this flag

    def _wait(self, work: Any) -> None:
        done, failed = threading.Event(), []

        def wait() -> None:
            try:
                work.wait()
            except Exception as exc:  # noqa: BLE001
                failed.append(exc)
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        while not done.wait(0.05):
            if getattr(self, "aborted", False):
                raise cgraph.ChannelClosedError("GlooCommunicator aborted")
        if failed:
            raise failed[0]


@pytest.fixture
def gloo(ray_session):
    from torch.distributed import TCPStore

    host = ray.util.get_node_ip_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield GlooCommunicator(host, store.port)
    del store


def sent(actor: Any) -> int:
    return int(ray.get(actor.module_value.remote(__name__, "SENT"))[0])


def test_user_communicator_per_edge_with_device_cpu(pool, gloo) -> None:  # noqa: F811
    a, b, *_ = pool
    before = sent(a)
    with InputNode() as inp:
        x = cgraph.with_type_hint(a.nested.bind(inp), cgraph.TorchTensorType(transport=gloo, device="cpu"))
        dag = b.describe.bind(x)
    compiled = cgraph.compile(dag)
    try:
        got = [compiled.execute(i).get(timeout=60) for i in (1, 2)]
    finally:
        compiled.teardown()
    assert [g["a"] for g in got] == [([[1.0] * 2] * 2, "torch.float32", "cpu"), ([[2.0] * 2] * 2, "torch.float32", "cpu")]
    assert sent(a) - before == 2 * 4  # 4 tensors in each nested value


def test_user_communicator_as_the_default_for_nccl_edges(pool, gloo) -> None:  # noqa: F811
    a, b, c, _ = pool
    before = sent(a) + sent(b)
    with InputNode() as inp:
        x = a.make.bind(inp).with_tensor_transport(transport="nccl", _static_shape=True, _direct_return=True)
        y = b.make.bind(inp).with_tensor_transport(transport="nccl")
        dag = MultiOutputNode([c.add.bind(x, y)])
    compiled = cgraph.compile(dag, default_communicator=gloo, overlap_gpu_communication=True)
    try:
        assert [compiled.execute(i).get(timeout=60)[0].tolist() for i in (1, 3)] == [[2.0] * 4, [6.0] * 4]
    finally:
        compiled.teardown()
    assert sent(a) + sent(b) - before == 4


def test_a_user_communicator_that_cannot_be_shipped_is_refused_at_compile(pool) -> None:  # noqa: F811
    a, b, *_ = pool

    class Holder(GlooCommunicator):
        def __init__(self) -> None:
            super().__init__("127.0.0.1", 1)
            self.lock = threading.Lock()

    with InputNode() as inp:
        dag = b.total.bind(cgraph.with_type_hint(a.make.bind(inp), cgraph.TorchTensorType(transport=Holder())))
    with pytest.raises(cgraph.CompileError, match=r"communicator custom:Holder \(Holder\) cannot be pickled"):
        cgraph.compile(dag)
