"""The front end on DAGs bound to actor *handles*, without a Ray cluster.

Ray 2.60 binds handle methods differently from ClassNodes: ``num_returns=k``
returns k placeholder nodes, and each handle object stamps a bind index. To
run Ray's real ``ActorMethod.bind`` offline, ``offline_handle`` builds a true
``ActorHandle`` whose pickling (which Ray's node scanner does) needs no
cluster, and auto-``ray.init`` is switched off for these tests.
"""

from __future__ import annotations

import logging
import textwrap

import pytest
import ray
import ray._private.auto_init_hook as auto_init_hook
from ray._raylet import ActorID
from ray.actor import ActorHandle

from cgraph import InputNode, MultiOutputNode
from cgraph.dag import read_dag
from cgraph.errors import DAGValidationError
from cgraph.ir import format_graph


class OfflineHandle(ActorHandle):
    """A real ActorHandle for a made-up actor id; pickles without a cluster."""

    def __reduce__(self):
        return (str, (f"offline-handle-{self._ray_actor_id.hex()}",))

    def __del__(self):  # nothing to release: no cluster holds a reference
        pass


def offline_handle(actor_cls, actor_id: ActorID | None = None) -> ActorHandle:
    """A handle to ``actor_cls`` as ``Actor.remote()`` builds it, for an actor that never runs.

    Pass the ``actor_id`` of another offline handle to get a second handle
    object of the same actor (with its own bind counter, as in Ray).
    """
    meta = actor_cls.__ray_metadata__
    mm = meta.method_meta
    return OfflineHandle(
        meta.language, actor_id or ActorID.from_random(), 0, True, mm.method_is_generator,
        mm.decorators, mm.signatures, mm.num_returns, mm.max_task_retries, mm.retry_exceptions,
        mm.generator_backpressure_num_objects, mm.num_objects_per_yield, mm.enable_task_events,
        meta.enable_tensor_transport, mm.method_name_to_tensor_transport, 0,
        meta.actor_creation_function_descriptor, None,
    )


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """ActorMethod.bind would start Ray on first use; these tests must not."""
    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", False)
    yield
    assert not ray.is_initialized(), "a unit test started Ray"


@ray.remote
class Worker:
    def f(self, x):
        return x

    def g(self, x):
        return x

    @ray.method(num_returns=2)
    def split(self, x):
        return x, x

    def stream(self, x):
        yield x


def ir(text: str) -> str:
    return textwrap.dedent(text).strip()


def test_num_returns_outputs_become_item_nodes():
    a, b = offline_handle(Worker), offline_handle(Worker)
    with InputNode() as inp:
        x, y = a.split.bind(inp)
        p, q, r = a.f.options(num_returns=3).bind(x)
        dag = MultiOutputNode([b.g.bind(y), p, q, r])
    graph = read_dag(dag).graph
    assert format_graph(graph) == ir("""
        actor a = Worker(gpus=0)
        actor b = Worker(gpus=0)
        n0 = input
        n1 = a.split(n0) returns=2
        n2 = n1[0]
        n3 = n1[1]
        n4 = b.g(n3)
        n5 = a.f(n2) returns=3
        n6 = n5[0]
        n7 = n5[1]
        n8 = n5[2]
        return [n4, n6, n7, n8]
    """)
    assert graph.node("n2").actor == "a"  # an item lives where its call ran


def test_a_return_value_nothing_reads_is_a_leaf_node_as_in_ray():
    a, b = offline_handle(Worker), offline_handle(Worker)
    with InputNode() as inp:
        x, y = a.split.bind(inp)
        p, _q, r = a.f.options(num_returns=3).bind(x)
        dag = MultiOutputNode([b.g.bind(y), p, r])
    with pytest.raises(DAGValidationError) as info:
        read_dag(dag)
    message = str(info.value)
    assert message.startswith("Compiled DAG doesn't support leaf nodes, i.e., nodes that don't have "
                              "downstream nodes and are not output nodes. There are 1 leaf nodes "
                              "in the DAG. Please add the outputs of ['f[1]'] to the MultiOutputNode.")
    assert "at:  Worker.f(Worker.split(inp)[0])[1]" in message


def test_an_item_can_carry_its_own_transport():
    a, b = offline_handle(Worker), offline_handle(Worker)
    with InputNode() as inp:
        x, y = a.split.bind(inp)
        dag = MultiOutputNode([b.g.bind(x.with_tensor_transport("nccl")), b.f.bind(y)])
    graph = read_dag(dag).graph
    assert [str(graph.node(n).hint) for n in ("n2", "n3")] == ["nccl", "None"]


def test_one_handle_binds_in_program_order():
    a, b = offline_handle(Worker), offline_handle(Worker)
    with InputNode() as inp:
        x = a.f.bind(inp)
        y = b.f.bind(x)
        dag = a.g.bind(y)
    front = read_dag(dag)
    assert "order=" not in format_graph(front.graph)
    assert [n.method for n in front.graph.actor_nodes("a")] == ["f", "g"]
    assert front.handles == {"a": a, "b": b}


def test_two_handle_objects_of_one_actor_interleave_their_bind_indices():
    # Ray keeps the bind counter per handle object: h2's calls are 0 and 1,
    # h1's call is 0, so Ray runs g(n0), f(n2), g(n1): f before the g it reads.
    h1 = offline_handle(Worker)
    h2 = offline_handle(Worker, h1._actor_id)
    with InputNode() as inp:
        y = h2.g.bind(inp)
        z = h2.g.bind(y)
        dag = h1.f.bind(z)
    graph = read_dag(dag).graph
    assert format_graph(graph) == ir("""
        actor a = Worker(gpus=0)
        n0 = input
        n1 = a.g(n0)
        n2 = a.g(n1) order=3
        n3 = a.f(n2) order=2
        return n3
    """)
    assert [n.id for n in graph.actor_nodes("a")] == ["n1", "n3", "n2"]


def test_class_name_from_the_handle_and_gpus_zero_offline(caplog):
    caplog.set_level(logging.DEBUG, logger="cgraph")
    with InputNode() as inp:
        dag = offline_handle(Worker).f.bind(inp)
    assert str(read_dag(dag).graph.actors[0]) == "actor a = Worker(gpus=0)"
    assert "gpus=0 (Ray is not connected)" in caplog.text


def test_streaming_generator_is_rejected():
    # Ray 2.60 cannot bind a generator on a handle at all (its bind raises a
    # TypeError); on a ClassNode the option passes through, and cgraph says no.
    from cgraph import DAGValidationError

    with InputNode() as inp:
        dag = Worker.bind().stream.options(num_returns="streaming").bind(inp)
    with pytest.raises(DAGValidationError) as err:
        read_dag(dag)
    message = str(err.value)
    assert "Worker.stream(inp)" in message
    assert "num_returns='streaming'" in message
    assert "fix: return a value" in message
