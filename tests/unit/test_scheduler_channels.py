"""plan_channels: transports per edge, errors that say how to fix, lookups, text form."""

from __future__ import annotations

import pytest

from cgraph.errors import DAGValidationError, GraphSyntaxError, TransportError
from cgraph.ir import DRIVER, TensorHint, parse_graph
from cgraph.scheduler import (
    ChannelKind,
    ChannelSpec,
    format_channels,
    map_values,
    parse_channels,
    plan_channels,
)

# a.send ==nccl==> b.recv, on two actors without GPUs
NO_GPU = """
actor a = Worker(gpus=0)
actor b = Worker(gpus=0)
n0 = input
n1 = a.send(n0) :nccl
n2 = b.recv(n1)
return n2
"""


def test_nccl_without_gpus_says_which_edge_which_actors_and_what_to_do() -> None:
    with pytest.raises(TransportError) as err:
        plan_channels(parse_graph(NO_GPU))
    assert str(err.value) == (
        "edge n1 = a.send(n0) :nccl -> n2 = b.recv(n1) uses transport 'nccl', "
        "but actors a (Worker, gpus=0) and b (Worker, gpus=0) have no GPU\n"
        "  at:  n1 = a.send(n0) :nccl\n"
        "       n2 = b.recv(n1)\n"
        "  why: NCCL moves tensors between GPUs, so both actors need one\n"
        '  fix: use with_tensor_transport(transport="shm") or transport="auto" for this edge, '
        'give both actors num_gpus=1, or compile with a CPU communicator (default_communicator="gloo", '
        'or "cpu" for actors on the driver\'s node)'
    )
    assert isinstance(err.value, ValueError)


def test_nccl_names_only_the_actor_without_a_gpu() -> None:
    with pytest.raises(TransportError, match=r"actor b \(Worker, gpus=0\) has no GPU"):
        plan_channels(parse_graph(NO_GPU.replace("a = Worker(gpus=0)", "a = Worker(gpus=1)")))


def test_nccl_without_gpus_falls_back_to_the_default_communicator() -> None:
    plan = plan_channels(parse_graph(NO_GPU), default_communicator="cpu")
    assert format_channels(plan).splitlines()[1] == "n1>b.comm = comm a -> b via cpu :nccl"


@pytest.mark.parametrize(
    ("gpus_a", "gpus_b", "hint", "expected"),
    [
        (1, 1, "auto", "n1>b.comm = comm a -> b via nccl :auto"),
        (1, 0, "auto", "n1.shm = shm a -> b via shm :auto"),
        (1, 1, "shm", "n1.shm = shm a -> b via shm :shm"),
        (1, 1, None, "n1.shm = shm a -> b via shm"),
        (0, 0, "custom:mine", "n1>b.comm = comm a -> b via custom:mine :custom:mine"),
        (1, 1, "nccl[static_shape]", "n1>b.comm = comm a -> b via nccl :nccl[static_shape]"),
    ],
)
def test_transport_per_hint(gpus_a: int, gpus_b: int, hint: str | None, expected: str) -> None:
    text = NO_GPU.replace("a = Worker(gpus=0)", f"a = Worker(gpus={gpus_a})")
    text = text.replace("b = Worker(gpus=0)", f"b = Worker(gpus={gpus_b})")
    text = text.replace(" :nccl", f" :{hint}" if hint else "")
    assert format_channels(plan_channels(parse_graph(text))).splitlines()[1] == expected


def test_edges_to_and_from_the_driver_never_use_a_communicator() -> None:
    # -> a.f(:nccl) -> driver ; GPU actor, nccl hint: the driver still reads shm
    graph = parse_graph("actor a = W(gpus=1)\nn0 = input\nn1 = a.f(n0) :nccl\nreturn n1")
    assert format_channels(plan_channels(graph)) == (
        "n0.shm = shm driver -> a via shm\nn1.shm = shm a -> driver via shm :nccl"
    )


def test_nccl_across_hosts_stays_on_the_communicator() -> None:
    text = NO_GPU.replace("gpus=0)", "gpus=1)").replace("b = Worker(gpus=1)", "b = Worker(gpus=1, host=n2)")
    lines = format_channels(plan_channels(parse_graph(text))).splitlines()
    assert lines[1] == "n1>b.comm = comm a -> b via nccl :nccl"
    assert lines[2] == "n2>driver.xnode = xnode b -> driver via xnode"


def test_shared_memory_on_every_node_and_one_crossing_per_node() -> None:
    """Two actors of another node share memory there; a value read by both crosses once."""
    graph = parse_graph(
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0, host=node2)
        actor c = W(gpus=0, host=node2)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        n3 = c.h(n2, n1)
        return n3
        """
    )
    assert format_channels(plan_channels(graph)).splitlines() == [
        "n0.shm = shm driver -> a via shm",
        "n1>b.xnode = xnode a -> b,c via xnode",
        "n2.shm = shm b -> c via shm",
        "n3>driver.xnode = xnode c -> driver via xnode",
    ]


def test_items_inherit_the_hint_of_their_call() -> None:
    graph = parse_graph(
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        n0 = input
        n1 = a.split(n0) returns=2 :nccl
        n2 = n1[0]
        n3 = n1[1] :shm
        n4 = b.g(n2, n3)
        return n4
        """
    )
    plan = plan_channels(graph)
    assert [spec.id for spec in plan.channels] == ["n0.shm", "n2>b.comm", "n3.shm", "n4.shm"]
    assert plan.for_reader("n2", "b").hint == TensorHint("nccl")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n1 = a.split(n0) returns=2\nn2 = b.g(n1)\nreturn n2",
         "n2 reads n1, a call with num_returns=2, as one value\n"
         "  at:  n1 = a.split(n0) returns=2\n       n2 = b.g(n1)\n"
         "  why: each result of n1 is a value of its own (n1[0], n1[1], ...)\n"
         "  fix: read one result: `x, y = actor.f.options(num_returns=2).bind(...)`, then bind x or y"),
        ("n1 = a.split(n0) returns=2\nreturn n1",
         "the output reads n1, a call with num_returns=2, as one value\n"
         "  at:  n1 = a.split(n0) returns=2\n       return n1\n"),
        ("n1 = a.f(n0)\nn2 = b.f(n0)\nn3 = allreduce(n1, n2)\nn4 = b.g(n3)\nreturn n4",
         "n4 reads n3, a collective, as one value\n"),
        ("n1 = a.f(n0)\nn2 = a.g(n0)\nn3 = allreduce(n1, n2)\nn4 = n3[0]\nreturn n4",
         "collective n3 has members a, a\n  at:  n3 = allreduce(n1, n2)\n"),
        ("n1 = a.f(n0)\nn2 = allreduce(n1, n0)\nn3 = n2[0]\nreturn n3",
         "collective n2 has members a, driver\n"),
    ],
    ids=["call reads multi-return", "output is multi-return", "call reads collective",
         "collective members share an actor", "collective member is the input"],
)  # fmt: skip
def test_bad_reads_are_dag_errors(text: str, expected: str) -> None:
    graph = parse_graph("actor a = W(gpus=1)\nactor b = W(gpus=1)\nn0 = input\n" + text)
    with pytest.raises(DAGValidationError) as err:
        plan_channels(graph)
    assert str(err.value).startswith(expected)


def test_value_map_readers_follow_actor_order_with_the_driver_last() -> None:
    # actors declared b, a; a reads n1 first; the driver reads it too
    graph = parse_graph(
        """
        actor b = W(gpus=0)
        actor a = W(gpus=0)
        actor c = W(gpus=0)
        n0 = input
        n1 = c.f(n0)
        n2 = a.g(n1)
        n3 = b.g(n1)
        return [n1, n2, n3]
        """
    )
    values = map_values(graph)
    assert values.values == ("n0", "n1", "n2", "n3")
    assert values.readers["n1"] == ("b", "a", DRIVER)
    assert values.holder == {"n0": DRIVER, "n1": "c", "n2": "a", "n3": "b"}
    assert values.inputs["n2"] == ("n1",)
    plan = plan_channels(graph)
    assert plan.for_reader("n1", "a") is plan.for_reader("n1", DRIVER)
    assert plan.for_reader("n1", "c") is None
    assert [s.id for s in plan.for_node("n1")] == ["n1.shm"]
    assert plan.for_node("n9") == ()


def test_input_attributes_read_the_input_channel() -> None:
    graph = parse_graph("actor a = W(gpus=0)\nn0 = input\nn1 = n0.x\nn2 = n0[1]\nn3 = a.f(n1, n2)\nreturn n3")
    assert map_values(graph).inputs["n3"] == ("n0",)
    assert plan_channels(graph).for_reader("n0", "a") == ChannelSpec(
        "n0.shm", "n0", ChannelKind.SHM, DRIVER, ("a",), "shm"
    )


def test_channel_text_round_trips() -> None:
    graph = parse_graph(
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1, host=node2)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0) :nccl[static_shape,direct_return]
        n2 = b.g(n1)
        n3 = c.h(n1, n2) :custom:mine
        n4 = a.k(n3, n1)
        return [n1, n4]
        """
    )
    plan = plan_channels(graph, default_communicator="cpu")
    assert "n1>c.comm = comm a -> c via cpu" in format_channels(plan)
    assert parse_channels(format_channels(plan)) == plan
    assert parse_channels(str(plan)).for_reader("n2", "c") == plan.for_reader("n2", "c")


def test_bad_channel_text_names_the_line() -> None:
    with pytest.raises(GraphSyntaxError, match="line 2: expected 'ID = KIND"):
        parse_channels("n0.shm = shm driver -> a via shm\nn1.shm = bogus")


# --------------------------------------------------------------------------- groups
GPU_PAIR = """
actor a = W(gpus={ga}, devices={da})
actor b = W(gpus={gb}, devices={db})
actor c = W(gpus=0)
n0 = input
n1 = a.f(n0) :nccl
n2 = b.g(n1)
n3 = c.h(n0)
n4 = b.k(n3) :custom:mine
n5 = c.m(n4)
n6 = allreduce(n2, n5)
n7 = n6[0]
n8 = n6[1]
return [n7, n8]
"""


def _planned(**where):
    from cgraph.scheduler import plan_schedule

    return plan_schedule(parse_graph(GPU_PAIR.format(**where)), default_communicator="gloo", customs=("custom:mine",))


def test_the_plan_names_every_group_its_kind_members_and_collectives_and_its_text_inverts():
    plan = _planned(ga=0.5, da="0", gb=0.5, db="0").plan
    assert [str(g) for g in plan.groups] == [
        "group nccl = cuda_ipc a,b via nccl",  # both on GPU 0 of one node: NCCL cannot, CUDA IPC can
        "group custom:mine = custom b,c via custom:mine",
        "group gloo = gloo b,c via gloo for n6",
    ]
    assert parse_channels(format_channels(plan)) == plan
    assert plan.group_of_collective("n6").name == "gloo" and plan.group("nccl").kind == "cuda_ipc"


def test_a_group_on_gpus_of_their_own_is_nccl_and_unlocated_actors_plan_as_nccl():
    assert _planned(ga=1, da="0", gb=1, db="1").plan.group("nccl").kind == "nccl"
    unlocated = GPU_PAIR.replace(", devices={da}", "").replace(", devices={db}", "").format(ga=1, gb=1)
    from cgraph.scheduler import plan_schedule

    assert plan_schedule(parse_graph(unlocated), default_communicator="gloo").plan.group("nccl").kind == "nccl"


def test_gpus_that_neither_nccl_nor_cuda_ipc_can_serve_are_refused_at_planning():
    from cgraph.errors import CompileError

    with pytest.raises(CompileError, match="Ray assigned no GPU"):
        _planned(ga=1, da="-", gb=1, db="1")
    with pytest.raises(CompileError, match="unknown communicator 'custom:mine'"):
        from cgraph.scheduler import plan_schedule

        plan_schedule(parse_graph(GPU_PAIR.format(ga=1, da="0", gb=1, db="1")), default_communicator="gloo",
                      customs=())


def test_a_cpu_group_off_the_drivers_node_is_refused_at_planning():
    text = GPU_PAIR.format(ga=0, da="-", gb=0, db="-").replace("actor c = W(gpus=0)", "actor c = W(gpus=0, host=n2)")
    text = text.replace(" :nccl", "").replace(", devices=-", "")
    from cgraph.scheduler import plan_schedule

    with pytest.raises(TransportError, match="cpu communicator of actors b, c"):
        plan_schedule(parse_graph(text), default_communicator="cpu", customs=("custom:mine",))


def test_where_ray_put_an_actor_prints_and_parses_back():
    text = "actor a = W(gpus=2, host=3f2a, devices=0+1)\nactor b = W(gpus=1, devices=-)\nactor c = W(gpus=0)\n" \
           "n0 = input\nn1 = a.f(n0)\nn2 = b.g(n1)\nn3 = c.h(n2)\nreturn n3"
    graph = parse_graph(text)
    assert [a.devices for a in graph.actors] == [("0", "1"), (), None]
    assert str(graph).splitlines()[:3] == text.splitlines()[:3]
    assert parse_graph(str(graph)) == graph
