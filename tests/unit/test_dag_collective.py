"""Collectives in a DAG, without Ray running: ClassNode actors through ``cgraph.plan``.

    inp ─► a.f ─┐                ┌─► n3[0] ─► a.g ─► driver
                ├─ allreduce n3 ─┤
    inp ─► b.f ─┘                └─► n3[1] ─► c.g ─► driver

The IR text, the COLLECTIVE ops in each member's lane, the deadlock check, the
overlap pass, the pictures, the communicator a collective gets, and every
bind-time error.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import ray

import cgraph
from cgraph import DAGValidationError, DeadlockError, InputNode, MultiOutputNode, TransportError
from cgraph.collective import ReduceOp
from cgraph.collective.dag_ops import allgather, allreduce, reducescatter
from cgraph.dag.adapter import uses_cgraph_input
from cgraph.ir import format_graph, parse_graph
from cgraph.scheduler import find_deadlock, format_schedule, raise_on_deadlock, verify
from cgraph.scheduler.groups import plan_groups
from cgraph.scheduler.ops import OpKind, Stream
from cgraph.visualize import dag_to_dot, schedule_to_dot


@ray.remote
class W:
    def f(self, x):
        return x

    def g(self, x):
        return x

    @ray.method(num_returns=2)
    def two(self, x):
        return x, x


@ray.remote(num_gpus=1)
class G:
    def f(self, x):
        return x


@pytest.fixture(autouse=True)
def _no_cluster():
    yield
    assert not ray.is_initialized(), "a unit test started Ray"


def ir(text: str) -> str:
    return textwrap.dedent(text).strip()


def two_members(op=ReduceOp.SUM, algorithm="auto"):
    a, b, c = W.bind(), W.bind(), W.bind()
    with InputNode() as inp:
        x, y = a.f.bind(inp), b.f.bind(inp)
        rx, ry = allreduce.bind([x, y], op=op, algorithm=algorithm)
        later = a.g.bind(inp)  # bound after the collective: runs after it on a
        return MultiOutputNode([a.g.bind(rx), c.g.bind(ry), later])


# --------------------------------------------------------------------------- IR
def test_allreduce_reads_as_a_collective_node_and_one_item_per_member():
    planned = cgraph.plan(two_members(ReduceOp.MAX, "tree"))
    assert format_graph(planned.graph) == ir("""
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n0)
        n3 = allreduce(n1, n2, op=$0, algorithm=$1)
        n4 = a.g(n0)
        n5 = n3[0]
        n6 = n3[1]
        n7 = a.g(n5)
        n8 = c.g(n6)
        return [n7, n8, n4]
    """)
    assert planned.graph.constants == ("max", "tree")
    assert [planned.graph.node(n).actor for n in ("n5", "n6")] == ["a", "b"]
    assert format_graph(parse_graph(format_graph(planned.graph))) == format_graph(planned.graph)


def test_allgather_and_reducescatter_over_three_members_chained():
    a, b, c = W.bind(), W.bind(), W.bind()
    with InputNode() as inp:
        parts = allgather.bind([w.f.bind(inp) for w in (a, b, c)])
        slices = reducescatter.bind(parts, op="min")  # another collective's results are members too
        dag = MultiOutputNode(slices)
    graph = cgraph.plan(dag).graph
    assert format_graph(graph) == ir("""
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n0)
        n3 = c.f(n0)
        n4 = allgather(n1, n2, n3)
        n5 = n4[0]
        n6 = n4[1]
        n7 = n4[2]
        n8 = reducescatter(n5, n6, n7, op=$0)
        n9 = n8[0]
        n10 = n8[1]
        n11 = n8[2]
        return [n9, n10, n11]
    """)
    assert graph.constants == ("min",)


def test_members_in_any_actor_order():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        x, y = a.f.bind(inp), b.f.bind(inp)
        ry, rx = allreduce.bind([y, x])
        dag = MultiOutputNode([rx, ry])
    planned = cgraph.plan(dag)
    assert "n3 = allreduce(n2, n1, op=$0, algorithm=$1)" in format_graph(planned.graph)
    lanes = {a: [str(op) for op in ops if op.kind is OpKind.COLLECTIVE] for a, ops in planned.schedule.items()}
    assert lanes == {"a": ["a.COLL3[b,a]"], "b": ["b.COLL3[b,a]"]}  # rank order is list order


def test_a_multi_return_call_as_a_member_must_be_indexed():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        dag = MultiOutputNode(allreduce.bind([a.two.bind(inp), b.f.bind(inp)]))
    with pytest.raises(DAGValidationError, match="n3 reads n1, a call with num_returns=2, as one value"):
        cgraph.plan(dag)


def test_output_hint_is_read_on_the_member_result():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        rx, ry = allreduce.bind([a.f.bind(inp), b.f.bind(inp)])
        dag = b.g.bind(rx.with_tensor_transport(transport="nccl"), ry)
    planned = cgraph.plan(dag, default_communicator="cpu")
    assert "n4 = n3[0] :nccl" in format_graph(planned.graph)
    assert "n4>b.comm = comm a -> b via cpu :nccl" in str(planned.plan)


# --------------------------------------------------------------------------- schedule
def test_each_member_runs_the_collective_in_bind_order():
    planned = cgraph.plan(two_members())
    assert format_schedule(planned.schedule) == (
        "a.R0 a.C1 a.W1 a.R1 a.COLL3[a,b] a.W5 a.C4 a.W4 a.R5 a.C7 a.W7"
        " | b.R0 b.C2 b.W2 b.R2 b.COLL3[a,b] b.W6"
        " | c.R6 c.C8 c.W8"
    )
    assert not verify(planned.graph, planned.plan, planned.schedule)
    assert find_deadlock(planned.schedule) is None


def test_two_collectives_swapped_on_one_member_is_a_deadlock_with_evidence():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        r1 = allreduce.bind([a.f.bind(inp), b.f.bind(inp)])
        r2 = allgather.bind([a.g.bind(inp), b.g.bind(inp)])
        dag = MultiOutputNode([*r1, *r2])
    planned = cgraph.plan(dag)
    schedule = dict(planned.schedule)
    colls = [i for i, op in enumerate(schedule["b"]) if op.kind is OpKind.COLLECTIVE]
    lane = list(schedule["b"])
    lane[colls[0]], lane[colls[1]] = lane[colls[1]], lane[colls[0]]
    schedule["b"] = tuple(lane)
    deadlock = find_deadlock(schedule)
    assert deadlock is not None and {op.kind for op in deadlock.cycle} == {OpKind.COLLECTIVE}
    with pytest.raises(DeadlockError, match="allreduce"):
        raise_on_deadlock(schedule, planned.graph)


def test_overlap_moves_the_collective_to_the_comm_stream_and_stays_deadlock_free():
    planned = cgraph.plan(two_members(), overlap_gpu_communication=True)
    colls = [op for ops in planned.schedule.values() for op in ops if op.kind is OpKind.COLLECTIVE]
    assert len(colls) == 2 and all(op.stream is Stream.COMM for op in colls)
    assert planned.planned.before_overlap is not None
    assert not verify(planned.graph, planned.plan, planned.schedule)
    assert find_deadlock(planned.schedule) is None


def test_pictures_draw_the_collective():
    planned = cgraph.plan(two_members(), overlap_gpu_communication=True)
    dot = schedule_to_dot(planned.schedule, planned.planned.before_overlap)
    assert '"a.COLL3[a,b]@comm" -> "b.COLL3[a,b]@comm"' in dot  # members chained
    assert 'shape="hexagon"' in dot and "collective members" in dot
    dag = dag_to_dot(planned.graph, planned.plan)
    assert "allreduce" in dag and "hexagon" in dag


# --------------------------------------------------------------------------- communicator
def _groups(dag, default=None, hosts=None):
    graph = cgraph.plan(dag).graph
    if hosts:
        from dataclasses import replace

        graph = replace(graph, actors=tuple(replace(a, host=hosts[a.id]) for a in graph.actors))
    plan = cgraph.plan(dag).plan
    groups = plan_groups(graph, plan.channels, default)
    return ({g.name: (g.transport, g.members) for g in groups},
            {node: g.name for g in groups for node in g.collectives})


def test_cpu_members_use_the_cpu_communicator_without_a_default():
    groups, of = _groups(two_members())
    assert groups == {"cpu": ("cpu", ("a", "b"))} and of == {"n3": "cpu"}


def test_cpu_members_use_the_default_communicator_when_given():
    groups, _ = _groups(two_members(), default="custom:Gloo")
    assert groups == {"custom:Gloo": ("custom:Gloo", ("a", "b"))}


def test_gpu_members_use_nccl_even_with_a_default():
    a, b = G.bind(), G.bind()
    with InputNode() as inp:
        dag = MultiOutputNode(allreduce.bind([a.f.bind(inp), b.f.bind(inp)]))
    groups, _ = _groups(dag, default="cpu")
    assert groups == {"nccl": ("nccl", ("a", "b"))}


def test_cpu_members_on_two_hosts_without_a_default_is_a_transport_error():
    with pytest.raises(TransportError, match="spans hosts .*default_communicator"):
        _groups(two_members(), hosts={"a": "node1", "b": "node2", "c": "node1"})


# --------------------------------------------------------------------------- errors
def test_dag_with_a_collective_compiles_with_cgraph_even_on_rays_input_node():
    from ray.dag import InputNode as RayInputNode

    a, b = W.bind(), W.bind()
    with RayInputNode() as inp:
        dag = MultiOutputNode(allreduce.bind([a.f.bind(inp), b.f.bind(inp)]))
    assert uses_cgraph_input(dag)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda a, b, inp: allreduce.bind([]), "got an empty list.*one tensor per member"),
        (lambda a, b, inp: allreduce.bind(a.f.bind(inp)), "got ClassMethodNode"),
        (lambda a, b, inp: allreduce.bind([a.f.bind(inp), a.g.bind(inp)]),
         "two nodes of one W actor: members 0 and 1.*at:  allreduce.bind\\(\\[W.f\\(inp\\), W.g\\(inp\\)\\]\\)"),
        (lambda a, b, inp: allreduce.bind([a.f.bind(inp), inp]), "member 1 is inp.*actor method's result"),
        (lambda a, b, inp: allgather.bind([inp[0], b.f.bind(inp)]), "member 0 is inp\\[0\\]"),
        (lambda a, b, inp: reducescatter.bind([a.f.bind(inp), 3]), "member 1 is the constant 3"),
        (lambda a, b, inp: allreduce.bind([a.f.bind(inp), b.f.bind(inp)], op="mean"),
         "unknown reduce op 'mean'.*ReduceOp.SUM"),
        (lambda a, b, inp: allreduce.bind([a.f.bind(inp), b.f.bind(inp)], algorithm="rign"),
         "unknown algorithm 'rign'.*did you mean 'ring'"),
    ],
)
def test_bind_errors_say_what_where_why_and_fix(make, match):
    a, b = W.bind(), W.bind()
    with InputNode() as inp, pytest.raises(DAGValidationError, match="(?s)" + match) as info:
        make(a, b, inp)
    assert all(part in str(info.value) for part in ("\n  at:  ", "\n  why: ", "\n  fix: "))


def test_a_collective_whose_results_reach_no_output_is_refused():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        x = a.f.bind(inp)
        allreduce.bind([x, b.f.bind(inp)])
        dag = a.g.bind(x)
    with pytest.raises(DAGValidationError, match=r"(?s)There are 1 leaf nodes.*\['allreduce'\].*at:  allreduce\(W.f\(inp\).*"
                       r"allreduce\(W.f\(\.\.\.\), .*reaches no output"):
        cgraph.plan(dag)


def test_running_the_dag_without_compiling_says_to_compile():
    a, b = W.bind(), W.bind()
    with InputNode() as inp:
        rx, _ = allreduce.bind([a.f.bind(inp), b.f.bind(inp)])
    with pytest.raises(NotImplementedError, match="cgraph.compile"):
        rx._execute_impl()


def test_the_objects_are_also_the_imperative_calls():
    from cgraph.errors import CollectiveGroupError

    assert repr(allreduce) == "cgraph.collective.allreduce"
    with pytest.raises(CollectiveGroupError, match="no-such-group"):  # cgraph.collective.api.allreduce
        allreduce(np.ones(2), group_name="no-such-group")
