"""The front end on real Ray DAG objects, compared with the expected IR text.

Actors are ClassNodes (``Worker.bind()``), so no Ray cluster starts: the DAG
objects are Ray's own, built through Ray's public API.
"""

from __future__ import annotations

import textwrap

import pytest
import ray
from ray.dag import InputNode as RayInputNode
from ray.dag import MultiOutputNode as RayMultiOutputNode
from ray.experimental.channel.cpu_communicator import CPUCommunicator
from ray.experimental.channel.torch_tensor_type import TorchTensorType as RayTorchTensorType

from cgraph import InputNode, MultiOutputNode, TorchTensorType, with_type_hint
from cgraph.dag import read_dag
from cgraph.ir import Const, Ref, format_graph, parse_graph


@ray.remote
class Worker:
    device = "cpu"  # a class attribute, not a method

    def f(self, x):
        return x

    def g(self, x, y=None):
        return x, y

    def h(self, *xs):
        return xs

    @ray.method(num_returns=2)
    def split(self, x):
        return x, x


@ray.remote(num_cpus=0, num_gpus=1)
class GpuWorker:
    def send(self, shape, dtype, value):
        return value

    def recv(self, tensor):
        return tensor


def ir(text: str) -> str:
    return textwrap.dedent(text).strip()


def read(dag) -> str:
    return format_graph(read_dag(dag).graph)


@pytest.fixture(autouse=True)
def _no_cluster():
    yield
    assert not ray.is_initialized(), "a unit test started Ray"


# --------------------------------------------------------------------------- shapes
def test_chain():
    a, b, c = Worker.bind(), Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = c.f.bind(b.f.bind(a.f.bind(inp)))
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        actor c = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n1)
        n3 = c.f(n2)
        return n3
    """)


def test_fan_out():
    a, b, c = Worker.bind(), Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp)
        dag = MultiOutputNode([b.f.bind(x), c.f.bind(x)])
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        actor c = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n1)
        n3 = c.f(n1)
        return [n2, n3]
    """)


def test_fan_in_with_input_index():
    a, b, c = Worker.bind(), Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp[0])
        y = b.f.bind(inp[1])
        dag = c.h.bind(x, y)
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        actor c = Worker(gpus=0)
        n0 = input
        n1 = n0[0]
        n2 = n0[1]
        n3 = a.f(n1)
        n4 = b.f(n2)
        n5 = c.h(n3, n4)
        return n5
    """)


def test_diamond():
    a, b, c, d = (Worker.bind() for _ in range(4))
    with InputNode() as inp:
        x = a.f.bind(inp)
        dag = d.h.bind(b.f.bind(x), c.f.bind(x))
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        actor c = Worker(gpus=0)
        actor d = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n1)
        n3 = c.f(n1)
        n4 = d.h(n2, n3)
        return n4
    """)


def test_same_actor_twice_keeps_one_actor_and_bind_order():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp)
        y = b.f.bind(x)
        dag = a.g.bind(y)
    front = read_dag(dag)
    assert format_graph(front.graph) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n1)
        n3 = a.g(n2)
        return n3
    """)
    assert [n.id for n in front.graph.actor_nodes("a")] == ["n1", "n3"]
    assert front.handles["a"] is a and front.handles["b"] is b


def test_input_attribute_and_kwargs():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.g.bind(inp.key, y=inp[0])
        dag = b.g.bind(x, y=[1, 2])
    front = read_dag(dag)
    assert format_graph(front.graph) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        n0 = input
        n1 = n0.key
        n2 = n0[0]
        n3 = a.g(n1, y=n2)
        n4 = b.g(n3, y=$0)
        return n4
    """)
    assert front.graph.constants == ([1, 2],)
    assert front.input_node is inp


def test_constants_keep_their_values_and_order():
    a = Worker.bind()
    shape = (10, 10)
    with InputNode() as inp:
        dag = a.h.bind(shape, inp, "float16", None)
    graph = read_dag(dag).graph
    call = graph.node("n1")
    assert call.args == (Const(0), Ref("n0"), Const(1), Const(2))
    assert graph.constants == (shape, "float16", None)
    assert graph.constants[0] is shape


def test_num_returns_on_a_class_node_call():
    a = Worker.bind()
    with InputNode() as inp:
        x = a.split.bind(inp)  # @ray.method(num_returns=2)
        y = a.f.options(num_returns=3).bind(inp)
        dag = MultiOutputNode([x, y])
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        n0 = input
        n1 = a.split(n0) returns=2
        n2 = a.f(n0) returns=3
        return [n1, n2]
    """)


def test_multi_output_may_repeat_a_node_and_return_an_input_attribute():
    a = Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp[0])
        dag = MultiOutputNode([x, x, inp[0]])
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        n0 = input
        n1 = n0[0]
        n2 = a.f(n1)
        return [n2, n2, n1]
    """)


def test_ids_follow_creation_order_level_by_level():
    # list comprehensions bind stage by stage; ids and actor letters follow
    workers = [Worker.bind() for _ in range(3)]
    sink = Worker.bind()
    with InputNode() as inp:
        firsts = [w.f.bind(inp) for w in workers]
        dag = MultiOutputNode([sink.f.bind(x) for x in reversed(firsts)])
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        actor c = Worker(gpus=0)
        actor d = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n0)
        n3 = c.f(n0)
        n4 = d.f(n3)
        n5 = d.f(n2)
        n6 = d.f(n1)
        return [n4, n5, n6]
    """)


def test_many_actors_get_two_letter_ids():
    workers = [Worker.bind() for _ in range(28)]
    with InputNode() as inp:
        x = inp
        for w in workers:
            x = w.f.bind(x)
    graph = read_dag(x).graph
    assert [a.id for a in graph.actors][24:] == ["y", "z", "aa", "ab"]
    assert parse_graph(format_graph(graph)) == graph


def test_gpus_come_from_class_node_options():
    a, b, c = GpuWorker.bind(), GpuWorker.options(num_gpus=2).bind(), Worker.bind()
    with InputNode() as inp:
        dag = MultiOutputNode([a.recv.bind(inp), b.recv.bind(inp), c.f.bind(inp)])
    assert [str(x) for x in read_dag(dag).graph.actors] == [
        "actor a = GpuWorker(gpus=1)",
        "actor b = GpuWorker(gpus=2)",
        "actor c = Worker(gpus=0)",
    ]


# --------------------------------------------------------------------------- hints
def test_tensor_transport_hints():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp).with_tensor_transport("nccl")
        y = a.f.bind(inp).with_tensor_transport("shm", device="cpu")
        z = a.f.bind(inp).with_tensor_transport("auto", _static_shape=True)
        w = a.f.bind(inp).with_tensor_transport("accelerator", _direct_return=True)
        dag = b.h.bind(x, y, z, w)
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0) :nccl
        n2 = a.f(n0) :shm[device=cpu]
        n3 = a.f(n0) :auto[static_shape]
        n4 = a.f(n0) :nccl[direct_return]
        n5 = b.h(n1, n2, n3, n4)
        return n5
    """)


class Sending(CPUCommunicator):
    """A Ray communicator whose transport is not "cpu" (it would send tensors itself)."""

    def get_transport_name(self) -> str:
        return "accelerator"


def test_custom_communicators_are_named_by_class_and_identity():
    comm1, comm2 = Sending(2, []), Sending(2, [])
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.f.bind(inp).with_tensor_transport(transport=comm1)
        y = a.f.bind(inp).with_tensor_transport(transport=comm2)
        z = a.f.bind(inp).with_tensor_transport(transport=comm1)
        dag = b.h.bind(x, y, z)
    front = read_dag(dag)
    hints = [front.graph.node(n).hint.transport for n in ("n1", "n2", "n3")]
    assert hints == ["custom:Sending", "custom:Sending_1", "custom:Sending"]
    assert dict(front.communicators) == {"custom:Sending": comm1, "custom:Sending_1": comm2}


def test_rays_cpu_communicator_on_an_edge_is_host_memory_as_in_ray():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = b.h.bind(a.f.bind(inp).with_tensor_transport(transport=CPUCommunicator(2, [])))
    front = read_dag(dag)
    assert front.graph.node("n1").hint.transport == "shm"
    assert dict(front.communicators) == {}


def test_with_type_hint_function_and_method():
    a, b = Worker.bind(), Worker.bind()
    hint = TorchTensorType(transport="nccl", _static_shape=True, _direct_return=True)
    with InputNode() as inp:
        x = a.f.bind(inp)
        assert x.with_type_hint(hint) is x  # Ray 2.60 nodes lack it: cgraph adds it
        y = with_type_hint(a.f.bind(inp), TorchTensorType())
        z = with_type_hint(a.f.bind(inp), TorchTensorType("shm", device="cpu"))
        dag = b.h.bind(x, y, z)
    assert read(dag) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        n0 = input
        n1 = a.f(n0) :nccl[static_shape,direct_return]
        n2 = a.f(n0) :auto
        n3 = a.f(n0) :shm[device=cpu]
        n4 = b.h(n1, n2, n3)
        return n4
    """)


def test_rays_own_torch_tensor_type_keeps_rays_meaning():
    # Ray's TorchTensorType "auto" is host memory: cgraph's "shm"
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = with_type_hint(a.f.bind(inp), RayTorchTensorType())
        y = with_type_hint(a.f.bind(inp), RayTorchTensorType(transport="accelerator"))
        dag = b.h.bind(x, y)
    graph = read_dag(dag).graph
    assert [str(graph.node(n).hint) for n in ("n1", "n2")] == ["shm", "nccl"]


def test_torch_tensor_type_with_a_non_ray_communicator():
    class MyComm:  # not a Ray Communicator: kept as cgraph's hint on the node
        pass

    comm = MyComm()
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = b.f.bind(a.f.bind(inp).with_type_hint(TorchTensorType(transport=comm)))
    front = read_dag(dag)
    assert str(front.graph.node("n1").hint) == "custom:MyComm"
    assert front.communicators["custom:MyComm"] is comm


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"transport": "gloo"}, "transport must be one of"),
        ({"device": "tpu"}, "device must be one of"),
        ({"transport": "nccl", "device": "cpu"}, 'use transport="shm"'),
    ],
)
def test_torch_tensor_type_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TorchTensorType(**kwargs)


def test_with_type_hint_rejects_what_is_not_a_hint():
    with InputNode() as inp:
        node = Worker.bind().f.bind(inp)
    with pytest.raises(TypeError, match="expected cgraph.TorchTensorType"):
        with_type_hint(node, "nccl")
    with pytest.raises(TypeError, match="expected a Ray DAG node"):
        with_type_hint(42, TorchTensorType())


# --------------------------------------------------------------------------- seed 002
def build_seed_dag(num_senders: int = 3):
    """Ray's overlap example (seed 002), only its imports changed, actors bound offline."""
    import torch

    senders = [GpuWorker.bind() for _ in range(num_senders)]
    receiver = GpuWorker.bind()
    shape, dtype = (10000, 10000), torch.float16
    with InputNode() as inp:
        branches = [sender.send.bind(shape, dtype, inp) for sender in senders]
        branches = [
            branch.with_type_hint(
                TorchTensorType(transport="nccl", _static_shape=True, _direct_return=True)
            )
            for branch in branches
        ]
        branches = [receiver.recv.bind(branch) for branch in branches]
        dag = MultiOutputNode(branches)
    return dag


SEED_IR = ir("""
    actor a = GpuWorker(gpus=1)
    actor b = GpuWorker(gpus=1)
    actor c = GpuWorker(gpus=1)
    actor d = GpuWorker(gpus=1)
    n0 = input
    n1 = a.send($0, $1, n0) :nccl[static_shape,direct_return]
    n2 = b.send($2, $3, n0) :nccl[static_shape,direct_return]
    n3 = c.send($4, $5, n0) :nccl[static_shape,direct_return]
    n4 = d.recv(n1)
    n5 = d.recv(n2)
    n6 = d.recv(n3)
    return [n4, n5, n6]
""")


def test_seed_overlap_example_with_cgraph_imports():
    graph = read_dag(build_seed_dag()).graph
    assert format_graph(graph) == SEED_IR
    assert graph.multi_output
    assert parse_graph(format_graph(graph), graph.constants) == graph


# --------------------------------------------------------------------------- round trip
def test_text_round_trips_for_ray_built_graphs():
    a, b = Worker.bind(), Worker.bind()
    with RayInputNode() as inp:  # Ray's own InputNode reads the same
        x = a.g.bind(inp[0], y=inp.k).with_tensor_transport("nccl")
        y = b.split.bind(x)
        dag = RayMultiOutputNode([y, a.f.bind(x)])
    graph = read_dag(dag).graph
    assert parse_graph(format_graph(graph), graph.constants) == graph
